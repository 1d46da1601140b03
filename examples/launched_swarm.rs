//! A whole TL → PM → workers flow, every agent but the TL a separate process the runtime
//! launched and supervises. Run with `cargo run --example launched_swarm` (well under a
//! minute).
//!
//! - The TL (this program, embedding the runtime) puts up an epic and launches a PM for it.
//! - The PM (a process) splits the epic into tasks on the board, one waiting on the others,
//!   and launches three workers.
//! - The workers (processes) claim tasks until the board is empty. One of them crashes on
//!   its first run while holding a task: the supervisor starts it again, and the task comes
//!   back to the pool when its lease ends.
//! - The PM hears of each worker's exit by mail, closes the epic and reports to the TL.
//!
//! The agents are fake: this same program, started with `agent ROLE` (a launch profile
//! `[this program, "agent", "{role}"]`). Each is an MCP client (rmcp) connected back to the
//! runtime through its local socket as itself, from `GUILDHALL_AGENT` and
//! `GUILDHALL_DATA_DIR`, as `guildhall mcp` connects a real agent CLI. A real swarm puts
//! `claude -p {prompt} --mcp-config {mcp_config}` (or any agent CLI) in the profile instead.

// An example talks to its reader on stdout.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guildhall::launch::{LaunchConfig, LaunchState, Launcher, Profile, SpawnRequest};
use guildhall::mcp::local::{self, Control, Hello};
use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::tasks::{TaskQuery, TaskSpec, TaskStatus};
use guildhall::{AgentSpec, InboxQuery, Runtime};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// The tasks the PM puts up; the last waits on all the others.
const WORK: [&str; 6] = [
    "parse the logs",
    "fix the flaky test",
    "bump the dependencies",
    "profile the hot loop",
    "review the API",
    "write the release notes",
];
const WORKERS: [&str; 3] = ["w1", "w2", "w3"];
/// How long the whole flow may take before the TL gives up on it.
const WHOLE_FLOW: Duration = Duration::from_secs(50);

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("agent") => agent(args.get(2).map_or("", String::as_str)).await,
        _ => tech_lead().await,
    }
}

