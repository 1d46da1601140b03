//! The patch format Codex's models are trained on, parsed and applied to text (no file is
//! touched here; [`apply_patch`](super::apply_patch) does that).
//!
//! ```text
//! *** Begin Patch
//! *** Add File: notes/new.md
//! +first line
//! *** Update File: src/lib.rs
//! *** Move to: src/core.rs
//! @@ fn main()
//!  context line
//! -removed line
//! +added line
//! *** End of File
//! *** Delete File: old.txt
//! *** End Patch
//! ```
//!
//! A chunk's `-` and ` ` lines are the text it expects, in order; `@@ LINE` first finds a
//! line (a function's signature, say) after which they must follow. The lines are looked
//! for exactly, then ignoring trailing whitespace, then ignoring surrounding whitespace
//! and typographic punctuation (as Codex does), so a patch written from a slightly stale
//! reading still lands, while one whose lines are gone is refused, never guessed at.
//! Parsing is as lenient as Codex's: markers may carry surrounding whitespace, the patch
//! may come wrapped in a `<<'EOF'` heredoc, and the first chunk may omit its `@@`.

use std::fmt;

/// One file's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Hunk {
    Add {
        path: String,
        contents: String,
    },
    Delete {
        path: String,
    },
    Update {
        path: String,
        move_to: Option<String>,
        chunks: Vec<Chunk>,
    },
}

impl Hunk {
    pub(super) fn path(&self) -> &str {
        match self {
            Self::Add { path, .. } | Self::Delete { path } | Self::Update { path, .. } => path,
        }
    }
}

/// One place changed in an updated file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Chunk {
    /// A line the change follows (`@@ LINE`).
    pub(super) context: Option<String>,
    /// The lines expected there (` ` and `-` lines).
    pub(super) old: Vec<String>,
    /// The lines put in their place (` ` and `+` lines).
    pub(super) new: Vec<String>,
    /// The old lines end the file (`*** End of File`).
    pub(super) at_end: bool,
    /// The patch line the chunk starts on, for messages.
    pub(super) line: usize,
}

/// Why a patch could not be read, with the patch line it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParseError {
    pub(super) line: usize,
    pub(super) why: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the patch is malformed at line {}: {}",
            self.line, self.why
        )
    }
}

const BEGIN: &str = "*** Begin Patch";
const END: &str = "*** End Patch";
const ADD: &str = "*** Add File: ";
const DELETE: &str = "*** Delete File: ";
const UPDATE: &str = "*** Update File: ";
const MOVE: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";

/// Reads a whole patch into its hunks, in order.
pub(super) fn parse(patch: &str) -> Result<Vec<Hunk>, ParseError> {
    let lines: Vec<&str> = patch.trim().lines().collect();
    let (body, first) = body_of(&lines)?;
    let mut hunks = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let line_no = first + at;
        let header = body[at].trim();
        at += 1;
        if header.is_empty() {
            continue;
        }
        if let Some(path) = header.strip_prefix(ADD) {
            let mut contents = String::new();
            while let Some(added) = body.get(at).and_then(|l| l.strip_prefix('+')) {
                contents.push_str(added);
                contents.push('\n');
                at += 1;
            }
            hunks.push(Hunk::Add {
                path: path_of(path, line_no)?,
                contents,
            });
        } else if let Some(path) = header.strip_prefix(DELETE) {
            hunks.push(Hunk::Delete {
                path: path_of(path, line_no)?,
            });
        } else if let Some(path) = header.strip_prefix(UPDATE) {
            let move_to = match body.get(at).and_then(|l| l.trim().strip_prefix(MOVE)) {
                Some(to) => {
                    at += 1;
                    Some(path_of(to, first + at - 1)?)
                }
                None => None,
            };
            let mut chunks = Vec::new();
            while at < body.len() {
                if body[at].trim().is_empty() {
                    at += 1;
                    continue;
                }
                if body[at].starts_with('*') && body[at].trim() != END_OF_FILE {
                    break;
                }
                let (chunk, used) = chunk_of(&body[at..], first + at, chunks.is_empty())?;
                chunks.push(chunk);
                at += used;
            }
            if chunks.is_empty() {
                return Err(ParseError {
                    line: line_no,
                    why: format!("`{header}` changes nothing: give at least one chunk"),
                });
            }
            hunks.push(Hunk::Update {
                path: path_of(path, line_no)?,
                move_to,
                chunks,
            });
        } else {
            return Err(ParseError {
                line: line_no,
                why: format!(
                    "`{}` is not a file header; each file starts with `*** Add File: PATH`, \
                     `*** Delete File: PATH` or `*** Update File: PATH`",
                    shortened(header)
                ),
            });
        }
    }
    if hunks.is_empty() {
        return Err(ParseError {
            line: first,
            why: "the patch changes no file".into(),
        });
    }
    Ok(hunks)
}

