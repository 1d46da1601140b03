//! `guildhall bench mcp`: the MCP server measured from outside, by a load driver speaking
//! newline-delimited JSON-RPC to child processes, against a bare rmcp server (the floor)
//! run the same way in the same process.
//!
//! Each transport is measured for: cold start to the first `tools/list` answer; sequential
//! `tools/call` latency (p50, p99); and pipelined throughput with a window of calls in
//! flight. The tool is `echo` on every server: in guildhall a supervised tool actor behind
//! the full call pipeline, in the floor a bare handler method.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool as McpTool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::Stage;
use crate::{CallContext, Tool};

/// The echo tool guildhall serves for this benchmark (`serve --bench-echo`).
pub struct Echo;

/// `echo`'s input.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EchoInput {
    /// Returned as given.
    pub text: String,
}

/// `echo`'s output.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EchoOutput {
    /// The input text.
    pub text: String,
}

impl Tool for Echo {
    type Input = EchoInput;
    type Output = EchoOutput;
    type Error = std::convert::Infallible;
    type State = ();
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Returns its input (benchmarks)."
    }
    async fn call(
        &self,
        _: &mut (),
        input: EchoInput,
        _: CallContext,
    ) -> Result<EchoOutput, Self::Error> {
        Ok(EchoOutput { text: input.text })
    }
}

/// The floor's `image` tool's answer: a 320 KiB image, as a screenshot is (base64, made
/// once).
fn floor_image() -> &'static str {
    static IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IMAGE.get_or_init(|| {
        use base64::Engine;
        let bytes: Vec<u8> = (0..320 * 1024).map(|i| (i % 251) as u8).collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    })
}

/// The floor: a minimal rmcp server with an `echo` tool answered inline, an `image` tool
/// answering a 320 KiB image, and a `crash` tool that ends the process.
#[derive(Clone, Default)]
pub struct FloorServer;

impl ServerHandler for FloorServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let schema = json!({ "type": "object", "properties": { "text": { "type": "string" } } });
        let Value::Object(schema) = schema else {
            return Err(McpError::internal_error("schema is an object", None));
        };
        let schema = Arc::new(schema);
        Ok(ListToolsResult::with_all_items(vec![
            McpTool::new("echo", "Returns its input.", Arc::clone(&schema)),
            McpTool::new("image", "Returns a 320 KiB image.", Arc::clone(&schema)),
            McpTool::new(
                "crash",
                "Ends this server's process without answering.",
                schema,
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name == "crash" {
            // What a crashing server does: gone mid-call (`bench storm`).
            std::process::exit(3);
        }
        if request.name == "image" {
            let image = ContentBlock::image(floor_image().to_owned(), "image/png");
            return Ok(CallToolResult::success(vec![image]).into());
        }
        let text = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("text"))
            .cloned()
            .unwrap_or(Value::Null);
        let value = json!({ "text": text });
        let mut result = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
        result.structured_content = Some(value);
        Ok(result.into())
    }
}

/// What `bench mcp` does.
#[derive(Debug, Clone)]
pub struct McpBenchConfig {
    /// Sequential calls timed per round (after a warm-up of a tenth as many).
    pub sequential: usize,
    /// Calls per pipelined run.
    pub pipelined: usize,
    /// Calls in flight in a pipelined run.
    pub window: usize,
    /// Concurrent HTTP clients.
    pub http_clients: usize,
    /// Rounds; each measures every contender once, alternating, and figures are medians.
    pub rounds: usize,
    /// Messages sent to a subscribed inbox, each timed until its `resources/updated`.
    pub notify_sends: usize,
}

impl Default for McpBenchConfig {
    fn default() -> Self {
        Self {
            sequential: 2_000,
            pipelined: 20_000,
            window: 64,
            http_clients: 16,
            rounds: 3,
            notify_sends: 1_000,
        }
    }
}

/// One transport's figures.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Figures {
    /// Process start to the first `tools/list` answer, in milliseconds.
    pub cold_ms: f64,
    /// Median sequential call latency, in microseconds.
    pub p50_us: f64,
    /// 99th percentile sequential call latency, in microseconds.
    pub p99_us: f64,
    /// Pipelined calls per second.
    pub calls_per_sec: f64,
}

