//! `guildhall bench soak`: a swarm run for a long time against a real `guildhall serve`, with
//! faults, watched for what breaks over hours: memory that grows, latency that drifts, mail
//! lost or doubled.
//!
//! The server is this binary's `serve` on a store of its own (redb in a temporary
//! directory), reached over Streamable HTTP (the stateless era, each request naming its
//! agent in `guildhall-agent`) as Claude Code instances reach it; every agent is one task of
//! this process, so a thousand fit one machine. Each agent, at a seeded random pace that adds
//! up to `rate` operations a second, sends mail to another agent (each send carrying a
//! `request_id`, retried with it until answered, so a send cut off by a kill is made once),
//! checks its inbox (taking what came), and appends to a shared context session. The server
//! is killed with SIGKILL and started again on the same store `kills` times, spread over the
//! middle of the run.
//!
//! Every `interval` it samples the server (RSS, threads, open descriptors, store size) and
//! the operations of that interval (p50 and p99 by kind, errors by kind). At the end it
//! stops the server, opens its store here, and checks the ledger: each acknowledged send is
//! in the mail history exactly once. It judges itself: no message lost or doubled, the p99
//! of the last tenth at most 1.5 times that of the first, and the server's memory over the
//! second half of its last life growing by at most 1% of its start an hour.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::percentile;

/// What `bench soak` runs.
#[derive(Debug, Clone)]
pub struct SoakBenchConfig {
    /// The `guildhall` binary whose `serve` is soaked.
    pub exe: PathBuf,
    /// Agents at work at once.
    pub agents: usize,
    /// How long the swarm works.
    pub duration: Duration,
    /// Operations a second, all agents together.
    pub rate: u32,
    /// Seeds the agents' choices and the faults' times.
    pub seed: u64,
    /// Times the server is killed (SIGKILL) and started again on its store.
    pub kills: usize,
    /// How often the server and the operations are sampled.
    pub interval: Duration,
}

/// One interval's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SoakSample {
    /// Seconds since the swarm started, at the end of the interval.
    pub at_secs: f64,
    /// Which life of the server this is (0 until the first kill).
    pub life: usize,
    /// The server's resident memory, KiB.
    pub rss_kib: u64,
    /// Its threads.
    pub threads: u64,
    /// Its open file descriptors.
    pub fds: u64,
    /// The store's size on disk, bytes.
    pub store_bytes: u64,
    /// Processes the server started, running now (commands).
    pub children: usize,
    /// The children's resident memory together, KiB.
    pub children_rss_kib: u64,
    /// Calls given up mid-call (the connection dropped) over the interval.
    pub dropped: usize,
    /// Per operation kind: how many were answered, their p50 and p99 (ms), and errors.
    pub ops: BTreeMap<&'static str, OpFigures>,
}

/// One kind of operation over one interval.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpFigures {
    /// Answered (tool errors included).
    pub count: usize,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Errors, by kind (`unreachable` while the server is down, `tool` for a tool's error).
    pub errors: BTreeMap<&'static str, usize>,
    /// The first tool error of the interval, as the tool said it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_example: Option<String>,
}

/// What `bench soak` found.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// Agents at work.
    pub agents: usize,
    /// How long they worked, seconds.
    pub duration_secs: f64,
    /// Kills done.
    pub kills: usize,
    /// Every interval, in order.
    pub samples: Vec<SoakSample>,
    /// Sends acknowledged (each with its own `request_id`).
    pub sends_acknowledged: usize,
    /// Connections stalled from a third of the run on (half sent a request and never read
    /// the answer, half never finished sending one).
    pub stalled_connections: usize,
    /// What the agents' temporary directory holds once the server stopped (a killed life's
    /// private directories included, which the next life removes).
    pub leftover_temp_entries: usize,
    /// Processes the server started still running once it stopped.
    pub orphans: usize,
    /// Acknowledged sends the history lacks.
    pub lost: usize,
    /// Acknowledged sends the history holds more than once.
    pub duplicated: usize,
    /// Each kind's p99 over the first tenth of the run (the worst interval's), ms.
    pub p99_first_tenth_ms: BTreeMap<&'static str, f64>,
    /// The same over the last tenth.
    pub p99_last_tenth_ms: BTreeMap<&'static str, f64>,
    /// The server's memory growth over the second half of its last life, as a share of its
    /// start per hour (a least-squares slope); `None` with fewer than three samples there.
    pub rss_growth_per_hour: Option<f64>,
    /// Each criterion missed, said plainly; empty when the run passed.
    pub failures: Vec<String>,
}