/// The lines between `*** Begin Patch` and `*** End Patch` (inside a heredoc if the patch
/// came in one), and the patch line the first of them is.
fn body_of<'a>(lines: &'a [&'a str]) -> Result<(&'a [&'a str], usize), ParseError> {
    let heredoc = |l: &str| matches!(l.trim(), "<<EOF" | "<<'EOF'" | "<<\"EOF\"");
    let (lines, first) = match lines {
        [open, inner @ .., close] if heredoc(open) && close.trim() == "EOF" => (inner, 2),
        _ => (lines, 1),
    };
    match lines {
        [begin, ..] if begin.trim() != BEGIN => Err(ParseError {
            line: first,
            why: format!("the first line must be `{BEGIN}`"),
        }),
        [_, body @ .., end] if end.trim() == END => Ok((body, first + 1)),
        _ => Err(ParseError {
            line: first + lines.len().saturating_sub(1),
            why: format!("the last line must be `{END}`"),
        }),
    }
}

fn path_of(path: &str, line: usize) -> Result<String, ParseError> {
    let path = path.trim();
    if path.is_empty() {
        return Err(ParseError {
            line,
            why: "the file header names no path".into(),
        });
    }
    Ok(path.to_owned())
}

/// One chunk from the start of `lines` and how many lines it took. `first` chunks may
/// start without `@@`.
fn chunk_of(lines: &[&str], line: usize, first: bool) -> Result<(Chunk, usize), ParseError> {
    let (context, start) = match lines[0] {
        "@@" => (None, 1),
        l if l.starts_with("@@ ") => (Some(l[3..].to_owned()), 1),
        _ if first => (None, 0),
        other => {
            return Err(ParseError {
                line,
                why: format!(
                    "`{}` should start a chunk with `@@` (or `@@ LINE`, a line the change \
                     follows)",
                    shortened(other)
                ),
            });
        }
    };
    let mut chunk = Chunk {
        context,
        old: Vec::new(),
        new: Vec::new(),
        at_end: false,
        line,
    };
    let mut used = start;
    for l in &lines[start..] {
        if l.trim() == END_OF_FILE {
            chunk.at_end = true;
            used += 1;
            break;
        }
        match l.chars().next() {
            // An empty line is an empty context line (models drop the lone space).
            None => {
                chunk.old.push(String::new());
                chunk.new.push(String::new());
            }
            Some(' ') => {
                chunk.old.push(l[1..].to_owned());
                chunk.new.push(l[1..].to_owned());
            }
            Some('-') => chunk.old.push(l[1..].to_owned()),
            Some('+') => chunk.new.push(l[1..].to_owned()),
            Some(_) if used == start => {
                return Err(ParseError {
                    line: line + used,
                    why: format!(
                        "`{}` is not a change line; each starts with ` ` (kept), `-` \
                         (removed) or `+` (added)",
                        shortened(l)
                    ),
                });
            }
            Some(_) => break,
        }
        used += 1;
    }
    // Empty lines before the next chunk's `@@` belong to no chunk.
    while chunk.old.last().is_some_and(String::is_empty)
        && chunk.new.last().is_some_and(String::is_empty)
        && lines[..used].last().is_some_and(|l| l.is_empty())
    {
        chunk.old.pop();
        chunk.new.pop();
        used -= 1;
    }
    if chunk.old.is_empty() && chunk.new.is_empty() {
        return Err(ParseError {
            line,
            why: "the chunk has no lines".into(),
        });
    }
    Ok((chunk, used))
}

fn shortened(line: &str) -> String {
    const SHOWN: usize = 80;
    match line.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    }
}