/// Everything `bench mcp --json` prints.
#[derive(Debug, Clone, Default, Serialize)]
pub struct McpReport {
    /// `serve --stdio`: cold start, ms.
    pub stdio_cold_ms: f64,
    /// `serve --stdio`: sequential p50, µs.
    pub stdio_p50_us: f64,
    /// `serve --stdio`: sequential p99, µs.
    pub stdio_p99_us: f64,
    /// `serve --stdio`: pipelined calls/s.
    pub stdio_calls_per_sec: f64,
    /// `guildhall mcp` bridge to a running server: cold start, ms.
    pub bridge_cold_ms: f64,
    /// Bridge: sequential p50, µs.
    pub bridge_p50_us: f64,
    /// Bridge: sequential p99, µs.
    pub bridge_p99_us: f64,
    /// Bridge: pipelined calls/s.
    pub bridge_calls_per_sec: f64,
    /// Streamable HTTP (2026-07-28, stateless): sequential p50, µs.
    pub http_p50_us: f64,
    /// HTTP: sequential p99, µs.
    pub http_p99_us: f64,
    /// HTTP: calls/s with `http_clients` concurrent clients.
    pub http_calls_per_sec: f64,
    /// The bare rmcp floor over stdio: cold start, ms.
    pub floor_stdio_cold_ms: f64,
    /// Floor: sequential p50, µs.
    pub floor_stdio_p50_us: f64,
    /// Floor: sequential p99, µs.
    pub floor_stdio_p99_us: f64,
    /// Floor: pipelined calls/s.
    pub floor_stdio_calls_per_sec: f64,
    /// stdio p50 / floor p50 (target ≤ 1.3).
    pub stdio_p50_ratio: f64,
    /// floor calls/s / stdio calls/s (target ≤ 1.3).
    pub stdio_throughput_ratio: f64,
    /// bridge p50 / stdio p50 (target ≤ 2).
    pub bridge_p50_ratio: f64,
    /// stdio calls/s / bridge calls/s (target ≤ 2).
    pub bridge_throughput_ratio: f64,
    /// HTTP p99 / HTTP p50 (target ≤ 3: no delayed-ACK stalls).
    pub http_p99_ratio: f64,
    /// From a `send_message` (one agent's connection) to the recipient's connection, which
    /// subscribed to its inbox, hearing `notifications/resources/updated`: median, ms. Both
    /// bridged to a server with a durable store.
    pub notify_p50_ms: f64,
    /// The same, 99th percentile (target ≤ 50 ms).
    pub notify_p99_ms: f64,
}

/// A server child process and its stdio.
pub(super) struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

type BenchError = Box<dyn std::error::Error + Send + Sync>;

impl Peer {
    /// Starts `command`, completes the handshake and lists tools; returns the time taken.
    async fn start(command: Command) -> Result<(Self, Duration), BenchError> {
        let started = Instant::now();
        let mut peer = Self::connect(command).await?;
        let listed = peer
            .ask(json!({ "jsonrpc": "2.0", "id": 0, "method": "tools/list" }))
            .await?;
        if !listed.to_string().contains("\"echo\"") {
            return Err(format!("the server does not list `echo`: {listed}").into());
        }
        Ok((peer, started.elapsed()))
    }