/// The TL: the runtime, its local socket, the launcher, and the epic.
async fn tech_lead() -> Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join(".guildhall");
    let runtime = Runtime::builder().data_dir(&data_dir).build().await?;
    let program = std::env::current_exe()?;
    let me = program.display().to_string();
    let fake = Profile::new([me.as_str(), "agent", "{role}"]);
    let config = LaunchConfig {
        profiles: BTreeMap::from([("fake".to_owned(), fake)]),
        ..LaunchConfig::default()
    };
    let launcher = Launcher::start(
        &runtime,
        config,
        dir.path().to_owned(),
        Some(data_dir.clone()),
        program,
    )
    .await?;
    // The local socket the agents connect back through, as `guildhall serve` opens it.
    let server = McpServer::new(runtime.clone()).connection(None, ToolFilter::all());
    let control = Control::default().with_launcher(Arc::clone(&launcher));
    let serving = local::open(&data_dir, server, control)?;

    let tl = runtime.register_agent(AgentSpec::new("tl", "tl")).await?;
    let epic = TaskSpec {
        title: "release 1.0".into(),
        ..TaskSpec::default()
    };
    let epic = runtime
        .tasks()
        .ok_or("no task board")?
        .create(Some("tl"), epic)
        .await?;
    let pm = SpawnRequest {
        id: Some("pm".into()),
        role: "pm".into(),
        task: Some(epic.id),
        ..SpawnRequest::default()
    };
    let pm = launcher.spawn(Some("tl"), pm).await?;
    println!(
        "[{:>5.2}s] tl launched pm (pid {}) for epic {}",
        secs(started),
        pm.pid.unwrap_or_default(),
        epic.id
    );

    // The TL's inbox until the PM has reported and exited.
    let mut pm_exited = false;
    while !pm_exited {
        if started.elapsed() > WHOLE_FLOW {
            let mut said = String::from("the flow did not finish in time; the agents' output:");
            for agent in launcher.list().await {
                said.push_str(&format!("\n{}: {}", agent.agent, agent.tail.join("\n  ")));
            }
            return Err(said.into());
        }
        let wait = InboxQuery {
            wait: Some(Duration::from_secs(5)),
            mark_read: true,
            ..InboxQuery::default()
        };
        for message in tl.check_inbox(wait).await?.messages {
            println!(
                "[{:>5.2}s] tl's inbox: {} (from {})",
                secs(started),
                message.subject,
                message.from
            );
            if &*message.subject == "agent pm exited" {
                if message
                    .payload
                    .as_ref()
                    .is_some_and(|p| p["exit_code"] != 0)
                {
                    let log = std::fs::read_to_string(data_dir.join("launched/pm.log"))
                        .unwrap_or_default();
                    return Err(format!("the PM failed; its log:\n{log}").into());
                }
                pm_exited = true;
            }
        }
    }

    println!("\nthe board:");
    let (tasks, _) = runtime
        .tasks()
        .ok_or("no task board")?
        .list(TaskQuery {
            limit: 100,
            ..TaskQuery::default()
        })
        .await?;
    for task in &tasks {
        let indent = if task.parent.is_some() { "    " } else { "  " };
        let last = task.notes.last().map_or("", |n| n.text.as_str());
        println!(
            "{indent}{:<26} {:<6} {last}",
            task.title,
            task.status.as_str()
        );
    }
    println!("\nlaunched:");
    let launched = launcher.list().await;
    for agent in &launched {
        println!(
            "  {:<3} {:<4} {:<6} restarts {}  last exit: {}",
            agent.agent,
            agent.role,
            agent.state.as_str(),
            agent.restarts,
            agent.last_exit.as_deref().unwrap_or("-")
        );
        // Its output over every run (`tail` holds the current run's).
        // (No file when it never wrote a line.)
        let log = agent
            .log
            .as_ref()
            .and_then(|file| std::fs::read_to_string(file).ok());
        for line in log.iter().flat_map(|log| log.lines()) {
            println!("      | {line}");
        }
    }
    let all_done = tasks.iter().all(|t| t.status == TaskStatus::Done);
    let all_ended = launched.iter().all(|a| a.state == LaunchState::Ended);
    drop(serving);
    runtime.shutdown().await;
    println!("\nthe whole flow took {:.1} s", secs(started));
    if !(all_done && all_ended && tasks.len() == WORK.len() + 1) {
        return Err("not every task was done, or an agent did not end well".into());
    }
    Ok(())
}

fn secs(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}

/// A launched agent: what it does is its role.
async fn agent(role: &str) -> Result<()> {
    let me = std::env::var("GUILDHALL_AGENT")?;
    let data_dir = PathBuf::from(std::env::var("GUILDHALL_DATA_DIR")?);
    let client = connect(&data_dir, &me).await?;
    let result = match role {
        "pm" => project_manager(&client).await,
        _ => worker(&client, &me, &data_dir).await,
    };
    client.cancel().await?;
    result
}

type Client = RunningService<RoleClient, ()>;

/// An MCP session with the runtime, bound to `agent` (its role and parent are already
/// registered: the launcher did it).
async fn connect(data_dir: &Path, agent: &str) -> Result<Client> {
    let hello = Hello::Mcp {
        agent: agent.to_owned(),
        role: None,
        parent: None,
        tools: None,
        token: None,
    };
    let connected = local::connect(data_dir, &hello).await?;
    Ok(().serve((connected.reader, connected.writer)).await?)
}

/// Calls `tool`; its structured result, or the tool's error.
async fn call(client: &Client, tool: &'static str, arguments: Value) -> Result<Value> {
    let params = CallToolRequestParams::new(tool)
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    let result = client.call_tool(params).await?;
    if result.is_error == Some(true) {
        let content = serde_json::to_value(&result.content)?;
        return Err(format!(
            "{tool}: {}",
            content[0]["text"].as_str().unwrap_or("failed")
        )
        .into());
    }
    result
        .structured_content
        .ok_or_else(|| format!("{tool} gave no structured result").into())
}