/// A chunk whose lines are not in the file.
#[derive(Debug)]
pub(super) struct Unplaced {
    /// Which chunk (from 0).
    pub(super) index: usize,
    /// What was not found: the context line or the old lines.
    pub(super) missing: Missing,
}

#[derive(Debug)]
pub(super) enum Missing {
    /// The `@@ LINE` line.
    Context(String),
    /// The old lines (after the context line, if any).
    Lines(Vec<String>),
    /// The search would have compared more lines than a patch may cost.
    TooCostly,
}

/// Line comparisons one patch may cost in all, whatever its files (about a second of one
/// core at worst): a chunk of many repeated lines sought in a file of the same lines
/// would otherwise cost their product.
pub(super) const COMPARISONS: u64 = 50_000_000;

/// `text` with `chunks` applied in order, each after the one before. The text's line
/// ending (`\n` or `\r\n`) and whether it ends with one are kept.
pub(super) fn apply(text: &str, chunks: &[Chunk], budget: &mut u64) -> Result<String, Unplaced> {
    let crlf = text.contains("\r\n");
    let ends_with_newline = text.is_empty() || text.ends_with('\n');
    let mut lines: Vec<&str> = text
        .split('\n')
        .map(|l| {
            if crlf {
                l.strip_suffix('\r').unwrap_or(l)
            } else {
                l
            }
        })
        .collect();
    if ends_with_newline {
        lines.pop();
    }
    let mut replacements: Vec<(usize, usize, &[String])> = Vec::new();
    let mut from = 0;
    for (index, chunk) in chunks.iter().enumerate() {
        let unplaced = |missing| Unplaced { index, missing };
        if let Some(context) = &chunk.context {
            let found = seek(&lines, std::slice::from_ref(context), from, false, budget)
                .map_err(|()| unplaced(Missing::TooCostly))?;
            from = found.ok_or_else(|| unplaced(Missing::Context(context.clone())))? + 1;
        }
        if chunk.old.is_empty() {
            // Pure additions go at the end of the file.
            replacements.push((lines.len(), 0, &chunk.new));
            continue;
        }
        let mut old: &[String] = &chunk.old;
        let mut new: &[String] = &chunk.new;
        let mut found = seek(&lines, old, from, chunk.at_end, budget)
            .map_err(|()| unplaced(Missing::TooCostly))?;
        // A trailing empty line in the patch often stands for the file's final newline.
        if found.is_none() && old.last().is_some_and(String::is_empty) {
            old = &old[..old.len() - 1];
            if new.last().is_some_and(String::is_empty) {
                new = &new[..new.len() - 1];
            }
            found = seek(&lines, old, from, chunk.at_end, budget)
                .map_err(|()| unplaced(Missing::TooCostly))?;
        }
        let at = found.ok_or_else(|| unplaced(Missing::Lines(chunk.old.clone())))?;
        replacements.push((at, old.len(), new));
        from = at + old.len();
    }
    let mut out: Vec<&str> = Vec::with_capacity(lines.len());
    let mut next = 0;
    for (at, len, new) in replacements {
        // Chunks are placed in order, so `at` never goes back; an addition at the end
        // after a chunk ending there is still after it.
        let at = at.max(next);
        out.extend_from_slice(&lines[next..at]);
        out.extend(new.iter().map(String::as_str));
        next = at + len;
    }
    out.extend_from_slice(&lines[next.min(lines.len())..]);
    let newline = if crlf { "\r\n" } else { "\n" };
    let mut result = out.join(newline);
    if ends_with_newline && !out.is_empty() {
        result.push_str(newline);
    }
    Ok(result)
}

