//! The public surface says what it means, read from the source so a new item that does not
//! fails here: every public `async fn` of the runtime documents what dropping its future
//! does (`# Cancel safety`); every public error type is `#[non_exhaustive]`, so a new
//! variant or field is not a breaking change for an embedder; and no error message prints
//! the error's own source, which a reporter of the chain (`ErrorChain`, anyhow's `{:#}`)
//! would then print twice.

use std::path::{Path, PathBuf};

/// The library's source trees: the runtime and its two crates. The command line and the
/// benchmarks are programs, not handles an embedder holds.
fn library_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = ["src", "actors/src", "supervision/src"]
        .iter()
        .flat_map(|dir| crate::support::rust_files(&root.join(dir)))
        .collect();
    files.retain(|f| {
        let rel = f.strip_prefix(root).expect("under the crate");
        !(rel.starts_with("src/cli")
            || rel.starts_with("src/bench")
            || rel == Path::new("src/cli.rs")
            || rel == Path::new("src/bench.rs")
            || rel == Path::new("src/main.rs"))
    });
    files
}

/// A file's text without its trailing test module.
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod ")
        .map_or(text, |at| &text[..at])
}

/// The lines above line `at` that belong to its item: doc comments and attributes.
fn preamble<'a>(lines: &[&'a str], at: usize) -> Vec<&'a str> {
    lines[..at]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("///") || l.starts_with("#["))
        .collect()
}

/// The public async fns in `text` whose docs say nothing of cancellation, by line.
fn undocumented_cancellation(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = without_tests(text).lines().collect();
    (0..lines.len())
        .filter(|&i| lines[i].trim_start().starts_with("pub async fn "))
        .filter(|&i| {
            !preamble(&lines, i)
                .iter()
                .any(|l| l.contains("# Cancel safety"))
        })
        .map(|i| (i + 1, lines[i].trim().to_owned()))
        .collect()
}

/// The public error types in `text` (named `…Error`) not marked `#[non_exhaustive]`.
fn exhaustive_errors(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = without_tests(text).lines().collect();
    (0..lines.len())
        .filter(|&i| {
            let line = lines[i].trim_start();
            ["pub enum ", "pub struct "].iter().any(|kind| {
                line.strip_prefix(kind).is_some_and(|rest| {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    name.ends_with("Error")
                })
            })
        })
        .filter(|&i| {
            !preamble(&lines, i)
                .iter()
                .any(|l| l.contains("non_exhaustive"))
        })
        .map(|i| (i + 1, lines[i].trim().to_owned()))
        .collect()
}

/// The errors in `text` whose `#[error("…")]` message prints the field that is also their
/// `source()`: a `#[from]` or `#[source]` field, or one named `source`.
fn sources_printed_twice(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = without_tests(text).lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let start = i;
        if !lines[i].trim_start().starts_with("#[error(") {
            i += 1;
            continue;
        }
        // The attribute, which may span lines.
        let mut message = String::new();
        while i < lines.len() {
            message.push_str(lines[i].trim());
            i += 1;
            if message.ends_with(")]") {
                break;
            }
        }
        // The item it describes, up to its end: a tuple variant's line, or a brace's close.
        let mut item = Vec::new();
        while i < lines.len() {
            let line = lines[i].trim();
            i += 1;
            if line.starts_with("///") || (item.is_empty() && line.starts_with("#[")) {
                continue;
            }
            item.push(line);
            if line.ends_with("),") || line.ends_with(");") || line.starts_with('}') {
                break;
            }
            if item.len() == 1 && !line.ends_with('{') {
                break;
            }
        }
        if message.contains("transparent") {
            continue;
        }
        let mut sources = Vec::new();
        if let Some(first) = item.first()
            && first.contains('(')
            && (first.contains("#[from]") || first.contains("#[source]"))
        {
            sources.push("0".to_owned());
        }
        for (k, line) in item.iter().enumerate() {
            let marked =
                k > 0 && (item[k - 1].contains("#[source]") || item[k - 1].contains("#[from]"));
            let field: String = line
                .trim_start_matches("pub ")
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if line.contains(':') && !field.is_empty() && (marked || field == "source") {
                sources.push(field);
            }
        }
        for field in sources {
            if message.contains(&format!("{{{field}}}")) || message.contains(&format!("{{{field}:"))
            {
                found.push((start + 1, format!("{} {}", message, item[0])));
            }
        }
    }
    found
}

fn every_file(find: fn(&str) -> Vec<(usize, String)>) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    library_files()
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("a source file is readable");
            let rel = path.strip_prefix(root).expect("under the crate").to_owned();
            find(&text)
                .into_iter()
                .map(move |(line, item)| format!("{}:{line}: {item}", rel.display()))
        })
        .collect()
}

#[test]
fn every_public_async_fn_says_what_dropping_its_future_does() {
    let missing = every_file(undocumented_cancellation);
    assert!(
        missing.is_empty(),
        "public async fns without a `# Cancel safety` section:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_public_error_type_is_non_exhaustive() {
    let exhaustive = every_file(exhaustive_errors);
    assert!(
        exhaustive.is_empty(),
        "public error types without #[non_exhaustive]:\n{}",
        exhaustive.join("\n")
    );
}

#[test]
fn no_error_message_prints_its_own_source() {
    let twice = every_file(sources_printed_twice);
    assert!(
        twice.is_empty(),
        "error messages that print their own source (keep it in `source()` only):\n{}",
        twice.join("\n")
    );
}

#[test]
fn the_source_check_sees_a_source_printed_twice() {
    let source = r#"
pub enum E {
    /// Fine: transparent.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Twice, by position.
    #[error("could not load: {0}")]
    Load(#[from] LoadError),
    /// Fine: the source is not printed.
    #[error("cannot open {path}")]
    Open {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Twice, by name.
    #[error(
        "cannot read {path}: {cause}"
    )]
    Read {
        path: PathBuf,
        #[source]
        cause: std::io::Error,
    },
    /// Fine: a plain field.
    #[error("bad: {reason}")]
    Bad { reason: String },
}
"#;
    let found: Vec<usize> = sources_printed_twice(source)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(found, [7, 18]);
}

#[test]
fn the_checks_see_what_is_missing() {
    let source = "\
/// Reads.
///
/// # Cancel safety
/// Cancel safe.
pub async fn read() {}

/// Writes.
#[must_use]
pub async fn write() {}

#[non_exhaustive]
#[derive(Debug)]
pub enum GoodError {}

/// Why.
#[derive(Debug)]
pub struct BadError;

pub struct ErrorKind;

#[cfg(test)]
mod tests {
    pub async fn helper() {}
}
";
    assert_eq!(
        undocumented_cancellation(source),
        [(9, "pub async fn write() {}".to_owned())]
    );
    assert_eq!(
        exhaustive_errors(source),
        [(17, "pub struct BadError;".to_owned())]
    );
}
