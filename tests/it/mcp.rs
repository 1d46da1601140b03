//! The MCP server on the wire, in both protocol eras: over an in-memory duplex (raw
//! newline-delimited JSON-RPC, as a stdio client speaks it) and over HTTP on 127.0.0.1:0.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use guildhall::mcp::http::{self, HttpOptions};
use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::{AgentSpec, CallContext, CallOptions, Outgoing, Runtime, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(10);

/// Reports progress 1, 2, 3 of 3, or waits until its call is cancelled.
struct Gate {
    cancelled: Arc<Notify>,
}

#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct GateInput {
    /// `progress` or `wait`.
    mode: String,
}

#[derive(Serialize, JsonSchema)]
struct GateOutput {
    done: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("cancelled")]
struct Cancelled;

impl Tool for Gate {
    type Input = GateInput;
    type Output = GateOutput;
    type Error = Cancelled;
    type State = ();
    fn name(&self) -> &str {
        "gate"
    }
    fn description(&self) -> &str {
        "Reports progress, or waits for cancellation."
    }
    async fn call(
        &self,
        _: &mut (),
        input: GateInput,
        ctx: CallContext,
    ) -> Result<GateOutput, Cancelled> {
        if input.mode == "wait" {
            ctx.cancellation().cancelled().await;
            self.cancelled.notify_one();
            return Err(Cancelled);
        }
        for step in 1..=3 {
            ctx.progress(f64::from(step), Some(3.0), Some("step"));
        }
        Ok(GateOutput { done: true })
    }
}

struct Tool2;
impl Tool for Tool2 {
    type Input = GateInput;
    type Output = GateOutput;
    type Error = Cancelled;
    type State = ();
    fn name(&self) -> &str {
        "late_tool"
    }
    fn description(&self) -> &str {
        "Registered after the client connected."
    }
    async fn call(
        &self,
        _: &mut (),
        _: GateInput,
        _: CallContext,
    ) -> Result<GateOutput, Cancelled> {
        Ok(GateOutput { done: true })
    }
}

pub(crate) async fn runtime() -> (Runtime, Arc<Notify>) {
    let cancelled = Arc::new(Notify::new());
    let rt = Runtime::builder()
        .tool(Gate {
            cancelled: Arc::clone(&cancelled),
        })
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("alice", "pm"))
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("bob", "dev").parent("alice"))
        .await
        .unwrap();
    (rt, cancelled)
}

/// A raw JSON-RPC client over one end of a duplex, the server on the other.
pub(crate) struct Wire {
    write: tokio::io::WriteHalf<DuplexStream>,
    lines: Lines<BufReader<tokio::io::ReadHalf<DuplexStream>>>,
    /// Messages read while looking for another one.
    seen: Vec<Value>,
    /// The 2026 `_meta` to stamp on requests, when speaking that era.
    meta: Option<Value>,
}

fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "wire-test", "version": "1" }
    })
}

impl Wire {
    pub(crate) fn start(server: McpServer) -> Self {
        let (client, served) = tokio::io::duplex(1 << 16);
        tokio::spawn(guildhall::mcp::serve_stream(
            server,
            tokio::io::split(served),
        ));
        let (read, write) = tokio::io::split(client);
        Self {
            write,
            lines: BufReader::new(read).lines(),
            seen: Vec::new(),
            meta: None,
        }
    }

    /// Connects in the handshake era (`initialize`).
    pub(crate) async fn legacy(server: McpServer) -> Self {
        let mut wire = Self::start(server);
        let init = wire
            .request(
                0,
                "initialize",
                json!({ "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": { "name": "wire-test", "version": "1" } }),
            )
            .await;
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
        wire.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await;
        wire
    }

    /// Speaks the stateless era: no handshake, `_meta` on every request.
    pub(crate) async fn stateless(server: McpServer) -> Self {
        let mut wire = Self::start(server);
        wire.meta = Some(meta_2026());
        let discover = wire.request(0, "server/discover", json!({})).await;
        let versions = discover["result"]["supportedVersions"].as_array().unwrap();
        assert!(versions.contains(&json!("2026-07-28")), "{discover}");
        assert!(versions.contains(&json!("2025-11-25")), "{discover}");
        wire
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.write.write_all(bytes).await.unwrap();
    }

    pub(crate) async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.write.write_all(&line).await.unwrap();
    }

    fn stamp(&self, mut params: Value) -> Value {
        if let Some(meta) = &self.meta {
            let mut merged = meta.clone();
            if let Some(extra) = params.get("_meta").and_then(Value::as_object) {
                for (k, v) in extra {
                    merged[k] = v.clone();
                }
            }
            params["_meta"] = merged;
        }
        params
    }

    pub(crate) async fn send_request(&mut self, id: u64, method: &str, params: Value) {
        let params = self.stamp(params);
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
    }

    pub(crate) async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send_request(id, method, params).await;
        self.next_where(|m| m["id"] == id && m.get("method").is_none())
            .await
    }

    /// The next message matching `want`, keeping the others for later.
    pub(crate) async fn next_where(&mut self, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(at) = self.seen.iter().position(&want) {
            return self.seen.remove(at);
        }
        loop {
            let line = tokio::time::timeout(LIMIT, self.lines.next_line())
                .await
                .expect("the server answers in time")
                .unwrap()
                .expect("the server keeps the stream open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if want(&message) {
                return message;
            }
            self.seen.push(message);
        }
    }

    /// Whether a message matching `want` was read while looking for others.
    pub(crate) fn seen_any(&self, want: impl Fn(&Value) -> bool) -> bool {
        self.seen.iter().any(want)
    }

    pub(crate) async fn call(&mut self, id: u64, tool: &str, arguments: Value) -> Value {
        self.request(
            id,
            "tools/call",
            json!({ "name": tool, "arguments": arguments }),
        )
        .await
    }
}

pub(crate) fn structured(response: &Value) -> &Value {
    let result = &response["result"];
    assert_eq!(result["isError"], false, "{response}");
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        text, result["structuredContent"],
        "the text block copies the structured result"
    );
    &result["structuredContent"]
}

async fn each_era(check: impl AsyncFn(Wire, &str)) {
    for era in ["2025-11-25", "2026-07-28"] {
        let (rt, _) = runtime().await;
        let server =
            McpServer::new(rt.clone()).connection(Some(Arc::from("alice")), ToolFilter::all());
        let wire = if era == "2026-07-28" {
            Wire::stateless(server).await
        } else {
            Wire::legacy(server).await
        };
        check(wire, era).await;
        rt.shutdown().await;
    }
}

#[tokio::test]
async fn tools_list_is_ordered_with_schemas_and_annotations() {
    each_era(async |mut wire, era| {
        let listed = wire.request(1, "tools/list", json!({})).await;
        let tools = listed["result"]["tools"].as_array().unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "{era}: deterministic name order");
        assert!(
            names.contains(&"gate") && names.contains(&"send_message"),
            "{era}: {names:?}"
        );
        let send = tools.iter().find(|t| t["name"] == "send_message").unwrap();
        assert_eq!(send["inputSchema"]["type"], "object");
        assert_eq!(send["outputSchema"]["type"], "object");
        let get = tools.iter().find(|t| t["name"] == "context_get").unwrap();
        assert_eq!(get["annotations"]["readOnlyHint"], true, "{get}");
        if era == "2026-07-28" {
            assert_eq!(listed["result"]["resultType"], "complete");
            assert!(listed["result"]["ttlMs"].is_u64(), "{listed}");
        } else {
            assert!(listed["result"].get("resultType").is_none(), "{listed}");
        }
        let bad = wire
            .request(2, "tools/list", json!({ "cursor": "nonsense" }))
            .await;
        assert_eq!(bad["error"]["code"], -32602, "{era}: {bad}");
    })
    .await;
}

/// An error the same call may not meet again (here a crash) carries `guildhall/transient`
/// beside its kind; a tool's own refusal carries its kind alone.
#[tokio::test]
async fn an_error_that_may_pass_is_marked_transient_for_the_client() {
    let (chaos, _) = crate::support::Chaos::new("chaos");
    let rt = Runtime::builder().tool(chaos).build().await.unwrap();
    rt.register_agent(AgentSpec::new("alice", "pm"))
        .await
        .unwrap();
    let server = McpServer::new(rt.clone()).connection(Some(Arc::from("alice")), ToolFilter::all());
    let mut wire = Wire::stateless(server).await;
    let crashed = wire.call(1, "chaos", json!({ "act": "panic" })).await;
    let meta = &crashed["result"]["_meta"];
    assert_eq!(meta["guildhall/error"], "crashed", "{crashed}");
    assert_eq!(meta["guildhall/transient"], true, "{crashed}");
    let refused = wire
        .call(2, "chaos", json!({ "act": "fail", "id": 1 }))
        .await;
    let meta = &refused["result"]["_meta"];
    assert_eq!(meta["guildhall/error"], "tool_error", "{refused}");
    assert!(meta.get("guildhall/transient").is_none(), "{refused}");
    rt.shutdown().await;
}