    /// Starts `command` and completes the MCP handshake.
    pub(super) async fn connect(mut command: Command) -> Result<Self, BenchError> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut peer = Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            next_id: 1,
        };
        peer.ask(
            json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": { "name": "guildhall-bench", "version": "1" } } }),
        )
        .await?;
        peer.write(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await?;
        Ok(peer)
    }

    /// Calls `tool`; its answer (a result or an error). What answers an earlier call given up
    /// midway, and notifications, are passed over.
    pub(super) async fn call_tool(
        &mut self,
        tool: &str,
        arguments: Value,
    ) -> Result<Value, BenchError> {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": { "name": tool, "arguments": arguments } }))
            .await?;
        loop {
            let message = self.next_message().await?;
            if message["id"] == json!(id) {
                return Ok(message);
            }
        }
    }

    async fn write(&mut self, message: &Value) -> Result<(), BenchError> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.stdin.write_all(&line).await?;
        Ok(())
    }

    /// The next message of any kind: a response or a notification.
    async fn next_message(&mut self) -> Result<Value, BenchError> {
        let line = self
            .lines
            .next_line()
            .await?
            .ok_or("the server closed its stdout")?;
        Ok(serde_json::from_str(&line)?)
    }

    async fn read(&mut self) -> Result<Value, BenchError> {
        loop {
            let line = self
                .lines
                .next_line()
                .await?
                .ok_or("the server closed its stdout")?;
            let message: Value = serde_json::from_str(&line)?;
            // Responses only; notifications are not expected here but are skipped.
            if message.get("id").is_some() {
                if message.get("error").is_some() {
                    return Err(format!("the server answered with an error: {message}").into());
                }
                return Ok(message);
            }
        }
    }

    async fn ask(&mut self, message: Value) -> Result<Value, BenchError> {
        self.write(&message).await?;
        self.read().await
    }

    /// A call whose text differs from the last one's: a model repeating the very same
    /// call is what the loop guard stops, not what this measures.
    fn call(&mut self) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": { "name": "echo", "arguments": { "text": format!("hello {id}") } } })
    }

    async fn sequential(&mut self, n: usize) -> Result<Vec<Duration>, BenchError> {
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let call = self.call();
            let started = Instant::now();
            let answer = self.ask(call).await?;
            times.push(started.elapsed());
            if answer["result"]["isError"] == true {
                return Err(format!("the call failed: {answer}").into());
            }
        }
        Ok(times)
    }

    async fn pipelined(&mut self, total: usize, window: usize) -> Result<f64, BenchError> {
        let started = Instant::now();
        let mut sent = 0;
        let mut received = 0;
        while sent < total.min(window) {
            let call = self.call();
            self.write(&call).await?;
            sent += 1;
        }
        while received < total {
            self.read().await?;
            received += 1;
            if sent < total {
                let call = self.call();
                self.write(&call).await?;
                sent += 1;
            }
        }
        Ok(total as f64 / started.elapsed().as_secs_f64())
    }

    async fn stop(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Microseconds, sorted, for `super::percentile`.
fn sorted_micros(times: &[Duration]) -> Vec<f64> {
    let mut micros: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e6).collect();
    micros.sort_by(f64::total_cmp);
    micros
}

async fn measure(command: Command, config: &McpBenchConfig) -> Result<Figures, BenchError> {
    let (mut peer, cold) = Peer::start(command).await?;
    peer.sequential(config.sequential / 10).await?;
    let times = sorted_micros(&peer.sequential(config.sequential).await?);
    let calls_per_sec = peer.pipelined(config.pipelined, config.window).await?;
    peer.stop().await;
    Ok(Figures {
        cold_ms: cold.as_secs_f64() * 1e3,
        p50_us: super::percentile(&times, 0.50),
        p99_us: super::percentile(&times, 0.99),
        calls_per_sec,
    })
}