impl SoakReport {
    /// Whether every criterion held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Operation kinds, as reported.
const SEND: &str = "send_message";
const INBOX: &str = "check_inbox";
const CONTEXT: &str = "context_update";
const BASH: &str = "bash";
const MARK: &str = "mark_read";
const READ: &str = "read_file";
const KINDS: [&str; 6] = [SEND, INBOX, MARK, CONTEXT, BASH, READ];
/// Connections stalled at once: each sent a request and never reads the answer, or never
/// finished sending it.
const STALLED: usize = 8;

/// How long a send cut off by a kill is retried (with its `request_id`) after the run ends.
const SEND_GRACE: Duration = Duration::from_secs(30);
/// How long a server is given to answer `status` after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The server under soak: a child process on its data directory.
struct Server {
    exe: PathBuf,
    data: PathBuf,
    child: std::process::Child,
}

impl Server {
    /// Starts `serve` on `data` (at `listen`: the same port after a kill) and waits until
    /// it answers `status`; returns it and its MCP URL.
    async fn start(
        exe: &Path,
        data: &Path,
        tmp: &Path,
        listen: &str,
    ) -> Result<(Self, String), String> {
        let child = std::process::Command::new(exe)
            .arg("--data-dir")
            .arg(data)
            .args(["serve", "--listen", listen, "--max-sessions", "100000"])
            .env("RUST_LOG", "off")
            // Its agents' private directories go here, to be counted at the end.
            .env("TMPDIR", tmp)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start `{} serve`: {e}", exe.display()))?;
        let server = Self {
            exe: exe.to_path_buf(),
            data: data.to_path_buf(),
            child,
        };
        let started = Instant::now();
        loop {
            let out = tokio::process::Command::new(exe)
                .arg("--data-dir")
                .arg(data)
                .args(["status", "--json"])
                .env("RUST_LOG", "off")
                .output()
                .await
                .map_err(|e| format!("cannot run `status`: {e}"))?;
            if out.status.success()
                && let Ok(status) = serde_json::from_slice::<Value>(&out.stdout)
                && let Some(url) = status["http"].as_str()
            {
                return Ok((server, url.to_owned()));
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "the server did not answer `status` within {START_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and waits for it to be gone.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks it to stop (`guildhall stop`) and waits; kills it if it will not.
    async fn stop(mut self) {
        let _ = tokio::process::Command::new(&self.exe)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("stop")
            .env("RUST_LOG", "off")
            .output()
            .await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// What the agents measured since the last sample.
#[derive(Default)]
struct Tally {
    times: HashMap<&'static str, Vec<f64>>,
    errors: HashMap<&'static str, BTreeMap<&'static str, usize>>,
    /// The first tool error of each kind, as the tool said it.
    examples: HashMap<&'static str, String>,
    /// Calls given up mid-call.
    dropped: usize,
}

/// What every agent shares.
struct Shared {
    http: reqwest::Client,
    url: tokio::sync::RwLock<String>,
    tally: Mutex<Tally>,
    /// The `request_id` of every acknowledged send.
    acknowledged: Mutex<Vec<String>>,
    /// The agents' file root (each agent's own files, and one all read).
    root: PathBuf,
}

/// The file every agent reads, in the root.
const SHARED_FILE: &str = "plan.md";

/// Why a call did not get an answer.
enum Failure {
    /// No answer: the server is down, or the request was cut off.
    Unreachable,
    /// The tool answered with an error: its text.
    Tool(String),
}

impl Shared {
    /// Calls `tool` as `agent`; its structured result.
    async fn call(&self, agent: &str, tool: &str, arguments: Value) -> Result<Value, Failure> {
        let url = self.url.read().await.clone();
        let response =
            super::mcp::stateless_call(&self.http, &url, "guildhall-soak", agent, tool, arguments)
                .send()
                .await
                .map_err(|_| Failure::Unreachable)?;
        if response.status().is_server_error() {
            return Err(Failure::Unreachable);
        }
        let text = response.text().await.map_err(|_| Failure::Unreachable)?;
        let answer = super::mcp::answer_in(&text).ok_or(Failure::Unreachable)?;
        let result = &answer["result"];
        if let Some(error) = answer.get("error") {
            return Err(Failure::Tool(error["message"].to_string()));
        }
        if result["isError"] == json!(true) {
            return Err(Failure::Tool(result["content"][0]["text"].to_string()));
        }
        Ok(result["structuredContent"].clone())
    }

    /// Calls and counts: the time of an answer, or the kind of error.
    async fn timed(
        &self,
        agent: &str,
        kind: &'static str,
        arguments: Value,
    ) -> Result<Value, bool> {
        let started = Instant::now();
        let outcome = self.call(agent, kind, arguments).await;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(value) => {
                tally.times.entry(kind).or_default().push(ms);
                Ok(value)
            }
            Err(failure) => {
                let unreachable = matches!(failure, Failure::Unreachable);
                let name = match failure {
                    Failure::Unreachable => "unreachable",
                    Failure::Tool(text) => {
                        tally.times.entry(kind).or_default().push(ms);
                        tally.examples.entry(kind).or_insert(text);
                        "tool"
                    }
                };
                *tally
                    .errors
                    .entry(kind)
                    .or_default()
                    .entry(name)
                    .or_default() += 1;
                Err(unreachable)
            }
        }
    }
}

/// One agent's work until `until`, then its cut-off sends finished.
async fn agent(
    shared: Arc<Shared>,
    me: usize,
    agents: usize,
    mean_pause: Duration,
    seed: u64,
    until: Instant,
) {
    let id = format!("soak-{me}");
    let mut rng = fastrand::Rng::with_seed(seed ^ (me as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut sent = 0u64;
    // Operations made: each call's arguments differ from the last's.
    let mut n = 0u64;
    let mut status_version = 0u64;
    while Instant::now() < until {
        n += 1;
        let pause = mean_pause.mul_f64(0.5 + rng.f64());
        tokio::time::sleep(pause).await;
        match rng.u8(..100) {
            0..45 => {
                let to = format!("soak-{}", rng.usize(..agents));
                let token = format!("s{me}x{sent}");
                sent += 1;
                let args = json!({ "to": to, "subject": format!("soak {token}"),
                    "body": "status: all green, next step planned", "request_id": token });
                // Retried with the same request_id until answered: made once, whatever a kill cut.
                let deadline = until + SEND_GRACE;
                loop {
                    match shared.timed(&id, SEND, args.clone()).await {
                        Ok(_) => {
                            shared
                                .acknowledged
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(token);
                            break;
                        }
                        Err(true) if Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(_) => break,
                    }
                }
            }
            45..70 => {
                // A waiting check for what came since the last, as an idle agent makes;
                // what came is acknowledged, so inboxes stay as short as a working swarm's.
                let taken = shared
                    .timed(
                        &id,
                        INBOX,
                        json!({ "since": "last", "limit": 20, "wait_secs": 0.5 }),
                    )
                    .await;
                let ids: Vec<Value> = taken.ok().map_or_else(Vec::new, |inbox| {
                    inbox["messages"]
                        .as_array()
                        .map(|messages| messages.iter().map(|m| m["id"].clone()).collect())
                        .unwrap_or_default()
                });
                if !ids.is_empty() {
                    let _ = shared
                        .timed(&id, MARK, json!({ "ids": ids, "ack": true }))
                        .await;
                }
            }
            70..82 => {
                // The agent's own status, changed only from the version it last saw.
                let session = format!("soak-{}", me % 10);
                let change = json!({ "session": session, "changes": [
                    { "key": format!("status-{me}"), "strategy": "merge",
                      "value": { "step": n, "state": "working" },
                      "expected_version": status_version }
                ]});
                match shared.timed(&id, CONTEXT, change).await {
                    Ok(update) => {
                        status_version = update["changes"][0]["after"].as_u64().unwrap_or(0);
                    }
                    // A kill between the commit and its answer: read the version again.
                    Err(_) => {
                        let got = shared
                            .call(
                                &id,
                                "context_get",
                                json!({ "session": format!("soak-{}", me % 10),
                                        "keys": [format!("status-{me}")] }),
                            )
                            .await;
                        if let Ok(got) = got {
                            status_version = got["entries"][0]["version"].as_u64().unwrap_or(0);
                        }
                    }
                }
            }
            82..90 => {
                // A short command writing in the agent's root, as a coding agent's.
                let notes = shared.root.join(format!("notes-{me}.txt"));
                let command = format!("echo step {n} > '{0}' && cat '{0}'", notes.display());
                let _ = shared.timed(&id, BASH, json!({ "command": command })).await;
            }
            90..96 => {
                let path = shared.root.join(SHARED_FILE);
                let _ = shared
                    .timed(
                        &id,
                        READ,
                        json!({ "path": path.display().to_string(),
                                "offset": 1 + n % 100, "limit": 20 }),
                    )
                    .await;
            }
            _ => {
                // A waiting check given up mid-call: the connection is dropped under it.
                let call = shared.call(
                    &id,
                    INBOX,
                    json!({ "since": "last", "limit": 5, "wait_secs": 2 }),
                );
                let gave_up = Duration::from_millis(rng.u64(20..200));
                if tokio::time::timeout(gave_up, call).await.is_err() {
                    shared
                        .tally
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .dropped += 1;
                }
            }
        }
    }
}

/// The server's resident memory (KiB) and threads, from `/proc`.
fn process_figures(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (field("VmRSS:"), field("Threads:"), fds)
}

/// The processes whose `TMPDIR` is under `tmp`: those the server started for its agents
/// (a sandboxed command gets its agent's private directory there).
fn started_in(tmp: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mark = format!("TMPDIR={}", tmp.display());
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|&b| b == 0)
                    .any(|var| var.starts_with(mark.as_bytes()))
            })
        })
        .collect()
}

/// Opens [`STALLED`] connections to `listen` that stall: half send a whole request and never
/// read the answer, half never finish their headers. Held until dropped.
async fn stall(listen: &str) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "list_agents", "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": { "name": "stalled", "version": "1" } } } })
    .to_string();
    let mut held = Vec::new();
    for i in 0..STALLED {
        let Ok(mut stream) = tokio::net::TcpStream::connect(listen).await else {
            continue;
        };
        let request = if i % 2 == 0 {
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {listen}\r\nContent-Type: application/json\r\n\
                 Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
                 Mcp-Method: tools/call\r\nMcp-Name: list_agents\r\n{}: stalled-{i}\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                crate::mcp::AGENT_HEADER,
                body.len()
            )
        } else {
            format!("POST /mcp HTTP/1.1\r\nHost: {listen}\r\nContent-Ty")
        };
        if stream.write_all(request.as_bytes()).await.is_ok() {
            held.push(stream);
        }
    }
    held
}

