//! Long calls as MCP tasks (`io.modelcontextprotocol/tasks`, SEP-2663) for guildhall's own
//! tools: a call that outlasts the grace becomes a task; its result is read with
//! `tasks/get`, also after the client reconnected; `tasks/cancel` cancels the call in its
//! tool; a crash fails the task; another agent cannot see it.

use std::sync::Arc;
use std::time::Duration;

use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::{AgentSpec, CallContext, Runtime, Tool, ToolOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::mcp::Wire;

/// Sleeps `ms`, then answers; or panics (`crash`), fails (`fail`), or waits to be cancelled
/// (`wait`). Its deadline is long: its calls may become tasks.
struct Slow {
    cancelled: Arc<Notify>,
}

#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct SlowInput {
    ms: u64,
    #[serde(default)]
    then: Option<String>,
}

#[derive(Serialize, JsonSchema)]
struct SlowOutput {
    slept_ms: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SlowError(String);

impl Tool for Slow {
    type Input = SlowInput;
    type Output = SlowOutput;
    type Error = SlowError;
    type State = ();
    fn name(&self) -> &str {
        "slow"
    }
    fn description(&self) -> &str {
        "Sleeps, then answers, fails, crashes, or waits to be cancelled."
    }
    async fn call(
        &self,
        _: &mut (),
        input: SlowInput,
        ctx: CallContext,
    ) -> Result<SlowOutput, SlowError> {
        tokio::time::sleep(Duration::from_millis(input.ms)).await;
        match input.then.as_deref() {
            Some("crash") => panic!("the slow tool crashed on purpose"),
            Some("fail") => Err(SlowError("the slow tool failed as asked".into())),
            Some("wait") => {
                ctx.cancellation().cancelled().await;
                self.cancelled.notify_one();
                Err(SlowError("cancelled".into()))
            }
            _ => Ok(SlowOutput { slept_ms: input.ms }),
        }
    }
}

async fn runtime() -> (Runtime, Arc<Notify>) {
    let cancelled = Arc::new(Notify::new());
    let slow = Slow {
        cancelled: Arc::clone(&cancelled),
    };
    let rt = Runtime::builder()
        .tool_with(
            slow,
            ToolOptions::default().timeout(Duration::from_secs(120)),
        )
        .build()
        .await
        .unwrap();
    for agent in ["alice", "bob"] {
        rt.register_agent(AgentSpec::new(agent, "dev"))
            .await
            .unwrap();
    }
    (rt, cancelled)
}

/// The per-request `_meta` of a 2026-07-28 client that takes tasks.
fn takes_tasks() -> Value {
    json!({ "io.modelcontextprotocol/clientCapabilities": {
        "extensions": { "io.modelcontextprotocol/tasks": {} } } })
}

async fn connect(server: &McpServer, agent: &str) -> Wire {
    Wire::stateless(server.connection(Some(Arc::from(agent)), ToolFilter::all())).await
}

async fn call_slow(wire: &mut Wire, id: u64, args: Value) -> Value {
    let params = json!({ "name": "slow", "arguments": args, "_meta": takes_tasks() });
    wire.request(id, "tools/call", params).await
}

async fn task_request(wire: &mut Wire, id: u64, method: &str, task: &str) -> Value {
    let params = json!({ "taskId": task, "_meta": takes_tasks() });
    wire.request(id, method, params).await
}

/// `tasks/get` until the task ends (bounded), with request ids from `first_id` up.
async fn settled(wire: &mut Wire, first_id: u64, task: &str) -> Value {
    let mut id = first_id;
    crate::support::eventually_some(Duration::from_secs(10), "the task ends", async || {
        let got = task_request(wire, id, "tasks/get", task).await;
        id += 1;
        assert!(got.get("error").is_none(), "{got}");
        let status = got["result"]["status"].as_str().unwrap_or("");
        ["completed", "failed", "cancelled"]
            .contains(&status)
            .then(|| got["result"].clone())
    })
    .await
}

#[tokio::test]
async fn a_long_call_becomes_a_task_its_owner_reads_even_after_reconnecting() {
    let (rt, _) = runtime().await;
    let server = McpServer::new(rt.clone());
    let mut wire = connect(&server, "alice").await;

    // Quick: answered directly, the spec's shortcut.
    let quick = call_slow(&mut wire, 1, json!({ "ms": 0 })).await;
    assert_eq!(quick["result"]["resultType"], "complete", "{quick}");
    assert_eq!(
        quick["result"]["structuredContent"]["slept_ms"], 0,
        "{quick}"
    );

    let created = call_slow(&mut wire, 2, json!({ "ms": 1500 })).await;
    let result = &created["result"];
    assert_eq!(result["resultType"], "task", "{created}");
    assert_eq!(result["status"], "working", "{created}");
    assert!(result["ttlMs"].as_u64().unwrap() >= 60_000, "{created}");
    let task = result["taskId"].as_str().unwrap().to_owned();
    let working = task_request(&mut wire, 3, "tasks/get", &task).await;
    assert_eq!(working["result"]["status"], "working", "{working}");

    // The client goes away; the call goes on; the same agent comes back for the result.
    drop(wire);
    let mut again = connect(&server, "alice").await;
    let done = settled(&mut again, 10, &task).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["slept_ms"], 1500,
        "{done}"
    );

    // Another agent's task is not there for bob, not even as existing.
    let mut bob = connect(&server, "bob").await;
    let hidden = task_request(&mut bob, 1, "tasks/get", &task).await;
    assert_eq!(hidden["error"]["code"], -32602, "{hidden}");
    let cancel = task_request(&mut bob, 2, "tasks/cancel", &task).await;
    assert_eq!(cancel["error"]["code"], -32602, "{cancel}");

