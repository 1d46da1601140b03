//! `guildhall bench soak`: a swarm run for a long time against a real `guildhall serve`, with
//! faults, watched for what breaks over hours: memory that grows, latency that drifts, mail
//! lost or doubled, tasks finished twice or never.
//!
//! The server is this binary's `serve` on a store of its own (redb in a temporary
//! directory), with a file root, the shell, and a proxied stdio server (`[servers.peer]`,
//! this binary's `bench mcp-floor`). Most agents reach it over Streamable HTTP (the
//! stateless era, each request naming its agent in `guildhall-agent`), every one a task of
//! this process, so a thousand fit one machine; `bridged` of them each through a stdio
//! bridge process of its own (`guildhall mcp --agent ID`), as Claude Code instances do. Each
//! agent, at a seeded random pace that adds up to `rate` operations a second, sends mail
//! (each send carrying a `request_id`, retried with it until answered, so a send cut off by
//! a kill is made once), checks its inbox and acknowledges what came, merges its status
//! into a context session from the version it saw, claims tasks, renews their leases and
//! finishes them (creating one when none is free), runs short commands, reads a file, calls
//! the proxied server, and drops a waiting call midway.
//!
//! Faults, seeded: eight connections stall from a third of the run; the server is killed
//! with SIGKILL and started again on the same store `kills` times over the first half; the
//! proxied server crashes (SIGKILL) at about a third and hangs (SIGSTOP) at about two
//! thirds.
//!
//! With `store` (a PostgreSQL server), the soak makes a database of its own there and
//! starts `servers` servers on it, each with its own port and data directory: agent
//! `soak-N` calls server N mod `servers`, so mail, tasks and context cross servers through
//! the database; kills take the servers in turn; `pg_restart`, the operator's command,
//! restarts PostgreSQL once at about half of the run. Figures are the servers' together,
//! the store's size the database's, and the ledger is read from the database once every
//! server has stopped; the database is dropped after.
//!
//! Every `interval` it samples the server (RSS, threads, open descriptors, store size, the
//! processes it started) and the operations of that interval (p50 and p99 by kind, errors
//! by kind). At the end it stops the server, opens its store here, and checks the ledger:
//! each acknowledged send in the mail history exactly once; each claimed task done, each
//! acknowledged finish on the board, none finished twice; no process the server started
//! left, nothing left in the agents' temporary directory; the proxied server answering
//! again. It judges itself on those, on the p99 of the last tenth being at most 1.5 times
//! that of the first, and on the server's memory over the second half of the run growing
//! by no more than 1% of its start an hour (beyond twice the slope's standard error).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::percentile;

#[cfg(feature = "postgres")]
mod database;

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
    /// A command the server is started under (a profiler: `heaptrack`, `valgrind
    /// --tool=massif`), the server's own command line after it; empty for none. The figures
    /// sampled are then the wrapper's process's, and a kill kills the wrapper.
    pub wrapper: Vec<String>,
    /// The server's store cache, MiB (`[store] cache_mib`); `None` for its default. A short
    /// run judging memory wants a small one: the cache fills early, and what grows after is
    /// not the cache.
    pub cache_mib: Option<usize>,
    /// Agents that call through a stdio bridge process of their own (`guildhall mcp`), as
    /// Claude Code instances do; the others call over HTTP.
    pub bridged: usize,
    /// Whether the memory's growth is judged (else only reported): a run too short for the
    /// server to settle, or one kept green while a known growth is open.
    pub judge_memory: bool,
    /// A PostgreSQL server, as a connection string whose user may create databases: the
    /// servers share a database of their own made on it (and dropped after) instead of
    /// each keeping a redb store. `None`: one server on redb.
    pub store: Option<String>,
    /// Servers at work on the shared store, each on its own port and data directory; agent
    /// `soak-N` calls server N mod `servers`, kills take them in turn. More than one needs
    /// `store`.
    pub servers: usize,
    /// A shell command that restarts the PostgreSQL server, run once at about half of the
    /// run (its output to `pg-restart.log` in the soak's directory).
    pub pg_restart: Option<String>,
}

/// One interval's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SoakSample {
    /// Seconds since the swarm started, at the end of the interval.
    pub at_secs: f64,
    /// Kills so far (0 until the first kill).
    pub life: usize,
    /// The servers' resident memory together, KiB.
    pub rss_kib: u64,
    /// Each server's, KiB.
    pub servers_rss_kib: Vec<u64>,
    /// Their threads.
    pub threads: u64,
    /// Their open file descriptors.
    pub fds: u64,
    /// The store's size on disk, bytes (the database's, when they share one).
    pub store_bytes: u64,
    /// Processes the server started, running now (commands).
    pub children: usize,
    /// The children's resident memory together, KiB.
    pub children_rss_kib: u64,
    /// Calls given up mid-call (the connection dropped) over the interval.
    pub dropped: usize,
    /// Unread messages in the agents' inboxes, as each agent's last inbox check said: a
    /// backlog that grows is mail no agent will list again (or a swarm that cannot keep up).
    pub unread: u64,
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
    /// Errors, by kind (`unreachable` while the server is down, `transient` for an error the
    /// server says may pass, such as its store unavailable while PostgreSQL restarts, `tool`
    /// for any other error of a tool).
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
    /// Servers they worked with.
    pub servers: usize,
    /// `redb`, or `postgres` (a database the servers shared).
    pub store: &'static str,
    /// How long they worked, seconds.
    pub duration_secs: f64,
    /// Kills done.
    pub kills: usize,
    /// How long each killed server took to answer `status` again, seconds (it opens its
    /// store, reading every page: a time that grows with the store).
    pub restarts_secs: Vec<f64>,
    /// PostgreSQL's restarts, as run.
    pub pg_restarts: Vec<PgRestart>,
    /// Every interval, in order.
    pub samples: Vec<SoakSample>,
    /// Sends acknowledged (each with its own `request_id`).
    pub sends_acknowledged: usize,
    /// Calls answered through the agents' stdio bridges (the rest went over HTTP).
    pub bridged_calls: usize,
    /// Connections stalled from a third of the run on (half sent a request and never read
    /// the answer, half never finished sending one).
    pub stalled_connections: usize,
    /// What the agents' temporary directory holds once the server stopped (a killed life's
    /// private directories included, which the next life removes).
    pub leftover_temp_entries: usize,
    /// Processes the server started still running once it stopped.
    pub orphans: usize,
    /// Their pids and command lines.
    pub orphan_commands: Vec<String>,
    /// Acknowledged sends no recipient's copy holds (inboxes and archives, read from the
    /// store once every server stopped).
    pub lost: usize,
    /// Sends the copies hold under more than one message id: made twice.
    pub duplicated: usize,
    /// Acknowledged sends the mail history (what `search_mail` and the observer show) does
    /// not list, though a copy holds them: reported, not judged (a server killed before
    /// its log writer ran leaves them to the next start's backfill).
    pub unlogged: usize,
    /// The task board's ledger: claims and finishes acknowledged, checked against it.
    pub tasks: TaskCheck,
    /// Agents' own files whose last acknowledged edit was checked once the server stopped.
    pub edits_checked: usize,
    /// Of those, files that do not hold it (or a later step): an acknowledged edit lost.
    pub edits_lost: usize,
    /// The proxied server's faults, as struck.
    pub peer_faults: Vec<PeerFaultStruck>,
    /// Whether the proxied server answered a call after the run (and its faults).
    pub peer_answers_after_faults: bool,
    /// When it did not, what the last call got.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_error_after_faults: Option<String>,
    /// Each kind's p99 over the first tenth of the run (all its answers), ms; the kinds
    /// with at least 200 answers in each tenth.
    pub p99_first_tenth_ms: BTreeMap<&'static str, f64>,
    /// The same over the last tenth.
    pub p99_last_tenth_ms: BTreeMap<&'static str, f64>,
    /// The server's memory growth over the second half of the run, as a share of its start
    /// per hour (a least-squares slope); `None` with fewer than four samples there.
    pub rss_growth_per_hour: Option<f64>,
    /// That slope's standard error, in the same unit: what the samples' noise allows.
    pub rss_growth_stderr_per_hour: Option<f64>,
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
const WRITE: &str = "write_file";
const EDIT: &str = "edit_file";
const CLAIM: &str = "task_claim";
const CREATE: &str = "task_create";
const HEARTBEAT: &str = "task_heartbeat";
const FINISH: &str = "task_update";
/// The proxied stdio server's tool (`bench mcp-floor`'s `echo`, as `[servers.peer]`).
const PEER: &str = "mcp__peer__echo";
const KINDS: [&str; 13] = [
    SEND, INBOX, MARK, CONTEXT, CLAIM, CREATE, HEARTBEAT, FINISH, BASH, PEER, READ, WRITE, EDIT,
];
/// The proxied server's call budget, and how long it has to answer a probe after a call
/// was cut off before it is taken for hung (its `timeout` and `hang_grace`): short, so a
/// hung server is found within the run.
const PEER_TIMEOUT: &str = "2s";
const PEER_HANG_GRACE: &str = "1s";
/// The label of the soak's tasks, which agents claim by.
const TASK_LABEL: &str = "soak";
/// The lease a claim asks for: longer than a killed server takes to start again, so a
/// kill does not take a task from its holder.
const TASK_LEASE_SECS: u64 = 60;
/// How often a held task's lease is renewed: a third of it.
const RENEW_EVERY: Duration = Duration::from_secs(TASK_LEASE_SECS / 3);
/// Connections stalled at once: each sent a request and never reads the answer, or never
/// finished sending it.
const STALLED: usize = 8;

