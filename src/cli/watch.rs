//! `guildhall watch`: the running server's events as they happen, one line each: calls and
//! how they ended, denials, tools restarted, breakers opening and closing, messages sent,
//! context sessions changed, agents connecting and leaving. `--tasks`: the task board, then
//! each task as it changes. `--agent A`: one agent's timeline, its calls nested (a
//! composite's steps under it) with outcome and duration.

use std::collections::HashMap;
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
    /// Only the task board: the unfinished tasks first, then each task as a commit changes
    /// it (status, assignee, holder, title).
    #[arg(long, conflicts_with = "agent")]
    tasks: bool,
    /// Only agent A's timeline: its calls (a composite's steps nested under it) with their
    /// outcome and duration, the mail it sends and gets, its connections, its sandbox's
    /// refusals.
    #[arg(long, value_name = "A")]
    agent: Option<String>,
}

/// Tasks shown for one commit at most (a bulk change is summarized past it).
const TASKS_PER_CHANGE: usize = 20;

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
    if args.tasks {
        let board = call(
            data_dir,
            "task_list",
            serde_json::json!({ "status": ["open", "in_progress"], "limit": 200 }),
        )
        .await?;
        for task in board["tasks"].as_array().into_iter().flatten() {
            print_task(&mut out, args.json, None, task)?;
        }
    }
    let mut timeline = Timeline::default();
    let mut seen = 0;
    while args.count.is_none_or(|count| seen < count) {
        let Some(line) = lines.next_line().await? else {
            break;
        };
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if args.tasks {
            if event["event"] != "tasks_changed" {
                continue;
            }
            let ids: Vec<u64> = event["ids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .collect();
            for id in ids.iter().take(TASKS_PER_CHANGE) {
                // A task gone meanwhile (a restart of the board) is skipped, not fatal.
                if let Ok(task) = call(data_dir, "task_get", serde_json::json!({ "id": id })).await
                {
                    print_task(&mut out, args.json, event["at_ms"].as_u64(), &task)?;
                }
            }
            if ids.len() > TASKS_PER_CHANGE && !args.json {
                writeln!(out, "  … and {} more tasks", ids.len() - TASKS_PER_CHANGE)?;
            }
        } else if let Some(agent) = &args.agent {
            let Some(shown) = timeline.take(agent, &event) else {
                continue;
            };
            if args.json {
                writeln!(out, "{line}")?;
            } else {
                writeln!(out, "{shown}")?;
            }
        } else if args.json {
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{}", describe(&line))?;
        }
        out.flush()?;
        seen += 1;
    }
    Ok(())
}

/// Calls `tool` on the running server as its operator.
async fn call(
    data_dir: &Path,
    tool: &str,
    arguments: Value,
) -> Result<Value, Box<dyn std::error::Error>> {
    let hello = Hello::Call {
        agent: None,
        token: None,
        tool: tool.to_owned(),
        arguments,
    };
    Ok(local::connect(data_dir, &hello).await?.value)
}

/// One task as a line (or, with `json`, as `{"event": "task", "at_ms", "task"}`).
fn print_task(
    out: &mut impl Write,
    json: bool,
    at_ms: Option<u64>,
    task: &Value,
) -> std::io::Result<()> {
    if json {
        let line = serde_json::json!({ "event": "task", "at_ms": at_ms, "task": task });
        return writeln!(out, "{line}");
    }
    let at = at_ms
        .map(super::clock::local_time)
        .unwrap_or_else(|| "board   ".to_owned());
    let status = match (task["status"].as_str(), task["ready"].as_bool()) {
        (Some("open"), Some(false)) => "blocked",
        (Some(status), _) => status,
        (None, _) => "?",
    };
    let mut line = format!(
        "{at}  task #{:<5} {status:<11} {}",
        task["id"].as_u64().unwrap_or_default(),
        task["title"].as_str().unwrap_or("")
    );
    if let Some(assignee) = task["assignee"].as_str() {
        line.push_str(&format!("  for {assignee}"));
    }
    if let Some(holder) = task["claimed_by"].as_str() {
        line.push_str(&format!("  held by {holder}"));
    }
    if let Some(blockers) = task["blocked_by"].as_array().filter(|b| !b.is_empty()) {
        let ids: Vec<String> = blockers.iter().map(|b| format!("#{b}")).collect();
        line.push_str(&format!("  after {}", ids.join(", ")));
    }
    writeln!(out, "{line}")
}

