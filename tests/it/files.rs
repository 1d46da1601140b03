//! The file tools through the runtime, as agents call them: confinement (a table of escape
//! attempts, a symlink swapped in during writes), read-before-write, concurrent editors,
//! edits that do not match, paging and refusals.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use guildhall::files::{Files, FilesConfig};
use guildhall::{AgentSpec, CallError, Runtime};
use serde_json::{Value, json};

use crate::support::as_agent;

/// A project root and a directory beside it that must stay out of reach.
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    let outside = dir.path().join("outside");
    for d in [&root, &outside, &root.join("src"), &root.join(".git")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(outside.join("secret"), "outside secret\n").unwrap();
    std::fs::write(
        root.join("src/main.rs"),
        "fn main() {\n    println!(\"hi\");\n}\n",
    )
    .unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    symlink(&outside, root.join("out_dir")).unwrap();
    symlink(outside.join("secret"), root.join("out_file")).unwrap();
    symlink("../outside/secret", root.join("src/relative_out")).unwrap();
    symlink("/etc", root.join("etc_link")).unwrap();
    symlink("src/main.rs", root.join("inner_link")).unwrap();
    symlink(".git", root.join("git_link")).unwrap();
    std::fs::hard_link(outside.join("secret"), root.join("hard_secret")).unwrap();
    Tree {
        root: root.canonicalize().unwrap(),
        outside: outside.canonicalize().unwrap(),
        _dir: dir,
    }
}

async fn runtime(tree: &Tree) -> Runtime {
    let files = Files::open(&FilesConfig {
        roots: vec![tree.root.clone()],
        ..FilesConfig::default()
    })
    .unwrap();
    let rt = Runtime::builder().files(&files).build().await.unwrap();
    for id in ["alice", "bob"] {
        rt.register_agent(AgentSpec::new(id, "dev")).await.unwrap();
    }
    rt
}

async fn call(rt: &Runtime, agent: &str, tool: &str, args: Value) -> Result<Value, CallError> {
    rt.call_json(tool, args, as_agent(rt, agent)).await
}

/// Every regular file under `dir`, with its content (symlinks are not followed).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push((entry.path(), std::fs::read(entry.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn no_path_leads_out_of_the_roots() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let outside = tree.outside.display().to_string();
    let root = tree.root.display().to_string();
    let long_name = "n".repeat(300);
    let long_path = "d/".repeat(2100);
    let attempts: Vec<(String, &str)> = vec![
        ("../outside/secret".into(), ".."),
        ("src/../../outside/secret".into(), ".."),
        ("./../outside/secret".into(), ".."),
        ("src/../..".into(), ".."),
        ("..".into(), ".."),
        (format!("{outside}/secret"), "outside the roots"),
        (format!("{root}/../outside/secret"), ".."),
        (format!("{root}/src/../../outside/secret"), ".."),
        ("/etc/passwd".into(), "outside the roots"),
        ("//etc/passwd".into(), "outside the roots"),
        ("/".into(), "outside the roots"),
        (root.clone(), "names a root"),
        (".".into(), "names a root"),
        (String::new(), "empty"),
        ("out_dir/secret".into(), "symlink"),
        ("out_file".into(), "symlink"),
        ("src/relative_out".into(), "symlink"),
        ("etc_link/passwd".into(), "symlink"),
        ("etc_link".into(), "symlink"),
        ("inner_link".into(), "symlink"),
        ("git_link/config".into(), "symlink"),
        (format!("{root}/out_dir/secret"), "symlink"),
        ("hard_secret".into(), "hard link"),
        (".git/config".into(), "denied"),
        (".GIT/config".into(), "denied"),
        (".Git/config".into(), "denied"),
        (".guildhall/guildhall.toml".into(), "denied"),
        ("src/.git/x".into(), "denied"),
        ("src/main.rs\0.txt".into(), "NUL"),
        ("\0".into(), "NUL"),
        (format!("src/{long_name}"), "bytes long"),
        (long_path, "bytes long"),
        ("src".into(), "directory"),
    ];
    assert!(attempts.len() >= 30);
    let before_out = snapshot(&tree.outside);
    let before_git = snapshot(&tree.root.join(".git"));
    for (path, why) in &attempts {
        let read = call(&rt, "alice", "read_file", json!({ "path": path })).await;
        let err = read.expect_err(&format!("read of {path:?} refused"));
        assert!(
            err.to_string().contains(why),
            "read {path:?}: expected `{why}` in: {err}"
        );
        let write = call(
            &rt,
            "alice",
            "write_file",
            json!({ "path": path, "content": "overwritten" }),
        )
        .await;
        assert!(write.is_err(), "write of {path:?} refused");
        let edit = call(
            &rt,
            "alice",
            "edit_file",
            json!({ "path": path, "old_string": "secret", "new_string": "x" }),
        )
        .await;
        assert!(edit.is_err(), "edit of {path:?} refused");
        for header in ["Add File", "Delete File"] {
            let patch =
                format!("*** Begin Patch\n*** {header}: {path}\n+overwritten\n*** End Patch");
            let patched = call(&rt, "alice", "apply_patch", json!({ "input": patch })).await;
            assert!(patched.is_err(), "apply_patch {header} of {path:?} refused");
        }
        let moved = format!(
            "*** Begin Patch\n*** Update File: src/main.rs\n*** Move to: {path}\n@@\n-fn main() {{\n+fn moved() {{\n*** End Patch"
        );
        let err = call(&rt, "alice", "apply_patch", json!({ "input": moved }))
            .await
            .expect_err(&format!("a move to {path:?} refused"));
        assert!(!err.to_string().is_empty());
    }
    assert_eq!(
        snapshot(&tree.outside),
        before_out,
        "nothing outside changed"
    );
    assert_eq!(
        snapshot(&tree.root.join(".git")),
        before_git,
        ".git untouched"
    );
    // The symlinks themselves are still symlinks, not replaced by files.
    assert!(tree.root.join("out_file").is_symlink());
    rt.shutdown().await;
}