/// The most the server's memory may grow over the second half of the run: 1% of its start
/// an hour.
const MAX_RSS_GROWTH_PER_HOUR: f64 = 0.01;

/// How long the processes a stopped server started have to end before they count as
/// orphans (those its end kills are gone a moment later, not at once).
const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// How long a send cut off by a kill is retried (with its `request_id`) after the run ends.
const SEND_GRACE: Duration = Duration::from_secs(30);
/// How long a server is given to answer `status` after it starts. Opening its store reads
/// every page of it (redb's integrity check, and after a kill redb's repair), so a start
/// takes longer as the store grows: at 19 minutes of 1,000 agents (301 MiB) a restarted
/// server did not answer within 30 s. Each restart's time is reported.
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The server under soak: a child process on its data directory.
struct Server {
    exe: PathBuf,
    data: PathBuf,
    child: std::process::Child,
}

impl Server {
    /// Starts `serve` in `place` (at its port: the same after a kill) on `store` when the
    /// servers share a database, and waits until it answers `status`; returns it and its
    /// MCP URL.
    async fn start(
        config: &SoakBenchConfig,
        place: &Place,
        store: Option<&str>,
    ) -> Result<(Self, String), String> {
        let (exe, wrapper, data, tmp, listen) = (
            config.exe.as_path(),
            config.wrapper.as_slice(),
            place.data.as_path(),
            place.tmp.as_path(),
            place.listen.as_str(),
        );
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = std::process::Command::new(program);
                command.args(args).arg(exe);
                command
            }
            None => std::process::Command::new(exe),
        };
        let child = command
            .arg("--data-dir")
            .arg(data)
            .args(["serve", "--listen", listen, "--max-sessions", "100000"])
            .env("RUST_LOG", "off")
            // Its agents' private directories go here, to be counted at the end.
            .env("TMPDIR", tmp)
            // The database, if one, by the environment: not on a command line anyone may read.
            .envs(store.map(|url| ("GUILDHALL_STORE", url)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                let program = wrapper.first().map_or(exe, Path::new);
                format!("cannot start `{}`: {e}", program.display())
            })?;
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
    /// Each server's MCP URL (the same port after a kill, so it changes only at a start).
    urls: Vec<tokio::sync::RwLock<String>>,
    tally: Mutex<Tally>,
    /// The `request_id` of every acknowledged send.
    acknowledged: Mutex<Vec<String>>,
    /// Task transitions the server acknowledged.
    tasks: Mutex<TaskLedger>,
    /// The answers' times in the first and last tenths.
    tenths: Tenths,
    /// The agents that call over a stdio bridge, each its own.
    bridges: HashMap<String, tokio::sync::Mutex<Bridge>>,
    /// Calls answered over a bridge.
    bridged_calls: std::sync::atomic::AtomicUsize,
    /// The binary, and each server's data directory, a bridge is started with.
    exe: PathBuf,
    data: Vec<PathBuf>,
    /// The agents' file root (each agent's own files, and one all read).
    root: PathBuf,
    /// Teams of about ten agents, each a role (`team-K`) its members broadcast to.
    teams: usize,
    /// Each agent's last acknowledged edit of its own file (the step it wrote).
    edits: Mutex<HashMap<usize, u64>>,
    /// Each agent's unread messages, as its last inbox check said.
    unread: Mutex<HashMap<usize, u64>>,
}

impl Shared {
    /// The role of agent `soak-N`: its team.
    fn team_of(&self, agent: &str) -> String {
        format!("team-{}", number(agent) % self.teams.max(1))
    }

    /// The server agent `soak-N` calls: N mod the servers.
    fn server_of(&self, agent: &str) -> usize {
        number(agent) % self.urls.len().max(1)
    }
}

