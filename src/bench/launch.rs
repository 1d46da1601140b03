//! `guildhall bench tasks`, its launch part: from `spawn_agent` to the launched agent's first
//! MCP call arriving, against the same agent program started by a bare `Command` with the
//! same environment, in the same run.
//!
//! The agent (`guildhall bench launch-agent {mcp_config}`) does what an agent CLI does: it
//! starts the MCP server its config names (`guildhall mcp`, the bridge), completes the MCP
//! handshake and calls `whoami`; then it mails its parent how long that took from its own
//! start, and exits. Guildhall's share of a launch is the launcher's part (the launch less
//! the bare start) plus the agent's connection (the bridge's start, its connection to the
//! server, the handshake and the call); the rest is the agent's own process start, which a
//! real agent CLI (Node, Python) makes far longer.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde::Serialize;
use serde_json::{Value, json};

use super::{Stage, median};
use crate::events::ToolEvent;
use crate::launch::{LaunchConfig, Launcher, Profile, SpawnRequest};
use crate::mcp::local::{self, Control};
use crate::mcp::{McpServer, ToolFilter};
use crate::{Agent, AgentSpec, InboxQuery, Runtime};

/// How long one launch may take to reach its first call.
const FIRST_CALL_WITHIN: Duration = Duration::from_secs(30);
/// The subject of the agent's report to its parent.
const REPORT: &str = "first call";

/// The launch figures (medians over the launches).
#[derive(Debug, Clone, Serialize)]
pub struct LaunchReport {
    /// Launches measured each way.
    pub launches: usize,
    /// From `spawn_agent` to the agent's first tool call arriving at the server, in ms.
    pub launch_first_call_p50_ms: f64,
    /// Baseline: from a bare `Command::spawn` of the same program, with the same
    /// environment and MCP config, to its first call arriving, in ms.
    pub direct_first_call_p50_ms: f64,
    /// Within the agent: from its start to its first call answered (starting the
    /// `guildhall mcp` bridge, connecting, the MCP handshake, the call), in ms.
    pub connect_first_call_p50_ms: f64,
    /// Guildhall's share of a launch: `(launch − direct + connect) / launch`.
    pub guildhall_share: f64,
}

/// Launches `launches` agents (`program bench launch-agent`) one after the other through a
/// launcher, and as many by a bare spawn, alternating.
///
/// # Errors
/// What failed: the runtime, the launcher, an agent that did not call in time.
pub async fn launch(
    program: &Path,
    launches: usize,
    stage: &dyn Stage,
) -> Result<LaunchReport, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let dir = tempfile::tempdir().map_err(|e| err(&e))?;
    let data_dir = dir.path().join("data");
    let runtime = Runtime::builder()
        .data_dir(&data_dir)
        .build()
        .await
        .map_err(|e| err(&e))?;
    let result = measure(&runtime, program, dir.path(), &data_dir, launches, stage).await;
    runtime.shutdown().await;
    result
}

async fn measure(
    runtime: &Runtime,
    program: &Path,
    base_dir: &Path,
    data_dir: &Path,
    launches: usize,
    stage: &dyn Stage,
) -> Result<LaunchReport, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let exe = program.display().to_string();
    let profile = Profile::new([exe.as_str(), "bench", "launch-agent", "{mcp_config}"]);
    let config = LaunchConfig {
        profiles: [("agent".to_owned(), profile)].into(),
        ..LaunchConfig::default()
    };
    let launcher = Launcher::start(
        runtime,
        config,
        base_dir.to_owned(),
        Some(data_dir.to_owned()),
        program.to_owned(),
    )
    .await
    .map_err(|e| err(&e))?;
    // The local socket the bridge connects to, as `guildhall serve` opens it.
    let server = McpServer::new(runtime.clone()).connection(None, ToolFilter::all());
    let control = Control::default().with_launcher(Arc::clone(&launcher));
    let _serving = local::open(data_dir, server, control).map_err(|e| err(&e))?;
    let parent = runtime
        .register_agent(AgentSpec::new("bench", "bench"))
        .await
        .map_err(|e| err(&e))?;

    let mut mail = Mail {
        parent,
        taken: Vec::new(),
    };
    stage.phase("launches", launches as u64 + 1);
    let (mut launched, mut direct, mut connect) = (Vec::new(), Vec::new(), Vec::new());
    // One of each first, unmeasured: the page cache holds the program after it.
    for n in 0..=launches {
        let id = format!("launched-{n}");
        let mut events = runtime.governance().events();
        let start = Instant::now();
        let request = SpawnRequest {
            id: Some(id.clone()),
            role: "agent".into(),
            ..SpawnRequest::default()
        };
        launcher
            .spawn(Some("bench"), request)
            .await
            .map_err(|e| err(&e))?;
        let first = first_call(&mut events, &id, start).await?;
        let inside = report_of(&mut mail, &id).await?;
        wait_exited(&mut mail, &id).await?;
        if n > 0 {
            launched.push(first);
            connect.push(inside);
        }

        let id = format!("direct-{n}");
        let config = mcp_config(program, data_dir, &id)?;
        let mut events = runtime.governance().events();
        let start = Instant::now();
        let mut child = tokio::process::Command::new(program)
            .args(["bench", "launch-agent"])
            .arg(&config)
            .env("GUILDHALL_AGENT", &id)
            .env("GUILDHALL_ROLE", "agent")
            .env("GUILDHALL_PARENT", "bench")
            .env("GUILDHALL_DATA_DIR", data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        let first = first_call(&mut events, &id, start).await?;
        report_of(&mut mail, &id).await?;
        let status = child.wait().await.map_err(|e| err(&e))?;
        if !status.success() {
            return Err(format!("the directly started agent {id} ended: {status}"));
        }
        if n > 0 {
            direct.push(first);
        }
        stage.step();
    }
    let launch_first_call_p50_ms = median(&mut launched);
    let direct_first_call_p50_ms = median(&mut direct);
    let connect_first_call_p50_ms = median(&mut connect);
    let ours = launch_first_call_p50_ms - direct_first_call_p50_ms + connect_first_call_p50_ms;
    Ok(LaunchReport {
        launches,
        launch_first_call_p50_ms,
        direct_first_call_p50_ms,
        connect_first_call_p50_ms,
        guildhall_share: (ours / launch_first_call_p50_ms).clamp(0.0, 1.0),
    })
}

