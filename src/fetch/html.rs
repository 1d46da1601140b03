//! A fetched page's HTML as Markdown, bounded so that no page can abort the process.
//!
//! The Markdown conversion (htmd) recurses once per nested element, and a page is untrusted:
//! 3,000 nested `<div>`s (33 KB) overflowed a runtime thread's stack, which aborts the whole
//! server. So a page is parsed first (html5ever builds its tree without recursion, and the
//! tree is freed without recursion), its depth is measured without recursion, and only a
//! tree no deeper than [`MAX_DEPTH`] is converted; a deeper one comes back as its text.
//! Both run on a thread of their own whose stack ([`STACK`]) holds the deepest tree converted
//! with a wide margin, so neither the bound nor the stack alone is what keeps the process up.

use std::rc::Rc;
use std::sync::LazyLock;

use markup5ever_rcdom::{Node, NodeData};

/// Elements nested deeper than this are not converted to Markdown: the page's text is
/// returned instead. Real pages nest a few dozen deep.
pub const MAX_DEPTH: usize = 512;

/// The stack of the thread a page is converted on. 511 levels of `div`, `ul`/`li`,
/// `blockquote`, tables or inline elements needed more than 1 MiB and less than 2 MiB in a
/// debug build (measured; a release build needs less), so [`MAX_DEPTH`] levels fit in an
/// eighth of it, and a test converts each of those shapes within a quarter.
const STACK: usize = 16 * 1024 * 1024;

/// Elements whose content is never shown (the converter skips them too).
const HIDDEN: &[&str] = &[
    "script", "style", "noscript", "template", "head", "svg", "iframe",
];

/// A page as the tool returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The text of its first `<title>`, if any.
    pub title: Option<String>,
    /// Markdown, or the page's text when it is not converted (`note` says why).
    pub content: String,
    /// How deep the page nests: its tree's depth, or, for a page not parsed, how deep its
    /// tags could nest.
    pub depth: usize,
    /// Why `content` is plain text rather than Markdown, when it is.
    pub note: Option<String>,
}

/// The converter `web_fetch` uses: htmd, without the parts no reader sees. Built once:
/// conversions share it, as they shared it before they moved to their own threads.
static CONVERTER: LazyLock<htmd::HtmlToMarkdown> = LazyLock::new(|| {
    htmd::HtmlToMarkdown::builder()
        .skip_tags(HIDDEN.to_vec())
        .build()
});

/// Why a page nesting `depth` deep comes back as its text.
fn too_deep(depth: usize) -> String {
    format!(
        "this page nests {depth} elements deep, past the {MAX_DEPTH} web_fetch turns into \
         Markdown; its text follows"
    )
}

/// `html` as Markdown, or as text past [`MAX_DEPTH`], on the calling thread. Its stack
/// must hold [`MAX_DEPTH`] levels of the conversion ([`convert_off_thread`] gives it one
/// that does); parsing and measuring use none.
pub fn convert(html: &str) -> Converted {
    // Lowercased once: the depth estimate, the title and the stripping all search it.
    let lower = html.to_ascii_lowercase();
    let title = title_of(html, &lower);
    // The parser's own work grows with the depth of the elements open at each tag, so a
    // page that could nest past the bound is not parsed at all: its tags are stripped.
    let estimate = estimated_depth(&lower);
    if estimate > MAX_DEPTH {
        return Converted {
            title,
            content: stripped(html, &lower),
            depth: estimate,
            note: Some(too_deep(estimate)),
        };
    }
    let tree = match CONVERTER.html_to_tree(html) {
        Ok(tree) => tree,
        // The parser recovers from any input and reads from memory: should it still fail,
        // the text is better than nothing.
        Err(err) => {
            return Converted {
                title,
                content: stripped(html, &lower),
                depth: estimate,
                note: Some(format!(
                    "this page could not be parsed ({err}); its text follows"
                )),
            };
        }
    };
    let depth = depth_of(&tree);
    if depth > MAX_DEPTH {
        return Converted {
            title,
            content: text_of(&tree),
            depth,
            note: Some(too_deep(depth)),
        };
    }
    Converted {
        title,
        content: CONVERTER.tree_to_markdown(&tree),
        depth,
        note: None,
    }
}

/// [`convert`] on a thread of its own with a stack sized for it, so the runtime's threads
/// never run it (its time is the page's, and its stack use is bounded by the depth check).
/// `held` is kept until the conversion ends (a permit that bounds conversions in flight).
///
/// # Errors
/// The thread could not be started (the system is out of threads or memory).
///
/// # Cancel safety
/// Dropping the future leaves the conversion to finish on its thread, which then ends and
/// drops `held`.
pub async fn convert_off_thread<H: Send + 'static>(
    html: String,
    held: H,
) -> std::io::Result<Converted> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("guildhall-html".into())
        .stack_size(STACK)
        .spawn(move || {
            let _ = tx.send(convert(&html));
            drop(held);
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("the conversion thread ended without an answer"))
}

