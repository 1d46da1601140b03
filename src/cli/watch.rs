//! `guildhall watch`: the running server's events as they happen, one line each: calls and
//! how they ended, denials, tools restarted, breakers opening and closing, messages sent,
//! context sessions changed, agents connecting and leaving.

use std::io::Write;
use std::path::Path;

use clap::Args;
use guildhall::mcp::local::{self, Hello, LocalError};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// One JSON object per event, as the server sends them (`event`, its fields, `at_ms`).
    #[arg(long)]
    json: bool,
    /// Stop after this many events (default: until interrupted or the server stops).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

pub(crate) async fn run(args: WatchArgs, data_dir: &Path) -> CliResult {
    let connected = match local::connect(data_dir, &Hello::Watch).await {
        Ok(connected) => connected,
        Err(LocalError::NotRunning { .. }) => {
            return Err(format!(
                "no guildhall server is running for {}: start one (`guildhall serve`, or an \
                 agent's `guildhall mcp`) to watch it",
                data_dir.display()
            )
            .into());
        }
        Err(err) => return Err(err.into()),
    };
    // The server subscribed before it answered: from here on, nothing is missed.
    writeln!(
        std::io::stderr(),
        "watching the server of {} (Ctrl-C to stop)",
        data_dir.display()
    )?;
    // The writer half stays open: closing it tells the server this watcher left.
    let _writer = connected.writer;
    let mut lines = connected.reader.lines();
    let mut out = std::io::stdout();
    let mut seen = 0;
    while args.count.is_none_or(|count| seen < count) {
        let Some(line) = lines.next_line().await? else {
            break;
        };
        if args.json {
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{}", describe(&line))?;
        }
        out.flush()?;
        seen += 1;
    }
    Ok(())
}

/// One event as a line for people: its local time, what happened, to what.
fn describe(line: &str) -> String {
    let Ok(event) = serde_json::from_str::<Value>(line) else {
        return line.to_owned();
    };
    let text = |key: &str| event[key].as_str().unwrap_or("?").to_owned();
    let at = event["at_ms"]
        .as_u64()
        .map(super::clock::local_time)
        .unwrap_or_default();
    let what = match event["event"].as_str().unwrap_or("") {
        "invoked" => format!(
            "call       {} by {}",
            text("tool"),
            event["agent"].as_str().unwrap_or("the runtime")
        ),
        "completed" => format!(
            "ok         {} in {:.1} ms",
            text("tool"),
            event["duration_us"].as_f64().unwrap_or(0.0) / 1e3
        ),
        "failed" => format!(
            "failed     {}: {}: {}",
            text("tool"),
            text("kind"),
            text("message")
        ),
        "denied" => format!("denied     {}: {}", text("tool"), text("reason")),
        "restarted" => format!(
            "restarted  {} (restart {})",
            text("tool"),
            event["restarts"]
        ),
        "circuit_opened" => format!("breaker    {} opened", text("tool")),
        "circuit_closed" => format!("breaker    {} closed", text("tool")),
        "mailed" => format!(
            "mail       {} -> {}: {}",
            text("from"),
            text("to"),
            text("subject")
        ),
        "context_changed" => format!(
            "context    {} v{} by {}: {}",
            text("session"),
            event["version"],
            event["author"].as_str().unwrap_or("the runtime"),
            event["keys"]
                .as_array()
                .map(|keys| keys.iter().filter_map(Value::as_str).collect::<Vec<_>>())
                .unwrap_or_default()
                .join(", ")
        ),
        "agent_connected" => format!("joined     {}", text("agent")),
        "agent_left" => format!("left       {}", text("agent")),
        "egress" => format!(
            "egress     {}:{} {} for {}: {}",
            text("host"),
            event["port"],
            if event["allowed"] == true {
                "allowed"
            } else {
                "refused"
            },
            event["agent"].as_str().unwrap_or("the runtime"),
            text("rule")
        ),
        "sandbox_refused" => format!(
            "sandbox    {} of {}: {}",
            text("tool"),
            event["agent"].as_str().unwrap_or("the runtime"),
            text("hint")
        ),
        "missed" => format!(
            "(missed {} events: more came than are shown)",
            event["count"]
        ),
        _ => line.to_owned(),
    };
    format!("{at}  {what}")
}