async fn measure_http(url: &str, config: &McpBenchConfig) -> Result<Figures, BenchError> {
    #[cfg(feature = "tls")]
    crate::tls::install();
    let client = reqwest::Client::new();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "guildhall-bench", "version": "1" }
    });
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "echo", "arguments": { "text": "hello" }, "_meta": meta } })
    .to_string();
    let url: Arc<str> = Arc::from(url);
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let one = move |client: reqwest::Client, body: String| {
        let url = Arc::clone(&url);
        // Each call's text differs (see `Peer::call`).
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = body.replacen("hello", &format!("hello {n}"), 1);
        async move {
            let response = client
                .post(&*url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "echo")
                .header(crate::mcp::AGENT_HEADER, "bench")
                .body(body)
                .send()
                .await?;
            let status = response.status();
            let text = response.text().await?;
            if !status.is_success() || !text.contains("hello") {
                return Err::<(), BenchError>(format!("HTTP {status}: {text}").into());
            }
            Ok(())
        }
    };
    for _ in 0..config.sequential / 10 {
        one(client.clone(), body.clone()).await?;
    }
    let mut times = Vec::with_capacity(config.sequential);
    for _ in 0..config.sequential {
        let started = Instant::now();
        one(client.clone(), body.clone()).await?;
        times.push(started.elapsed());
    }
    let times = sorted_micros(&times);
    let per_client = (config.pipelined / config.http_clients.max(1)).max(1);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..config.http_clients.max(1) {
        let (client, body) = (client.clone(), body.clone());
        let one = one.clone();
        tasks.spawn(async move {
            for _ in 0..per_client {
                one(client.clone(), body.clone()).await?;
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let total = per_client * config.http_clients.max(1);
    Ok(Figures {
        cold_ms: 0.0,
        p50_us: super::percentile(&times, 0.50),
        p99_us: super::percentile(&times, 0.99),
        calls_per_sec: total as f64 / started.elapsed().as_secs_f64(),
    })
}

/// A `tools/call` of `tool` as `agent` to the Streamable HTTP endpoint `url`, in the
/// stateless era (2026-07-28: one POST, the client's identity in `_meta`), ready to send
/// (more headers may be added).
pub fn stateless_call(
    client: &reqwest::Client,
    url: &str,
    client_name: &str,
    agent: &str,
    tool: &str,
    arguments: Value,
) -> reqwest::RequestBuilder {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": client_name, "version": "1" }
    });
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": tool, "arguments": arguments, "_meta": meta } });
    client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .header(crate::mcp::AGENT_HEADER, agent)
        .body(body.to_string())
}

/// The JSON-RPC answer in an HTTP response's body: the body itself, or the last message
/// of an event stream that answers a request (has an `id`).
pub fn answer_in(text: &str) -> Option<Value> {
    if let Ok(value) = serde_json::from_str(text) {
        return Some(value);
    }
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .rfind(|message| message.get("id").is_some())
}

/// Where a background server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    InMemory,
    Durable,
}

/// Times `sends` messages from one bridged agent to another that subscribed to its inbox,
/// each from just before the send is written until the recipient hears
/// `notifications/resources/updated` (each send waits for its notification, so none
/// coalesce). Milliseconds, sorted.
async fn measure_notify(exe: &Path, data_dir: &Path, sends: usize) -> Result<Vec<f64>, BenchError> {
    let bridge = |agent: &str| {
        let mut command = Command::new(exe);
        command
            .arg("--data-dir")
            .arg(data_dir)
            .args(["mcp", "--agent", agent, "--no-start"]);
        command
    };
    let (mut watcher, _) = Peer::start(bridge("watcher")).await?;
    let (mut sender, _) = Peer::start(bridge("sender")).await?;
    watcher
        .ask(
            json!({ "jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
                     "params": { "uri": "guildhall://inbox" } }),
        )
        .await?;
    let mut times = Vec::with_capacity(sends);
    for i in 0..sends {
        let id = 10 + i as u64;
        // Each body differs: the same call repeated is what the loop guard stops.
        let send = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": "send_message",
                        "arguments": { "to": "watcher", "body": format!("note {i}") } } });
        let started = Instant::now();
        sender.write(&send).await?;
        loop {
            let message = watcher.next_message().await?;
            if message["method"] == "notifications/resources/updated" {
                break;
            }
        }
        times.push(started.elapsed().as_secs_f64() * 1e3);
        let answer = sender.read().await?;
        if answer["result"]["isError"] == true {
            return Err(format!("a send failed: {answer}").into());
        }
    }
    watcher.stop().await;
    sender.stop().await;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// A `guildhall serve` running in the background for the bridge and HTTP runs.
struct Background {
    child: Child,
    url: String,
}