#[tokio::test]
async fn calls_act_as_the_bound_agent_and_errors_are_typed() {
    each_era(async |mut wire, era| {
        let sent = wire
            .call(1, "send_message", json!({ "to": "bob", "body": "hello" }))
            .await;
        assert_eq!(structured(&sent)["delivered_to"], json!(["bob"]), "{era}");

        // Bad arguments and business errors are results the model can read.
        let invalid = wire.call(2, "send_message", json!({ "bogus": true })).await;
        assert_eq!(invalid["result"]["isError"], true, "{era}: {invalid}");
        let text = invalid["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with("invalid_arguments:") && text.contains("bogus"),
            "{text}"
        );
        let unknown_agent = wire
            .call(3, "send_message", json!({ "to": "carol", "body": "x" }))
            .await;
        assert_eq!(
            unknown_agent["result"]["isError"], true,
            "{era}: {unknown_agent}"
        );
        assert!(
            unknown_agent["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("carol")
        );

        // An unknown tool is a protocol error.
        let missing = wire.call(4, "no_such_tool", json!({})).await;
        assert_eq!(missing["error"]["code"], -32602, "{era}: {missing}");
    })
    .await;
}

#[tokio::test]
async fn progress_reaches_a_request_with_a_progress_token() {
    each_era(async |mut wire, era| {
        let params = json!({ "name": "gate", "arguments": { "mode": "progress" },
                             "_meta": { "progressToken": "tok-1" } });
        wire.send_request(7, "tools/call", params).await;
        let done = wire.next_where(|m| m["id"] == 7).await;
        assert_eq!(structured(&done)["done"], true, "{era}");
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let note = wire
                .next_where(|m| m["method"] == "notifications/progress")
                .await;
            assert_eq!(note["params"]["progressToken"], "tok-1", "{era}: {note}");
            assert_eq!(note["params"]["total"], 3.0);
            seen.push(note["params"]["progress"].as_f64().unwrap());
        }
        assert_eq!(seen, vec![1.0, 2.0, 3.0], "{era}: increasing, in order");
    })
    .await;
}

#[tokio::test]
async fn cancellation_reaches_the_running_tool() {
    for era in ["2025-11-25", "2026-07-28"] {
        let (rt, cancelled) = runtime().await;
        let server =
            McpServer::new(rt.clone()).connection(Some(Arc::from("alice")), ToolFilter::all());
        let mut wire = if era == "2026-07-28" {
            Wire::stateless(server).await
        } else {
            Wire::legacy(server).await
        };
        let fired = cancelled.notified();
        wire.send_request(
            9,
            "tools/call",
            json!({ "name": "gate", "arguments": { "mode": "wait" } }),
        )
        .await;
        // Ask until the call is known to the server; a cancel for an unknown id is ignored.
        let mut params = json!({ "requestId": 9, "reason": "user pressed stop" });
        if let Some(meta) = &wire.meta {
            params["_meta"] = meta.clone();
        }
        let cancel =
            json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": params });
        tokio::pin!(fired);
        let until_fired = async {
            loop {
                wire.send(cancel.clone()).await;
                if tokio::time::timeout(Duration::from_millis(50), &mut fired)
                    .await
                    .is_ok()
                {
                    break;
                }
            }
        };
        tokio::time::timeout(LIMIT, until_fired)
            .await
            .unwrap_or_else(|_| panic!("{era}: the tool's cancellation token never fired"));
        rt.shutdown().await;
    }
}

#[tokio::test]
async fn tool_list_changes_are_announced() {
    let (rt, _) = runtime().await;
    let mut wire = Wire::legacy(McpServer::new(rt.clone())).await;
    // The handshake is done once a request has been answered after it.
    wire.request(1, "ping", json!({})).await;
    rt.register(Tool2).await.unwrap();
    wire.next_where(|m| m["method"] == "notifications/tools/list_changed")
        .await;
    let listed = wire.request(2, "tools/list", json!({})).await;
    assert!(listed.to_string().contains("late_tool"));
    rt.shutdown().await;

    // 2026: the notification arrives on a `subscriptions/listen` stream.
    let (rt, _) = runtime().await;
    let mut wire = Wire::stateless(McpServer::new(rt.clone())).await;
    wire.send_request(
        3,
        "subscriptions/listen",
        json!({ "notifications": { "toolsListChanged": true } }),
    )
    .await;
    wire.next_where(|m| m["method"] == "notifications/subscriptions/acknowledged")
        .await;
    rt.register(Tool2).await.unwrap();
    let note = wire
        .next_where(|m| m["method"] == "notifications/tools/list_changed")
        .await;
    assert!(note.to_string().contains("subscription"), "{note}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_filtered_tool_is_hidden_and_refused() {
    let (rt, _) = runtime().await;
    let filter = ToolFilter::parse("send_message,context_*").unwrap();
    let mut wire =
        Wire::legacy(McpServer::new(rt.clone()).connection(Some(Arc::from("bob")), filter)).await;
    let listed = wire.request(1, "tools/list", json!({})).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "context_get",
            "context_history",
            "context_update",
            "send_message"
        ]
    );
    let refused = wire.call(2, "gate", json!({ "mode": "progress" })).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not available")
    );
    rt.shutdown().await;
}

/// A server on 127.0.0.1:0 and its base URL.
async fn http_server(options: HttpOptions) -> (Runtime, String, CancellationToken) {
    let (rt, _) = runtime().await;
    let (url, stop) = crate::support::http_endpoint(&rt, options).await;
    (rt, url, stop)
}

fn post(
    client: &reqwest::Client,
    url: &str,
    method: &str,
    body: &Value,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .body(body.to_string())
}

/// The JSON-RPC response in a JSON or SSE body.
async fn rpc_body(response: reqwest::Response) -> Value {
    let text = response.text().await.unwrap();
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        return value;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC response in {text:?}"))
}

fn tools_call(id: u64, tool: &str, arguments: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": tool, "arguments": arguments, "_meta": meta_2026() } })
}

