//! Dependencies point one way (docs/ARCHITECTURE.md, "Layers"), and the code says which:
//! - each top-level module of each crate (the library, the actors crate, the supervision
//!   crate) names only the modules its entry in [`GUILDHALL`], [`ACTORS`] or [`SUPERVISION`]
//!   lists, and every listed edge is used (the map is the graph, not a bound on it);
//! - the maps themselves have no cycle;
//! - inside every folder at any depth (`tasks/`, `governance/layers/`, `store/postgres/`),
//!   no file imports a file that imports it back, the folder's root file (`tasks.rs`) among
//!   them: a root that re-exports its files is their face, but a root whose code uses a file
//!   that uses the root is a circle.
//! Read from the source, so a new edge fails here before it settles in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module of a crate and the modules it may use.
type Allowed = &'static [(&'static str, &'static [&'static str])];

/// The library's top-level modules, leaves first, then each domain on what it stands on
/// (docs/ARCHITECTURE.md's code map). The binary (`main.rs`, `cli/`) sits above all of them.
#[rustfmt::skip]
const GUILDHALL: Allowed = &[
    // Leaves: they use no other module.
    ("time", &[]),
    ("detached", &[]),
    ("sorted", &[]),
    ("paged", &[]),
    ("private_fs", &[]),
    ("process_group", &[]),
    ("output_log", &[]),
    ("tls", &[]),
    ("addresses", &[]),
    ("json_id", &[]),
    ("events", &[]),
    ("changes", &[]),
    // The domains.
    ("store", &["private_fs", "sorted"]),
    // One writer per key, loaded on first use, committed before acknowledged.
    ("durable", &["store"]),
    ("files", &["time"]),
    // What every process started for an agent is confined by: the file roots' paths.
    ("sandbox", &["addresses", "files", "private_fs"]),
    ("shell", &["files", "process_group", "sandbox", "time"]),
    ("fetch", &["addresses", "tls"]),
    ("agents", &["changes", "durable", "events", "paged", "sorted", "store", "time"]),
    ("context", &["agents", "changes", "durable", "events", "paged", "store", "time"]),
    ("tasks", &["agents", "durable", "events", "store", "time"]),
    ("humans", &["agents", "time"]),
    // A call's way through a tool: the pipeline, governance around it, the registry.
    ("pipeline", &["events"]),
    ("governance", &["agents", "context", "events", "paged", "pipeline", "private_fs",
                     "sandbox", "store"]),
    ("options", &["agents", "governance", "pipeline"]),
    ("registry", &["governance", "options", "pipeline"]),
    ("error", &["agents", "context", "store"]),
    ("runtime", &["agents", "changes", "context", "durable", "error", "events",
                  "governance", "options", "pipeline", "registry", "store"]),
    // The built-in domains as subsystems of the runtime: the runtime names none of them.
    ("builtin", &["agents", "durable", "error", "fetch", "files", "governance", "humans",
                  "runtime", "sandbox", "shell", "store", "tasks", "time"]),
    // External tools, registered through the runtime like any other.
    ("servers", &["changes", "detached", "events", "governance", "json_id", "options", "output_log",
                  "process_group", "runtime", "sandbox", "tls"]),
    ("commands", &["detached", "options", "process_group", "runtime", "sandbox", "shell",
                   "time"]),
    // `find_tools`: a search over the tools a caller may use.
    ("tool_search", &["runtime"]),
    // Skill folders served as the `skill` tool.
    ("skills", &["agents", "runtime"]),
    // Tools composed of tools: each step a governed call through the runtime.
    ("compose", &["options", "runtime"]),
    // Agents the runtime starts, as supervised processes that connect back over MCP.
    ("launch", &["agents", "changes", "commands", "error", "output_log", "private_fs", "process_group",
                 "runtime", "sandbox", "servers", "tasks", "time"]),
    // Metrics from the runtime's events, for the HTTP listener.
    ("observe", &["changes", "events", "governance", "runtime", "store", "time", "tls"]),
    // What an agent's client is told at points of its own loop (Claude Code's hooks).
    ("loop_hooks", &["agents", "runtime", "tasks"]),
    ("mcp", &["agents", "changes", "context", "governance", "json_id", "launch", "loop_hooks",
              "observe", "options", "private_fs", "runtime", "servers", "skills", "tasks",
              "time", "tool_search"]),
    // A2A at the edge: remote callers as agents calling the tools; remote agents as tools.
    ("a2a", &["addresses", "agents", "changes", "humans", "mcp", "options", "runtime", "skills", "tasks",
              "tls"]),
    // Reads guildhall.toml into the settings of every layer above, mcp's included.
    ("config", &["a2a", "agents", "commands", "compose", "fetch", "files", "governance", "humans", "launch",
                 "loop_hooks", "mcp", "observe", "sandbox", "servers", "shell", "skills", "tasks"]),
    ("bench", &["a2a", "agents", "compose", "context", "events", "files", "governance", "launch", "mcp",
                "observe", "options", "runtime", "sandbox", "servers", "shell", "store",
                "tasks", "tls"]),
];

