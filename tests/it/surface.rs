//! The public surface says what it means, read from the source so a new item that does not
//! fails here: every public `async fn` of the runtime documents what dropping its future
//! does (`# Cancel safety`), and every public error type is `#[non_exhaustive]`, so a new
//! variant or field is not a breaking change for an embedder.

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