#[tokio::test]
async fn http_serves_2026_requests_as_the_named_agent() {
    let (rt, url, stop) = http_server(HttpOptions::default()).await;
    let client = crate::support::http_client();
    let body = tools_call(
        1,
        "send_message",
        json!({ "to": "bob", "body": "over http" }),
    );
    let response = post(&client, &url, "tools/call", &body)
        .header("mcp-name", "send_message")
        .header(guildhall::mcp::AGENT_HEADER, "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let answer = rpc_body(response).await;
    assert_eq!(
        structured(&answer)["delivered_to"],
        json!(["bob"]),
        "{answer}"
    );
    let inbox = rt
        .agent("bob")
        .unwrap()
        .check_inbox(Default::default())
        .await
        .unwrap();
    assert_eq!(&*inbox.messages[0].from.to_string(), "alice");

    // A new agent named by the header is registered with the role header's role.
    let body = tools_call(2, "send_message", json!({ "to": "alice", "body": "hi" }));
    let response = post(&client, &url, "tools/call", &body)
        .header("mcp-name", "send_message")
        .header(guildhall::mcp::AGENT_HEADER, "carol")
        .header(guildhall::mcp::ROLE_HEADER, "qa")
        .send()
        .await
        .unwrap();
    structured(&rpc_body(response).await);
    assert_eq!(rt.lookup_agent("carol").unwrap().role, "qa");
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn http_rejects_foreign_origins_hosts_and_bad_headers() {
    let (rt, url, stop) = http_server(HttpOptions::default()).await;
    let client = crate::support::http_client();
    let list = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": { "_meta": meta_2026() } });

    let ok = post(&client, &url, "tools/list", &list)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let local_origin = post(&client, &url, "tools/list", &list)
        .header("origin", "http://localhost:5173")
        .send()
        .await
        .unwrap();
    assert_eq!(local_origin.status(), 200);

    let evil_origin = post(&client, &url, "tools/list", &list)
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(evil_origin.status(), 403);
    let rebound_host = post(&client, &url, "tools/list", &list)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound_host.status(), 403);

    // 2026 header rules: Mcp-Method must match the body; an unknown version is refused.
    let mismatched = post(&client, &url, "prompts/list", &list)
        .send()
        .await
        .unwrap();
    assert_eq!(mismatched.status(), 400);
    assert_eq!(rpc_body(mismatched).await["error"]["code"], -32020);
    let call = tools_call(2, "gate", json!({ "mode": "progress" }));
    let no_name = post(&client, &url, "tools/call", &call)
        .send()
        .await
        .unwrap();
    assert_eq!(no_name.status(), 400, "tools/call needs Mcp-Name");
    let future = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2099-01-01")
        .header("mcp-method", "tools/list")
        .body(list.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(future.status(), 400);
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn http_requires_the_token_when_one_is_set_and_off_loopback() {
    let options = HttpOptions {
        token: Some("s3cret".into()),
        ..HttpOptions::default()
    };
    let (rt, url, stop) = http_server(options).await;
    let client = crate::support::http_client();
    let list = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": { "_meta": meta_2026() } });
    let anonymous = post(&client, &url, "tools/list", &list)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let wrong = post(&client, &url, "tools/list", &list)
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = post(&client, &url, "tools/list", &list)
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    stop.cancel();

    let open = "0.0.0.0:0".parse().unwrap();
    let refused = http::router(
        McpServer::new(rt.clone()),
        open,
        HttpOptions::default(),
        stop,
    );
    assert!(matches!(
        refused,
        Err(http::HttpError::TokenRequired { .. })
    ));
    rt.shutdown().await;
}

#[tokio::test]
async fn http_dropped_response_stream_cancels_the_call() {
    let (rt, cancelled) = runtime().await;
    let (url, stop) = crate::support::http_endpoint(&rt, HttpOptions::default()).await;
    let client = crate::support::http_client();
    let fired = cancelled.notified();
    let call = tools_call(1, "gate", json!({ "mode": "wait" }));
    let pending = post(&client, &url, "tools/call", &call)
        .header("mcp-name", "gate")
        .header(guildhall::mcp::AGENT_HEADER, "alice")
        .send();
    // The client gives up: the request (and its response stream) is dropped.
    let _ = tokio::time::timeout(Duration::from_millis(300), pending).await;
    tokio::time::timeout(LIMIT, fired)
        .await
        .expect("the tool's cancellation token fired");
    stop.cancel();
    rt.shutdown().await;
}

/// `guildhall send`, `inbox` and `status` reach a running server through its socket (the
/// store is the server's, so they could not open it themselves), and a second server for
/// the same data directory is refused.
#[tokio::test]
async fn the_cli_talks_to_a_running_server() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    let cli = |args: &[&str]| {
        let out = crate::support::guildhall(dir.path())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(cli(&["agents", "register", "pm", "--role", "pm"]).0);
    assert!(
        cli(&[
            "agents", "register", "dev", "--role", "dev", "--parent", "pm"
        ])
        .0
    );
    let mut server = crate::support::serve_in_background(dir.path());

    let (ok, receipt, err) = cli(&[
        "send",
        "--from",
        "pm",
        "--to",
        "dev",
        "--subject",
        "task",
        "--body",
        "do it",
    ]);
    assert!(ok, "{err}");
    let receipt: Value = serde_json::from_str(&receipt).unwrap();
    assert_eq!(receipt["delivered_to"], json!(["dev"]));
    let (ok, listed, err) = cli(&["inbox", "--agent", "dev", "--json", "--full", "--take"]);
    assert!(ok, "{err}");
    let message: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(
        (message["from"].as_str(), message["body"].as_str()),
        (Some("pm"), Some("do it"))
    );
    let (_, after, _) = cli(&["inbox", "--agent", "dev", "--json"]);
    assert!(after.trim().is_empty(), "--take marked it read: {after}");
    let (ok, _, err) = cli(&["send", "--from", "pm", "--to", "nobody", "--body", "x"]);
    assert!(!ok && err.contains("nobody"), "{err}");

    let (ok, _, err) = cli(&["serve", "--no-http"]);
    assert!(
        !ok && err.contains("already running"),
        "a second server is refused: {err}"
    );

    let term = Command::new("kill")
        .arg(server.id().to_string())
        .status()
        .unwrap();
    assert!(term.success());
    assert!(server.wait().success(), "SIGTERM stops the server cleanly");
    assert!(
        !dir.path().join("guildhall.sock").exists(),
        "the socket is removed"
    );
}

#[tokio::test]
async fn approvals_are_asked_through_elicitation() {
    let mut config = guildhall::governance::GovernanceConfig::default();
    config.roles.insert(
        "pm".into(),
        guildhall::governance::Principal {
            trust: None,
            rules: vec![
                guildhall::governance::Rule::new(
                    "send_message",
                    guildhall::governance::Action::Ask,
                )
                .unwrap(),
            ],
            role: None,
        },
    );
    let rt = Runtime::builder().governance(config).build().await.unwrap();
    rt.register_agent(AgentSpec::new("alice", "pm"))
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("bob", "dev"))
        .await
        .unwrap();
    let server = McpServer::new(rt.clone());
    let send = |n: u32| json!({ "to": "bob", "subject": format!("task {n}"), "body": "go" });

    // A client that can be asked: the call waits for the user's answer.
    let mut wire = Wire::start(server.connection(Some(Arc::from("alice")), ToolFilter::all()));
    let init = wire
        .request(
            0,
            "initialize",
            json!({ "protocolVersion": "2025-11-25", "capabilities": { "elicitation": {} },
                    "clientInfo": { "name": "wire-test", "version": "1" } }),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    wire.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
        .await;
    for (id, answer, approved) in [
        (
            1,
            json!({ "action": "accept", "content": { "approve": "once" } }),
            true,
        ),
        (2, json!({ "action": "decline" }), false),
        (
            3,
            json!({ "action": "accept", "content": { "approve": "deny" } }),
            false,
        ),
    ] {
        wire.send_request(
            id,
            "tools/call",
            json!({ "name": "send_message", "arguments": send(id as u32) }),
        )
        .await;
        let ask = wire
            .next_where(|m| m["method"] == "elicitation/create")
            .await;
        let message = ask["params"]["message"].as_str().unwrap();
        assert!(
            message.contains("alice wants to call `send_message`"),
            "{message}"
        );
        assert!(
            message.contains("role rule `send_message → ask`"),
            "{message}"
        );
        wire.send(json!({ "jsonrpc": "2.0", "id": ask["id"], "result": answer }))
            .await;
        let reply = wire
            .next_where(|m| m["id"] == id && m.get("method").is_none())
            .await;
        assert_eq!(reply["result"]["isError"], !approved, "{reply}");
    }

    // A client that cannot be asked is told how to allow the call.
    let mut plain =
        Wire::legacy(server.connection(Some(Arc::from("alice")), ToolFilter::all())).await;
    let reply = plain.call(1, "send_message", send(9)).await;
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    let text = reply["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("denied: "), "{text}");
    assert!(text.contains("[[agents.alice.rules]]"), "{text}");
    rt.shutdown().await;
}

#[tokio::test]
async fn every_message_that_cannot_be_taken_is_answered() {
    each_era(async |mut wire, era| {
        // Not JSON, not UTF-8, nested too deep, too long: parse errors, id null.
        let deep = format!("{}{}\n", "[".repeat(5_000), "]".repeat(5_000));
        let long = format!("\"{}\"\n", "x".repeat(5 * 1024 * 1024));
        for bad in [
            b"{not json\n".to_vec(),
            b"\"\xff\xfe\"\n".to_vec(),
            deep.into_bytes(),
            long.into_bytes(),
        ] {
            wire.send_raw(&bad).await;
            let answer = wire.next_where(|m| m["error"]["code"] == -32700).await;
            assert_eq!(answer["id"], Value::Null, "{era}: {answer}");
        }
        // A request past the limit: -32600 with its id, wherever the id stands.
        let pad = "x".repeat(5 * 1024 * 1024);
        for (id, line) in [
            (
                39,
                format!(
                    r#"{{"jsonrpc":"2.0","method":"ping","params":{{"pad":"{pad}"}},"id":39}}"#
                ),
            ),
            (
                40,
                format!(
                    r#"{{"id":40,"jsonrpc":"2.0","method":"ping","params":{{"pad":"{pad}"}}}}"#
                ),
            ),
        ] {
            wire.send_raw(format!("{line}\n").as_bytes()).await;
            let answer = wire.next_where(|m| m["id"] == id).await;
            assert_eq!(answer["error"]["code"], -32600, "{era}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("longer than the limit of 4194304"),
                "{era}: {message}"
            );
        }
        // An invalid request with a readable id: -32600 with that id.
        wire.send(json!({"jsonrpc": "1.0", "id": 41, "method": "ping"}))
            .await;
        let answer = wire.next_where(|m| m["id"] == 41).await;
        assert_eq!(answer["error"]["code"], -32600, "{era}: {answer}");
        // tools/call with a non-string name, or arguments that are not an object: -32602.
        wire.send(json!({"jsonrpc": "2.0", "id": 42, "method": "tools/call",
                         "params": {"name": 7}}))
            .await;
        let answer = wire.next_where(|m| m["id"] == 42).await;
        assert_eq!(answer["error"]["code"], -32602, "{era}: {answer}");
        wire.send(json!({"jsonrpc": "2.0", "id": 43, "method": "tools/call",
                         "params": {"name": "check_inbox", "arguments": [1]}}))
            .await;
        let answer = wire.next_where(|m| m["id"] == 43).await;
        assert_eq!(answer["error"]["code"], -32602, "{era}: {answer}");
        // The connection still serves.
        let ok = wire.call(44, "check_inbox", json!({})).await;
        assert_eq!(ok["result"]["isError"], false, "{era}: {ok}");
    })
    .await;
}

fn initialize_body(id: u64) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "initialize",
            "params": { "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": { "name": "http-test", "version": "1" } } })
}

fn legacy_post(
    client: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body)
}