/// Bytes the files under `dir` hold.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// Runs the soak; `progress` is called with each sample as it is taken.
///
/// # Errors
/// The server cannot start (or start again after a kill), or its store cannot be read at the
/// end.
pub async fn soak(
    config: SoakBenchConfig,
    progress: &(dyn Fn(&SoakSample) + Sync),
) -> Result<SoakReport, String> {
    #[cfg(feature = "tls")]
    crate::tls::install();
    let dir = tempfile::tempdir().map_err(|e| format!("cannot make a directory: {e}"))?;
    let (data, tmp, root) = (
        dir.path().join("data"),
        dir.path().join("tmp"),
        dir.path().join("work"),
    );
    let prepare = |e: std::io::Error| format!("cannot prepare the soak's directories: {e}");
    for made in [&data, &tmp, &root] {
        std::fs::create_dir_all(made).map_err(prepare)?;
    }
    std::fs::write(root.join(SHARED_FILE), "# The plan\n".repeat(200)).map_err(prepare)?;
    std::fs::write(
        data.join("guildhall.toml"),
        format!(
            "[files]\nroots = [{:?}]\n[shell]\n",
            root.display().to_string()
        ),
    )
    .map_err(prepare)?;
    let (mut server, url) = Server::start(&config.exe, &data, &tmp, "127.0.0.1:0").await?;
    let listen = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or("127.0.0.1:0")
        .to_owned();
    let shared = Arc::new(Shared {
        http: reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?,
        url: tokio::sync::RwLock::new(url),
        tally: Mutex::new(Tally::default()),
        acknowledged: Mutex::new(Vec::new()),
        root,
    });
    let agents = config.agents.max(2);
    // Every agent makes itself known (its first request registers it) before any works, so
    // that no send goes to an agent not there yet.
    for me in 0..agents {
        shared
            .call(&format!("soak-{me}"), "whoami", json!({}))
            .await
            .map_err(|_| format!("agent soak-{me} could not join"))?;
    }
    let mean_pause = Duration::from_secs_f64(agents as f64 / f64::from(config.rate.max(1)));
    let started = Instant::now();
    let until = started + config.duration;
    let mut workers = tokio::task::JoinSet::new();
    for me in 0..agents {
        workers.spawn(agent(
            Arc::clone(&shared),
            me,
            agents,
            mean_pause,
            config.seed,
            until,
        ));
    }
    // Kills spread over the middle of the run (from a fifth to four fifths), jittered.
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let mut kills: Vec<Duration> = (0..config.kills)
        .map(|k| {
            let share = 0.2 + 0.6 * (k as f64 + rng.f64()) / config.kills.max(1) as f64;
            config.duration.mul_f64(share)
        })
        .collect();
    kills.reverse();
    let mut samples = Vec::new();
    let mut life = 0;
    let stall_at = started + config.duration / 3;
    let mut stalled = None;
    // At least 100 ms: an interval of 0 from the library would sample without pause.
    let interval = config.interval.max(Duration::from_millis(100));
    let mut next_sample = started + interval;
    while Instant::now() < until {
        let next_kill = kills.last().map(|at| started + *at);
        let mut wake = next_kill
            .map_or(next_sample, |k| k.min(next_sample))
            .min(until);
        if stalled.is_none() {
            wake = wake.min(stall_at);
        }
        tokio::time::sleep_until(wake.into()).await;
        if stalled.is_none() && Instant::now() >= stall_at {
            stalled = Some(stall(&listen).await);
        }
        if next_kill.is_some_and(|k| Instant::now() >= k) {
            kills.pop();
            server.kill();
            let (restarted, url) = Server::start(&config.exe, &data, &tmp, &listen).await?;
            server = restarted;
            *shared.url.write().await = url;
            life += 1;
        }
        if Instant::now() >= next_sample || Instant::now() >= until {
            let sample = take_sample(&shared, &server, &data, &tmp, started, life);
            progress(&sample);
            samples.push(sample);
            next_sample += interval;
        }
    }
    while workers.join_next().await.is_some() {}
    let duration_secs = started.elapsed().as_secs_f64();
    let killed = life;
    let stalled_connections = stalled.as_ref().map_or(0, Vec::len);
    drop(stalled);
    server.stop().await;
    let leftover_temp_entries = std::fs::read_dir(&tmp).map_or(0, Iterator::count);
    let orphans = started_in(&tmp).len();
    let acknowledged = std::mem::take(
        &mut *shared
            .acknowledged
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let (lost, duplicated) = ledger(&data, &acknowledged).await?;
    let mut report = SoakReport {
        agents,
        duration_secs,
        kills: killed,
        sends_acknowledged: acknowledged.len(),
        stalled_connections,
        leftover_temp_entries,
        orphans,
        lost,
        duplicated,
        p99_first_tenth_ms: p99_over(&samples, |s| s.at_secs <= duration_secs / 10.0 + 1e-9),
        p99_last_tenth_ms: p99_over(&samples, |s| s.at_secs > duration_secs * 0.9 - 1e-9),
        rss_growth_per_hour: rss_growth(&samples),
        samples,
        failures: Vec::new(),
    };
    report.failures = judge(&report);
    Ok(report)
}

/// The interval's figures, its tally taken.
fn take_sample(
    shared: &Shared,
    server: &Server,
    data: &Path,
    tmp: &Path,
    started: Instant,
    life: usize,
) -> SoakSample {
    let tally = std::mem::take(&mut *shared.tally.lock().unwrap_or_else(PoisonError::into_inner));
    let mut ops = BTreeMap::new();
    for kind in KINDS {
        let mut times = tally.times.get(kind).cloned().unwrap_or_default();
        times.sort_by(f64::total_cmp);
        ops.insert(
            kind,
            OpFigures {
                count: times.len(),
                p50_ms: percentile(&times, 0.50),
                p99_ms: percentile(&times, 0.99),
                errors: tally.errors.get(kind).cloned().unwrap_or_default(),
                error_example: tally.examples.get(kind).cloned(),
            },
        );
    }
    let (rss_kib, threads, fds) = process_figures(server.pid());
    let children = started_in(tmp);
    let children_rss_kib = children.iter().map(|&pid| process_figures(pid).0).sum();
    SoakSample {
        at_secs: started.elapsed().as_secs_f64(),
        life,
        rss_kib,
        threads,
        fds,
        store_bytes: dir_bytes(data),
        children: children.len(),
        children_rss_kib,
        dropped: tally.dropped,
        ops,
    }
}

/// Each kind's largest p99 over the samples `which` keeps (a kind none of them timed is
/// left out).
fn p99_over(
    samples: &[SoakSample],
    which: impl Fn(&SoakSample) -> bool,
) -> BTreeMap<&'static str, f64> {
    let mut worst = BTreeMap::new();
    for sample in samples.iter().filter(|s| which(s)) {
        for (kind, op) in &sample.ops {
            if op.p99_ms.is_finite() {
                let at = worst.entry(*kind).or_insert(op.p99_ms);
                *at = op.p99_ms.max(*at);
            }
        }
    }
    worst
}