/// Milliseconds from `start` to `agent`'s first call (`whoami`) arriving.
async fn first_call(
    events: &mut crate::EventStream,
    agent: &str,
    start: Instant,
) -> Result<f64, String> {
    let wait = async {
        while let Some(event) = events.next().await {
            if let ToolEvent::Invoked {
                tool,
                agent: Some(by),
                ..
            } = event
                && &*tool == "whoami"
                && &*by == agent
            {
                return Some(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        None
    };
    match tokio::time::timeout(FIRST_CALL_WITHIN, wait).await {
        Ok(Some(ms)) => Ok(ms),
        Ok(None) => Err("the runtime stopped".into()),
        Err(_) => Err(format!(
            "agent {agent} made no call within {FIRST_CALL_WITHIN:?}"
        )),
    }
}

/// The bench agent's mail, read as it comes: a message taken from the inbox while waiting
/// for another (an agent's exit notice read with its report) is kept for the next wait.
struct Mail {
    parent: Agent,
    taken: Vec<Arc<crate::Message>>,
}

/// The agent's own figure: ms from its start to its first call answered.
async fn report_of(mail: &mut Mail, agent: &str) -> Result<f64, String> {
    let message = next_from(mail, agent, |subject| subject == REPORT).await?;
    message
        .body
        .trim()
        .parse()
        .map_err(|_| format!("agent {agent} reported `{}`", message.body))
}

async fn wait_exited(mail: &mut Mail, agent: &str) -> Result<(), String> {
    next_from(mail, agent, |subject| subject.ends_with(" exited"))
        .await
        .map(drop)
}

/// The next message from `agent` whose subject `matches`: one taken before, or the next
/// such to arrive in the parent's inbox.
async fn next_from(
    mail: &mut Mail,
    agent: &str,
    matches: impl Fn(&str) -> bool,
) -> Result<Arc<crate::Message>, String> {
    let until = Instant::now() + FIRST_CALL_WITHIN;
    // Bounded: each turn waits, and the wait ends at `until`.
    for _ in 0..1_000 {
        if let Some(i) = mail
            .taken
            .iter()
            .position(|m| m.from.as_str() == agent && matches(&m.subject))
        {
            return Ok(mail.taken.swap_remove(i));
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let inbox = mail
            .parent
            .check_inbox(InboxQuery {
                wait: Some(left),
                ..InboxQuery::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let ids: Vec<_> = inbox.messages.iter().map(|m| m.id).collect();
        mail.parent
            .mark_read(&ids, false)
            .await
            .map_err(|e| e.to_string())?;
        mail.taken.extend(inbox.messages);
    }
    Err(format!("no message from agent {agent} in time"))
}

/// The MCP config the launcher would write for `agent`, for the bare start.
fn mcp_config(program: &Path, data_dir: &Path, agent: &str) -> Result<PathBuf, String> {
    let path = data_dir.join(format!("{agent}.mcp.json"));
    let config = json!({ "mcpServers": { "guildhall": {
        "command": program,
        "args": ["--data-dir", data_dir, "mcp", "--agent", agent, "--role", "agent",
                 "--parent", "bench"] } } });
    std::fs::write(&path, config.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The agent `guildhall bench launch-agent` runs: connects through the MCP server its config
/// names, calls `whoami`, and mails its parent how long that took.
///
/// # Errors
/// What failed: the config, the server's start, the handshake or a call.
pub async fn launch_agent(mcp_config: &Path) -> Result<(), String> {
    let start = Instant::now();
    let text = std::fs::read_to_string(mcp_config)
        .map_err(|e| format!("{}: {e}", mcp_config.display()))?;
    let config: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let server = &config["mcpServers"]["guildhall"];
    let command = server["command"]
        .as_str()
        .ok_or("the MCP config names no command")?;
    let args: Vec<&str> = server["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut bridge = tokio::process::Command::new(command)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{command}: {e}"))?;
    let (Some(stdout), Some(stdin)) = (bridge.stdout.take(), bridge.stdin.take()) else {
        return Err("the bridge's pipes".into());
    };
    let client = ().serve((stdout, stdin)).await.map_err(|e| e.to_string())?;
    let call = |name: &'static str, arguments: Value| {
        let params = CallToolRequestParams::new(name)
            .with_arguments(arguments.as_object().cloned().unwrap_or_default());
        client.call_tool(params)
    };
    call("whoami", json!({})).await.map_err(|e| e.to_string())?;
    let took = start.elapsed().as_secs_f64() * 1e3;
    let report = json!({ "to": "parent", "subject": REPORT, "body": took.to_string() });
    let sent = call("send_message", report)
        .await
        .map_err(|e| e.to_string())?;
    if sent.is_error == Some(true) {
        return Err(format!("send_message: {:?}", sent.content));
    }
    client.cancel().await.map_err(|e| e.to_string())?;
    Ok(())
}
