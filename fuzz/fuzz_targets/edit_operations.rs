//! Any file content and any edits, through `read_file` then `multi_edit` as an agent would
//! call them: an answer or an error, never `crashed`; an edit that answers left the file at
//! the size it says, at most the 16 MiB the file tools handle; one that fails left the file
//! as it was.
//!
//! Input: a first byte `n`, then `4 × n` bytes of file content, then the edits: a JSON
//! array of `{old_string, new_string, replace_all}`, or any other bytes split in two halves
//! as one edit's old and new strings (`replace_all` when `n` is odd).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use guildhall::files::{Files, FilesConfig};
use guildhall::{Agent, AgentSpec, CallOptions, ErrorKind, Runtime};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// The largest file the tools write.
const MAX_FILE: u64 = 16 * 1024 * 1024;

struct Fixture {
    tokio: tokio::runtime::Runtime,
    runtime: Runtime,
    agent: Agent,
    file: PathBuf,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("guildhall-fuzz-edit-{}", std::process::id()));
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
            file: root.join("f.txt"),
        }
    })
}

fn edits_of(bytes: &[u8], replace_all: bool) -> Value {
    if let Ok(edits @ Value::Array(_)) = serde_json::from_slice::<Value>(bytes) {
        return edits;
    }
    let text = String::from_utf8_lossy(bytes);
    let middle = (0..=text.len() / 2).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let (old, new) = text.split_at(middle);
    json!([{ "old_string": old, "new_string": new, "replace_all": replace_all }])
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (content, edits) = rest.split_at((usize::from(n) * 4).min(rest.len()));
    let f = fixture();
    std::fs::write(&f.file, content).expect("the file is written");
    let call = |tool: &str, args: Value| {
        f.tokio.block_on(f.runtime.call_json(tool, args, CallOptions::new().as_agent(&f.agent)))
    };
    if call("read_file", json!({ "path": "f.txt" })).is_err() {
        return; // binary or not UTF-8: nothing to edit
    }
    let args = json!({ "path": "f.txt", "edits": edits_of(edits, n % 2 == 1) });
    match call("multi_edit", args) {
        Ok(done) => {
            let size = std::fs::metadata(&f.file).expect("the file is there").len();
            assert_eq!(done["bytes"].as_u64(), Some(size), "{done}");
            assert!(size <= MAX_FILE, "{size} bytes written");
        }
        Err(err) => {
            assert_ne!(err.kind(), ErrorKind::Crashed, "{err}");
            assert_eq!(std::fs::read(&f.file).expect("readable"), content, "{err}");
        }
    }
});