#[tokio::test]
async fn a_symlink_swapped_in_during_writes_never_leads_out() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let sub = tree.root.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Swaps `sub` between a directory and a symlink to the outside, as fast as it can.
    let swapper = {
        let (stop, sub, outside) = (Arc::clone(&stop), sub.clone(), tree.outside.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u32;
            while !stop.load(Ordering::Relaxed) && swaps < 1_000_000 {
                let parked = sub.with_extension("parked");
                if std::fs::rename(&sub, &parked).is_ok() {
                    let _ = symlink(&outside, &sub);
                    let _ = std::fs::remove_file(&sub);
                    let _ = std::fs::rename(&parked, &sub);
                }
                swaps += 1;
            }
        })
    };
    let mut written = 0;
    for i in 0..300 {
        let result = call(
            &rt,
            "alice",
            "write_file",
            json!({ "path": format!("sub/new-{i}.txt"), "content": "in the root" }),
        )
        .await;
        if result.is_ok() {
            written += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let outside: Vec<_> = snapshot(&tree.outside)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        outside,
        [tree.outside.join("secret")],
        "nothing written outside"
    );
    // The writes that went ahead are in the root (some may have been refused mid-swap).
    let inside = snapshot(&tree.root)
        .into_iter()
        .filter(|(p, _)| p.file_name().unwrap().to_string_lossy().starts_with("new-"))
        .count();
    assert_eq!(inside, written);
    rt.shutdown().await;
}