/// The actors crate: the `Tool` contract and the worker that runs one.
#[rustfmt::skip]
const ACTORS: Allowed = &[
    ("error", &[]),
    ("trace", &[]),
    ("args", &["error"]),
    ("context", &["trace"]),
    ("deadline", &["context"]),
    ("tool", &["context"]),
    ("spec", &["error", "tool"]),
    ("worker", &["context", "error", "tool"]),
];

/// The supervision crate: policies first, then specs, the supervisor, and what is built on
/// it.
#[rustfmt::skip]
const SUPERVISION: Allowed = &[
    ("backoff", &[]),
    ("breaker", &[]),
    ("error", &[]),
    ("intensity", &[]),
    ("snapshot", &["breaker"]),
    ("spec", &["backoff", "breaker", "snapshot"]),
    (
        "supervisor",
        &["backoff", "error", "intensity", "snapshot", "spec"],
    ),
    (
        "dynamic",
        &[
            "backoff",
            "error",
            "intensity",
            "snapshot",
            "spec",
            "supervisor",
        ],
    ),
    (
        "lazy",
        &["backoff", "dynamic", "error", "spec", "supervisor"],
    ),
];

/// The crates checked: where their code is, their map, and the files above the map.
fn crates() -> [(PathBuf, Allowed, &'static [&'static str]); 3] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        (root.join("src"), GUILDHALL, &["lib", "main", "cli"]),
        (root.join("actors/src"), ACTORS, &["lib"]),
        (root.join("supervision/src"), SUPERVISION, &["lib"]),
    ]
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

/// Where the modules of the crate at `src` use what `allowed` does not list for them, or no
/// longer use what it does. Files in `above` (the crate root, the binary) are not checked.
fn against_the_map(src: &Path, allowed: Allowed, above: &[&str]) -> Vec<String> {
    let map: BTreeMap<&str, BTreeSet<&str>> = allowed
        .iter()
        .map(|(module, uses)| (*module, uses.iter().copied().collect()))
        .collect();
    let modules: BTreeSet<String> = map.keys().map(|m| (*m).to_owned()).collect();
    let from_root = reexports(&code(&src.join("lib.rs")), &modules);
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for path in crate::support::rust_files(src) {
        let rel = path.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a path");
        let first = first.as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs");
        if above.contains(&module) {
            continue;
        }
        let Some(may) = map.get(module) else {
            wrong.push(format!(
                "{}: module `{module}` has no entry in the map (tests/it/layers.rs); add one with what it uses",
                rel.display()
            ));
            continue;
        };
        for (head, line) in heads(&code(&path), "crate") {
            let target = if modules.contains(&head) {
                head
            } else if let Some(source) = from_root.get(&head) {
                source.clone()
            } else {
                continue;
            };
            if target == module {
                continue;
            }
            if !may.contains(target.as_str()) {
                wrong.push(format!(
                    "{}:{line}: `{module}` uses `{target}`, which its entry in the map does not list",
                    rel.display()
                ));
            }
            used.entry(module.to_owned()).or_default().insert(target);
        }
    }
    for (module, may) in &map {
        if !src.join(format!("{module}.rs")).is_file() && !src.join(module).is_dir() {
            wrong.push(format!("the map names `{module}`, which is not a module"));
        }
        for target in may {
            if !used.get(*module).is_some_and(|u| u.contains(*target)) {
                wrong.push(format!(
                    "`{module}` no longer uses `{target}`: take it out of its entry in the map"
                ));
            }
        }
    }
    if let Some(cycle) = find_cycle(
        &map.iter()
            .map(|(m, uses)| {
                (
                    (*m).to_owned(),
                    uses.iter().map(|u| (*u).to_owned()).collect(),
                )
            })
            .collect(),
    ) {
        wrong.push(format!(
            "the map itself goes in a circle: {}",
            cycle.join(" → ")
        ));
    }
    wrong
}

