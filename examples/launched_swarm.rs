//! A whole TL → PM → workers flow, every agent but the TL a separate process the runtime
//! launched and supervises. Run with `cargo run --example launched_swarm` (well under a
//! minute).
//!
//! - The TL (this program, embedding the runtime) puts up an epic and launches a PM for it.
//! - The PM (a process) splits the epic into tasks on the board, one waiting on the others,
//!   launches three workers, and ends. Its profile says `wake_on_mail`: each time mail
//!   reaches it (a task done, a worker's exit) the runtime starts it again, its prompt naming
//!   that mail, which it reads from its inbox. No agent polls for its mail.
//! - The workers (processes) claim tasks until the board is empty. One of them crashes on
//!   its first run while holding a task: the supervisor starts it again, and the task comes
//!   back to the pool when its lease ends.
//! - Woken by the last worker's exit, the PM closes the epic and reports to the TL, which
//!   stops it.
//!
//! The agents are fake: this same program, started with `agent ROLE [PROMPT]` (launch
//! profiles `[this program, "agent", "{role}", "{prompt}"]`). Each is an MCP client (rmcp) connected back to the
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
        Some("agent") => {
            let role = args.get(2).map_or("", String::as_str);
            agent(role, args.get(3).map(String::as_str)).await
        }
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
    // The PM ends after each round of mail and is woken by the next: each wake is a
    // restart, so its intensity leaves room for one per message it may get.
    let pm = Profile {
        wake_on_mail: true,
        max_restarts: 30,
        ..Profile::new([me.as_str(), "agent", "{role}", "{prompt}"])
    };
    let config = LaunchConfig {
        profiles: BTreeMap::from([("fake".to_owned(), fake), ("pm".to_owned(), pm)]),
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
        profile: Some("pm".into()),
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

    // The TL's inbox until the PM has reported.
    let mut reported = false;
    while !reported {
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
            if &*message.subject == "agent pm exited"
                && message
                    .payload
                    .as_ref()
                    .is_some_and(|p| p["exit_code"] != 0)
            {
                let log =
                    std::fs::read_to_string(data_dir.join("launched/pm.log")).unwrap_or_default();
                return Err(format!("the PM failed; its log:\n{log}").into());
            }
            reported |= &*message.subject == "release 1.0 is done";
        }
    }
    // Then, once it is idle (its last round over), it is stopped: nothing is left to wake
    // it for.
    while let Some(pm) = launcher.list().await.into_iter().find(|a| a.agent == "pm")
        && pm.state != LaunchState::Idle
    {
        if started.elapsed() > WHOLE_FLOW {
            return Err(format!("the PM did not go idle: {pm:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    launcher.stop(None, "pm").await?;

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
async fn agent(role: &str, prompt: Option<&str>) -> Result<()> {
    let me = std::env::var("GUILDHALL_AGENT")?;
    let data_dir = PathBuf::from(std::env::var("GUILDHALL_DATA_DIR")?);
    let client = connect(&data_dir, &me).await?;
    let result = match role {
        "pm" => project_manager(&client, prompt.unwrap_or_default()).await,
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
        model: None,
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

/// The PM, run once per round of mail. Its first run (launched for the epic) splits the
/// epic into tasks and launches the workers. Every later run was woken by mail its prompt
/// names (a task done, a worker's exit): it reads that mail, tells the workers to go home
/// once no task is left, and once every worker has ended closes the epic and reports.
async fn project_manager(client: &Client, prompt: &str) -> Result<()> {
    let mine = call(client, "task_list", json!({ "mine": true })).await?;
    let epic = mine["tasks"][0]["id"].clone();
    if !prompt.contains("woken by new mail") {
        return put_up_the_work(client, &epic).await;
    }
    let mail = take_mail(client, 0.0).await?;
    let named: Vec<&str> = mail
        .iter()
        .filter(|m| m["id"].as_str().is_some_and(|id| prompt.contains(id)))
        .filter_map(|m| m["subject"].as_str())
        .collect();
    if named.is_empty() {
        return Err(format!("woken by mail it cannot find in its inbox: {prompt}").into());
    }
    println!("pm: woken by {}", named.join(", "));
    let left = json!({ "parent": epic, "status": ["open", "in_progress"] });
    if call(client, "task_list", left).await?["total"] == 0 {
        for id in WORKERS {
            // Once per worker, however many runs get here: the request id makes a second
            // send return the first one's receipt.
            let home = json!({ "to": id, "subject": "stop", "body": "all done",
                               "request_id": format!("stop-{id}") });
            call(client, "send_message", home).await?;
        }
    }
    let devs = call(client, "list_agents", json!({ "role": "dev" })).await?;
    let ended = devs["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["launched"]["state"] == "ended")
        .count();
    if ended < WORKERS.len() {
        return Ok(()); // Idle until the next mail.
    }
    let done = json!({ "parent": epic, "status": ["done"] });
    let count = call(client, "task_list", done).await?["total"].clone();
    let note = format!("{count} of {} tasks done by {ended} workers", WORK.len());
    call(
        client,
        "task_update",
        json!({ "id": epic, "status": "done", "note": note }),
    )
    .await?;
    let report = json!({ "to": "parent", "subject": "release 1.0 is done", "body": note,
                         "request_id": "report" });
    call(client, "send_message", report).await?;
    Ok(())
}

/// The PM's first run: the tasks on the board, the last waiting on the others, and the
/// workers launched to take them.
async fn put_up_the_work(client: &Client, epic: &Value) -> Result<()> {
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
    Ok(())
}

/// The messages that came within `wait_secs`, marked read.
async fn take_mail(client: &Client, wait_secs: f64) -> Result<Vec<Value>> {
    let inbox = call(
        client,
        "check_inbox",
        json!({ "wait_secs": wait_secs, "full": true, "limit": 100 }),
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