#[tokio::test]
async fn writes_need_a_read_of_the_current_content() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let file = tree.root.join("src/main.rs");
    let write = |content: &'static str| {
        call(
            &rt,
            "alice",
            "write_file",
            json!({ "path": "src/main.rs", "content": content }),
        )
    };
    // Never read: refused, nothing written.
    let err = write("lost").await.unwrap_err().to_string();
    assert!(err.contains("you have not read it"), "{err}");
    assert!(std::fs::read_to_string(&file).unwrap().contains("println"));

    // Read, then changed by someone else: refused, with when it was read.
    call(&rt, "alice", "read_file", json!({ "path": "src/main.rs" }))
        .await
        .unwrap();
    std::fs::write(&file, "fn main() {} // a person's edit\n").unwrap();
    let err = write("stale").await.unwrap_err().to_string();
    assert!(err.contains("changed since you read it at"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "fn main() {} // a person's edit\n"
    );

    // Read again: the write goes ahead, and a second write needs no new read.
    call(&rt, "alice", "read_file", json!({ "path": "src/main.rs" }))
        .await
        .unwrap();
    let done = write("fn main() {}\n").await.unwrap();
    assert_eq!(done["created"], json!(false));
    assert_eq!(done["bytes"], json!(13));
    write("fn main() { }\n").await.unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "fn main() { }\n");

    // Another agent's read does not count for this one.
    let err = call(
        &rt,
        "bob",
        "write_file",
        json!({ "path": "src/main.rs", "content": "bob" }),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("you have not read it"), "{err}");

    // A new file needs no read; its directories are made; the mode of an existing file stays.
    let made = call(
        &rt,
        "bob",
        "write_file",
        json!({ "path": "docs/new/notes.md", "content": "# notes\n" }),
    )
    .await
    .unwrap();
    assert_eq!(made["created"], json!(true));
    assert_eq!(
        std::fs::read_to_string(tree.root.join("docs/new/notes.md")).unwrap(),
        "# notes\n"
    );
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o750)).unwrap();
    write("fn main() {}\n").await.unwrap();
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o750
    );
    // No temporary file is left behind.
    assert!(
        snapshot(&tree.root)
            .iter()
            .all(|(p, _)| !p.to_string_lossy().contains("guildhall-tmp"))
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn of_two_editors_from_the_same_read_exactly_one_wins() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let file = tree.root.join("src/main.rs");
    for round in 0..20 {
        let original = format!("round {round}\nshared line\n");
        std::fs::write(&file, &original).unwrap();
        for agent in ["alice", "bob"] {
            call(&rt, agent, "read_file", json!({ "path": "src/main.rs" }))
                .await
                .unwrap();
        }
        let edit = |agent: &'static str| {
            call(
                &rt,
                agent,
                "edit_file",
                json!({
                    "path": "src/main.rs",
                    "old_string": "shared line",
                    "new_string": format!("{agent}'s line"),
                }),
            )
        };
        let (a, b) = tokio::join!(edit("alice"), edit("bob"));
        assert!(a.is_ok() != b.is_ok(), "round {round}: {a:?} / {b:?}");
        let loser = a.err().or(b.err()).unwrap().to_string();
        assert!(loser.contains("changed since you read it"), "{loser}");
        let now = std::fs::read_to_string(&file).unwrap();
        assert!(
            now == format!("round {round}\nalice's line\n")
                || now == format!("round {round}\nbob's line\n"),
            "a whole version, not a torn one: {now:?}"
        );
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn an_edit_that_does_not_match_says_why() {
    let tree = tree();
    let rt = runtime(&tree).await;
    std::fs::write(
        tree.root.join("src/lib.rs"),
        "fn alpha() {\n    let total = 1;\n}\nfn beta() {\n    let total = 1;\n}\n",
    )
    .unwrap();
    call(&rt, "alice", "read_file", json!({ "path": "src/lib.rs" }))
        .await
        .unwrap();
    let edit = |old: &str, new: &str, all: bool| {
        call(
            &rt,
            "alice",
            "edit_file",
            json!({ "path": "src/lib.rs", "old_string": old, "new_string": new, "replace_all": all }),
        )
    };
    let err = edit("let totl = 1;", "x", false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("nearest lines"), "{err}");
    assert!(err.contains("line 2:     let total = 1;"), "{err}");
    let err = edit("let total = 1;", "x", false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("occurs 2 times (on lines 2, 5)"), "{err}");
    let err = edit("fn  alpha()  {", "x", false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("only in whitespace"), "{err}");
    let err = edit("zzz qqq", "x", false).await.unwrap_err().to_string();
    assert!(err.contains("no line resembles"), "{err}");
    let err = edit("", "x", false).await.unwrap_err().to_string();
    assert!(err.contains("old_string is empty"), "{err}");
    let err = edit("fn", "fn", false).await.unwrap_err().to_string();
    assert!(err.contains("the same"), "{err}");

    let done = edit("let total = 1;", "let total = 2;", true)
        .await
        .unwrap();
    assert_eq!(done["replacements"], json!(2));
    let done = edit("fn beta() {", "fn gamma() {", false).await.unwrap();
    assert_eq!(done["replacements"], json!(1));
    assert_eq!(
        std::fs::read_to_string(tree.root.join("src/lib.rs")).unwrap(),
        "fn alpha() {\n    let total = 2;\n}\nfn gamma() {\n    let total = 2;\n}\n"
    );
    rt.shutdown().await;
}

/// 30 edits doubling every `a` of a 1,000-byte file once built a 2 GB string and aborted the
/// server; a 64 KiB file edited with `replace_all` wrote 19.6 MB that read_file refused.
/// Each result is bounded before it is built, and nothing is written.
#[tokio::test]
async fn no_edit_or_write_makes_a_file_larger_than_the_tools_handle() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let small = "a".repeat(1_000);
    std::fs::write(tree.root.join("grow.txt"), &small).unwrap();
    call(&rt, "alice", "read_file", json!({ "path": "grow.txt" }))
        .await
        .unwrap();
    let doubling: Vec<Value> = (0..30)
        .map(|_| json!({ "old_string": "a", "new_string": "aa", "replace_all": true }))
        .collect();
    let err = call(
        &rt,
        "alice",
        "multi_edit",
        json!({ "path": "grow.txt", "edits": doubling }),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("edit"), "{err}");
    assert!(err.contains("past the 16777216 bytes"), "{err}");
    assert_eq!(
        std::fs::read_to_string(tree.root.join("grow.txt")).unwrap(),
        small
    );

    let wide = "ab".repeat(32 * 1024);
    std::fs::write(tree.root.join("wide.txt"), &wide).unwrap();
    call(&rt, "alice", "read_file", json!({ "path": "wide.txt" }))
        .await
        .unwrap();
    let err = call(
        &rt,
        "alice",
        "edit_file",
        json!({ "path": "wide.txt", "old_string": "a", "new_string": "x".repeat(600), "replace_all": true }),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("the result would be 19693568 bytes"), "{err}");
    assert_eq!(
        std::fs::read_to_string(tree.root.join("wide.txt")).unwrap(),
        wide
    );

    let err = call(
        &rt,
        "alice",
        "write_file",
        json!({ "path": "huge.txt", "content": "z".repeat(16 * 1024 * 1024 + 1) }),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("past the 16777216 bytes"), "{err}");
    assert!(!tree.root.join("huge.txt").exists());
    // The same growth within the bound is made.
    let done = call(
        &rt,
        "alice",
        "edit_file",
        json!({ "path": "grow.txt", "old_string": "a", "new_string": "aa", "replace_all": true }),
    )
    .await
    .unwrap();
    assert_eq!(done["bytes"], json!(2_000));
    rt.shutdown().await;
}