/// Where `pattern` starts in `lines` at or after `from` (at the end when `at_end`),
/// compared ever more loosely. `Err` when the budget runs out.
fn seek(
    lines: &[&str],
    pattern: &[String],
    from: usize,
    at_end: bool,
    budget: &mut u64,
) -> Result<Option<usize>, ()> {
    if pattern.len() > lines.len() {
        return Ok(None);
    }
    let last = lines.len() - pattern.len();
    let starts: Box<dyn Iterator<Item = usize>> = if at_end {
        Box::new((from..=last).rev().take(1).chain(from..last))
    } else {
        Box::new(from..=last)
    };
    let starts: Vec<usize> = starts.collect();
    for rule in [Rule::Exact, Rule::Trailing, Rule::Loose] {
        for &start in &starts {
            let mut matched = true;
            for (line, want) in lines[start..].iter().zip(pattern) {
                *budget = budget.checked_sub(1).ok_or(())?;
                if !rule.same(line, want) {
                    matched = false;
                    break;
                }
            }
            if matched {
                return Ok(Some(start));
            }
        }
    }
    Ok(None)
}

/// How closely a file's line must equal a patch's, tried in this order.
#[derive(Clone, Copy)]
enum Rule {
    Exact,
    /// Trailing whitespace ignored.
    Trailing,
    /// Surrounding whitespace ignored, typographic punctuation as ASCII.
    Loose,
}

impl Rule {
    fn same(self, line: &str, want: &str) -> bool {
        match self {
            Self::Exact => line == want,
            Self::Trailing => line.trim_end() == want.trim_end(),
            Self::Loose => line
                .trim()
                .chars()
                .map(plain)
                .eq(want.trim().chars().map(plain)),
        }
    }
}