/// The memory's least-squares slope over the second half of the server's last life, as a
/// share of that half's first sample per hour.
fn rss_growth(samples: &[SoakSample]) -> Option<f64> {
    let last_life = samples.last()?.life;
    let life: Vec<&SoakSample> = samples.iter().filter(|s| s.life == last_life).collect();
    let half = &life[life.len() / 2..];
    if half.len() < 3 {
        return None;
    }
    let n = half.len() as f64;
    let (mx, my) = (
        half.iter().map(|s| s.at_secs).sum::<f64>() / n,
        half.iter().map(|s| s.rss_kib as f64).sum::<f64>() / n,
    );
    let cov: f64 = half
        .iter()
        .map(|s| (s.at_secs - mx) * (s.rss_kib as f64 - my))
        .sum();
    let var: f64 = half.iter().map(|s| (s.at_secs - mx).powi(2)).sum();
    let start = half[0].rss_kib.max(1) as f64;
    (var > 0.0).then(|| cov / var * 3600.0 / start)
}

/// Each acknowledged send (by its `request_id`, in its subject) counted in the history of
/// the stopped server's store: how many are missing, and how many are there more than once.
async fn ledger(data: &Path, acknowledged: &[String]) -> Result<(usize, usize), String> {
    let runtime = crate::Runtime::builder()
        .data_dir(data)
        .build()
        .await
        .map_err(|e| format!("cannot open the soaked store: {e}"))?;
    let found = runtime
        .search_mail(crate::agents::MailSearch::new("", usize::MAX))
        .await
        .map_err(|e| format!("cannot read the mail history: {e}"));
    runtime.shutdown().await;
    let found = found?;
    // Every send the history holds, by its request_id: acknowledged or not, none twice.
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for message in &found.messages {
        if let Some(token) = message.subject.strip_prefix("soak ") {
            *counts.entry(token).or_default() += 1;
        }
    }
    let lost = acknowledged
        .iter()
        .filter(|token| !counts.contains_key(token.as_str()))
        .count();
    let duplicated = counts.values().filter(|&&n| n > 1).count();
    Ok((lost, duplicated))
}

/// The criteria missed.
fn judge(report: &SoakReport) -> Vec<String> {
    let mut failures = Vec::new();
    for (count, what) in [
        (report.orphans, "processes the server started outlived it"),
        (
            report.leftover_temp_entries,
            "entries were left in the agents' temporary directory",
        ),
        (report.lost, "acknowledged sends are not in the history"),
        (report.duplicated, "sends are in the history more than once"),
    ] {
        if count > 0 {
            failures.push(format!("{count} {what}"));
        }
    }
    for (kind, first) in &report.p99_first_tenth_ms {
        if let Some(last) = report.p99_last_tenth_ms.get(kind)
            && *last > 1.5 * first
        {
            failures.push(format!(
                "`{kind}`'s p99 over the last tenth ({last:.1} ms) is over 1.5 times the first's \
                 ({first:.1} ms)"
            ));
        }
    }
    if let Some(growth) = report.rss_growth_per_hour
        && growth > 0.01
    {
        failures.push(format!(
            "the server's memory grew by {:.1}% of its start an hour over the second half of its last life",
            growth * 100.0
        ));
    }
    failures
}
