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
use std::sync::Arc;

use markup5ever_rcdom::{Node, NodeData};

/// Elements nested deeper than this are not converted to Markdown: the page's text is
/// returned instead. Real pages nest a few dozen deep.
pub const MAX_DEPTH: usize = 512;

/// The stack of the thread a page is converted on. A converted level took under 1 KiB of
/// stack here, so [`MAX_DEPTH`] levels need well under a tenth of it.
const STACK: usize = 16 * 1024 * 1024;

/// Elements whose content is never shown (the converter skips them too).
const HIDDEN: &[&str] = &[
    "script", "style", "noscript", "template", "head", "svg", "iframe",
];

/// A page as the tool returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// Markdown, or the page's text when it nests too deep.
    pub content: String,
    /// The nesting depth the page's tree has.
    pub depth: usize,
    /// Whether `content` is plain text because the page nests past [`MAX_DEPTH`].
    pub as_text: bool,
}

/// The converter `web_fetch` uses: htmd, without the parts no reader sees.
fn converter() -> htmd::HtmlToMarkdown {
    htmd::HtmlToMarkdown::builder()
        .skip_tags(HIDDEN.to_vec())
        .build()
}

/// `html` as Markdown, or as text past [`MAX_DEPTH`], on the calling thread. Its stack
/// must hold [`MAX_DEPTH`] levels of the conversion ([`convert_off_thread`] gives it one
/// that does); parsing and measuring use none.
pub fn convert(html: &str) -> Converted {
    // The parser's own work grows with the depth of the elements open at each tag, so a
    // page that could nest past the bound is not parsed at all: its tags are stripped.
    let estimate = estimated_depth(html);
    if estimate > MAX_DEPTH {
        return Converted {
            content: stripped(html),
            depth: estimate,
            as_text: true,
        };
    }
    let converter = converter();
    let tree = match converter.html_to_tree(html) {
        Ok(tree) => tree,
        // The parser recovers from any input and reads from memory: should it still fail,
        // the bytes are better than nothing.
        Err(_) => {
            return Converted {
                content: html.to_owned(),
                depth: 0,
                as_text: true,
            };
        }
    };
    let depth = depth_of(&tree);
    if depth > MAX_DEPTH {
        return Converted {
            content: text_of(&tree),
            depth,
            as_text: true,
        };
    }
    Converted {
        content: converter.tree_to_markdown(&tree),
        depth,
        as_text: false,
    }
}

/// [`convert`] on a thread of its own with a stack sized for it, so the runtime's threads
/// never run it (its time is the page's, and its stack use is bounded by the depth check).
///
/// # Errors
/// The thread could not be started (the system is out of threads or memory).
///
/// `held` is kept until the conversion ends (a permit that bounds conversions in flight).
///
/// # Cancel safety
/// Dropping the future leaves the conversion to finish on its thread, which then ends and
/// drops `held`.
pub async fn convert_off_thread<H: Send + 'static>(
    html: Arc<str>,
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
fn estimated_depth(html: &str) -> usize {
    let bytes = html.as_bytes();
    let (mut depth, mut deepest, mut at) = (0usize, 0usize, 0usize);
    while let Some(found) = memchr(b'<', &bytes[at..]) {
        at += found + 1;
        if bytes[at..].starts_with(b"!--") {
            at = html[at..]
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
        if end == start {
            continue;
        }
        let name = html[start..end].to_ascii_lowercase();
        if VOID.contains(&name.as_str()) || SELF_CLOSING.contains(&name.as_str()) {
            continue;
        }
        if closing {
            depth = depth.saturating_sub(1);
            continue;
        }
        let close = memchr(b'>', &bytes[end..]).map_or(bytes.len(), |n| end + n);
        if close > end && bytes[close - 1] == b'/' {
            continue;
        }
        depth += 1;
        deepest = deepest.max(depth);
        if matches!(name.as_str(), "script" | "style") {
            let ender = format!("</{name}");
            at = html[close.min(html.len())..]
                .to_ascii_lowercase()
                .find(&ender)
                .map_or(bytes.len(), |n| close + n);
        }
    }
    deepest
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

/// The page's text with its tags, scripts, styles and comments taken out, white space made
/// one, in one pass: for pages too deep to parse.
fn stripped(html: &str) -> String {
    let mut out = String::with_capacity(html.len().min(1 << 20));
    let lower = html.to_ascii_lowercase();
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
        let page = convert("<h1>Title</h1><p>Some <b>bold</b> text.</p><script>x()</script>");
        assert!(!page.as_text);
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
            let converter = converter();
            let tree = converter.html_to_tree(page).unwrap();
            assert!(depth_of(&tree) <= 4 * estimated_depth(page) + 3, "{page}");
        }
        assert_eq!(estimated_depth("<p>a<p>b<p>c"), 0);
        assert_eq!(estimated_depth(&"<div>".repeat(700)), 700);
    }

    #[test]
    fn a_stripped_page_reads_as_its_text() {
        assert_eq!(
            stripped("<h1>A &amp; B</h1><script>x('<p>')</script><!-- c --><p>one\n two</p>"),
            "A & B one two"
        );
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
        assert!(converted.as_text);
        assert!(converted.depth > MAX_DEPTH);
        assert_eq!(converted.content, "deep words");
    }
}
