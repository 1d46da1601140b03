//! `guildhall hook` timed as an agent's client runs it: a process started with a hook's input
//! on stdin, asking a running server over the local socket, and exiting with its answer.
//! Every fourth hook has a new message to announce. The baseline is the same process
//! started with no agent, which exits before it talks to anyone: what starting the binary
//! costs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::mcp::local::{self, Hello};

/// What to run.
#[derive(Debug, Clone)]
pub struct HookBenchConfig {
    /// The `guildhall` binary: the server and the hooks.
    pub exe: PathBuf,
    /// Hooks timed (and as many baseline starts).
    pub calls: usize,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct HookReport {
    /// Hooks timed.
    pub calls: usize,
    /// Process start to answer, median, in ms.
    pub hook_p50_ms: f64,
    /// Its 99th percentile.
    pub hook_p99_ms: f64,
    /// Starting the binary alone (a hook with no agent, which answers nothing), median, ms.
    pub spawn_p50_ms: f64,
    /// Hooks that announced mail (every fourth had one new message).
    pub announced: usize,
}

/// A hook's input as Claude Code sends it at a prompt.
const PROMPT: &str = r#"{"session_id":"bench","transcript_path":"/tmp/t.jsonl","cwd":"/tmp","permission_mode":"default","hook_event_name":"UserPromptSubmit","prompt":"go on"}"#;

/// Runs the bench.
///
/// # Errors
/// A message naming what failed (the server did not start, a hook failed).
pub async fn hook(config: HookBenchConfig) -> Result<HookReport, String> {
    let dir = super::tempfile_in(&std::env::temp_dir());
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut server = tokio::process::Command::new(&config.exe)
        .arg("--data-dir")
        .arg(&dir)
        .args(["serve", "--no-http"])
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting the server: {e}"))?;
    let measured = measure(&config, &dir).await;
    let _ = local::connect(&dir, &Hello::Stop).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), server.wait()).await;
    let _ = std::fs::remove_dir_all(&dir);
    measured
}

async fn measure(config: &HookBenchConfig, dir: &Path) -> Result<HookReport, String> {
    let ready_by = Instant::now() + Duration::from_secs(20);
    while local::connect(dir, &Hello::Status).await.is_err() {
        if Instant::now() > ready_by {
            return Err("the server did not answer within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (agent, parent) in [("pm", None), ("dev", Some("pm"))] {
        let hello = Hello::Mcp {
            agent: agent.into(),
            role: Some(agent.into()),
            parent: parent.map(Into::into),
            tools: None,
            token: None,
            model: None,
        };
        local::connect(dir, &hello)
            .await
            .map_err(|e| format!("registering {agent}: {e}"))?;
    }
    let calls = config.calls.max(1);
    let (mut hooks, mut spawns, mut announced) = (Vec::new(), Vec::new(), 0);
    for i in 0..calls {
        if i % 4 == 0 {
            let send = Hello::Call {
                agent: Some("pm".into()),
                token: None,
                tool: "send_message".into(),
                arguments: json!({ "to": "dev", "subject": format!("step {i}"), "body": "next" }),
            };
            local::connect(dir, &send)
                .await
                .map_err(|e| format!("sending: {e}"))?;
        }
        let (took, out) = run_hook(&config.exe, dir, Some("dev")).await?;
        hooks.push(took);
        announced += usize::from(!out.is_empty());
        spawns.push(run_hook(&config.exe, dir, None).await?.0);
    }
    hooks.sort_by(f64::total_cmp);
    spawns.sort_by(f64::total_cmp);
    Ok(HookReport {
        calls,
        hook_p50_ms: super::percentile(&hooks, 0.5),
        hook_p99_ms: super::percentile(&hooks, 0.99),
        spawn_p50_ms: super::percentile(&spawns, 0.5),
        announced,
    })
}

/// One `guildhall hook` as `agent`: its time from start to exit, in ms, and its stdout.
async fn run_hook(exe: &Path, dir: &Path, agent: Option<&str>) -> Result<(f64, Vec<u8>), String> {
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("--data-dir")
        .arg(dir)
        .arg("hook")
        .env_remove("GUILDHALL_AGENT")
        .env_remove("GUILDHALL_SOCKET")
        .env("RUST_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(agent) = agent {
        command.env("GUILDHALL_AGENT", agent);
    }
    let at = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting a hook: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(PROMPT.as_bytes()).await;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("waiting for a hook: {e}"))?;
    let took = at.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        return Err(format!("a hook exited with {}", out.status));
    }
    Ok((took, out.stdout))
}
