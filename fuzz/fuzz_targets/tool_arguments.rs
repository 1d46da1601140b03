//! Any JSON arguments to any built-in tool, through the whole call path (decoding,
//! governance, the pipeline, the tool): an answer or an error, never `crashed`.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use guildhall::{Agent, AgentSpec, CallOptions, ErrorKind, MailboxConfig, Runtime};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

struct Fixture {
    tokio: tokio::runtime::Runtime,
    runtime: Runtime,
    tools: Vec<String>,
    /// The agent every fuzzed call is made as.
    fuzz: Agent,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio starts");
        let runtime = tokio.block_on(async {
            let rt = Runtime::builder()
                .mailbox_config(MailboxConfig {
                    max_wait: Duration::from_millis(1),
                    ..MailboxConfig::default()
                })
                .build()
                .await
                .expect("runtime starts");
            for id in ["fuzz", "peer"] {
                rt.register_agent(AgentSpec::new(id, "dev"))
                    .await
                    .expect("agent registers");
            }
            rt
        });
        let tools = runtime.tools().into_iter().map(|t| t.name).collect();
        let fuzz = runtime.agent("fuzz").expect("registered above");
        Fixture {
            tokio,
            runtime,
            tools,
            fuzz,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let tool = &f.tools[usize::from(pick) % f.tools.len()];
    let args: Value = serde_json::from_slice(rest)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(rest).into_owned()));
    let outcome = f.tokio.block_on(f.runtime.call_json(
        tool,
        args.clone(),
        CallOptions::new().as_agent(&f.fuzz),
    ));
    if let Err(err) = outcome {
        assert_ne!(err.kind(), ErrorKind::Crashed, "{tool} {args}: {err}");
    }
});
