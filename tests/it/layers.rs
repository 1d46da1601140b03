//! The crate's modules depend on each other in one direction (docs/ARCHITECTURE.md, "Layers"):
//! a module names only modules below it in [`ORDER`], and inside a domain no file imports a
//! file that imports it back. Read from the source, so a new edge against the order fails here
//! before it settles in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's top-level modules, lowest first. A module may use the modules before it.
/// The binary (`main.rs`, `cli/`) sits above all of them.
const ORDER: &[&str] = &[
    // Leaves every layer may use.
    "time",
    "detached",
    "sorted",
    "paged",
    "private_fs",
    "process_group",
    "output_log",
    "tls",
    "addresses",
    "json_id",
    "events",
    "changes",
    // The domains, each on the ones before it.
    "store",
    "files",
    // What every process started for an agent is confined by: the file roots' paths.
    "sandbox",
    "shell",
    "fetch",
    "agents",
    "context",
    "tasks",
    "humans",
    "pipeline",
    "governance",
    "options",
    "registry",
    "error",
    "runtime",
    // External tools, registered through the runtime like any other.
    "servers",
    "commands",
    // Agents the runtime starts, as supervised processes that connect back over MCP.
    "launch",
    // Metrics from the runtime's events, for the HTTP listener.
    "observe",
    "mcp",
    // Reads guildhall.toml into the settings of every layer above, mcp's included.
    "config",
    "bench",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The code of a file: comments and the trailing test module removed (a test module's
/// `super::` is its own file, and tests may reach anywhere).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a source file is readable");
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |at| &after[at..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |at| &after[at + 2..]);
        } else if rest.starts_with('"') {
            // Skip string literals, so a `//` in a URL is not a comment.
            let body = &rest[1..];
            let mut end = body.len();
            let mut escaped = false;
            for (i, c) in body.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => {
                        end = i + 1;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            out.push_str("\"\"");
            rest = &body[end.min(body.len())..];
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first segments of the paths written right after a `prefix::` (one for `a::b`, one
/// per item for `{a, b::c}`), with the line each is on.
fn heads(code: &str, prefix: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let pattern = format!("{prefix}::");
    let mut from = 0;
    while let Some(found) = code[from..].find(&pattern) {
        let at = from + found;
        from = at + pattern.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let item = ident(group[item_start..i].trim_start());
                        if !item.is_empty() {
                            out.push((item.to_owned(), line));
                        }
                        item_start = i + 1;
                        if c == '}' {
                            break;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
        } else {
            let item = ident(rest);
            if !item.is_empty() {
                out.push((item.to_owned(), line));
            }
        }
    }
    out
}

/// What a module root re-exports: item name → the submodule it comes from.
fn reexports(root: &str, submodules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for statement in root.split(';') {
        let statement = statement.trim();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let source = ident(path);
        if !submodules.contains(source) {
            continue;
        }
        let items = path.find('{').map_or_else(
            || vec![path.rsplit("::").next().unwrap_or(path)],
            |open| path[open + 1..].trim_end_matches('}').split(',').collect(),
        );
        for item in items {
            let name = item.rsplit(" as ").next().unwrap_or(item);
            let name = ident(name.rsplit("::").next().unwrap_or(name).trim());
            if !name.is_empty() && name != "self" {
                map.insert(name.to_owned(), source.to_owned());
            }
        }
    }
    map
}

#[test]
fn modules_depend_on_lower_layers_only() {
    let src = src();
    let files = crate::support::rust_files(&src);
    let lib = code(&src.join("lib.rs"));
    let modules: BTreeSet<String> = ORDER.iter().map(|m| (*m).to_owned()).collect();
    let from_root = reexports(&lib, &modules);
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);

    let mut wrong = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a path");
        let first = first.as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs");
        if matches!(module, "lib" | "main" | "cli") {
            continue;
        }
        let Some(own) = rank(module) else {
            wrong.push(format!(
                "{}: module `{module}` has no place in ORDER (tests/it/layers.rs); add it where it belongs",
                rel.display()
            ));
            continue;
        };
        for (head, line) in heads(&code(path), "crate") {
            let target = if modules.contains(&head) {
                head
            } else if let Some(source) = from_root.get(&head) {
                source.clone()
            } else {
                continue;
            };
            if target != module && rank(&target).is_none_or(|t| t > own) {
                wrong.push(format!(
                    "{}:{line}: `{module}` uses `{target}`, which sits above it",
                    rel.display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies against the layer order:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn files_of_a_domain_do_not_import_each_other_in_circles() {
    let src = src();
    let mut problems = Vec::new();
    for module in ORDER {
        let dir = src.join(module);
        if !dir.is_dir() {
            continue;
        }
        let siblings: BTreeSet<String> = std::fs::read_dir(&dir)
            .expect("a domain directory is readable")
            .filter_map(|e| {
                let path = e.ok()?.path();
                if path.extension()? != "rs" {
                    return None;
                }
                Some(path.file_stem()?.to_string_lossy().into_owned())
            })
            .collect();
        let root = code(&src.join(format!("{module}.rs")));
        let from_root = reexports(&root, &siblings);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in &siblings {
            let text = code(&dir.join(format!("{file}.rs")));
            let mut uses = heads(&text, "super");
            uses.extend(heads(&text, &format!("crate::{module}")));
            for (head, _) in uses {
                let target = if siblings.contains(&head) {
                    head
                } else if let Some(source) = from_root.get(&head) {
                    source.clone()
                } else {
                    continue;
                };
                if &target != file {
                    edges.entry(file.clone()).or_default().insert(target);
                }
            }
        }
        if let Some(cycle) = find_cycle(&edges) {
            problems.push(format!("src/{module}/: {}", cycle.join(" → ")));
        }
    }
    assert!(
        problems.is_empty(),
        "files importing each other in a circle:\n{}",
        problems.join("\n")
    );
}

/// A cycle of `edges`, as the files along it (first repeated last), if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|start| visit(start, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_checks_see_a_wrong_edge_and_a_cycle() {
    // The parsing both tests rely on: paths in groups, nested groups and single paths.
    let found: Vec<String> = heads(
        "use crate::{agents::{A, B}, store};\nlet x = crate::mcp::Y; // crate::bench\n",
        "crate",
    )
    .into_iter()
    .map(|(h, _)| h)
    .collect();
    assert_eq!(found, ["agents", "store", "mcp", "bench"]);
    let stripped = code_of("let u = \"http://x\"; // crate::bench\nuse crate::store;");
    assert_eq!(
        heads(&stripped, "crate")
            .into_iter()
            .map(|(h, _)| h)
            .collect::<Vec<_>>(),
        ["store"]
    );
    let modules = BTreeSet::from(["runtime".to_owned()]);
    let map = reexports(
        "pub use runtime::{Runtime, RuntimeBuilder};\npub use guildhall_actors::{self as actors, Tool};",
        &modules,
    );
    assert_eq!(
        map.into_iter().collect::<Vec<_>>(),
        [
            ("Runtime".to_owned(), "runtime".to_owned()),
            ("RuntimeBuilder".to_owned(), "runtime".to_owned())
        ]
    );
    let mut edges = BTreeMap::new();
    edges.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    edges.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["a".to_owned(), "b".to_owned(), "a".to_owned()])
    );
    edges.remove("b");
    assert_eq!(find_cycle(&edges), None);
}

fn code_of(text: &str) -> String {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("x.rs");
    std::fs::write(&path, text).expect("written");
    code(&path)
}