/// Typographic punctuation and spaces as their ASCII forms.
fn plain(c: char) -> char {
    match c {
        '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' => '\'',
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' => '"',
        '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(patch: &str) -> Vec<Chunk> {
        match parse(patch).unwrap().remove(0) {
            Hunk::Update { chunks, .. } => chunks,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_patch_reads_into_its_hunks() {
        let hunks = parse(
            "*** Begin Patch\n*** Add File: a.txt\n+one\n+two\n*** Delete File: b.txt\n\
             *** Update File: c.rs\n*** Move to: d.rs\n@@ fn f()\n-    old\n+    new\n\
             *** End Patch\n",
        )
        .unwrap();
        assert_eq!(hunks.len(), 3);
        assert_eq!(
            hunks[0],
            Hunk::Add {
                path: "a.txt".into(),
                contents: "one\ntwo\n".into()
            }
        );
        assert_eq!(
            hunks[1],
            Hunk::Delete {
                path: "b.txt".into()
            }
        );
        let Hunk::Update {
            path,
            move_to,
            chunks,
        } = &hunks[2]
        else {
            panic!()
        };
        assert_eq!((path.as_str(), move_to.as_deref()), ("c.rs", Some("d.rs")));
        assert_eq!(chunks[0].context.as_deref(), Some("fn f()"));
        assert_eq!((chunks[0].old.len(), chunks[0].new.len()), (1, 1));
    }

    #[test]
    fn a_heredoc_and_a_missing_first_marker_are_read_as_codex_reads_them() {
        let chunks = update(
            "<<'EOF'\n*** Begin Patch\n*** Update File: x\n keep\n+added\n*** End Patch\nEOF\n",
        );
        assert_eq!(chunks[0].old, ["keep"]);
        assert_eq!(chunks[0].new, ["keep", "added"]);
    }

    #[test]
    fn malformed_patches_name_the_line() {
        let err = parse("*** Begin Patch\n*** Frobnicate: x\n*** End Patch").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.why.contains("not a file header"), "{err}");
        let err = parse("*** Begin Patch\n*** Update File: x\n*** End Patch").unwrap_err();
        assert!(err.why.contains("changes nothing"), "{err}");
        let err = parse("Begin\n*** End Patch").unwrap_err();
        assert!(err.why.contains("first line"), "{err}");
        let err = parse("*** Begin Patch\n*** Delete File: x").unwrap_err();
        assert!(err.why.contains("last line"), "{err}");
        let err = parse("*** Begin Patch\n*** End Patch").unwrap_err();
        assert!(err.why.contains("no file"), "{err}");
        let err = parse("*** Begin Patch\n*** Update File: x\n@@\n-a\n@@\nnope\n*** End Patch")
            .unwrap_err();
        assert_eq!(err.line, 6, "{err}");
    }

    #[test]
    fn chunks_land_after_their_context_and_keep_the_line_ending() {
        let text = "fn a() {\n    x\n}\nfn b() {\n    x\n}\n";
        let chunks = update(
            "*** Begin Patch\n*** Update File: f\n@@ fn b() {\n-    x\n+    y\n*** End Patch",
        );
        let mut budget = COMPARISONS;
        assert_eq!(
            apply(text, &chunks, &mut budget).unwrap(),
            "fn a() {\n    x\n}\nfn b() {\n    y\n}\n"
        );
        let crlf = text.replace('\n', "\r\n");
        assert_eq!(
            apply(&crlf, &chunks, &mut budget).unwrap(),
            "fn a() {\r\n    x\r\n}\r\nfn b() {\r\n    y\r\n}\r\n"
        );
        let no_final = "a\nb";
        let chunks = update("*** Begin Patch\n*** Update File: f\n-b\n+c\n*** End Patch");
        assert_eq!(apply(no_final, &chunks, &mut budget).unwrap(), "a\nc");
    }

    #[test]
    fn loose_matches_land_and_missing_lines_are_refused() {
        let text = "let s = \u{201C}hi\u{201D};  \nend\n";
        let chunks = update(
            "*** Begin Patch\n*** Update File: f\n-let s = \"hi\";\n+let s = \"yo\";\n*** End Patch",
        );
        let mut budget = COMPARISONS;
        assert_eq!(
            apply(text, &chunks, &mut budget).unwrap(),
            "let s = \"yo\";\nend\n"
        );
        let stale = update("*** Begin Patch\n*** Update File: f\n-gone\n+new\n*** End Patch");
        let err = apply(text, &stale, &mut budget).unwrap_err();
        assert!(matches!(err.missing, Missing::Lines(ref l) if l == &["gone"]));
        let stale =
            update("*** Begin Patch\n*** Update File: f\n@@ fn gone()\n-end\n+x\n*** End Patch");
        let err = apply(text, &stale, &mut budget).unwrap_err();
        assert!(matches!(err.missing, Missing::Context(ref c) if c == "fn gone()"));
    }

    #[test]
    fn the_end_of_file_marker_takes_the_last_occurrence_and_additions_append() {
        let text = "x\ny\nx\n";
        let chunks =
            update("*** Begin Patch\n*** Update File: f\n-x\n+z\n*** End of File\n*** End Patch");
        let mut budget = COMPARISONS;
        assert_eq!(apply(text, &chunks, &mut budget).unwrap(), "x\ny\nz\n");
        let chunks = update("*** Begin Patch\n*** Update File: f\n@@\n+tail\n*** End Patch");
        assert_eq!(
            apply(text, &chunks, &mut budget).unwrap(),
            "x\ny\nx\ntail\n"
        );
    }

    #[test]
    fn a_costly_search_stops_at_its_budget() {
        let text = "a\n".repeat(20_000);
        let mut patch = String::from("*** Begin Patch\n*** Update File: f\n");
        for _ in 0..2_000 {
            patch.push_str("-a\n");
        }
        patch.push_str("-b\n+c\n*** End Patch");
        let chunks = update(&patch);
        let mut budget = 1_000_000;
        let err = apply(&text, &chunks, &mut budget).unwrap_err();
        assert!(matches!(err.missing, Missing::TooCostly));
    }
}