/// The N of agent `soak-N`.
fn number(agent: &str) -> usize {
    agent
        .strip_prefix("soak-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The task transitions agents saw acknowledged, checked against the board at the end.
#[derive(Default)]
struct TaskLedger {
    /// Tasks an agent claimed (its claim answered).
    claimed: Vec<Value>,
    /// Tasks an agent finished (`done`, answered).
    finished: Vec<Value>,
}

/// The file every agent reads, in the root.
const SHARED_FILE: &str = "plan.md";

/// Why a call did not get an answer.
enum Failure {
    /// No answer: the server is down, or the request was cut off.
    Unreachable,
    /// The tool answered with an error: its text, and whether the server says the same
    /// call may succeed later (`guildhall/transient`: what it needs is unavailable for now,
    /// such as its store while PostgreSQL restarts).
    Tool { text: String, transient: bool },
}

/// Every answer's time in the first and the last tenth of the run, by kind: their p99s,
/// each over all of its tenth's calls, are what the latency criterion compares.
struct Tenths {
    /// When the swarm started working, and for how long it works.
    run: std::sync::OnceLock<(Instant, Duration)>,
    times: Mutex<[HashMap<&'static str, Vec<f64>>; 2]>,
}

impl Tenths {
    fn add(&self, kind: &'static str, ms: f64) {
        let Some(&(started, duration)) = self.run.get() else {
            return;
        };
        let at = started.elapsed();
        let tenth = if at < duration / 10 {
            0
        } else if at >= duration.mul_f64(0.9) && at <= duration {
            1
        } else {
            return;
        };
        self.times.lock().unwrap_or_else(PoisonError::into_inner)[tenth]
            .entry(kind)
            .or_default()
            .push(ms);
    }

    /// Each kind's p99 over the first tenth and over the last, for the kinds with at least
    /// [`MIN_P99_CALLS`] answers in both (a p99 of fewer is about their maximum).
    fn p99s(&self) -> [BTreeMap<&'static str, f64>; 2] {
        let mut times =
            std::mem::take(&mut *self.times.lock().unwrap_or_else(PoisonError::into_inner));
        let mut p99s = [BTreeMap::new(), BTreeMap::new()];
        for kind in KINDS {
            if times
                .iter()
                .all(|tenth| tenth.get(kind).is_some_and(|t| t.len() >= MIN_P99_CALLS))
            {
                for (tenth, p99) in times.iter_mut().zip(&mut p99s) {
                    let calls = tenth.entry(kind).or_default();
                    calls.sort_by(f64::total_cmp);
                    p99.insert(kind, percentile(calls, 0.99));
                }
            }
        }
        p99s
    }
}

/// Answers a tenth needs of a kind for its p99 to be compared.
const MIN_P99_CALLS: usize = 200;

/// An agent's stdio bridge (`guildhall mcp --agent ID --no-start`), as Claude Code launches
/// it: started at its agent's first call, and again after it ended (the server killed).
#[derive(Default)]
struct Bridge {
    peer: Option<super::mcp::Peer>,
    /// A bridge that could not start is not tried again before this.
    retry_at: Option<Instant>,
}

/// How long after a bridge failed to start (the server down) it is tried again.
const BRIDGE_RETRY: Duration = Duration::from_millis(200);

impl Shared {
    /// Calls `tool` as `agent` (over its bridge if it has one, else over HTTP); its
    /// structured result.
    async fn call(&self, agent: &str, tool: &str, arguments: Value) -> Result<Value, Failure> {
        let answer = match self.bridges.get(agent) {
            Some(bridge) => self.bridged(agent, bridge, tool, arguments).await?,
            None => self.over_http(agent, tool, arguments).await?,
        };
        let result = &answer["result"];
        if let Some(error) = answer.get("error") {
            return Err(Failure::Tool {
                text: error["message"].to_string(),
                transient: false,
            });
        }
        if result["isError"] == json!(true) {
            return Err(Failure::Tool {
                text: result["content"][0]["text"].to_string(),
                transient: result["_meta"]["guildhall/transient"] == json!(true),
            });
        }
        Ok(result["structuredContent"].clone())
    }

    async fn over_http(&self, agent: &str, tool: &str, arguments: Value) -> Result<Value, Failure> {
        let url = self.urls[self.server_of(agent)].read().await.clone();
        let response =
            super::mcp::stateless_call(&self.http, &url, "guildhall-soak", agent, tool, arguments)
                .header(crate::mcp::ROLE_HEADER, self.team_of(agent))
                .send()
                .await
                .map_err(|_| Failure::Unreachable)?;
        if response.status().is_server_error() {
            return Err(Failure::Unreachable);
        }
        let text = response.text().await.map_err(|_| Failure::Unreachable)?;
        super::mcp::answer_in(&text).ok_or(Failure::Unreachable)
    }

    async fn bridged(
        &self,
        agent: &str,
        bridge: &tokio::sync::Mutex<Bridge>,
        tool: &str,
        arguments: Value,
    ) -> Result<Value, Failure> {
        let mut bridge = bridge.lock().await;
        if bridge.peer.is_none() {
            if bridge.retry_at.is_some_and(|at| Instant::now() < at) {
                return Err(Failure::Unreachable);
            }
            let mut command = tokio::process::Command::new(&self.exe);
            command
                .arg("--data-dir")
                .arg(&self.data[self.server_of(agent)])
                .args([
                    "mcp",
                    "--agent",
                    agent,
                    "--role",
                    &self.team_of(agent),
                    "--no-start",
                ])
                .env("RUST_LOG", "off");
            match super::mcp::Peer::connect(command).await {
                Ok(peer) => bridge.peer = Some(peer),
                Err(_) => {
                    bridge.retry_at = Some(Instant::now() + BRIDGE_RETRY);
                    return Err(Failure::Unreachable);
                }
            }
        }
        let peer = bridge.peer.as_mut().ok_or(Failure::Unreachable)?;
        match tokio::time::timeout(REQUEST_TIMEOUT, peer.call_tool(tool, arguments)).await {
            Ok(Ok(answer)) => {
                self.bridged_calls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(answer)
            }
            Ok(Err(_)) | Err(_) => {
                // Its server went away: the bridge ended; the next call starts another.
                bridge.peer = None;
                Err(Failure::Unreachable)
            }
        }
    }

    /// Calls and counts: the time of an answer, or the kind of error and whether a retry
    /// may succeed (no answer, or an error the server calls transient).
    async fn timed(
        &self,
        agent: &str,
        kind: &'static str,
        arguments: Value,
    ) -> Result<Value, bool> {
        let started = Instant::now();
        let outcome = self.call(agent, kind, arguments).await;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if !matches!(outcome, Err(Failure::Unreachable)) {
            self.tenths.add(kind, ms);
        }
        let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(value) => {
                tally.times.entry(kind).or_default().push(ms);
                Ok(value)
            }
            Err(failure) => {
                let (name, retry) = match failure {
                    Failure::Unreachable => ("unreachable", true),
                    Failure::Tool { text, transient } => {
                        tally.times.entry(kind).or_default().push(ms);
                        tally.examples.entry(kind).or_insert(text);
                        (if transient { "transient" } else { "tool" }, transient)
                    }
                };
                *tally
                    .errors
                    .entry(kind)
                    .or_default()
                    .entry(name)
                    .or_default() += 1;
                Err(retry)
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
    // The task this agent holds, and how many heartbeats it gives before finishing it.
    let mut held: Option<(Value, u32)> = None;
    // When its lease was last renewed: renewed at a third of the lease whatever the mix
    // draws, as a working agent does.
    let mut renewed = Instant::now();
    // The last message it received (what a reply answers).
    let mut received: Option<Value> = None;
    // The step its own file holds, when it knows it (after a failed edit it reads it again).
    let mut edited: Option<u64> = None;
    while Instant::now() < until {
        n += 1;
        let pause = mean_pause.mul_f64(0.5 + rng.f64());
        tokio::time::sleep(pause).await;
        if let Some((task, _)) = &held
            && renewed.elapsed() >= RENEW_EVERY
        {
            let _ = shared
                .timed(&id, HEARTBEAT, json!({ "id": task.clone() }))
                .await;
            renewed = Instant::now();
        }
        match rng.u8(..100) {
            0..40 => {
                let token = format!("s{me}x{sent}");
                sent += 1;
                let mut args = json!({ "subject": format!("soak {token}"),
                    "body": "status: all green, next step planned", "request_id": token });
                match rng.u8(..8) {
                    // A reply to what it last received (in that thread, to its sender).
                    0 if received.is_some() => {
                        args["reply_to"] = received.take().unwrap_or_default();
                    }
                    // A broadcast to its team (its role), as a PM's to its subagents.
                    1 => args["to"] = json!(format!("role:{}", shared.team_of(&id))),
                    _ => args["to"] = json!(format!("soak-{}", rng.usize(..agents))),
                }
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
            40..62 => {
                // A waiting check of the unread mail, as an idle agent makes; what came is
                // acknowledged, so inboxes stay as short as a working swarm's. Unread, not
                // `since: "last"`: that lists each message once, so what a check cut off
                // mid-call listed would never be seen (a server cannot tell that an answer
                // did not reach its client); unread mail is listed until acknowledged.
                let taken = shared
                    .timed(&id, INBOX, json!({ "limit": 20, "wait_secs": 0.5 }))
                    .await;
                if let Ok(inbox) = &taken
                    && let Some(unread) = inbox["unread"].as_u64()
                {
                    shared
                        .unread
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(me, unread);
                }
                let ids: Vec<Value> = taken.ok().map_or_else(Vec::new, |inbox| {
                    inbox["messages"]
                        .as_array()
                        .map(|messages| messages.iter().map(|m| m["id"].clone()).collect())
                        .unwrap_or_default()
                });
                if let Some(last) = ids.last() {
                    received = Some(last.clone());
                }
                if !ids.is_empty() {
                    let _ = shared
                        .timed(&id, MARK, json!({ "ids": ids, "ack": true }))
                        .await;
                }
            }
            62..73 => {
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
            73..83 => {
                held = task_step(&shared, &id, held, &mut rng, n, until).await;
                if held.is_some() {
                    // A claim or a heartbeat: the lease runs from now.
                    renewed = Instant::now();
                }
            }
            83..85 => {
                edited = edit_step(&shared, &id, me, edited, n).await;
            }
            85..88 => {
                // A short command writing in the agent's root, as a coding agent's.
                let notes = shared.root.join(format!("notes-{me}.txt"));
                let command = format!("echo step {n} > '{0}' && cat '{0}'", notes.display());
                let _ = shared.timed(&id, BASH, json!({ "command": command })).await;
            }
            88..92 => {
                let _ = shared
                    .timed(&id, PEER, json!({ "text": format!("{id} step {n}") }))
                    .await;
            }
            92..96 => {
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
                // A waiting check given up mid-call: the connection is dropped under it (over
                // HTTP, for a bridged agent too: its stdio stream cannot drop one call).
                let call = shared.over_http(&id, INBOX, json!({ "limit": 5, "wait_secs": 2 }));
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
    // What it holds is finished: every task claimed is done by the end.
    if let Some((task, _)) = held {
        finish(&shared, &id, task, until).await;
    }
}

/// One edit of the agent's own file (`edits-N.txt` in the root): `step K` becomes `step
/// N`. Knowing no step (at first, or after an edit whose answer a kill cut), it reads the
/// file and writes it whole, as an agent that lost track does (a write needs a read first).
/// Returns the step the file holds, when known; each one acknowledged is noted for the
/// ledger.
async fn edit_step(
    shared: &Shared,
    id: &str,
    me: usize,
    known: Option<u64>,
    n: u64,
) -> Option<u64> {
    let path = shared
        .root
        .join(format!("edits-{me}.txt"))
        .display()
        .to_string();
    let done = match known {
        Some(step) => shared
            .timed(
                id,
                EDIT,
                json!({ "path": path, "old_string": format!("step {step}\n"),
                        "new_string": format!("step {n}\n") }),
            )
            .await
            .is_ok(),
        None => {
            // Absent at first: the read fails and the write creates it.
            let _ = shared.timed(id, READ, json!({ "path": path })).await;
            shared
                .timed(
                    id,
                    WRITE,
                    json!({ "path": path, "content": format!("step {n}\n") }),
                )
                .await
                .is_ok()
        }
    };
    if !done {
        return None;
    }
    shared
        .edits
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(me, n);
    Some(n)
}

/// One step of an agent's work on the board: with no task, claim one (or, with none to
/// claim, create one, so the board holds about as many as the agents take); holding one,
/// renew its lease a few times, then finish it. Returns what it holds after.
async fn task_step(
    shared: &Shared,
    id: &str,
    held: Option<(Value, u32)>,
    rng: &mut fastrand::Rng,
    n: u64,
    until: Instant,
) -> Option<(Value, u32)> {
    match held {
        Some((task, 0)) => {
            finish(shared, id, task, until).await;
            None
        }
        Some((task, beats)) => {
            // Whatever the heartbeat got, the agent finishes what it claimed: a finish is
            // refused if the task was taken from it (its lease run out), and then whoever
            // took it finishes it, so a claimed task is done once either way.
            let _ = shared
                .timed(id, HEARTBEAT, json!({ "id": task.clone() }))
                .await;
            Some((task, beats - 1))
        }
        None => {
            let claimed = shared
                .timed(
                    id,
                    CLAIM,
                    json!({ "labels": [TASK_LABEL], "lease_secs": TASK_LEASE_SECS }),
                )
                .await
                .ok()?;
            let task = claimed["task"]["id"].clone();
            if task.is_null() {
                let _ = shared
                    .timed(
                        id,
                        CREATE,
                        json!({ "title": format!("soak task {id}x{n}"), "labels": [TASK_LABEL] }),
                    )
                    .await;
                return None;
            }
            shared
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .claimed
                .push(task.clone());
            Some((task, rng.u32(..4)))
        }
    }
}

/// Marks `task` done, retried while the server is down (a retry after a kill that cut the
/// first attempt's answer is refused, the task no longer held: the board says whether the
/// first landed).
async fn finish(shared: &Shared, id: &str, task: Value, until: Instant) {
    let deadline = until.max(Instant::now()) + SEND_GRACE;
    loop {
        match shared
            .timed(
                id,
                FINISH,
                json!({ "id": task.clone(), "status": "done", "note": "finished" }),
            )
            .await
        {
            Ok(_) => {
                shared
                    .tasks
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .finished
                    .push(task);
                return;
            }
            Err(true) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return,
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

/// A process as `/proc/PID/stat` shows it: its parent, and when it started (clock ticks
/// after boot), which tells it from a later process given the same pid. `None` for a
/// process that has ended, reaped or not (a zombie).
fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name, which may hold spaces and parentheses.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    if matches!(fields.first(), Some(&("Z" | "X"))) {
        return None;
    }
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// Every process below `root` (its children, theirs, ...), each with its start time.
fn descendants(root: u32) -> Vec<(u32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let all: Vec<(u32, u32, u64)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| stat_of(pid).map(|(parent, start)| (pid, parent, start)))
        .collect();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for &(pid, _, start) in all.iter().filter(|(_, p, _)| *p == parent) {
            found.push((pid, start));
            parents.push(pid);
        }
    }
    found
}

/// `pid`'s command line, its arguments joined by spaces.
fn command_line(pid: u32) -> String {
    let line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    format!(
        "{pid}: {}",
        String::from_utf8_lossy(&line).replace('\0', " ").trim_end()
    )
}

/// Whether `process` still runs (the same pid, started at the same time).
fn running((pid, start): (u32, u64)) -> bool {
    stat_of(pid).is_some_and(|(_, now)| now == start)
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

/// PostgreSQL restarted by the operator's command, as run.
#[derive(Debug, Clone, Serialize)]
pub struct PgRestart {
    /// Seconds since the swarm started, when the command began.
    pub at_secs: f64,
    /// How long the command took, seconds.
    pub took_secs: f64,
    /// Whether it exited with success.
    pub ok: bool,
    /// When it did not: its status and the last lines it wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How long the operator's PostgreSQL restart may take before it is killed and the run
/// fails (`pg_ctl restart -w` waits a minute at most by default).
const PG_RESTART_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes of the restart command's output an error quotes at most (its end).
const PG_RESTART_TAIL: u64 = 2048;

/// Runs `command` (with `sh -c`), which restarts PostgreSQL, its output to `pg-restart.log`
/// in `dir`: a file, not a pipe, since a server it starts keeps what it was given open.
/// Killed past [`PG_RESTART_TIMEOUT`].
async fn restart_postgres(command: &str, dir: &Path, started: Instant) -> PgRestart {
    let at_secs = started.elapsed().as_secs_f64();
    let began = Instant::now();
    let log_path = dir.join("pg-restart.log");
    let status = match std::fs::File::create(&log_path).and_then(|log| Ok((log.try_clone()?, log)))
    {
        Ok((out, err)) => {
            let run = tokio::process::Command::new("sh")
                .args(["-c", command])
                .stdin(std::process::Stdio::null())
                .stdout(out)
                .stderr(err)
                .kill_on_drop(true)
                .status();
            match tokio::time::timeout(PG_RESTART_TIMEOUT, run).await {
                Ok(status) => status.map_err(|e| format!("cannot run `sh -c {command}`: {e}")),
                Err(_) => Err(format!(
                    "`{command}` did not end within {PG_RESTART_TIMEOUT:?}, and was killed"
                )),
            }
        }
        Err(e) => Err(format!("cannot make {}: {e}", log_path.display())),
    };
    let error = match status {
        Ok(status) if status.success() => None,
        Ok(status) => Some(format!("`{command}` {status}: {}", tail_of(&log_path))),
        Err(e) => Some(e),
    };
    PgRestart {
        at_secs,
        took_secs: began.elapsed().as_secs_f64(),
        ok: error.is_none(),
        error,
    }
}

/// The last lines of what `path` holds, at most [`PG_RESTART_TAIL`] bytes of its end,
/// joined with ` / `.
fn tail_of(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let length = file.metadata().map_or(0, |m| m.len());
        let _ = file.seek(SeekFrom::Start(length.saturating_sub(PG_RESTART_TAIL)));
        let mut bytes = Vec::new();
        let _ = file.take(PG_RESTART_TAIL).read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" / ")
}

/// A fault of the proxied server.
#[derive(Debug, Clone, Copy)]
enum PeerFault {
    /// Killed (SIGKILL), as a server that crashes: its supervisor starts it again.
    Crash,
    /// Stopped (SIGSTOP) and never continued, as a server that hangs: the call cut off at
    /// its deadline, an unanswered probe gets it killed and started again.
    Hang,
}

impl PeerFault {
    /// Strikes every copy of the proxied server the soaked server (`server`) started.
    fn strike(self, server: u32, started: Instant) -> PeerFaultStruck {
        let peers: Vec<u32> = descendants(server)
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|line| line.split(|&b| b == 0).any(|arg| arg == b"mcp-floor"))
            })
            .collect();
        let (signal, fault) = match self {
            Self::Crash => (libc::SIGKILL, "crash"),
            Self::Hang => (libc::SIGSTOP, "hang"),
        };
        for &pid in &peers {
            signal_process(pid, signal);
        }
        PeerFaultStruck {
            at_secs: started.elapsed().as_secs_f64(),
            fault,
            processes: peers.len(),
        }
    }
}

/// Sends `signal` to `pid`, a process the soaked server started (its `TMPDIR` is the
/// soak's), found a moment ago.
#[allow(unsafe_code)]
fn signal_process(pid: u32, signal: i32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill sends a signal; no memory is involved.
        unsafe { libc::kill(pid, signal) };
    }
}

/// A fault of the proxied server, as struck.
#[derive(Debug, Clone, Serialize)]
pub struct PeerFaultStruck {
    /// Seconds since the swarm started.
    pub at_secs: f64,
    /// `crash` (SIGKILL) or `hang` (SIGSTOP).
    pub fault: &'static str,
    /// Its processes struck.
    pub processes: usize,
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

/// Runs the soak; `progress` is called with each sample as it is taken. Once `stop` is
/// ready (the operator's Ctrl-C or SIGTERM) it ends at once: the servers and bridges it
/// started are killed, its directories removed and its database dropped, and it answers
/// an error saying so.
///
/// # Errors
/// Several servers or a PostgreSQL restart without a PostgreSQL store; the database cannot
/// be made; a server cannot start (or start again after a kill); the store cannot be read
/// at the end; stopped.
pub async fn soak(
    config: SoakBenchConfig,
    progress: &(dyn Fn(&SoakSample) + Sync),
    stop: impl std::future::Future<Output = ()>,
) -> Result<SoakReport, String> {
    #[cfg(feature = "tls")]
    crate::tls::install();
    if config.store.is_none() && config.servers > 1 {
        return Err(format!(
            "{} servers need a PostgreSQL store to share (`--store`): a redb store has one",
            config.servers
        ));
    }
    if config.store.is_none() && config.pg_restart.is_some() {
        return Err(
            "a PostgreSQL restart (`--pg-restart`) needs a PostgreSQL store (`--store`)".into(),
        );
    }
    // Dropped when stopped, the run kills what it started (`Server`'s drop, the bridges'
    // closed input) and removes its directories.
    let stopped = || Err("stopped by a signal before its end: what it started was stopped".into());
    match config.store.as_deref() {
        None => tokio::select! {
            report = run(&config, None, progress) => report,
            () = stop => stopped(),
        },
        #[cfg(feature = "postgres")]
        Some(admin) => {
            let database = Database::make(admin).await?;
            let report = tokio::select! {
                report = run(&config, Some(&database), progress) => report,
                () = stop => stopped(),
            };
            database.remove().await;
            report
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err("this binary was built without PostgreSQL (feature `postgres`)".into()),
    }
}

#[cfg(feature = "postgres")]
use database::Database;

/// Built without PostgreSQL, there is no database to share.
#[cfg(not(feature = "postgres"))]
enum Database {}

#[cfg(not(feature = "postgres"))]
impl Database {
    fn url(&self) -> &str {
        match *self {}
    }

    #[allow(clippy::unused_async)]
    async fn size(&self) -> Option<u64> {
        match *self {}
    }
}

/// Where one of the soak's servers lives: its data directory (its socket, its config, its
/// redb store when there is no database), its agents' `TMPDIR`, and its port (the same
/// after a kill).
struct Place {
    data: PathBuf,
    tmp: PathBuf,
    listen: String,
}

/// The soak itself, on `database` when the servers share one.
async fn run(
    config: &SoakBenchConfig,
    database: Option<&Database>,
    progress: &(dyn Fn(&SoakSample) + Sync),
) -> Result<SoakReport, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot make a directory: {e}"))?;
    let root = dir.path().join("work");
    let store_url = database.map(Database::url);
    let mut places: Vec<Place> = (0..config.servers.max(1))
        .map(|k| Place {
            data: dir.path().join(format!("data-{k}")),
            tmp: dir.path().join(format!("tmp-{k}")),
            listen: "127.0.0.1:0".to_owned(),
        })
        .collect();
    let prepare = |e: std::io::Error| format!("cannot prepare the soak's directories: {e}");
    std::fs::create_dir_all(&root).map_err(prepare)?;
    std::fs::write(root.join(SHARED_FILE), "# The plan\n".repeat(200)).map_err(prepare)?;
    let store = config
        .cache_mib
        .map(|mib| format!("[store]\ncache_mib = {mib}\n"))
        .unwrap_or_default();
    let server_config = format!(
        "{store}[files]\nroots = [{root:?}]\n[shell]\n\
         [servers.peer]\ncommand = {exe:?}\nargs = [\"bench\", \"mcp-floor\"]\n\
         env = {{ RUST_LOG = \"off\" }}\ntimeout = \"{PEER_TIMEOUT}\"\n\
         hang_grace = \"{PEER_HANG_GRACE}\"\n",
        root = root.display().to_string(),
        exe = config.exe.display().to_string(),
    );
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    for place in &mut places {
        for made in [&place.data, &place.tmp] {
            std::fs::create_dir_all(made).map_err(prepare)?;
        }
        std::fs::write(place.data.join("guildhall.toml"), &server_config).map_err(prepare)?;
        let (server, url) = Server::start(config, place, store_url).await?;
        place.listen = url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or("127.0.0.1:0")
            .to_owned();
        servers.push(server);
        urls.push(tokio::sync::RwLock::new(url));
    }
    let agents = config.agents.max(2);
    let shared = Arc::new(Shared {
        http: reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?,
        urls,
        tally: Mutex::new(Tally::default()),
        acknowledged: Mutex::new(Vec::new()),
        tasks: Mutex::new(TaskLedger::default()),
        tenths: Tenths {
            run: std::sync::OnceLock::new(),
            times: Mutex::default(),
        },
        // The last ones (never the first, which calls over HTTP after the run).
        bridges: (0..config.bridged.min(agents - 1))
            .map(|k| {
                (
                    format!("soak-{}", agents - 1 - k),
                    tokio::sync::Mutex::default(),
                )
            })
            .collect(),
        bridged_calls: std::sync::atomic::AtomicUsize::new(0),
        exe: config.exe.clone(),
        data: places.iter().map(|p| p.data.clone()).collect(),
        root,
        teams: agents.div_ceil(10),
        edits: Mutex::new(HashMap::new()),
        unread: Mutex::new(HashMap::new()),
    });
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
    let _ = shared.tenths.run.set((started, config.duration));
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
    // Kills spread over the first half after its first tenth (that the first tenth's
    // latency is the servers' at rest, and the second half's memory one life's), jittered;
    // with several servers, each kill the next server's.
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let mut kills: Vec<Duration> = (0..config.kills)
        .map(|k| {
            let share = 0.1 + 0.35 * (k as f64 + rng.f64()) / config.kills.max(1) as f64;
            config.duration.mul_f64(share)
        })
        .collect();
    kills.reverse();
    // The proxied server (the first server's) crashes at about a third of the run, and
    // hangs at about two thirds.
    let mut peer_faults = vec![
        (
            config.duration.mul_f64(0.62 + 0.06 * rng.f64()),
            PeerFault::Hang,
        ),
        (
            config.duration.mul_f64(0.30 + 0.06 * rng.f64()),
            PeerFault::Crash,
        ),
    ];
    // PostgreSQL restarts once the kills are done, before the half whose memory is judged.
    let mut pg_restart = config
        .pg_restart
        .as_deref()
        .map(|command| (config.duration.mul_f64(0.46 + 0.03 * rng.f64()), command));
    let mut pg_restarts = Vec::new();
    // How long each killed server took to answer again.
    let mut restarts_secs = Vec::new();
    let mut peer_faulted = Vec::new();
    // What each life of each server had started when it ended: none may outlive it.
    let mut started_by_server = Vec::new();
    let mut samples = Vec::new();
    let mut life = 0;
    let mut store_bytes = 0;
    let stall_at = started + config.duration / 3;
    let mut stalled = None;
    // At least 100 ms: an interval of 0 from the library would sample without pause.
    let interval = config.interval.max(Duration::from_millis(100));
    let mut next_sample = started + interval;
    while Instant::now() < until {
        let next_kill = kills.last().map(|at| started + *at);
        let next_peer_fault = peer_faults.last().map(|(at, _)| started + *at);
        let next_pg_restart = pg_restart.map(|(at, _)| started + at);
        let mut wake = [next_kill, next_peer_fault, next_pg_restart]
            .into_iter()
            .flatten()
            .fold(next_sample, Instant::min)
            .min(until);
        if stalled.is_none() {
            wake = wake.min(stall_at);
        }
        tokio::time::sleep_until(wake.into()).await;
        if stalled.is_none() && Instant::now() >= stall_at {
            stalled = Some(stall(&places[0].listen).await);
        }
        if next_peer_fault.is_some_and(|at| Instant::now() >= at)
            && let Some((_, fault)) = peer_faults.pop()
        {
            peer_faulted.push(fault.strike(servers[0].pid(), started));
        }
        if next_kill.is_some_and(|k| Instant::now() >= k) {
            kills.pop();
            let victim = life % servers.len();
            started_by_server.extend(descendants(servers[victim].pid()));
            servers[victim].kill();
            let began = Instant::now();
            let (restarted, url) = Server::start(config, &places[victim], store_url).await?;
            restarts_secs.push(began.elapsed().as_secs_f64());
            servers[victim] = restarted;
            *shared.urls[victim].write().await = url;
            life += 1;
        }
        if next_pg_restart.is_some_and(|at| Instant::now() >= at)
            && let Some((_, command)) = pg_restart.take()
        {
            pg_restarts.push(restart_postgres(command, dir.path(), started).await);
        }
        if Instant::now() >= next_sample || Instant::now() >= until {
            store_bytes = match database {
                Some(database) => database.size().await.unwrap_or(store_bytes),
                None => dir_bytes(&places[0].data),
            };
            let sample = take_sample(&shared, &servers, store_bytes, started, life);
            progress(&sample);
            samples.push(sample);
            next_sample += interval;
        }
    }
    while workers.join_next().await.is_some() {}
    let duration_secs = started.elapsed().as_secs_f64();
    // After its faults the proxied server answers again (its supervisor started it anew).
    let mut peer_answers = false;
    let mut peer_error = None;
    let peer_deadline = Instant::now() + SEND_GRACE;
    let mut attempt = 0;
    while !peer_answers && Instant::now() < peer_deadline {
        attempt += 1;
        // Each attempt's arguments its own: the loop guard refuses a call repeated as is.
        let text = format!("after the faults, attempt {attempt}");
        match shared.call("soak-0", PEER, json!({ "text": text })).await {
            Ok(_) => peer_answers = true,
            Err(failure) => {
                peer_error = Some(match failure {
                    Failure::Unreachable => "the server did not answer".to_owned(),
                    Failure::Tool { text, .. } => text,
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // The bridges go before their server: a client closing, not a server dropping it.
    for bridge in shared.bridges.values() {
        bridge.lock().await.peer = None;
    }
    let killed = life;
    let stalled_connections = stalled.as_ref().map_or(0, Vec::len);
    drop(stalled);
    for server in servers {
        started_by_server.extend(descendants(server.pid()));
        server.stop().await;
    }
    let leftover_temp_entries = places
        .iter()
        .map(|place| std::fs::read_dir(&place.tmp).map_or(0, Iterator::count))
        .sum();
    // Processes the servers started (their descendants when they ended, and any process
    // with their agents' `TMPDIR`, should one have left its tree) that still run, once
    // those ending with them have had a moment to.
    let orphans_now = || {
        let mut orphans: Vec<u32> = places.iter().flat_map(|p| started_in(&p.tmp)).collect();
        orphans.extend(
            started_by_server
                .iter()
                .filter(|&&process| running(process))
                .map(|&(pid, _)| pid),
        );
        orphans.sort_unstable();
        orphans.dedup();
        orphans
    };
    let settled = Instant::now() + ORPHAN_GRACE;
    let mut orphans = orphans_now();
    while !orphans.is_empty() && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(50)).await;
        orphans = orphans_now();
    }
    let orphan_commands: Vec<String> = orphans.iter().map(|&pid| command_line(pid)).collect();
    let orphans = orphans.len();
    let acknowledged = std::mem::take(
        &mut *shared
            .acknowledged
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let tasks = std::mem::take(&mut *shared.tasks.lock().unwrap_or_else(PoisonError::into_inner));
    let opened = match store_url {
        #[cfg(feature = "postgres")]
        Some(url) => crate::Runtime::builder().store_url(url),
        _ => crate::Runtime::builder().data_dir(&places[0].data),
    };
    let MailCheck {
        lost,
        duplicated,
        unlogged,
        tasks,
    } = ledger(opened, &acknowledged, &tasks).await?;
    let edits = std::mem::take(&mut *shared.edits.lock().unwrap_or_else(PoisonError::into_inner));
    let edits_lost = edits
        .iter()
        .filter(|&(me, &step)| {
            let text = std::fs::read_to_string(shared.root.join(format!("edits-{me}.txt")));
            let held = text.ok().and_then(|t| {
                t.trim()
                    .strip_prefix("step ")
                    .and_then(|k| k.parse::<u64>().ok())
            });
            held.is_none_or(|held| held < step)
        })
        .count();
    let growth = rss_growth(&samples, duration_secs);
    let [first_tenth, last_tenth] = shared.tenths.p99s();
    let mut report = SoakReport {
        agents,
        servers: places.len(),
        store: if database.is_some() {
            "postgres"
        } else {
            "redb"
        },
        duration_secs,
        kills: killed,
        restarts_secs,
        pg_restarts,
        sends_acknowledged: acknowledged.len(),
        bridged_calls: shared
            .bridged_calls
            .load(std::sync::atomic::Ordering::Relaxed),
        stalled_connections,
        leftover_temp_entries,
        orphans,
        orphan_commands,
        lost,
        duplicated,
        unlogged,
        tasks,
        edits_checked: edits.len(),
        edits_lost,
        peer_faults: peer_faulted,
        peer_answers_after_faults: peer_answers,
        peer_error_after_faults: peer_error.filter(|_| !peer_answers),
        p99_first_tenth_ms: first_tenth,
        p99_last_tenth_ms: last_tenth,
        rss_growth_per_hour: growth.map(|(slope, _)| slope),
        rss_growth_stderr_per_hour: growth.map(|(_, stderr)| stderr),
        samples,
        failures: Vec::new(),
    };
    report.failures = judge(&report, config.judge_memory);
    Ok(report)
}

/// The interval's figures, its tally taken: the servers' together.
fn take_sample(
    shared: &Shared,
    servers: &[Server],
    store_bytes: u64,
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
    let figures: Vec<(u64, u64, u64)> = servers.iter().map(|s| process_figures(s.pid())).collect();
    let children: Vec<(u32, u64)> = servers.iter().flat_map(|s| descendants(s.pid())).collect();
    let children_rss_kib = children
        .iter()
        .map(|&(pid, _)| process_figures(pid).0)
        .sum();
    SoakSample {
        at_secs: started.elapsed().as_secs_f64(),
        life,
        rss_kib: figures.iter().map(|f| f.0).sum(),
        servers_rss_kib: figures.iter().map(|f| f.0).collect(),
        threads: figures.iter().map(|f| f.1).sum(),
        fds: figures.iter().map(|f| f.2).sum(),
        store_bytes,
        children: children.len(),
        children_rss_kib,
        dropped: tally.dropped,
        unread: shared
            .unread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .sum(),
        ops,
    }
}

/// The memory's least-squares slope over the second half of the run (the server's last
/// life: kills come in the first half), as a share of that half's first sample per hour,
/// and the slope's standard error in the same unit; `None` with fewer than four samples
/// there.
fn rss_growth(samples: &[SoakSample], duration_secs: f64) -> Option<(f64, f64)> {
    let last_life = samples.last()?.life;
    let half: Vec<&SoakSample> = samples
        .iter()
        .filter(|s| s.life == last_life && s.at_secs >= duration_secs / 2.0)
        .collect();
    if half.len() < 4 {
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
    if var <= 0.0 {
        return None;
    }
    let slope = cov / var;
    let residuals: f64 = half
        .iter()
        .map(|s| (s.rss_kib as f64 - my - slope * (s.at_secs - mx)).powi(2))
        .sum();
    let stderr = (residuals / (n - 2.0) / var).sqrt();
    let per_hour = 3600.0 / half[0].rss_kib.max(1) as f64;
    Some((slope * per_hour, stderr * per_hour))
}

/// The stopped servers' store, opened by `store`, against what the agents saw
/// acknowledged: each send (by its `request_id`, in its subject) found in the recipients'
/// copies, under one message id, and in the mail history; and the task board's ledger.
async fn ledger(
    store: crate::RuntimeBuilder,
    acknowledged: &[String],
    tasks: &TaskLedger,
) -> Result<MailCheck, String> {
    let runtime = store
        .build()
        .await
        .map_err(|e| format!("cannot open the soaked store: {e}"))?;
    let copies = sends_in_copies(&*runtime.store());
    let found = runtime
        .search_mail(crate::agents::MailSearch::new("", usize::MAX))
        .await
        .map_err(|e| format!("cannot read the mail history: {e}"));
    let board = check_tasks(&runtime, tasks).await;
    runtime.shutdown().await;
    let (copies, found, board) = (copies?, found?, board?);
    let logged: std::collections::HashSet<&str> = found
        .messages
        .iter()
        .filter_map(|m| m.subject.strip_prefix("soak "))
        .collect();
    Ok(MailCheck {
        lost: acknowledged
            .iter()
            .filter(|token| !copies.contains_key(token.as_str()))
            .count(),
        duplicated: copies.values().filter(|ids| ids.len() > 1).count(),
        unlogged: acknowledged
            .iter()
            .filter(|token| !logged.contains(token.as_str()))
            .count(),
        tasks: board,
    })
}

/// What the mail ledger found.
struct MailCheck {
    lost: usize,
    duplicated: usize,
    unlogged: usize,
    tasks: TaskCheck,
}

/// Every soak send the recipients' copies hold (inboxes and archives, each copy of a
/// broadcast alike), by its `request_id` (in its subject): the message ids it was stored
/// under, more than one being a send made twice.
fn sends_in_copies(
    store: &dyn crate::store::Store,
) -> Result<HashMap<String, std::collections::BTreeSet<uuid::Uuid>>, String> {
    let mut copies: HashMap<String, std::collections::BTreeSet<uuid::Uuid>> = HashMap::new();
    for table in [crate::store::Table::Inbox, crate::store::Table::Archive] {
        crate::store::scan_values(store, table, b"", |_, m: crate::agents::Message| {
            if let Some(token) = m.subject.strip_prefix("soak ") {
                copies.entry(token.to_owned()).or_default().insert(m.id);
            }
        })
        .map_err(|e| format!("cannot read the recipients' copies: {e}"))?;
    }
    Ok(copies)
}

/// What the board says of the task transitions acknowledged.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskCheck {
    /// Claims acknowledged.
    pub claimed: usize,
    /// Finishes (`done`) acknowledged.
    pub finished: usize,
    /// Tasks claimed that are not done: every agent finishes what it holds by the end.
    pub claimed_unfinished: usize,
    /// Tasks acknowledged done that the board does not hold as done.
    pub finished_lost: usize,
    /// Tasks whose history has them made done more than once.
    pub finished_twice: usize,
}

/// Reads each task claimed or finished, with its history, from the stopped server's board.
async fn check_tasks(runtime: &crate::Runtime, tasks: &TaskLedger) -> Result<TaskCheck, String> {
    let mut check = TaskCheck {
        claimed: tasks.claimed.len(),
        finished: tasks.finished.len(),
        ..TaskCheck::default()
    };
    // Each task's times made done, by its id as the tools write it.
    let mut done: HashMap<String, usize> = HashMap::new();
    for task in tasks.claimed.iter().chain(&tasks.finished) {
        let key = task.to_string();
        if done.contains_key(&key) {
            continue;
        }
        let got = runtime
            .call_json(
                "task_get",
                json!({ "id": task, "history": true }),
                crate::CallOptions::new(),
            )
            .await
            .map_err(|e| format!("cannot read task {task}: {e}"))?;
        let times = got["history"].as_array().map_or(0, |events| {
            events
                .iter()
                .filter(|e| e["status"][1] == json!("done"))
                .count()
        });
        done.insert(key, times);
    }
    let times = |task: &Value| done.get(&task.to_string()).copied().unwrap_or(0);
    check.claimed_unfinished = tasks.claimed.iter().filter(|t| times(t) == 0).count();
    check.finished_lost = tasks.finished.iter().filter(|t| times(t) == 0).count();
    check.finished_twice = done.values().filter(|&&n| n > 1).count();
    Ok(check)
}

/// The criteria missed.
fn judge(report: &SoakReport, memory: bool) -> Vec<String> {
    let mut failures = Vec::new();
    if report.orphans > 0 {
        failures.push(format!(
            "{} processes the server started outlived it: {}",
            report.orphans,
            report.orphan_commands.join("; ")
        ));
    }
    for (count, what) in [
        (
            report.leftover_temp_entries,
            "entries were left in the agents' temporary directory",
        ),
        (report.lost, "acknowledged sends are not in the history"),
        (report.duplicated, "sends are in the history more than once"),
        (
            report.tasks.claimed_unfinished,
            "tasks claimed were never finished",
        ),
        (
            report.tasks.finished_lost,
            "tasks acknowledged done are not done on the board",
        ),
        (
            report.tasks.finished_twice,
            "tasks were finished more than once",
        ),
        (
            report.edits_lost,
            "agents' files lack their last acknowledged edit",
        ),
    ] {
        if count > 0 {
            failures.push(format!("{count} {what}"));
        }
    }
    for restart in report.pg_restarts.iter().filter(|r| !r.ok) {
        failures.push(format!(
            "PostgreSQL's restart at {:.0} s failed: {}",
            restart.at_secs,
            restart.error.as_deref().unwrap_or("")
        ));
    }
    for struck in report.peer_faults.iter().filter(|f| f.processes == 0) {
        failures.push(format!(
            "the proxied server's {} at {:.0} s found none of its processes to strike",
            struck.fault, struck.at_secs
        ));
    }
    if !report.peer_answers_after_faults {
        failures.push(format!(
            "the proxied server did not answer within {SEND_GRACE:?} after its faults: {}",
            report.peer_error_after_faults.as_deref().unwrap_or("")
        ));
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
    // Growth past the bound by more than twice its standard error: a slope the samples'
    // noise cannot explain (a minute's samples resolve tens of percent an hour; an hour's,
    // a fraction of one).
    if let (true, Some(growth), Some(stderr)) = (
        memory,
        report.rss_growth_per_hour,
        report.rss_growth_stderr_per_hour,
    ) && growth - 2.0 * stderr > MAX_RSS_GROWTH_PER_HOUR
    {
        failures.push(format!(
            "the server's memory grew by {:.1}% (± {:.1}%) of its start an hour over the second \
             half of the run",
            growth * 100.0,
            stderr * 100.0
        ));
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed restart quotes the end of what its command wrote, never more than the bound
    /// however much it wrote.
    #[test]
    fn a_failed_restart_quotes_the_last_lines_of_its_output_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("pg-restart.log");
        let lines: Vec<String> = (1..=10).map(|n| format!("line {n}")).collect();
        std::fs::write(&log, lines.join("\n")).unwrap();
        assert_eq!(tail_of(&log), "line 6 / line 7 / line 8 / line 9 / line 10");
        std::fs::write(&log, "x".repeat(1 << 20)).unwrap();
        assert_eq!(tail_of(&log).len(), PG_RESTART_TAIL as usize);
        assert_eq!(tail_of(&dir.path().join("absent")), "");
    }
}