/// Files importing each other in a circle inside any folder under `src`, at any depth,
/// each folder's root file among them.
fn circles(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut folders = vec![(src.to_path_buf(), "crate".to_owned())];
    while let Some((folder, path)) = folders.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&folder)
            .expect("a source folder is readable")
            .map(|e| e.expect("a folder entry").path())
            .filter(|p| p.is_dir())
            .collect();
        entries.sort();
        for dir in entries {
            let name = dir
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            let root = folder.join(format!("{name}.rs"));
            let path = format!("{path}::{name}");
            if root.is_file()
                && let Some(cycle) = circle_in(&dir, &root, &path)
            {
                let rel = dir.strip_prefix(src).unwrap_or(&dir);
                found.push(format!("src/{}/: {}", rel.display(), cycle.join(" → ")));
            }
            folders.push((dir, path));
        }
    }
    found
}

/// A circle among the files of folder `dir` (module `path`, e.g. `crate::tasks`) and its
/// root file `root`. A file's own folder counts as the file: its `crate::` paths into this
/// folder are the file's.
fn circle_in(dir: &Path, root: &Path, path: &str) -> Option<Vec<String>> {
    let files: BTreeSet<String> = std::fs::read_dir(dir)
        .expect("a source folder is readable")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "rs")
                .then(|| p.file_stem().map(|s| s.to_string_lossy().into_owned()))?
        })
        .collect();
    let root_name = root
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    let root_code = code(root);
    let from_root = reexports(&root_code, &files);
    let resolve = |head: &str| {
        if files.contains(head) {
            head.to_owned()
        } else if let Some(source) = from_root.get(head) {
            source.clone()
        } else {
            root_name.clone()
        }
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let text = code(&dir.join(format!("{file}.rs")));
        let mut uses = heads(&text, "super");
        uses.extend(heads(&text, path));
        if dir.join(file).is_dir() {
            for inner in crate::support::rust_files(&dir.join(file)) {
                uses.extend(heads(&code(&inner), path));
            }
        }
        for (head, _) in uses {
            let target = resolve(&head);
            if head != "super" && &target != file {
                edges.entry(file.clone()).or_default().insert(target);
            }
        }
    }
    // The root's face (its `pub use`) is not a use; anything else it names in a file is.
    let body = without_reexports(&root_code);
    let mut uses = heads(&body, "self");
    uses.extend(heads(&body, path));
    for file in &files {
        if starts_a_path(&body, file) {
            uses.push((file.clone(), 0));
        }
    }
    for (head, _) in uses {
        if files.contains(&head) || from_root.contains_key(&head) {
            edges
                .entry(root_name.clone())
                .or_default()
                .insert(resolve(&head));
        }
    }
    find_cycle(&edges)
}

/// Whether `name::` begins a path somewhere in `code` (a child module named from its root).
fn starts_a_path(code: &str, name: &str) -> bool {
    let pattern = format!("{name}::");
    code.match_indices(&pattern).any(|(at, _)| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
    })
}