/// The text of the first `<title>` of `html` (`lower`, its ASCII-lowercased copy, is
/// searched).
fn title_of(html: &str, lower: &str) -> Option<String> {
    let open = lower.find("<title")?;
    let start = open + lower[open..].find('>')? + 1;
    let end = start + lower[start..].find("</title")?;
    let title = html
        .get(start..end)?
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    (!title.is_empty()).then_some(title)
}

/// Elements without content, which never nest.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "param", "keygen",
];
/// Elements whose end tag may be left out: the next one closes them, so they do not nest
/// by themselves (what nests them, a list or a table, is counted).
const SELF_CLOSING: &[&str] = &[
    "p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th", "thead", "tbody", "tfoot", "rb",
    "rt", "rp", "rtc", "colgroup", "caption",
];

/// How deep the page's tags nest, read in one pass over its text: start tags open, end
/// tags close, void and optional-end elements count for nothing. The parser may close
/// elements earlier, never later; an optional-end element, and the ones a table implies
/// (`tbody`, `tr`, `td`), add at most three levels inside each counted one, and the
/// document, `html` and `body` three more: the tree is at most `4 × estimate + 3` deep,
/// which bounds the parser's work per tag.
fn estimated_depth(lower: &str) -> usize {
    let bytes = lower.as_bytes();
    let (mut depth, mut deepest, mut at) = (0usize, 0usize, 0usize);
    while let Some(found) = position(b'<', &bytes[at..]) {
        at += found + 1;
        if bytes[at..].starts_with(b"!--") {
            at = lower[at..]
                .find("-->")
                .map_or(bytes.len(), |end| at + end + 3);
            continue;
        }
        let closing = bytes.get(at) == Some(&b'/');
        let start = at + usize::from(closing);
        let end = bytes[start..]
            .iter()
            .position(|b| !b.is_ascii_alphanumeric())
            .map_or(bytes.len(), |n| start + n);
        let name = &lower[start..end];
        if name.is_empty() || VOID.contains(&name) || SELF_CLOSING.contains(&name) {
            continue;
        }
        if closing {
            depth = depth.saturating_sub(1);
            continue;
        }
        let close = position(b'>', &bytes[end..]).map_or(bytes.len(), |n| end + n);
        if close > end && bytes[close - 1] == b'/' {
            continue;
        }
        depth += 1;
        deepest = deepest.max(depth);
        // A script's or a style's text holds no tags: skip to its end tag.
        if matches!(name, "script" | "style") {
            let ender = if name == "script" {
                "</script"
            } else {
                "</style"
            };
            at = lower[close..]
                .find(ender)
                .map_or(bytes.len(), |n| close + n);
        }
    }
    deepest
}

fn position(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

/// The page's text with its tags, scripts, styles and comments taken out, white space made
/// one, in one pass: for pages too deep to parse.
/// `lower` is `html` ASCII-lowercased.
fn stripped(html: &str, lower: &str) -> String {
    let mut out = String::with_capacity(html.len().min(1 << 20));
    let mut rest = 0;
    let mut space = false;
    let push = |text: &str, out: &mut String, space: &mut bool| {
        for c in text.chars() {
            if c.is_whitespace() {
                *space = !out.is_empty();
            } else {
                if *space {
                    out.push(' ');
                    *space = false;
                }
                out.push(c);
            }
        }
    };
    while let Some(open) = lower[rest..].find('<') {
        let open = rest + open;
        push(&decode(&html[rest..open]), &mut out, &mut space);
        let hidden = ["script", "style", "noscript", "template"]
            .into_iter()
            .find(|tag| lower[open + 1..].starts_with(tag));
        rest = if lower[open..].starts_with("<!--") {
            lower[open..]
                .find("-->")
                .map_or(html.len(), |n| open + n + 3)
        } else if let Some(tag) = hidden {
            let ender = format!("</{tag}");
            match lower[open..].find(&ender) {
                Some(n) => lower[open + n..]
                    .find('>')
                    .map_or(html.len(), |m| open + n + m + 1),
                None => html.len(),
            }
        } else {
            lower[open..].find('>').map_or(html.len(), |n| open + n + 1)
        };
        space = !out.is_empty();
    }
    push(&decode(&html[rest..]), &mut out, &mut space);
    out
}

/// The few character references a text needs to read right.
fn decode(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('&') {
        return text.into();
    }
    text.replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
        .into()
}

/// The deepest nesting of `root`'s tree, counted without recursion.
fn depth_of(root: &Rc<Node>) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(Rc::clone(root), 0usize)];
    while let Some((node, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        for child in node.children.borrow().iter() {
            stack.push((Rc::clone(child), depth + 1));
        }
    }
    deepest
}

/// The text of `root`'s tree without the hidden elements, its blocks on lines of their
/// own and runs of white space made one, gathered without recursion.
fn text_of(root: &Rc<Node>) -> String {
    let mut out = String::new();
    let mut stack = vec![Rc::clone(root)];
    while let Some(node) = stack.pop() {
        match &node.data {
            NodeData::Text { contents } => {
                let contents = contents.borrow();
                for word in contents.split_whitespace() {
                    if !out.is_empty() && !out.ends_with(['\n', ' ']) {
                        out.push(' ');
                    }
                    out.push_str(word);
                }
            }
            NodeData::Element { name, .. } => {
                let tag = name.local.as_ref();
                if HIDDEN.contains(&tag) {
                    continue;
                }
                if !out.is_empty() && !out.ends_with('\n') && !is_inline(tag) {
                    out.push('\n');
                }
                stack.extend(node.children.borrow().iter().rev().cloned());
            }
            NodeData::Document => stack.extend(node.children.borrow().iter().rev().cloned()),
            _ => {}
        }
    }
    out.trim().to_owned()
}

