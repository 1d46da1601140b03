//! Any file content and any patch, through `apply_patch` as an agent would call it: an
//! answer or an error, never `crashed`; a patch that answers changed only files inside the
//! root, each at most the 16 MiB the file tools handle; one that fails changed nothing.
//!
//! Input: a first byte `n`, then `4 × n` bytes of the file `f.txt`, then the patch. Bytes
//! that do not start with `*** Begin Patch` are taken as the chunks of an update of
//! `f.txt`, so most inputs reach the placing of lines rather than the header checks.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use guildhall::files::{Files, FilesConfig};
use guildhall::{Agent, AgentSpec, CallOptions, ErrorKind, Runtime};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

/// The largest file the tools write.
const MAX_FILE: u64 = 16 * 1024 * 1024;

struct Fixture {
    tokio: tokio::runtime::Runtime,
    runtime: Runtime,
    agent: Agent,
    root: PathBuf,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("guildhall-fuzz-patch-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("a root");
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio starts");
        let (runtime, agent) = tokio.block_on(async {
            let files = Files::open(&FilesConfig {
                roots: vec![root.clone()],
                ..FilesConfig::default()
            })
            .expect("the root opens");
            let rt = Runtime::builder().files(&files).build().await.expect("runtime starts");
            let agent = rt.register_agent(AgentSpec::new("fuzz", "dev")).await.expect("agent");
            (rt, agent)
        });
        Fixture {
            tokio,
            runtime,
            agent,
            root,
        }
    })
}

/// Every file under `dir` with its content.
fn snapshot(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).expect("readable").flatten() {
        let kind = entry.file_type().expect("a type");
        if kind.is_dir() {
            snapshot(&entry.path(), out);
        } else {
            out.push((entry.path(), std::fs::read(entry.path()).unwrap_or_default()));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (content, patch) = rest.split_at((usize::from(n) * 4).min(rest.len()));
    let f = fixture();
    // A fresh root each run: what one patch added is not the next one's context.
    let _ = std::fs::remove_dir_all(&f.root);
    std::fs::create_dir_all(&f.root).expect("a root");
    std::fs::write(f.root.join("f.txt"), content).expect("the file is written");
    let call = |tool: &str, args: serde_json::Value| {
        f.tokio.block_on(f.runtime.call_json(tool, args, CallOptions::new().as_agent(&f.agent)))
    };
    let _ = call("read_file", json!({ "path": "f.txt" }));
    let text = String::from_utf8_lossy(patch);
    let input = if text.trim_start().starts_with("*** Begin Patch") {
        text.into_owned()
    } else {
        format!("*** Begin Patch\n*** Update File: f.txt\n{text}\n*** End Patch")
    };
    let mut before = Vec::new();
    snapshot(&f.root, &mut before);
    match call("apply_patch", json!({ "input": input })) {
        Ok(done) => {
            for file in done["files"].as_array().expect("a list") {
                let path = Path::new(file["path"].as_str().expect("a path"));
                assert!(path.starts_with(&f.root), "{done}");
                if file["change"] != "deleted" {
                    let size = std::fs::metadata(path).expect("the file is there").len();
                    assert_eq!(file["bytes"].as_u64(), Some(size), "{done}");
                    assert!(size <= MAX_FILE, "{size} bytes written");
                }
            }
        }
        Err(err) => {
            assert_ne!(err.kind(), ErrorKind::Crashed, "{err}");
            let mut after = Vec::new();
            snapshot(&f.root, &mut after);
            before.sort();
            after.retain(|(p, _)| p.is_file());
            after.sort();
            // Directories made for added files may stay; no file changes.
            assert_eq!(before, after, "{err}");
        }
    }
});