/// `code` without its re-exports (`pub use …;`, `pub(crate) use …;`).
fn without_reexports(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    loop {
        let next = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .filter_map(|p| {
                let mut from = 0;
                while let Some(at) = rest[from..].find(p) {
                    let at = from + at;
                    let before = rest[..at].trim_end().chars().next_back();
                    if before.is_none_or(|c| matches!(c, ';' | '{' | '}' | ']')) {
                        return Some(at);
                    }
                    from = at + p.len();
                }
                None
            })
            .min();
        let Some(at) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at]);
        rest = rest[at..].find(';').map_or("", |end| &rest[at + end + 1..]);
    }
}

#[test]
fn every_module_uses_what_its_entry_in_the_map_lists_and_nothing_else() {
    let mut wrong = Vec::new();
    for (src, allowed, above) in crates() {
        wrong.extend(against_the_map(&src, allowed, above));
    }
    assert!(
        wrong.is_empty(),
        "dependencies against the map of layers:\n{}",
        wrong.join("\n")
    );
}

/// A module's root file and its files count as one folder: the root re-exports its files
/// and wires them (a tool's constructor, a supervisor's spec), and no file imports what
/// the root itself defines, so a folder's files form layers, never a circle.
#[test]
fn files_of_a_folder_do_not_import_each_other_in_circles() {
    let mut found = Vec::new();
    for (src, _, _) in crates() {
        found.extend(circles(&src));
    }
    assert!(
        found.is_empty(),
        "files importing each other in a circle:\n{}",
        found.join("\n")
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
    // A made-up crate: a forbidden edge (through a re-export), a listed edge no longer
    // used, a module the map does not know.
    let dir = tempfile::tempdir().expect("a temp dir");
    let src = dir.path();
    let write = |name: &str, text: &str| {
        let path = src.join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a folder");
        std::fs::write(path, text).expect("written");
    };
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\npub mod c;\npub mod d;\npub use b::B;\n",
    );
    write("a.rs", "use crate::B;\n");
    write("b.rs", "pub struct B;\n");
    write("c.rs", "");
    write("d.rs", "");
    let allowed: Allowed = &[("a", &[]), ("b", &["a"]), ("d", &[])];
    assert_eq!(
        against_the_map(src, allowed, &["lib"]),
        [
            "a.rs:1: `a` uses `b`, which its entry in the map does not list",
            "c.rs: module `c` has no entry in the map (tests/it/layers.rs); add one with what it uses",
            "`b` no longer uses `a`: take it out of its entry in the map",
        ]
    );
    let circular: Allowed = &[("a", &["b"]), ("b", &["a"])];
    assert!(
        against_the_map(src, circular, &["lib", "c", "d"])
            .contains(&"the map itself goes in a circle: a → b → a".to_owned())
    );
    // A root whose code uses a file that uses the root back is a circle; a file using a
    // root that only re-exports it is not. Nested folders are checked too.
    write(
        "d.rs",
        "mod e;\nmod inner;\npub use e::E;\npub struct D;\nfn f() { inner::go(); }\n",
    );
    write("d/e.rs", "use super::D;\npub struct E;\n");
    write(
        "d/inner.rs",
        "mod x;\nmod y;\nuse super::D;\npub fn go() {}\n",
    );
    write("d/inner/x.rs", "use super::y::Y;\npub struct X;\n");
    write(
        "d/inner/y.rs",
        "use crate::d::inner::x::X;\npub struct Y;\n",
    );
    assert_eq!(
        circles(src),
        ["src/d/: d.rs → inner → d.rs", "src/d/inner/: x → y → x",]
    );
    std::fs::write(
        src.join("d.rs"),
        "mod e;\nmod inner;\npub use e::E;\npub struct D;\n",
    )
    .expect("written");
    assert_eq!(circles(src), ["src/d/inner/: x → y → x"]);

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