/// Elements that flow within a line of text.
fn is_inline(tag: &str) -> bool {
    matches!(
        tag,
        "a" | "abbr"
            | "b"
            | "bdi"
            | "bdo"
            | "cite"
            | "code"
            | "data"
            | "dfn"
            | "em"
            | "i"
            | "kbd"
            | "mark"
            | "q"
            | "s"
            | "samp"
            | "small"
            | "span"
            | "strong"
            | "sub"
            | "sup"
            | "time"
            | "u"
            | "var"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shallow_page_is_markdown() {
        let page = convert(
            "<title>The  page</title><h1>Title</h1><p>Some <b>bold</b> text.</p><script>x()</script>",
        );
        assert_eq!(page.note, None);
        assert_eq!(page.title.as_deref(), Some("The page"));
        assert_eq!(convert("<p>no <b>title</b></p>").title, None);
        assert!(page.content.contains("# Title"), "{}", page.content);
        assert!(page.content.contains("**bold**"), "{}", page.content);
        assert!(!page.content.contains("x()"), "{}", page.content);
    }

    #[test]
    fn the_depth_estimate_never_counts_less_than_the_tree() {
        for page in [
            "<div><p>a<p>b<ul><li>x<li>y</ul></div>",
            "<b><i>x</b></i><br><img src=x/><!-- <div><div> -->",
            "<table><tr><td><table><tr><td>deep</table></table>",
            "<script>if (a < b) { '<div>' }</script><div>x</div>",
        ] {
            let tree = CONVERTER.html_to_tree(page).unwrap();
            assert!(depth_of(&tree) <= 4 * estimated_depth(page) + 3, "{page}");
        }
        assert_eq!(estimated_depth("<p>a<p>b<p>c"), 0);
        assert_eq!(estimated_depth(&"<div>".repeat(700)), 700);
    }

    #[test]
    fn a_stripped_page_reads_as_its_text() {
        let page = "<h1>A &amp; B</h1><SCRIPT>x('<p>')</script><!-- c --><p>one\n two</p>";
        assert_eq!(stripped(page, &page.to_ascii_lowercase()), "A & B one two");
    }

    #[test]
    fn a_page_nested_past_the_bound_is_its_text() {
        let n = MAX_DEPTH * 20;
        let page = format!(
            "{}<p>deep <i>words</i></p><script>hidden()</script>{}",
            "<div>".repeat(n),
            "</div>".repeat(n)
        );
        let converted = convert(&page);
        assert!(converted.note.is_some_and(|n| n.contains("elements deep")));
        assert!(converted.depth > MAX_DEPTH);
        assert_eq!(converted.content, "deep words");
    }

    /// Lists nest two levels a tag pair the estimate counts once: such a page is parsed,
    /// and its tree, past the bound, comes back as its text, gathered without recursion.
    #[test]
    fn a_parsed_tree_past_the_bound_is_its_text() {
        let n = MAX_DEPTH / 2 + 10;
        let page = format!("{}bottom{}", "<ul><li>".repeat(n), "</li></ul>".repeat(n));
        assert!(estimated_depth(&page) <= MAX_DEPTH);
        let converted = convert(&page);
        assert!(converted.depth > MAX_DEPTH, "{}", converted.depth);
        assert!(converted.note.is_some());
        assert_eq!(converted.content, "bottom");
    }

    /// The conversion of a tree at the bound, of each shape that recurses, fits in a
    /// quarter of the stack its thread gets.
    #[test]
    fn a_tree_at_the_bound_converts_within_a_quarter_of_the_stack() {
        let n = MAX_DEPTH - 4;
        for page in [
            format!("{}x{}", "<div>".repeat(n), "</div>".repeat(n)),
            format!(
                "{}x{}",
                "<ul><li>".repeat(n / 2),
                "</li></ul>".repeat(n / 2)
            ),
            format!("{}x{}", "<blockquote>".repeat(n), "</blockquote>".repeat(n)),
            format!(
                "{}x{}",
                "<table><tr><td>".repeat(n / 4),
                "</td></tr></table>".repeat(n / 4)
            ),
            format!(
                "{}x{}",
                "<b><i><a href=y>".repeat(n / 3),
                "</a></i></b>".repeat(n / 3)
            ),
        ] {
            let converted = std::thread::Builder::new()
                .stack_size(STACK / 4)
                .spawn(move || convert(&page))
                .unwrap()
                .join()
                .unwrap();
            assert_eq!(converted.note, None, "depth {}", converted.depth);
            assert!(converted.depth > MAX_DEPTH / 2, "depth {}", converted.depth);
        }
    }
}