async fn start_background(
    exe: &Path,
    data_dir: &Path,
    store: Store,
) -> Result<Background, BenchError> {
    let mut command = Command::new(exe);
    command.arg("--data-dir").arg(data_dir).arg("serve");
    if store == Store::InMemory {
        command.arg("--in-memory");
    }
    let mut child = command
        .args(["--bench-echo", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await? {
        if let Some(url) = line.strip_prefix("mcp endpoint: ") {
            let url = url.trim().to_owned();
            // Keep draining so the server never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok(Background { child, url });
        }
    }
    Err("the background server exited before listening".into())
}

/// Runs the benchmark with the guildhall binary `exe`.
///
/// # Errors
/// A server that fails to start, answers with an error, or closes early.
pub async fn mcp(
    exe: &Path,
    config: McpBenchConfig,
    stage: &dyn Stage,
) -> Result<McpReport, BenchError> {
    let scratch = super::tempfile_in(&std::env::temp_dir());
    std::fs::create_dir_all(&scratch)?;
    let data_dir = scratch.join("data");
    let mut background = start_background(exe, &data_dir, Store::InMemory).await?;
    let rounds = config.rounds.max(1);
    let mut floor = Vec::new();
    let mut stdio = Vec::new();
    let mut bridge = Vec::new();
    let mut http = Vec::new();
    stage.phase("mcp rounds", rounds as u64 * 4);
    for _ in 0..rounds {
        let mut command = Command::new(exe);
        command.args(["bench", "mcp-floor"]);
        floor.push(measure(command, &config).await?);
        stage.step();
        let mut command = Command::new(exe);
        command.arg("--data-dir").arg(scratch.join("stdio")).args([
            "serve",
            "--stdio",
            "--in-memory",
            "--bench-echo",
        ]);
        stdio.push(measure(command, &config).await?);
        stage.step();
        let mut command = Command::new(exe);
        command
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["mcp", "--agent", "bench", "--no-start"]);
        bridge.push(measure(command, &config).await?);
        stage.step();
        http.push(measure_http(&background.url, &config).await?);
        stage.step();
    }
    let _ = background.child.kill().await;
    stage.phase("inbox notifications", 1);
    let notify_dir = scratch.join("notify");
    let mut durable = start_background(exe, &notify_dir, Store::Durable).await?;
    let notified = measure_notify(exe, &notify_dir, config.notify_sends.max(1)).await;
    let _ = durable.child.kill().await;
    let notified = notified?;
    stage.step();
    let _ = std::fs::remove_dir_all(&scratch);
    let med = |runs: &[Figures], f: fn(&Figures) -> f64| {
        super::median(&mut runs.iter().map(f).collect::<Vec<_>>())
    };
    let mut report = McpReport {
        stdio_cold_ms: med(&stdio, |f| f.cold_ms),
        stdio_p50_us: med(&stdio, |f| f.p50_us),
        stdio_p99_us: med(&stdio, |f| f.p99_us),
        stdio_calls_per_sec: med(&stdio, |f| f.calls_per_sec),
        bridge_cold_ms: med(&bridge, |f| f.cold_ms),
        bridge_p50_us: med(&bridge, |f| f.p50_us),
        bridge_p99_us: med(&bridge, |f| f.p99_us),
        bridge_calls_per_sec: med(&bridge, |f| f.calls_per_sec),
        http_p50_us: med(&http, |f| f.p50_us),
        http_p99_us: med(&http, |f| f.p99_us),
        http_calls_per_sec: med(&http, |f| f.calls_per_sec),
        floor_stdio_cold_ms: med(&floor, |f| f.cold_ms),
        floor_stdio_p50_us: med(&floor, |f| f.p50_us),
        floor_stdio_p99_us: med(&floor, |f| f.p99_us),
        floor_stdio_calls_per_sec: med(&floor, |f| f.calls_per_sec),
        ..McpReport::default()
    };
    report.stdio_p50_ratio = report.stdio_p50_us / report.floor_stdio_p50_us;
    report.stdio_throughput_ratio = report.floor_stdio_calls_per_sec / report.stdio_calls_per_sec;
    report.bridge_p50_ratio = report.bridge_p50_us / report.stdio_p50_us;
    report.bridge_throughput_ratio = report.stdio_calls_per_sec / report.bridge_calls_per_sec;
    report.http_p99_ratio = report.http_p99_us / report.http_p50_us;
    report.notify_p50_ms = super::percentile(&notified, 0.5);
    report.notify_p99_ms = super::percentile(&notified, 0.99);
    Ok(report)
}