    // A client that does not take tasks waits for the result itself.
    let plain = bob
        .request(
            3,
            "tools/call",
            json!({ "name": "slow", "arguments": { "ms": 400 } }),
        )
        .await;
    assert_eq!(
        plain["result"]["structuredContent"]["slept_ms"], 400,
        "{plain}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_task_cancels_the_call_in_its_tool() {
    let (rt, cancelled) = runtime().await;
    let server = McpServer::new(rt.clone());
    let mut wire = connect(&server, "alice").await;
    let created = call_slow(&mut wire, 1, json!({ "ms": 0, "then": "wait" })).await;
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();
    let ack = task_request(&mut wire, 2, "tasks/cancel", &task).await;
    assert_eq!(ack["result"], json!({ "resultType": "complete" }), "{ack}");
    tokio::time::timeout(Duration::from_secs(10), cancelled.notified())
        .await
        .expect("the tool saw its call cancelled");
    let ended = settled(&mut wire, 3, &task).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    // Cancelling an ended task is the same empty acknowledgement.
    let again = task_request(&mut wire, 300, "tasks/cancel", &task).await;
    assert_eq!(
        again["result"],
        json!({ "resultType": "complete" }),
        "{again}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_crash_fails_the_task_and_a_tool_error_completes_it_as_an_error() {
    let (rt, _) = runtime().await;
    let server = McpServer::new(rt.clone());
    let mut wire = connect(&server, "alice").await;
    let crashed = call_slow(&mut wire, 1, json!({ "ms": 400, "then": "crash" })).await;
    let task = crashed["result"]["taskId"].as_str().unwrap().to_owned();
    let ended = settled(&mut wire, 2, &task).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["error"]["data"]["kind"], "crashed", "{ended}");
    assert!(
        ended["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("crashed:"),
        "{ended}"
    );
    assert!(ended.get("result").is_none(), "{ended}");

    let failed = call_slow(&mut wire, 300, json!({ "ms": 400, "then": "fail" })).await;
    let task = failed["result"]["taskId"].as_str().unwrap().to_owned();
    let ended = settled(&mut wire, 301, &task).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["result"]["isError"], true, "{ended}");
    let text = ended["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("failed as asked"), "{ended}");
    rt.shutdown().await;
}

#[tokio::test]
async fn task_methods_need_the_extension_and_an_unknown_task_is_invalid_params() {
    let (rt, _) = runtime().await;
    let server = McpServer::new(rt.clone());
    let mut wire = connect(&server, "alice").await;
    let gated = wire
        .request(1, "tasks/get", json!({ "taskId": "whatever" }))
        .await;
    assert_eq!(gated["error"]["code"], -32021, "{gated}");
    let unknown = task_request(&mut wire, 2, "tasks/get", "no-such-task").await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    rt.shutdown().await;
}

#[tokio::test]
async fn an_agent_has_at_most_64_tasks_running() {
    let (rt, _) = runtime().await;
    let server = McpServer::new(rt.clone());
    let mut wire = connect(&server, "alice").await;
    let max = guildhall::mcp::tasks::MAX_RUNNING as u64;
    for id in 1..=max + 1 {
        // Each with its own arguments: the loop guard stops identical calls.
        let params = json!({ "name": "slow", "arguments": { "ms": id, "then": "wait" },
                             "_meta": takes_tasks() });
        wire.send_request(id, "tools/call", params).await;
    }
    let (mut tasks, mut refused) = (Vec::new(), Vec::new());
    for id in 1..=max + 1 {
        let answer = wire
            .next_where(|m| m["id"] == id && m.get("method").is_none())
            .await;
        match answer["result"]["taskId"].as_str() {
            Some(task) => tasks.push(task.to_owned()),
            None => refused.push(answer),
        }
    }
    assert_eq!(tasks.len() as u64, max, "{:?}", refused.first());
    let message = refused[0]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("already has 64 tasks running"),
        "{message}"
    );
    // bob's own tasks are not counted against alice's.
    let mut bob = connect(&server, "bob").await;
    let his = call_slow(&mut bob, 1, json!({ "ms": 0, "then": "wait" })).await;
    assert_eq!(his["result"]["resultType"], "task", "{his}");
    let his = his["result"]["taskId"].as_str().unwrap().to_owned();
    task_request(&mut bob, 2, "tasks/cancel", &his).await;
    for (n, task) in tasks.iter().enumerate() {
        task_request(&mut wire, 1000 + n as u64, "tasks/cancel", task).await;
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn a_handshake_era_client_that_declares_the_extension_gets_tasks_too() {
    let (rt, _) = runtime().await;
    let server = McpServer::new(rt.clone());
    let mut wire = Wire::start(server.connection(Some(Arc::from("alice")), ToolFilter::all()));
    let init = wire
        .request(
            0,
            "initialize",
            json!({ "protocolVersion": "2025-11-25",
                    "capabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } },
                    "clientInfo": { "name": "wire-test", "version": "1" } }),
        )
        .await;
    let extensions = &init["result"]["capabilities"]["extensions"];
    assert!(
        extensions.get("io.modelcontextprotocol/tasks").is_some(),
        "{init}"
    );
    wire.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
        .await;
    let created = wire
        .request(
            1,
            "tools/call",
            json!({ "name": "slow", "arguments": { "ms": 800 } }),
        )
        .await;
    let task = created["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {created}"))
        .to_owned();
    let done = settled(&mut wire, 2, &task).await;
    assert_eq!(
        done["result"]["structuredContent"]["slept_ms"], 800,
        "{done}"
    );
    rt.shutdown().await;
}