/// A failed edit of 16 MiB of long lines once spent minutes comparing every line while it
/// held a write lock other files share. The search for the nearest lines is bounded (25 M
/// cells of edit distance): the answer comes, says how far it looked, and shows each line
/// cut. (That the search runs after the lock is let go is `edit_file`'s structure: no call
/// can observe it without timing.)
#[tokio::test]
async fn a_failed_edit_of_a_huge_file_answers_with_a_bounded_search() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let line = "q".repeat(7_999);
    let text: String = (0..2_000).map(|i| format!("{i}{line}\n")).collect();
    std::fs::write(tree.root.join("long.txt"), &text).unwrap();
    call(
        &rt,
        "alice",
        "read_file",
        json!({ "path": "long.txt", "limit": 1 }),
    )
    .await
    .unwrap();
    let near = format!("{}r", "q".repeat(300));
    let failed = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        call(
            &rt,
            "alice",
            "edit_file",
            json!({ "path": "long.txt", "old_string": near, "new_string": "x" }),
        ),
    )
    .await
    .expect("a failed edit's search is bounded");
    let err = failed.unwrap_err().to_string();
    assert!(err.contains("nearest lines"), "{err:.300}");
    assert!(err.contains("as far as the search looks"), "{err:.300}");
    assert!(
        err.len() < 2_000,
        "the lines shown are cut: {} bytes",
        err.len()
    );
    assert_eq!(
        std::fs::read_to_string(tree.root.join("long.txt")).unwrap(),
        text
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn reads_come_numbered_in_pages_and_only_as_text() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let text: String = (1..=25).map(|i| format!("line {i}\n")).collect();
    std::fs::write(tree.root.join("long.txt"), text).unwrap();
    let page = call(
        &rt,
        "alice",
        "read_file",
        json!({ "path": "long.txt", "offset": 11, "limit": 10 }),
    )
    .await
    .unwrap();
    let page = page.as_str().unwrap();
    assert!(page.starts_with("    11\tline 11\n"), "{page}");
    assert!(page.contains("    20\tline 20\n"), "{page}");
    assert!(!page.contains("line 21"), "{page}");
    assert!(
        page.ends_with("(lines 11–20 of 25; read on with offset 21)"),
        "{page}"
    );
    let last = call(
        &rt,
        "alice",
        "read_file",
        json!({ "path": format!("{}/long.txt", tree.root.display()), "offset": 21 }),
    )
    .await
    .unwrap();
    assert!(
        last.as_str().unwrap().ends_with("    25\tline 25\n"),
        "{last}"
    );

    std::fs::write(tree.root.join("program.bin"), b"\x7fELF\x02\x01\x01\0\0\0").unwrap();
    std::fs::write(tree.root.join("latin1.txt"), b"caf\xe9\n").unwrap();
    std::fs::write(tree.root.join("empty.txt"), b"").unwrap();
    for (path, why) in [
        ("program.bin", "binary"),
        ("latin1.txt", "not UTF-8"),
        ("missing.txt", "no such file"),
    ] {
        let err = call(&rt, "alice", "read_file", json!({ "path": path }))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{path}: {err}");
    }
    let empty = call(&rt, "alice", "read_file", json!({ "path": "empty.txt" }))
        .await
        .unwrap();
    assert_eq!(empty, json!("(the file is empty)"));
    for (args, why) in [
        (
            json!({ "path": "long.txt", "offset": 0 }),
            "counts lines from 1",
        ),
        (json!({ "path": "long.txt", "limit": 0 }), "give 1 to 10000"),
    ] {
        let err = call(&rt, "alice", "read_file", args)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{err}");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn unusable_roots_are_refused_at_start() {
    let missing = Files::open(&FilesConfig {
        roots: vec![PathBuf::from("/nonexistent/guildhall-root")],
        ..FilesConfig::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(missing.contains("/nonexistent/guildhall-root"), "{missing}");
    let none = Files::open(&FilesConfig {
        roots: vec![],
        ..FilesConfig::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(none.contains("no root given"), "{none}");
}

fn patch(body: &str) -> Value {
    json!({ "input": format!("*** Begin Patch\n{body}*** End Patch\n") })
}

#[tokio::test]
async fn a_patch_adds_updates_moves_and_deletes_files_all_or_nothing() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let root = &tree.root;
    std::fs::write(root.join("lib.rs"), "pub fn one() -> u32 {\n    1\n}\n").unwrap();
    std::fs::write(root.join("old.txt"), "to be deleted\n").unwrap();
    call(&rt, "alice", "read_file", json!({ "path": "old.txt" }))
        .await
        .unwrap();
    // No earlier read is needed for an update: its context is the proof.
    let done = call(
        &rt,
        "alice",
        "apply_patch",
        patch(
            "*** Add File: notes/new.md\n+# New\n+\n+body\n\
             *** Update File: src/main.rs\n@@ fn main() {\n-    println!(\"hi\");\n+    println!(\"hello\");\n\
             *** Update File: lib.rs\n*** Move to: core/lib.rs\n pub fn one() -> u32 {\n-    1\n+    2\n\
             *** Delete File: old.txt\n",
        ),
    )
    .await
    .unwrap();
    let changes: Vec<(&str, &str)> = done["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["change"].as_str().unwrap(), f["path"].as_str().unwrap()))
        .collect();
    let shown = |p: &str| root.join(p).display().to_string();
    assert_eq!(
        changes,
        [
            ("added", shown("notes/new.md").as_str()),
            ("updated", shown("src/main.rs").as_str()),
            ("moved", shown("core/lib.rs").as_str()),
            ("deleted", shown("old.txt").as_str()),
        ]
    );
    assert_eq!(done["files"][2]["from"], json!(shown("lib.rs")));
    assert_eq!(
        std::fs::read_to_string(root.join("notes/new.md")).unwrap(),
        "# New\n\nbody\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("src/main.rs")).unwrap(),
        "fn main() {\n    println!(\"hello\");\n}\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("core/lib.rs")).unwrap(),
        "pub fn one() -> u32 {\n    2\n}\n"
    );
    assert!(!root.join("lib.rs").exists() && !root.join("old.txt").exists());

    // Someone changes main.rs: a patch written from the old reading is refused whole (the
    // file it would add is not added), with the nearest lines shown.
    std::fs::write(
        root.join("src/main.rs"),
        "fn main() {\n    println!(\"howdy\");\n}\n",
    )
    .unwrap();
    let before = snapshot(root);
    let err = call(
        &rt,
        "alice",
        "apply_patch",
        patch(
            "*** Add File: second.md\n+x\n\
             *** Update File: src/main.rs\n@@ fn main() {\n-    println!(\"hello\");\n+    println!(\"bye\");\n",
        ),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("src/main.rs: not edited: chunk 1 (patch line 5): its kept and removed lines are not in the file after `@@ fn main() {`"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert!(err.contains("line 2:     println!(\"howdy\");"), "{err}");
    assert_eq!(snapshot(root), before, "a refused patch changes nothing");

    // A context line that is gone names itself.
    let err = call(
        &rt,
        "alice",
        "apply_patch",
        patch("*** Update File: src/main.rs\n@@ fn start() {\n-}\n+};\n"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("its `@@ fn start() {` line is not in the file"),
        "{err}"
    );
    assert!(err.contains("line 1: fn main() {"), "{err}");

    // A delete needs a read of the current content; an add never overwrites; a move never
    // lands on a file; no file twice; a malformed patch names its line.
    std::fs::write(root.join("unread.txt"), "mine\n").unwrap();
    let refusals = [
        (
            patch("*** Delete File: unread.txt\n"),
            "you have not read it",
        ),
        (
            patch("*** Add File: src/main.rs\n+x\n"),
            "it exists already",
        ),
        (
            patch("*** Update File: core/lib.rs\n*** Move to: src/main.rs\n@@\n-    2\n+    3\n"),
            "a move never overwrites",
        ),
        (
            patch("*** Add File: twice.md\n+a\n*** Add File: ./twice.md\n+b\n"),
            "names this file twice",
        ),
        (patch("*** Delete File: nothing.txt\n"), "no such file"),
        (
            json!({ "input": "*** Begin Patch\n*** Update File: src/main.rs\n@@\n?what\n*** End Patch" }),
            "malformed at line 4",
        ),
        (
            json!({ "input": "--- a/x\n+++ b/x\n" }),
            "first line must be `*** Begin Patch`",
        ),
    ];
    for (args, why) in refusals {
        let err = call(&rt, "alice", "apply_patch", args.clone())
            .await
            .expect_err(&format!("{args} refused"))
            .to_string();
        assert!(err.contains(why), "{args}: expected `{why}` in: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(root.join("unread.txt")).unwrap(),
        "mine\n"
    );
    assert!(!root.join("twice.md").exists());

    // An updated file the agent had read whole stays writable without another read; one
    // it had not read does not.
    call(&rt, "bob", "read_file", json!({ "path": "core/lib.rs" }))
        .await
        .unwrap();
    call(
        &rt,
        "bob",
        "apply_patch",
        patch("*** Update File: core/lib.rs\n-    2\n+    4\n"),
    )
    .await
    .unwrap();
    call(
        &rt,
        "bob",
        "edit_file",
        json!({ "path": "core/lib.rs", "old_string": "4", "new_string": "5" }),
    )
    .await
    .unwrap();
    let err = call(
        &rt,
        "alice",
        "edit_file",
        json!({ "path": "core/lib.rs", "old_string": "5", "new_string": "6" }),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("not written"), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn several_edits_apply_in_order_or_not_at_all() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let file = tree.root.join("src/main.rs");
    let before = std::fs::read_to_string(&file).unwrap();
    let edits = |edits: Value| {
        call(
            &rt,
            "alice",
            "multi_edit",
            json!({ "path": "src/main.rs", "edits": edits }),
        )
    };
    let err = edits(json!([{ "old_string": "main", "new_string": "start" }]))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("you have not read it"), "{err}");
    call(&rt, "alice", "read_file", json!({ "path": "src/main.rs" }))
        .await
        .unwrap();
    // The second edit does not match: the first is not applied either.
    let err = edits(json!([
        { "old_string": "fn main", "new_string": "fn start" },
        { "old_string": "no such text", "new_string": "x" },
    ]))
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("edit 2 of 2: "), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    let err = edits(json!([])).await.unwrap_err().to_string();
    assert!(err.contains("0 edits given; give 1 to 100"), "{err}");
    let err = edits(json!([{ "old_string": "", "new_string": "x" }]))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("edit 1 of 1: old_string is empty"), "{err}");

    // Each edit sees the result of the ones before.
    let done = edits(json!([
        { "old_string": "fn main", "new_string": "fn start" },
        { "old_string": "fn start() {", "new_string": "fn start() -> () {" },
        { "old_string": "\"", "new_string": "'", "replace_all": true },
    ]))
    .await
    .unwrap();
    assert_eq!(done["replacements"], json!(4));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "fn start() -> () {\n    println!('hi');\n}\n"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn listings_show_the_roots_and_nothing_past_them() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let listed = call(&rt, "alice", "list_dir", json!({})).await.unwrap();
    let entries = listed["entries"].as_array().unwrap();
    let kind = |name: &str| {
        entries
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["kind"].as_str().unwrap().to_owned())
    };
    assert_eq!(listed["path"], json!(tree.root.display().to_string()));
    assert_eq!(kind("src").as_deref(), Some("dir"));
    assert_eq!(kind("hard_secret").as_deref(), Some("file"));
    assert_eq!(kind("out_dir").as_deref(), Some("symlink"));
    assert_eq!(kind(".git"), None, "denied names are left out");
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted);
    let src = call(&rt, "alice", "list_dir", json!({ "path": "src" }))
        .await
        .unwrap();
    assert_eq!(
        src["entries"][0],
        json!({ "name": "main.rs", "kind": "file", "bytes": 34 })
    );
    for (path, why) in [
        ("out_dir", "symlink"),
        ("../outside", ".."),
        (".git", "denied"),
        ("missing", "no such file"),
    ] {
        let err = call(&rt, "alice", "list_dir", json!({ "path": path }))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{path}: {err}");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn glob_finds_newest_first_as_ripgrep_walks() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let write = |path: &str, age_secs: u64| {
        let full = tree.root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, path).unwrap();
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age_secs);
        std::fs::File::options()
            .write(true)
            .open(&full)
            .unwrap()
            .set_modified(when)
            .unwrap();
    };
    write("src/old.rs", 300);
    write("src/deep/new.rs", 10);
    write("src/deep/mid.rs", 100);
    write("target/build.rs", 1);
    write("notes.md", 50);
    std::fs::write(tree.root.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(tree.outside.join("outside.rs"), "x").unwrap();
    let glob = |args: Value| call(&rt, "alice", "glob", args);
    let found = glob(json!({ "pattern": "**/*.rs" })).await.unwrap();
    let names: Vec<String> = found["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            f.as_str()
                .unwrap()
                .strip_prefix(&format!("{}/", tree.root.display()))
                .unwrap()
                .to_owned()
        })
        .collect();
    // Newest first (main.rs was written as the test began); target/ is ignored; the
    // symlinks are not followed.
    assert_eq!(
        names,
        [
            "src/main.rs",
            "src/deep/new.rs",
            "src/deep/mid.rs",
            "src/old.rs"
        ]
    );
    assert!(names.iter().all(|n| n != "target/build.rs"), "{names:?}");
    assert!(names.iter().all(|n| !n.contains("outside")), "{names:?}");
    assert_eq!(found["total"], json!(names.len()));

    let one_level = glob(json!({ "pattern": "*.rs", "path": "src" }))
        .await
        .unwrap();
    assert_eq!(
        one_level["files"],
        json!([
            format!("{}/src/main.rs", tree.root.display()),
            format!("{}/src/old.rs", tree.root.display())
        ])
    );
    let limited = glob(json!({ "pattern": "**/*", "limit": 1 }))
        .await
        .unwrap();
    assert_eq!(limited["files"].as_array().unwrap().len(), 1);
    assert!(limited["total"].as_u64().unwrap() > 1);
    assert!(
        !limited["files"][0].as_str().unwrap().contains(".git/"),
        "denied names are not walked"
    );
    let err = glob(json!({ "pattern": "a[" }))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("pattern \"a[\""), "{err}");
    let err = glob(json!({ "pattern": "*", "path": "out_dir" }))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("symlink"), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn grep_searches_contents_as_ripgrep_does_and_stays_inside() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let put = |path: &str, content: &[u8]| {
        let full = tree.root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, content).unwrap();
    };
    put(
        "src/lib.rs",
        b"// a secret here\nfn one() {}\nfn two() {}\n// SECRET again\n",
    );
    put("docs/notes.md", b"no match\nsecret in docs\n");
    put("build/out.rs", b"secret in an ignored file\n");
    put("data.bin", b"secret\0binary");
    put(".gitignore", b"build/\n");
    let grep = |args: Value| call(&rt, "alice", "grep", args);
    let relative = |found: &Value| -> Vec<String> {
        found["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_str()
                    .unwrap()
                    .replace(&format!("{}/", tree.root.display()), "")
            })
            .collect()
    };

    // Files with matches: not outside (symlinks), not the hard link, not .git, not
    // ignored, not binary.
    let found = grep(json!({ "pattern": "secret" })).await.unwrap();
    let mut files = relative(&found);
    files.sort();
    assert_eq!(files, ["docs/notes.md", "src/lib.rs"]);
    assert_eq!(found["truncated"], json!(false));

    let found = grep(json!({ "pattern": "secret", "case_insensitive": true, "mode": "count" }))
        .await
        .unwrap();
    let mut counts = relative(&found);
    counts.sort();
    assert_eq!(counts, ["docs/notes.md:1", "src/lib.rs:2"]);

    let found = grep(json!({
        "pattern": "fn two", "mode": "content", "context": 1, "type": "rust"
    }))
    .await
    .unwrap();
    assert_eq!(
        relative(&found),
        [
            "src/lib.rs-2-fn one() {}",
            "src/lib.rs:3:fn two() {}",
            "src/lib.rs-4-// SECRET again"
        ]
    );
    let found = grep(json!({ "pattern": "secret", "glob": "*.md" }))
        .await
        .unwrap();
    assert_eq!(relative(&found), ["docs/notes.md"]);
    let found = grep(json!({ "pattern": "secret", "path": "src/lib.rs", "mode": "content" }))
        .await
        .unwrap();
    assert_eq!(relative(&found), ["src/lib.rs:1:// a secret here"]);
    let found = grep(json!({ "pattern": "fn", "mode": "content", "limit": 1 }))
        .await
        .unwrap();
    assert_eq!(found["results"].as_array().unwrap().len(), 1);
    assert_eq!(found["truncated"], json!(true));

    for (args, why) in [
        (json!({ "pattern": "(" }), "pattern \"(\""),
        (
            json!({ "pattern": "x", "type": "klingon" }),
            "unknown file type",
        ),
        (json!({ "pattern": "x", "context": 99 }), "give 0 to 20"),
        (json!({ "pattern": "x", "path": "out_dir" }), "symlink"),
        (json!({ "pattern": "x", "path": "../outside" }), ".."),
        (json!({ "pattern": "x", "glob": "a[" }), "glob"),
    ] {
        let err = grep(args.clone()).await.unwrap_err().to_string();
        assert!(err.contains(why), "{args}: {err}");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn a_named_pipe_is_refused_without_waiting_for_a_writer() {
    let tree = tree();
    let rt = runtime(&tree).await;
    let made = std::process::Command::new("mkfifo")
        .arg(tree.root.join("pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    // Opening it to read would wait for a writer that never comes: each answer is at once.
    for (tool, args) in [
        ("read_file", json!({ "path": "pipe" })),
        ("write_file", json!({ "path": "pipe", "content": "x" })),
        (
            "edit_file",
            json!({ "path": "pipe", "old_string": "a", "new_string": "b" }),
        ),
    ] {
        let err = call(&rt, "alice", tool, args)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{tool}: {err}");
    }
    let found = call(&rt, "alice", "grep", json!({ "pattern": "x" }))
        .await
        .unwrap();
    assert_eq!(found["truncated"], json!(false));
    // Named, it is called what it is (it once came back as "Not a directory").
    let err = call(
        &rt,
        "alice",
        "grep",
        json!({ "pattern": "x", "path": "pipe" }),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("not a regular file or a directory"), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn denied_names_are_globs_that_hide_secrets_everywhere() {
    let tree = tree();
    std::fs::write(tree.root.join(".env.local"), "TOKEN=1\n").unwrap();
    std::fs::create_dir(tree.root.join("keys")).unwrap();
    std::fs::write(tree.root.join("keys/server.PEM"), "-----BEGIN\n").unwrap();
    let files = Files::open(&FilesConfig {
        roots: vec![tree.root.clone()],
        deny: vec![".git".into(), ".env*".into(), "*.pem".into()],
        ..FilesConfig::default()
    })
    .unwrap();
    let rt = Runtime::builder().files(&files).build().await.unwrap();
    rt.register_agent(AgentSpec::new("alice", "dev"))
        .await
        .unwrap();
    for path in [".env.local", "keys/server.PEM", ".ENV", "keys/new.pem"] {
        let err = call(&rt, "alice", "read_file", json!({ "path": path }))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("is denied to the file tools"), "{path}: {err}");
        let err = call(
            &rt,
            "alice",
            "write_file",
            json!({ "path": path, "content": "x" }),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("is denied to the file tools"), "{path}: {err}");
    }
    let listed = call(&rt, "alice", "list_dir", json!({ "path": "keys" }))
        .await
        .unwrap();
    assert_eq!(listed["entries"], json!([]));
    let found = call(&rt, "alice", "glob", json!({ "pattern": "**/*" }))
        .await
        .unwrap();
    let found = found["files"].to_string();
    assert!(!found.contains(".env") && !found.contains("PEM"), "{found}");
    let grep = call(&rt, "alice", "grep", json!({ "pattern": "TOKEN|BEGIN" }))
        .await
        .unwrap();
    assert_eq!(grep["results"], json!([]));
    rt.shutdown().await;

    let err = Files::open(&FilesConfig {
        roots: vec![tree.root.clone()],
        deny: vec!["[".into()],
        ..FilesConfig::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("deny `[`"), "{err}");
}

#[tokio::test]
async fn roots_can_differ_per_role_and_per_agent() {
    let tree = tree();
    for dir in ["docs", "web"] {
        std::fs::create_dir(tree.root.join(dir)).unwrap();
        std::fs::write(tree.root.join(dir).join("notes.md"), format!("{dir}\n")).unwrap();
    }
    let files = Files::open(&FilesConfig {
        roots: vec![tree.root.clone()],
        roles: [("writer".to_owned(), vec![tree.root.join("docs")])].into(),
        agents: [("frontend".to_owned(), vec![tree.root.join("web")])].into(),
        ..FilesConfig::default()
    })
    .unwrap();
    let rt = Runtime::builder().files(&files).build().await.unwrap();
    for (id, role) in [
        ("lead", "dev"),
        ("scribe", "writer"),
        ("frontend", "writer"),
    ] {
        rt.register_agent(AgentSpec::new(id, role)).await.unwrap();
    }
    let read = |agent: &'static str, path: &'static str| {
        let rt = rt.clone();
        async move {
            call(&rt, agent, "read_file", json!({ "path": path }))
                .await
                .map(|v| v.as_str().unwrap().to_owned())
                .map_err(|e| e.to_string())
        }
    };
    // The default roots: the whole tree.
    assert!(
        read("lead", "docs/notes.md")
            .await
            .unwrap()
            .contains("docs")
    );
    // The role's roots: only docs/, relative paths start there.
    assert!(read("scribe", "notes.md").await.unwrap().contains("docs"));
    let err = read("scribe", "src/main.rs").await.unwrap_err();
    assert!(err.contains("no such file"), "{err}");
    let outside = tree.root.join("web/notes.md").display().to_string();
    let err = call(&rt, "scribe", "read_file", json!({ "path": outside }))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the roots"), "{err}");
    // The agent's own roots win over its role's.
    assert!(read("frontend", "notes.md").await.unwrap().contains("web"));
    let listed = call(&rt, "scribe", "glob", json!({ "pattern": "**/*" }))
        .await
        .unwrap()
        .to_string();
    assert!(
        listed.contains("docs/notes.md") && !listed.contains("main.rs"),
        "{listed}"
    );
    rt.shutdown().await;

    let err = Files::open(&FilesConfig {
        roots: vec![tree.root.clone()],
        roles: [("writer".to_owned(), vec![tree.root.join("missing")])].into(),
        ..FilesConfig::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("[files.roles] writer"), "{err}");
}

#[tokio::test]
async fn a_rewritten_file_keeps_its_mode_owner_and_group() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tree = tree();
    let rt = runtime(&tree).await;
    let file = tree.root.join("run.sh");
    std::fs::write(&file, "echo one\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o754)).unwrap();
    // Given away to `nobody` where the tests may (as root, as in CI); else the owner is
    // the test's own user and keeping it is still checked.
    let _ = std::os::unix::fs::chown(&file, Some(65534), Some(65534));
    let before = std::fs::metadata(&file).unwrap();
    call(&rt, "alice", "read_file", json!({ "path": "run.sh" }))
        .await
        .unwrap();
    call(
        &rt,
        "alice",
        "edit_file",
        json!({ "path": "run.sh", "old_string": "one", "new_string": "two" }),
    )
    .await
    .unwrap();
    // The new file was made while the old one still existed, so their inodes differ (a
    // later file may reuse the freed one).
    assert_ne!(
        std::fs::metadata(&file).unwrap().ino(),
        before.ino(),
        "replaced by rename, not written in place"
    );
    call(
        &rt,
        "alice",
        "write_file",
        json!({ "path": "run.sh", "content": "echo three\n" }),
    )
    .await
    .unwrap();
    let after = std::fs::metadata(&file).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "echo three\n");
    assert_eq!(after.mode() & 0o7777, 0o754);
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    rt.shutdown().await;
}