/// The PM: splits its epic into tasks, launches the workers, and reports when they are done.
async fn project_manager(client: &Client) -> Result<()> {
    let mine = call(client, "task_list", json!({ "mine": true })).await?;
    let epic = mine["tasks"][0]["id"].clone();
    let mut ids = Vec::new();
    for title in &WORK[..WORK.len() - 1] {
        let task = call(
            client,
            "task_create",
            json!({ "title": title, "parent": epic, "assignee": "role:dev" }),
        )
        .await?;
        ids.push(task["id"].clone());
    }
    let notes = json!({
        "title": WORK[WORK.len() - 1], "parent": epic, "assignee": "role:dev", "blocked_by": ids });
    call(client, "task_create", notes).await?;
    for id in WORKERS {
        call(
            client,
            "spawn_agent",
            json!({ "id": id, "role": "dev", "profile": "fake" }),
        )
        .await?;
    }
    // Each task done and each worker's exit are mailed here. When no task is left, the
    // workers are told to go home.
    let (mut exited, mut told) = (0, false);
    for _ in 0..60 {
        if exited == WORKERS.len() {
            break;
        }
        let messages = take_mail(client, 2.0).await?;
        exited += messages
            .iter()
            .filter(|m| {
                m["subject"]
                    .as_str()
                    .is_some_and(|s| s.ends_with(" exited"))
            })
            .filter(|m| m["payload"]["exit_code"] == 0)
            .count();
        let a_task_done = messages.iter().any(|m| {
            m["subject"]
                .as_str()
                .is_some_and(|s| s.starts_with("task "))
        });
        if a_task_done && !told {
            let left = json!({ "parent": epic, "status": ["open", "in_progress"] });
            if call(client, "task_list", left).await?["total"] == 0 {
                for id in WORKERS {
                    let home = json!({ "to": id, "subject": "stop", "body": "all done" });
                    call(client, "send_message", home).await?;
                }
                told = true;
            }
        }
    }
    let done = json!({ "parent": epic, "status": ["done"] });
    let count = call(client, "task_list", done).await?["total"].clone();
    let note = format!("{count} of {} tasks done by {exited} workers", WORK.len());
    call(
        client,
        "task_update",
        json!({ "id": epic, "status": "done", "note": note }),
    )
    .await?;
    let report = json!({ "to": "parent", "subject": "release 1.0 is done", "body": note });
    call(client, "send_message", report).await?;
    Ok(())
}

/// The messages that came within `wait_secs`, marked read.
async fn take_mail(client: &Client, wait_secs: f64) -> Result<Vec<Value>> {
    let inbox = call(
        client,
        "check_inbox",
        json!({ "wait_secs": wait_secs, "full": true }),
    )
    .await?;
    let messages = inbox["messages"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&Value> = messages.iter().map(|m| &m["id"]).collect();
    if !ids.is_empty() {
        call(client, "mark_read", json!({ "ids": ids })).await?;
    }
    Ok(messages)
}

/// A worker: claims tasks until none is left. w3 crashes on its first run, holding a task.
async fn worker(client: &Client, me: &str, data_dir: &Path) -> Result<()> {
    let crashed_once = data_dir.join(format!("{me}.crashed"));
    let mut finished = 0;
    for _ in 0..200 {
        let claimed = call(client, "task_claim", json!({ "lease_secs": 1 })).await?;
        let Some(task) = claimed.get("task") else {
            // Nothing free now (blocked, or held by others): wait for mail, which is a
            // task becoming ready or the PM saying there is nothing left.
            let mail = take_mail(client, 1.0).await?;
            if mail.iter().any(|m| m["subject"] == "stop") {
                break;
            }
            continue;
        };
        if me == "w3" && !crashed_once.exists() {
            std::fs::write(&crashed_once, b"")?;
            println!(
                "{me}: crashing while holding `{}`",
                task["title"].as_str().unwrap_or("?")
            );
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // the work
        let note = format!("done by {me}");
        call(
            client,
            "task_update",
            json!({ "id": task["id"], "status": "done", "note": note }),
        )
        .await?;
        finished += 1;
    }
    let body = format!("{finished} tasks done");
    call(
        client,
        "send_message",
        json!({ "to": "parent", "subject": format!("{me} finished"), "body": body }),
    )
    .await?;
    Ok(())
}