#[tokio::test]
async fn http_answers_bad_bodies_with_a_status_and_a_json_rpc_error() {
    let (rt, url, stop) = http_server(HttpOptions::default()).await;
    let client = crate::support::http_client();
    let garbled = legacy_post(&client, &url, "{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(garbled.status(), 400);
    let body = rpc_body(garbled).await;
    assert_eq!(body["error"]["code"], -32700, "{body}");
    let bad_name =
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": 1}});
    let answer = legacy_post(&client, &url, bad_name.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let body = rpc_body(answer).await;
    assert_eq!(
        (body["id"].clone(), body["error"]["code"].clone()),
        (json!(9), json!(-32602))
    );
    // An oversized body is read and answered, not cut off with a reset connection.
    let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(6 * 1024 * 1024));
    let too_big = legacy_post(&client, &url, huge)
        .send()
        .await
        .expect("an answer, not a reset");
    assert_eq!(too_big.status(), 413);
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn an_http_agent_is_registered_at_initialize_with_its_role_and_parent() {
    let (rt, url, stop) = http_server(HttpOptions::default()).await;
    let client = crate::support::http_client();
    let response = legacy_post(&client, &url, initialize_body(0).to_string())
        .header("guildhall-agent", "web-dev")
        .header("guildhall-role", "dev")
        .header("guildhall-parent", "lead")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let init = rpc_body(response).await;
    // Registered before any call, its parent not registered yet.
    let record = rt
        .lookup_agent("web-dev")
        .expect("registered at initialize");
    assert_eq!(record.role, "dev");
    assert_eq!(record.parent.as_ref().unwrap().as_str(), "lead");
    let instructions = init["result"]["instructions"].as_str().unwrap();
    assert!(
        instructions.contains("You are agent `web-dev` in role `dev`, reporting to `lead`"),
        "{instructions}"
    );
    // Without the header the instructions say how to name one.
    let anonymous = rpc_body(
        legacy_post(&client, &url, initialize_body(1).to_string())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        anonymous["result"]["instructions"]
            .as_str()
            .unwrap()
            .contains("`Guildhall-Agent` header"),
        "{anonymous}"
    );
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn http_session_delete_answers_204_and_404_for_an_unknown_session() {
    let (rt, url, stop) = http_server(HttpOptions::default()).await;
    let client = crate::support::http_client();
    let response = legacy_post(&client, &url, initialize_body(0).to_string())
        .send()
        .await
        .unwrap();
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let delete = |id: String| client.delete(&url).header("mcp-session-id", id).send();
    assert_eq!(delete(session.clone()).await.unwrap().status(), 204);
    assert_eq!(delete(session).await.unwrap().status(), 404);
    assert_eq!(
        delete("no-such-session".into()).await.unwrap().status(),
        404
    );
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn http_sessions_are_capped_with_a_retry_after() {
    let options = HttpOptions {
        max_sessions: 3,
        ..HttpOptions::default()
    };
    let (rt, url, stop) = http_server(options).await;
    let client = crate::support::http_client();
    let mut sessions = Vec::new();
    for id in 0..3 {
        let response = legacy_post(&client, &url, initialize_body(id).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        sessions.push(
            response.headers()["mcp-session-id"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    let over = legacy_post(&client, &url, initialize_body(3).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(over.status(), 503);
    assert!(over.headers().contains_key("retry-after"));
    let body = rpc_body(over).await;
    assert!(
        body["error"]["message"].as_str().unwrap().contains("limit"),
        "{body}"
    );
    // A session closed by its client makes room.
    let closed = client
        .delete(&url)
        .header("mcp-session-id", &sessions[0])
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    crate::support::eventually(LIMIT, || async {
        legacy_post(&client, &url, initialize_body(4).to_string())
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn http_off_loopback_with_a_token_accepts_any_host_and_refuses_an_empty_token() {
    let (rt, _) = runtime().await;
    let empty = http::router(
        McpServer::new(rt.clone()),
        "0.0.0.0:7077".parse().unwrap(),
        HttpOptions {
            token: Some("  ".into()),
            ..HttpOptions::default()
        },
        CancellationToken::new(),
    );
    assert!(matches!(empty, Err(http::HttpError::EmptyToken)));
    // Bound to every address (the listener here is loopback, the router is told otherwise).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let router = http::router(
        McpServer::new(rt.clone()),
        format!("0.0.0.0:{}", addr.port()).parse().unwrap(),
        HttpOptions {
            token: Some("s3cret".into()),
            ..HttpOptions::default()
        },
        stop.clone(),
    )
    .unwrap();
    tokio::spawn(http::serve(listener, router, stop.clone()));
    let url = format!("http://{addr}{}", http::PATH);
    let client = crate::support::http_client();
    let response = legacy_post(&client, &url, initialize_body(1).to_string())
        .header("host", "build-box.internal:7077")
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn an_mcp_call_that_names_no_agent_is_refused_and_says_how_to_name_one() {
    let (rt, url, stop) = http_server(HttpOptions::default()).await;
    let client = crate::support::http_client();
    let call = tools_call(1, "check_inbox", json!({}));
    let refused = rpc_body(
        post(&client, &url, "tools/call", &call)
            .header("mcp-name", "check_inbox")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Guildhall-Agent") || message.contains("guildhall-agent"),
        "{refused}"
    );
    assert!(message.contains("GUILDHALL_AGENT"), "{refused}");
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn a_claimed_role_never_raises_trust_and_a_given_role_cannot_be_changed() {
    use guildhall::governance::{GovernanceConfig, Principal, Trust};
    let mut config = GovernanceConfig {
        trust: Trust::ReadOnly,
        ..GovernanceConfig::default()
    };
    config.roles.insert(
        "tl".into(),
        Principal {
            trust: Some(Trust::Autonomous),
            ..Principal::default()
        },
    );
    config.agents.insert(
        "tl".into(),
        Principal {
            role: Some("tl".into()),
            ..Principal::default()
        },
    );
    let rt = Runtime::builder().governance(config).build().await.unwrap();
    let (url, stop) = crate::support::http_endpoint(&rt, HttpOptions::default()).await;
    let client = crate::support::http_client();
    let send = |agent: &'static str, role: &'static str| {
        let call = tools_call(1, "send_message", json!({"to": "tl", "body": "hi"}));
        post(&client, &url, "tools/call", &call)
            .header("mcp-name", "send_message")
            .header(guildhall::mcp::AGENT_HEADER, agent)
            .header(guildhall::mcp::ROLE_HEADER, role)
            .send()
    };
    // The config gives `tl` its role: it writes.
    let sent = rpc_body(send("tl", "tl").await.unwrap()).await;
    assert_eq!(sent["result"]["isError"], false, "{sent}");
    // A newcomer claiming `tl` stays at the default trust (read-only): refused.
    let claimed = rpc_body(send("mallory", "tl").await.unwrap()).await;
    assert_eq!(claimed["result"]["isError"], true, "{claimed}");
    // Nor can `tl` be registered under another role.
    let rerole = rpc_body(send("tl", "intern").await.unwrap()).await;
    assert!(
        rerole["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("role `tl`"),
        "{rerole}"
    );
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn an_agent_with_a_token_is_usable_only_with_it() {
    let rt = Runtime::builder()
        .credentials(guildhall::agents::Credentials::new([(
            "tl".to_owned(),
            "tl-secret".to_owned(),
        )]))
        .build()
        .await
        .unwrap();
    let (url, stop) = crate::support::http_endpoint(&rt, HttpOptions::default()).await;
    let client = crate::support::http_client();
    let inbox = |token: Option<&'static str>| {
        let call = tools_call(1, "check_inbox", json!({}));
        let mut request = post(&client, &url, "tools/call", &call)
            .header("mcp-name", "check_inbox")
            .header(guildhall::mcp::AGENT_HEADER, "tl");
        if let Some(token) = token {
            request = request.header(guildhall::agents::TOKEN_HEADER, token);
        }
        request.send()
    };
    let none = rpc_body(inbox(None).await.unwrap()).await;
    assert!(
        none["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("protected by a token"),
        "{none}"
    );
    let wrong = rpc_body(inbox(Some("guess")).await.unwrap()).await;
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not its token"),
        "{wrong}"
    );
    let right = rpc_body(inbox(Some("tl-secret")).await.unwrap()).await;
    assert_eq!(right["result"]["isError"], false, "{right}");
    stop.cancel();
    rt.shutdown().await;
}

/// A token in the config protects the agent on the local socket too: the CLI (and
/// `guildhall mcp`) pass `GUILDHALL_AGENT_TOKEN`; the store and the socket are private.
#[tokio::test]
async fn the_socket_admits_a_protected_agent_only_with_its_token() {
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cli = |args: &[&str], token: Option<&str>| {
        let mut command = crate::support::guildhall(&data);
        command.args(args).env_remove("GUILDHALL_AGENT_TOKEN");
        if let Some(token) = token {
            command.env("GUILDHALL_AGENT_TOKEN", token);
        }
        let out = command.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The first command creates the data directory and the store.
    assert!(cli(&["agents", "register", "tl", "--role", "tl"], None).0);
    std::fs::write(data.join("tl.token"), "tl-secret\n").unwrap();
    std::fs::write(
        data.join("guildhall.toml"),
        "[agents.tl]\nrole = \"tl\"\ntoken_file = \"tl.token\"\n",
    )
    .unwrap();
    let mut server = crate::support::serve_in_background(&data);
    let send = ["send", "--from", "tl", "--to", "tl", "--body", "note"];
    let (ok, err) = cli(&send, None);
    assert!(!ok && err.contains("protected by a token"), "{err}");
    let (ok, err) = cli(&send, Some("guess"));
    assert!(!ok && err.contains("not its token"), "{err}");
    let (ok, err) = cli(&send, Some("tl-secret"));
    assert!(ok, "{err}");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "the data directory is private");
    assert_eq!(
        mode(&data.join("guildhall.redb")),
        0o600,
        "the store is private"
    );
    assert_eq!(
        mode(&data.join("guildhall.sock")) & 0o077,
        0,
        "the socket is private"
    );
    let term = Command::new("kill")
        .arg(server.id().to_string())
        .status()
        .unwrap();
    assert!(term.success());
    assert!(server.wait().success());
}

#[tokio::test]
async fn an_image_read_reaches_the_client_as_an_image_whole() {
    let dir = tempfile::tempdir().unwrap();
    // A PNG signature and 100 KiB after it: over the 50 KiB a text result is cut at.
    let mut png = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    png.extend((0..100 * 1024).map(|i| (i % 251) as u8));
    std::fs::write(dir.path().join("shot.png"), &png).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
    let files = guildhall::files::Files::open(&guildhall::files::FilesConfig {
        roots: vec![dir.path().to_owned()],
        ..Default::default()
    })
    .unwrap();
    let rt = Runtime::builder().files(&files).build().await.unwrap();
    rt.register_agent(AgentSpec::new("alice", "dev"))
        .await
        .unwrap();
    let server = McpServer::new(rt.clone()).connection(Some(Arc::from("alice")), ToolFilter::all());
    let mut wire = Wire::legacy(server).await;
    let image = wire
        .call(1, "read_file", json!({ "path": "shot.png" }))
        .await;
    let block = &image["result"]["content"][0];
    assert_eq!(block["type"], "image", "{image}");
    assert_eq!(block["mimeType"], "image/png");
    let data = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        block["data"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(data, png, "the whole image, not cut");
    assert!(
        image["result"].get("structuredContent").is_none(),
        "{image}"
    );
    let text = wire
        .call(2, "read_file", json!({ "path": "notes.txt" }))
        .await;
    assert_eq!(
        text["result"]["content"][0]["text"], "     1\thello\n",
        "{text}"
    );
    rt.shutdown().await;
}

/// The value of the one sample named `metric` whose labels include `labels`.
fn sample(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::Value as V;
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match &s.value {
            V::Counter(v) | V::Gauge(v) | V::Untyped(v) => Some(*v),
            V::Histogram(buckets) => buckets.last().map(|b| b.count),
            V::Summary(_) => None,
        })
}

#[tokio::test]
async fn http_serves_metrics_a_prometheus_parser_reads() {
    let (rt, _) = runtime().await;
    let options = HttpOptions {
        metrics: Some(guildhall::observe::Metrics::start(&rt)),
        ..HttpOptions::default()
    };
    let (url, stop) = crate::support::http_endpoint(&rt, options).await;
    let metrics_url = url.replace(http::PATH, http::METRICS_PATH);
    let alice = crate::support::as_agent(&rt, "alice");
    rt.call_json("gate", json!({ "mode": "progress" }), alice.clone())
        .await
        .unwrap();
    let refused = rt.call_json("gate", json!({ "mode": 7 }), alice).await;
    assert!(refused.is_err());
    rt.agent("alice")
        .unwrap()
        .send(guildhall::Outgoing::to("bob").subject("hi").body("x"))
        .await
        .unwrap();
    rt.sessions()
        .open("plan", Some("alice"))
        .await
        .unwrap()
        .replace("goal", json!("ship"))
        .await
        .unwrap();
    let client = crate::support::http_client();
    // The aggregator follows the events on its own task: the scrape shows them soon after.
    let what = "the scrape shows the message sent";
    let scrape = crate::support::eventually_some(Duration::from_secs(10), what, async || {
        let response = client.get(&metrics_url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        let text = response.text().await.unwrap();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let parsed =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        (sample(&parsed, "guildhall_messages_total", &[]) == Some(1.0)
            && sample(&parsed, "guildhall_context_batches_total", &[]) == Some(1.0))
        .then_some(parsed)
    })
    .await;
    let ok = [("tool", "gate"), ("outcome", "ok")];
    assert_eq!(sample(&scrape, "guildhall_calls_total", &ok), Some(1.0));
    let bad = [("tool", "gate"), ("outcome", "invalid_arguments")];
    assert_eq!(sample(&scrape, "guildhall_calls_total", &bad), Some(1.0));
    assert_eq!(
        sample(
            &scrape,
            "guildhall_call_duration_seconds_count",
            &[("tool", "gate")]
        ),
        Some(1.0)
    );
    assert_eq!(sample(&scrape, "guildhall_agents", &[]), Some(2.0));
    // Calls are counted by the calls themselves: none is lost, even when more end at once
    // than the event stream keeps for a subscriber that falls behind.
    let burst = 5_000;
    // Made by no agent: the loop guard would stop one agent repeating a call.
    let calls =
        (0..burst).map(|_| rt.call_json("gate", json!({ "mode": "progress" }), CallOptions::new()));
    for result in futures::future::join_all(calls).await {
        result.unwrap();
    }
    let text = client
        .get(&metrics_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let after = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    assert_eq!(
        sample(&after, "guildhall_calls_total", &ok),
        Some(f64::from(burst + 1)),
        "{text}"
    );
    assert_eq!(
        sample(
            &after,
            "guildhall_call_duration_seconds_count",
            &[("tool", "gate")]
        ),
        Some(f64::from(burst + 1))
    );
    assert_eq!(
        sample(&scrape, "guildhall_message_deliveries_total", &[]),
        Some(1.0)
    );
    // Read at the scrape: each inbox's depth, sessions, the store's commits.
    let unread = |agent| sample(&scrape, "guildhall_mailbox_unread", &[("agent", agent)]);
    assert_eq!((unread("bob"), unread("alice")), (Some(1.0), Some(0.0)));
    assert_eq!(sample(&scrape, "guildhall_sessions", &[]), Some(1.0));
    assert!(sample(&scrape, "guildhall_store_commits_total", &[]).is_some_and(|n| n >= 2.0));
    assert!(sample(&scrape, "guildhall_store_commit_seconds_total", &[]).is_some());
    assert_eq!(
        sample(&scrape, "guildhall_store_failed_commits_total", &[]),
        Some(0.0)
    );
    // A page that rebinds a name to 127.0.0.1 cannot read them.
    let foreign = client
        .get(&metrics_url)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    stop.cancel();
    rt.shutdown().await;
}

/// Reads server-sent events from `response` until `enough` holds of the events so far.
async fn sse_until(
    response: &mut reqwest::Response,
    enough: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut text = String::new();
    let mut events = Vec::new();
    while !enough(&events) {
        let chunk = tokio::time::timeout(LIMIT, response.chunk())
            .await
            .expect("events in time")
            .unwrap()
            .expect("the stream stays open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            for data in block.lines().filter_map(|l| l.strip_prefix("data:")) {
                events.push(serde_json::from_str(data.trim()).unwrap());
            }
        }
    }
    events
}

#[tokio::test]
async fn http_streams_events_each_agent_sees_only_its_share_of() {
    let (rt, _) = runtime().await;
    let (url, stop) = crate::support::http_endpoint(&rt, HttpOptions::default()).await;
    let events_url = url.replace(http::PATH, http::EVENTS_PATH);
    let client = crate::support::http_client();
    let open = |agent: Option<&str>| {
        let mut request = client.get(&events_url);
        if let Some(agent) = agent {
            request = request.header("guildhall-agent", agent);
        }
        request.send()
    };
    let mut bob = open(Some("bob")).await.unwrap();
    assert_eq!(bob.status(), 200);
    assert!(
        bob.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    // A second stream of bob's follows the same rendering of bob's share.
    let mut bob_again = open(Some("bob")).await.unwrap();
    let mut operator = open(None).await.unwrap();
    let alice = crate::support::as_agent(&rt, "alice");
    rt.call_json("gate", json!({ "mode": "progress" }), alice)
        .await
        .unwrap();
    rt.agent("alice")
        .unwrap()
        .send(guildhall::Outgoing::to("bob").subject("parse").body("go"))
        .await
        .unwrap();
    let as_bob = crate::support::as_agent(&rt, "bob");
    rt.call_json("gate", json!({ "mode": "progress" }), as_bob)
        .await
        .unwrap();
    let done = |events: &[Value]| events.iter().filter(|e| e["event"] == "completed").count();
    let seen = sse_until(&mut bob, |events| done(events) >= 1).await;
    let kinds: Vec<&str> = seen.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["mailed", "invoked", "completed"], "{seen:?}");
    assert_eq!(seen[0]["from"], "alice");
    assert_eq!(seen[1]["agent"], "bob");
    let again = sse_until(&mut bob_again, |events| done(events) >= 1).await;
    assert_eq!(again, seen, "both of bob's streams show the same");
    let all = sse_until(&mut operator, |events| done(events) >= 2).await;
    assert!(
        all.iter()
            .any(|e| e["event"] == "invoked" && e["agent"] == "alice"),
        "the operator sees every call: {all:?}"
    );
    let unknown = open(Some("nobody")).await.unwrap();
    assert_eq!(unknown.status(), 404);
    let foreign = client
        .get(&events_url)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    stop.cancel();
    rt.shutdown().await;
}

/// An HTTP endpoint serving the dashboard: its base URL (no path) and its stop.
async fn dashboard_endpoint(rt: &Runtime) -> (String, CancellationToken) {
    let options = HttpOptions {
        dashboard: Some(guildhall::mcp::local::Control::default()),
        ..HttpOptions::default()
    };
    let (url, stop) = crate::support::http_endpoint(rt, options).await;
    (url.trim_end_matches(http::PATH).to_owned(), stop)
}

#[tokio::test]
async fn http_serves_the_dashboard_and_the_status_it_reads() {
    let (rt, _) = runtime().await;
    let (base, stop) = dashboard_endpoint(&rt).await;
    let client = crate::support::http_client();
    let page = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'self'")
    );
    let html = page.text().await.unwrap();
    for part in [
        "id=\"swarm\"",
        "id=\"supervision\"",
        "id=\"mail\"",
        "EventSource(\"events\")",
    ] {
        assert!(html.contains(part), "the page has {part}");
    }
    // bob (under alice) is connected: the status says so.
    let server = McpServer::new(rt.clone());
    let _bob = server.connection(Some(Arc::from("bob")), ToolFilter::all());
    let status = client
        .get(format!("{base}{}", http::STATUS_PATH))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let status: Value = serde_json::from_str(&status).unwrap();
    let bob = status["agent_list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == "bob")
        .unwrap();
    assert_eq!(
        (&bob["parent"], &bob["connections"]),
        (&json!("alice"), &json!(1))
    );
    assert!(status["tree"]["children"].is_array(), "{status}");
    let foreign = client
        .get(format!("{base}/"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    stop.cancel();
    rt.shutdown().await;
}

/// A GET of `url`: its status and text.
async fn status_and_text(client: &reqwest::Client, url: String) -> (u16, String) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test]
async fn the_dashboard_reads_sessions_their_history_and_what_a_version_changed() {
    let (rt, _) = runtime().await;
    let (base, stop) = dashboard_endpoint(&rt).await;
    let client = crate::support::http_client();
    let get = |path: String| status_and_text(&client, format!("{base}{path}"));
    let mut events = rt.governance().events();
    let plan = rt.sessions().open("plan", Some("alice")).await.unwrap();
    plan.replace("goal", json!({"ship": "v1", "owner": "alice"}))
        .await
        .unwrap();
    plan.merge("goal", json!({"ship": "v2"})).await.unwrap();
    plan.replace("notes", json!("draft")).await.unwrap();
    let changed = events.next().await.unwrap();
    assert_eq!(
        serde_json::to_value(&changed).unwrap(),
        json!({"event": "context_changed", "session": "plan", "version": 1, "author": "alice", "keys": ["goal"]})
    );

    let (status, list) = get(http::SESSIONS_PATH.to_owned()).await;
    assert_eq!(status, 200);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(
        (&list["total"], &list["sessions"][0]["id"]),
        (&json!(1), &json!("plan"))
    );

    let (status, session) = get(format!("{}/plan", http::SESSIONS_PATH)).await;
    assert_eq!(status, 200);
    let session: Value = serde_json::from_str(&session).unwrap();
    assert_eq!(session["info"]["version"], 3);
    assert_eq!(
        session["entries"]["entries"][0]["value"],
        json!({"ship": "v2", "owner": "alice"})
    );
    let versions: Vec<&Value> = session["history"]["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["version"])
        .collect();
    assert_eq!(versions, [&json!(1), &json!(2), &json!(3)]);

    let (status, v2) = get(format!("{}/plan/versions/2", http::SESSIONS_PATH)).await;
    assert_eq!(status, 200);
    let v2: Value = serde_json::from_str(&v2).unwrap();
    assert_eq!(v2["batch"]["changes"][0]["strategy"], "merge");
    assert_eq!(v2["before"]["entries"][0]["value"]["ship"], "v1");
    assert_eq!(v2["after"]["entries"][0]["value"]["ship"], "v2");

    // What does not exist is named, with the status that says so.
    let (status, body) = get(format!("{}/plan/versions/9", http::SESSIONS_PATH)).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains('9') && body.contains('3'), "{body}");
    let (status, body) = get(format!("{}/nope", http::SESSIONS_PATH)).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("nope"), "{body}");
    let (status, _) = get(format!("{}/plan/versions/x", http::SESSIONS_PATH)).await;
    assert_eq!(status, 400);

    // Every observer route checks the Host, as the page does.
    for path in [
        http::SESSIONS_PATH.to_owned(),
        format!("{}/plan", http::SESSIONS_PATH),
        format!("{}/alice/mail", http::AGENTS_PATH),
        http::STATUS_PATH.to_owned(),
        http::EVENTS_PATH.to_owned(),
    ] {
        let foreign = client
            .get(format!("{base}{path}"))
            .header("host", "evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(foreign.status(), 403, "{path}");
        // And the Origin: a page of another site reading them is refused, as on /mcp.
        let cross = client
            .get(format!("{base}{path}"))
            .header("origin", "https://evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(cross.status(), 403, "{path}");
    }
    stop.cancel();
    rt.shutdown().await;
}

/// An agent's token protects its mail on the dashboard too: without the listener's token
/// (every local process reaches a loopback dashboard, agents' commands among them), a
/// protected agent's mail needs its own token, and the operator's event stream, which shows
/// every agent's calls and mail, is refused while any agent has a token.
#[tokio::test]
async fn a_token_protects_its_agents_mail_and_events_on_the_dashboard() {
    let rt = Runtime::builder()
        .credentials(guildhall::agents::Credentials::new([(
            "pm".to_owned(),
            "pm-secret".to_owned(),
        )]))
        .build()
        .await
        .unwrap();
    for id in ["pm", "dev"] {
        rt.register_agent(guildhall::AgentSpec::new(id, "dev"))
            .await
            .unwrap();
    }
    rt.agent("dev")
        .unwrap()
        .send(Outgoing::to("pm").subject("private").body("for pm only"))
        .await
        .unwrap();
    let (base, stop) = dashboard_endpoint(&rt).await;
    let client = crate::support::http_client();
    let mail = |agent: &str, token: Option<&str>| {
        let mut request = client.get(format!("{base}{}/{agent}/mail", http::AGENTS_PATH));
        if let Some(token) = token {
            request = request.header("guildhall-agent-token", token);
        }
        request.send()
    };
    let refused = mail("pm", None).await.unwrap();
    assert_eq!(refused.status(), 403);
    let said = refused.text().await.unwrap();
    assert!(
        said.contains("has a token") && !said.contains("for pm only"),
        "{said}"
    );
    assert_eq!(mail("pm", Some("wrong")).await.unwrap().status(), 403);
    let shown = mail("pm", Some("pm-secret")).await.unwrap();
    assert_eq!(shown.status(), 200);
    assert!(shown.text().await.unwrap().contains("for pm only"));
    assert_eq!(mail("dev", None).await.unwrap().status(), 200);
    // The history and its search leave out mail to or from a protected agent.
    rt.agent("dev")
        .unwrap()
        .send(Outgoing::to("dev").subject("public").body("a note to self"))
        .await
        .unwrap();
    let history =
        |query: &str| status_and_text(&client, format!("{base}{}?{query}", http::MAIL_PATH));
    for query in ["", "q=for+pm", "q=from%3Adev", "q=public"] {
        let (status, body) = history(query).await;
        assert_eq!(status, 200, "{query}: {body}");
        assert!(!body.contains("for pm only"), "{query}: {body}");
    }
    let (_, hidden) = history("q=for+pm").await;
    let hidden: Value = serde_json::from_str(&hidden).unwrap();
    assert_eq!(hidden["matched"], 0, "not even counted: {hidden}");
    let (_, public) = history("q=note%20self").await;
    let public: Value = serde_json::from_str(&public).unwrap();
    assert_eq!(public["matched"], 1, "{public}");
    assert_eq!(public["messages"][0]["body"], "a note to self", "{public}");
    for (query, named) in [
        ("limit=0", "limit `0` is not 1 to 200"),
        ("before=x", "before `x` is not a message id"),
        ("sort=new", "unknown parameter `sort`"),
        ("q=thread%3Ax", "`x` is not a message id"),
    ] {
        let (status, body) = history(query).await;
        assert_eq!(
            (status, body.contains(named)),
            (400, true),
            "{query}: {body}"
        );
    }
    let events = client
        .get(format!("{base}{}", http::EVENTS_PATH))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 403);
    assert!(events.text().await.unwrap().contains("--token"));
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn the_dashboard_reads_an_agents_mail_a_thread_and_a_sent_messages_fate_without_marking_anything_read()
 {
    let (rt, _) = runtime().await;
    let (base, stop) = dashboard_endpoint(&rt).await;
    let client = crate::support::http_client();
    let get = |path: String| status_and_text(&client, format!("{base}{}{path}", http::AGENTS_PATH));
    let bob = rt.agent("bob").unwrap();
    let alice = rt.agent("alice").unwrap();
    let asked = bob
        .send(
            Outgoing::to("alice")
                .subject("logs?")
                .body("where are they"),
        )
        .await
        .unwrap();
    bob.send(Outgoing::to("alice").subject("other").body("unrelated"))
        .await
        .unwrap();
    let question = alice.read(asked.id).await.unwrap();
    alice
        .reply(
            &question,
            Outgoing::default().subject("re").body("in /var/log"),
        )
        .await
        .unwrap();

    let (status, inbox) = get("/alice/mail".into()).await;
    assert_eq!(status, 200, "{inbox}");
    let inbox: Value = serde_json::from_str(&inbox).unwrap();
    let subjects: Vec<&Value> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["subject"])
        .collect();
    assert_eq!(
        subjects,
        [&json!("other")],
        "the read one is not unread: {inbox}"
    );

    // The thread, as each side keeps it (read ones too).
    let thread = asked.id;
    let (_, theirs) = get(format!("/alice/mail?thread={thread}&all=true")).await;
    let (_, mine) = get(format!("/bob/mail?thread={thread}&all=true")).await;
    let bodies = |text: &str| -> Vec<Value> {
        let value: Value = serde_json::from_str(text).unwrap();
        value["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].clone())
            .collect()
    };
    assert_eq!(bodies(&theirs), [json!("where are they")], "{theirs}");
    assert_eq!(bodies(&mine), [json!("in /var/log")], "{mine}");
    // Reading changed nothing: alice's answer is still unread for bob.
    assert_eq!(bob.unread().await.unwrap(), 1);

    let (status, body) = get("/nobody/mail".into()).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("nobody"), "{body}");
    let (status, body) = get("/alice/mail?thread=soon".into()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("soon"), "{body}");

    // What became of a sent message, as its sender sees it: alice read the question.
    let (status, sent) = get(format!("/bob/sent/{}", asked.id)).await;
    assert_eq!(status, 200, "{sent}");
    let sent: Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(sent["recipients"][0]["agent"], "alice", "{sent}");
    assert_eq!(sent["recipients"][0]["state"], "read", "{sent}");
    assert!(sent["recipients"][0]["read_at"].is_string(), "{sent}");
    // Only its sender's: to anyone else it is no message of theirs.
    let (status, body) = get(format!("/alice/sent/{}", asked.id)).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = get("/bob/sent/later".into()).await;
    assert_eq!(status, 400, "{body}");
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn a_connection_sees_the_tool_set_fitted_to_its_model() {
    let (rt, _) = runtime().await;
    let models = BTreeMap::from([(
        "gpt-*".to_owned(),
        guildhall::mcp::models::ModelConfig {
            hide: vec!["context_*".into()],
            swap: BTreeMap::from([("send_message".into(), "gate".into())]),
            simplify_schemas: true,
        },
    )]);
    let rules = guildhall::mcp::models::ModelRules::new(&models, BTreeMap::new()).unwrap();
    let server = McpServer::new(rt.clone()).with_models(rules);
    let names = |listed: &Value| -> Vec<String> {
        listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // A model the rule covers (named by the connection's opener).
    let gpt = server
        .connection(Some(Arc::from("alice")), ToolFilter::all())
        .with_model(Some(Arc::from("gpt-5-codex")));
    let mut gpt = Wire::legacy(gpt).await;
    let listed = gpt.request(1, "tools/list", json!({})).await;
    let seen = names(&listed);
    assert!(seen.contains(&"gate".to_owned()), "{seen:?}");
    assert!(
        !seen
            .iter()
            .any(|n| n.starts_with("context_") || n == "send_message"),
        "{seen:?}"
    );
    // Its schemas: no nullable unions, no $refs, and still JSON Schema 2020-12.
    for tool in listed["result"]["tools"].as_array().unwrap() {
        let text = tool.to_string();
        assert!(
            !text.contains("\"null\"") && !text.contains("$ref") && !text.contains("nullable"),
            "{text}"
        );
        let name = tool["name"].as_str().unwrap();
        crate::schemas::check(name, "simplified input", &tool["inputSchema"], None);
        if let Some(output) = tool.get("outputSchema") {
            crate::schemas::check(name, "simplified output", output, None);
        }
    }
    let refused = gpt
        .request(
            2,
            "tools/call",
            json!({"name": "send_message", "arguments": {"to": "bob"}}),
        )
        .await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("not offered to model `gpt-5-codex`"),
        "{refused}"
    );

    // Another model (the client's name, `wire-test`): the whole set, as declared.
    let other = server.connection(Some(Arc::from("alice")), ToolFilter::all());
    let mut other = Wire::legacy(other).await;
    let listed = other.request(1, "tools/list", json!({})).await;
    let seen = names(&listed);
    assert!(
        seen.contains(&"context_get".to_owned()) && seen.contains(&"send_message".to_owned()),
        "{seen:?}"
    );
    assert!(
        !seen.contains(&"gate".to_owned()),
        "swapped in for gpt-* only: {seen:?}"
    );
    assert!(
        listed.to_string().contains("\"null\""),
        "schemas as declared"
    );
    rt.shutdown().await;
}

/// `guildhall mcp --model` names the model behind its client: the server's `[models]`
/// rules fit that connection's tool set to it, and another connection keeps the whole set.
#[test]
fn the_bridge_names_its_clients_model_and_the_tool_set_fits_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    std::fs::create_dir(data.join("project")).unwrap();
    std::fs::write(
        data.join("guildhall.toml"),
        format!(
            "[files]\nroots = [{:?}]\n\n[models.\"gpt-*\"]\nhide = [\"task_*\"]\n\
             swap = {{ edit_file = \"apply_patch\" }}\n",
            data.join("project")
        ),
    )
    .unwrap();
    let _server = crate::support::serve_in_background(data);
    let list = |model: Option<&str>| -> Vec<String> {
        let mut command = crate::support::guildhall(data);
        command.args(["mcp", "--agent", "dev", "--no-start"]);
        if let Some(model) = model {
            command.args(["--model", model]);
        }
        let mut child = command
            .env_remove("GUILDHALL_AGENT")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let requests = [
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"some-client","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
        ];
        let mut stdin = child.stdin.take().unwrap();
        for request in requests {
            std::io::Write::write_all(&mut stdin, format!("{request}\n").as_bytes()).unwrap();
        }
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut names = Vec::new();
        for line in std::io::BufRead::lines(stdout) {
            let message: Value = serde_json::from_str(&line.unwrap()).unwrap();
            if message["id"] == 1 {
                names = message["result"]["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].as_str().unwrap().to_owned())
                    .collect();
                break;
            }
        }
        drop(stdin);
        let _ = child.wait();
        names
    };
    let has = |names: &[String], tool: &str| names.iter().any(|t| t == tool);
    let fitted = list(Some("gpt-5"));
    assert!(has(&fitted, "send_message"), "{fitted:?}");
    assert!(!fitted.iter().any(|t| t.starts_with("task_")), "{fitted:?}");
    assert!(
        has(&fitted, "apply_patch") && !has(&fitted, "edit_file"),
        "apply_patch instead of edit_file: {fitted:?}"
    );
    let whole = list(None);
    assert!(has(&whole, "task_list"), "{whole:?}");
    assert!(
        has(&whole, "edit_file") && !has(&whole, "apply_patch"),
        "apply_patch only where swapped in: {whole:?}"
    );
}

/// The dashboard's task board: unfinished tasks with assignee, holder and lease, the latest
/// ended ones newest first, one task with its history; bad queries named.
#[tokio::test]
async fn the_dashboard_reads_the_task_board_and_a_tasks_history() {
    let (rt, _) = runtime().await;
    let (base, stop) = dashboard_endpoint(&rt).await;
    let client = crate::support::http_client();
    let get = |path: &str| status_and_text(&client, format!("{base}{}{path}", http::TASKS_PATH));
    let call = |tool: &'static str, agent: &'static str, args: Value| {
        let rt = rt.clone();
        async move {
            rt.call_json(tool, args, crate::support::as_agent(&rt, agent))
                .await
                .unwrap_or_else(|err| panic!("{tool}: {err}"))
        }
    };
    let first = call("task_create", "alice", json!({ "title": "schema" })).await;
    let second = call(
        "task_create",
        "alice",
        json!({ "title": "api", "assignee": "bob", "blocked_by": [first["id"]] }),
    )
    .await;
    call("task_create", "alice", json!({ "title": "old" })).await;
    call(
        "task_update",
        "alice",
        json!({ "id": 3, "status": "cancelled", "note": "not needed" }),
    )
    .await;
    let claimed = call("task_claim", "bob", json!({ "lease_secs": 120 })).await;
    assert_eq!(claimed["task"]["id"], first["id"], "{claimed}");

    let (status, body) = get("?status=open,in_progress").await;
    assert_eq!(status, 200, "{body}");
    let board: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(board["total"], 2, "{board}");
    let tasks = board["tasks"].as_array().unwrap();
    assert_eq!(tasks[0]["status"], "in_progress");
    assert_eq!(tasks[0]["claimed_by"], "bob");
    assert!(tasks[0]["lease_expires"].is_string(), "{board}");
    assert_eq!(tasks[1]["assignee"], "bob");
    assert_eq!(tasks[1]["blocked_by"], json!([first["id"]]));
    assert_eq!(tasks[1]["ready"], false, "blocked: {board}");
    assert!(board["now"].is_string(), "the server's clock, for leases");
    let (_, ended) = get("?status=done,failed,cancelled&newest=true&limit=5").await;
    let ended: Value = serde_json::from_str(&ended).unwrap();
    assert_eq!(ended["tasks"][0]["title"], "old", "{ended}");

    let (status, one) = get(&format!("/{}", second["id"])).await;
    assert_eq!(status, 200, "{one}");
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one["history"][0]["action"], "created", "{one}");
    let (_, old) = get("/3").await;
    let old: Value = serde_json::from_str(&old).unwrap();
    let changes: Vec<&Value> = old["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["status"])
        .collect();
    assert_eq!(changes[1], &json!(["open", "cancelled"]), "{old}");

    for (query, code, why) in [
        ("?status=finished", 400, "status `finished` is none of"),
        ("?limit=0", 400, "limit `0` is not 1 to 5000"),
        ("?colour=red", 400, "unknown parameter `colour`"),
        ("/99", 404, "99"),
        ("/x", 400, "`x` is not a task id"),
    ] {
        let (status, body) = get(query).await;
        assert_eq!(status, code, "{query}: {body}");
        assert!(body.contains(why), "{query}: {body}");
    }
    stop.cancel();
    rt.shutdown().await;
}

/// An agent's timeline from the audit log, after the fact: its calls oldest first, a call
/// made within another nested under it (its `parent` is the other's `span`), each with its
/// decision, outcome and duration; a crash with its cause, the calls after the restart.
/// Another agent's calls are not in it; bad parameters are named.
#[tokio::test]
async fn an_agents_timeline_nests_its_calls_and_names_a_crashs_cause() {
    let (chaos, _) = crate::support::Chaos::new("chaos");
    let rt = Runtime::builder().tool(chaos).build().await.unwrap();
    for (id, role) in [("alice", "pm"), ("bob", "dev")] {
        rt.register_agent(AgentSpec::new(id, role)).await.unwrap();
    }
    let as_alice = || crate::support::as_agent(&rt, "alice");
    rt.call_json("whoami", json!({}), as_alice()).await.unwrap();
    let audit = rt.governance().audit().unwrap().clone();
    audit.flush().await.unwrap();
    let outer = audit
        .query(&guildhall::governance::AuditQuery::default())
        .unwrap()
        .pop()
        .unwrap();
    let within = guildhall::actors::TraceParent::of_call(&outer.call_id, None);
    rt.call_json("whoami", json!({}), as_alice().trace_parent(within))
        .await
        .unwrap();
    let crashed = rt
        .call_json("chaos", json!({ "act": "panic" }), as_alice())
        .await;
    assert!(crashed.is_err());
    rt.call_json("chaos", json!({ "act": "ok" }), as_alice())
        .await
        .unwrap();
    rt.call_json("whoami", json!({}), crate::support::as_agent(&rt, "bob"))
        .await
        .unwrap();

    let (base, stop) = dashboard_endpoint(&rt).await;
    let client = crate::support::http_client();
    let timeline = |query: &str| {
        status_and_text(
            &client,
            format!("{base}{}/alice/timeline{query}", http::AGENTS_PATH),
        )
    };
    let (status, body) = timeline("").await;
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    let calls = body["calls"].as_array().unwrap();
    // Calls started within one millisecond come in no particular order: found by content.
    let mut seen: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c["tool"].as_str().unwrap(), c["outcome"].as_str().unwrap()))
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            ("chaos", "crashed"),
            ("chaos", "ok"),
            ("whoami", "ok"),
            ("whoami", "ok")
        ],
        "{body}"
    );
    let find = |tool: &str, outcome: &str| -> Vec<&Value> {
        calls
            .iter()
            .filter(|c| c["tool"] == tool && c["outcome"] == outcome)
            .collect()
    };
    let whoamis = find("whoami", "ok");
    let (outer, nested): (Vec<&Value>, Vec<&Value>) =
        whoamis.iter().partition(|c| c["parent"].is_null());
    assert_eq!((outer.len(), nested.len()), (1, 1), "{body}");
    assert_eq!(nested[0]["parent"], outer[0]["span"], "nested: {body}");
    assert_eq!(outer[0]["decision"], "allow");
    assert!(outer[0]["duration_us"].is_u64(), "{body}");
    let cause = find("chaos", "crashed")[0]["cause"].as_str().unwrap();
    assert!(cause.contains("asked to panic"), "{cause}");
    assert!(find("chaos", "ok")[0]["cause"].is_null(), "{body}");

    let (_, limited) = timeline("?limit=1").await;
    let limited: Value = serde_json::from_str(&limited).unwrap();
    let newest = calls.iter().map(|c| c["call_id"].as_str().unwrap()).max();
    assert_eq!(
        limited["calls"][0]["call_id"].as_str(),
        newest,
        "the newest: {limited}"
    );
    assert_eq!(limited["calls"].as_array().unwrap().len(), 1);
    for (query, named) in [
        ("?limit=0", "limit `0` is not 1 to 2000"),
        ("?since_ms=soon", "since_ms `soon`"),
        ("?agent=bob", "unknown parameter `agent`"),
        ("?since_ms=0", "more than 24 hours ago"),
    ] {
        let (status, body) = timeline(query).await;
        assert_eq!(
            (status, body.contains(named)),
            (400, true),
            "{query}: {body}"
        );
    }
    let (status, _) = status_and_text(
        &client,
        format!("{base}{}/nobody/timeline", http::AGENTS_PATH),
    )
    .await;
    assert_eq!(status, 404);
    stop.cancel();
    rt.shutdown().await;
}