/// One agent's calls as they open and close, each nested under the call it was made in
/// (its `traceparent` names that call's span).
#[derive(Default)]
struct Timeline {
    /// Open calls of the agent, by call id: the tool, its span id, its depth.
    open: HashMap<String, (String, String, usize)>,
}

/// Calls of one agent kept open at most (a watcher that missed their ends forgets them).
const OPEN_CALLS: usize = 4_096;

impl Timeline {
    /// `event` as a line of `agent`'s timeline, or `None` when it is not the agent's.
    fn take(&mut self, agent: &str, event: &Value) -> Option<String> {
        let text = |key: &str| event[key].as_str().unwrap_or("?").to_owned();
        let at = event["at_ms"]
            .as_u64()
            .map(super::clock::local_time)
            .unwrap_or_default();
        let indent = |depth: usize| "  ".repeat(depth.min(16));
        let what = match event["event"].as_str().unwrap_or("") {
            "invoked" if event["agent"] == agent => {
                let id = text("call_id");
                // A call's span id is its call id's last 8 bytes (`TraceParent::of_call`).
                let span: String = id.replace('-', "").chars().skip(16).collect();
                let parent = event["traceparent"]
                    .as_str()
                    .and_then(|t| t.split('-').nth(2))
                    .unwrap_or_default();
                let depth = self
                    .open
                    .values()
                    .find(|(_, s, _)| s == parent)
                    .map_or(0, |(_, _, d)| d + 1);
                if self.open.len() >= OPEN_CALLS {
                    self.open.clear();
                }
                self.open.insert(id, (text("tool"), span, depth));
                format!("{}▸ {}", indent(depth), text("tool"))
            }
            "completed" | "failed" | "denied" => {
                let (tool, _, depth) = self.open.remove(&text("call_id"))?;
                let pad = indent(depth);
                match event["event"].as_str() {
                    Some("completed") => format!(
                        "{pad}✓ {tool} {:.1} ms",
                        event["duration_us"].as_f64().unwrap_or(0.0) / 1e3
                    ),
                    Some("failed") => {
                        format!("{pad}✗ {tool}: {}: {}", text("kind"), text("message"))
                    }
                    _ => format!("{pad}⊘ {tool} denied: {}", text("reason")),
                }
            }
            "restarted" if self.open.values().any(|(t, _, _)| *t == text("tool")) => format!(
                "restarted  {} (restart {}) during a call of {agent}",
                text("tool"),
                event["restarts"]
            ),
            "mailed" if event["from"] == agent || event["to"] == agent => format!(
                "mail       {} -> {}: {}",
                text("from"),
                text("to"),
                text("subject")
            ),
            "agent_connected" if event["agent"] == agent => "joined".to_owned(),
            "agent_left" if event["agent"] == agent => "left".to_owned(),
            "egress" if event["agent"] == agent && event["allowed"] == false => {
                format!(
                    "egress     {}:{} refused: {}",
                    text("host"),
                    event["port"],
                    text("rule")
                )
            }
            "sandbox_refused" if event["agent"] == agent => {
                format!("sandbox    {}: {}", text("tool"), text("hint"))
            }
            _ => return None,
        };
        Some(format!("{at}  {what}"))
    }
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
        "tasks_changed" => format!(
            "tasks      {} changed",
            event["ids"]
                .as_array()
                .map(|ids| ids.iter().map(|id| format!("#{id}")).collect::<Vec<_>>())
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
