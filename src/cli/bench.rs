//! `guildhall bench`.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use clap::{Args, Subcommand, ValueEnum};
use guildhall::bench::{
    CallsConfig, CallsReport, ContextBenchConfig, EventsBenchConfig, MailboxBenchConfig,
    McpBenchConfig, SpawnKind, SpawnReport, Stage, TasksBenchConfig, ToolsBenchConfig,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    which: Which,
}

#[derive(Debug, Subcommand)]
enum Which {
    /// Per-call overhead against a direct call and a bare ractor actor, breaker cost, crash
    /// recovery time, and the cost of spawning many supervised actors and tools. About 1 s at
    /// the defaults (release build, 2 cores).
    Calls(CallsArgs),
    /// Mailbox throughput: one-way sends in memory (against bare ractor actors), request/reply
    /// round trips, and durable sends with group commit. About 10 s at the defaults.
    Mailbox(MailboxArgs),
    /// Register and activate many agents; report time and memory per agent. About 2 s at the
    /// defaults.
    Swarm(SwarmArgs),
    /// One message to every agent of a large durable swarm (`*`): time and memory added,
    /// against writing the same inbox records directly. About 40 s at the default size.
    Fanout(FanOutArgs),
    /// The task board: durable claims by 100 workers at once, against durable mailbox sends
    /// by as many agents in the same store and run. About 10 s at the defaults.
    Tasks(TasksArgs),
    /// Session context: updates of 1 KB entries in memory (against bare ractor actors),
    /// durable updates with group commit, and recovery of a session of 1,000,000 operations.
    /// About 10 s at the defaults.
    Context(ContextArgs),
    /// The MCP server from outside: cold start, sequential latency and pipelined throughput
    /// over `serve --stdio`, through the `guildhall mcp` bridge and over HTTP, against a bare
    /// rmcp server (the floor) measured the same way. About 12 s at the defaults.
    Mcp(McpArgs),
    /// The file tools: `grep` over a generated tree of 10,000 files (200 MiB) against
    /// ripgrep (`rg`) on the same tree, and `read_file` / `edit_file` through the runtime
    /// against the same read and write done directly, and `bash` running `true` against a
    /// bare tokio `Command` and sandboxed against its sandbox off (`sandboxed_bash_ratio`),
    /// and an HTTP GET through the sandbox's egress proxy against the same GET made directly
    /// (`proxy_added_us`). About 30 s at the defaults.
    Tools(ToolsArgs),
    /// A tool call to a bare rmcp stdio server directly against the same call through
    /// guildhall's proxy (`mcp__floor__echo`), throughput with concurrent callers, and the
    /// time from killing the proxied server to it serving again. About 5 s at the defaults.
    Proxy(ProxyArgs),
    /// Proxied servers crashing on every call (and one that cannot start) while another
    /// agent checks its inbox: that agent's p99 quiet and during the storm, guildhall's memory
    /// over the crash cycles, and the processes left once the servers are removed. About
    /// 10 s at the defaults; `--servers 100 --cycles 1000` about a minute.
    Storm(StormArgs),
    /// A swarm of agents working against a real `guildhall serve` for a long time (mail,
    /// inbox checks, context merges, task claims and heartbeats, commands, files, a proxied
    /// server; over HTTP and stdio bridges), with faults (the server killed and started
    /// again on its store, the proxied server crashed and hung, stalled and dropped
    /// connections): per interval its memory, threads, descriptors, store size and each
    /// operation's p50/p99; at the end the ledger (every acknowledged send in the history
    /// once, every claimed task done once) and the verdict. With `--store`, several servers
    /// share a PostgreSQL database, killed in turn, and `--pg-restart` restarts PostgreSQL
    /// midway. Exits 1 when a criterion is missed. As long as `--duration`.
    Soak(SoakArgs),
    /// `guildhall hook` as an agent's client runs it, server running: process start to
    /// answer (`hook_p50_ms`, `hook_p99_ms`), against starting the binary alone. About 5 s
    /// at the defaults.
    Hook(HookArgs),
    /// The event stream under load: how late a watcher gets events at `--rate` events/s,
    /// and what a watcher costs a governed call (with and without, same run). About 10 s
    /// at the defaults.
    Events(EventsArgs),
    /// One exchange with an agent over A2A (a blocking SendMessage to `role:tl`: a board
    /// task, mail, tl's reply) against the same over MCP (`send_message` waiting for the
    /// reply), alternating in rounds in one process. About 10 s at the defaults.
    #[cfg(feature = "a2a")]
    A2a(A2aArgs),
    /// The observer on a large store (100,000 messages, 10,000 tasks, filled through the
    /// runtime): the dashboard's first screen over HTTP against the same on an empty store,
    /// and mail searches against a scan of the same texts in memory. About a minute at the
    /// defaults.
    Observer(ObserverArgs),
    /// The PostgreSQL store: durable sends with group commit against a plain multi-row
    /// INSERT + COMMIT loop of the same rows, in a database of its own made on the server
    /// `--store` names (and dropped after). About 10 s at the defaults.
    #[cfg(feature = "postgres")]
    Cluster(ClusterArgs),
    /// Serve the bare rmcp floor server over stdio (run by `bench mcp`).
    #[command(hide = true)]
    McpFloor,
    /// The agent `bench tasks` launches: connects through its MCP config's server, calls
    /// `whoami`, reports to its parent and exits.
    #[command(hide = true)]
    LaunchAgent {
        /// The MCP config (`{mcp_config}`).
        mcp_config: std::path::PathBuf,
    },
    /// Spawn many actors or tools once and report time and memory (run in a fresh process by
    /// `bench calls`; useful on its own too).
    Spawn(SpawnArgs),
}

#[derive(Debug, Args)]
struct HookArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Hooks timed.
    #[arg(long, default_value_t = 400)]
    calls: usize,
}

#[derive(Debug, Args)]
struct CallsArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Measurement rounds (each runs one batch of every contender).
    #[arg(long, default_value_t = CallsConfig::default().rounds)]
    rounds: usize,
    /// Calls per batch.
    #[arg(long, default_value_t = CallsConfig::default().batch)]
    batch: usize,
    /// Crashes timed for the recovery percentiles.
    #[arg(long, default_value_t = CallsConfig::default().crashes)]
    crashes: usize,
    /// Supervised tool actors spawned for the spawn and memory figures.
    #[arg(long, default_value_t = 10_000)]
    spawn: usize,
}

#[derive(Debug, Args)]
struct McpArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Sequential calls timed per round.
    #[arg(long, default_value_t = McpBenchConfig::default().sequential)]
    sequential: usize,
    /// Calls per pipelined run.
    #[arg(long, default_value_t = McpBenchConfig::default().pipelined)]
    pipelined: usize,
    /// Calls in flight in a pipelined run.
    #[arg(long, default_value_t = McpBenchConfig::default().window)]
    window: usize,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = McpBenchConfig::default().http_clients)]
    http_clients: usize,
    /// Rounds (figures are medians).
    #[arg(long, default_value_t = McpBenchConfig::default().rounds)]
    rounds: usize,
    /// Messages sent to a subscribed inbox, each timed until its notification.
    #[arg(long, default_value_t = McpBenchConfig::default().notify_sends)]
    notify_sends: usize,
}

#[derive(Debug, Args)]
struct MailboxArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Agents (each one also sends).
    #[arg(long, default_value_t = MailboxBenchConfig::default().agents)]
    agents: usize,
    /// One-way messages each agent sends per round.
    #[arg(long, default_value_t = MailboxBenchConfig::default().per_agent)]
    per_agent: usize,
    /// Request/reply pairs at once.
    #[arg(long, default_value_t = MailboxBenchConfig::default().pairs)]
    pairs: usize,
    /// Round trips per pair per round.
    #[arg(long, default_value_t = MailboxBenchConfig::default().trips)]
    trips: usize,
    /// Durable messages each agent sends per round.
    #[arg(long, default_value_t = MailboxBenchConfig::default().durable_per_agent)]
    durable_per_agent: usize,
    /// Measurement rounds (figures are medians).
    #[arg(long, default_value_t = MailboxBenchConfig::default().rounds)]
    rounds: usize,
    /// Where the durable store is created (a fresh directory inside it, removed after).
    /// Defaults to the data directory: measure the disk you will run on.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
struct TasksArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Workers claiming at once (and agents sending, for the baseline).
    #[arg(long, default_value_t = TasksBenchConfig::default().claimers)]
    claimers: usize,
    /// Tasks created and claimed per round.
    #[arg(long, default_value_t = TasksBenchConfig::default().tasks)]
    tasks: usize,
    /// Agents launched (and as many started directly, for the baseline), each timed to its
    /// first MCP call (0: skip).
    #[arg(long, default_value_t = 10)]
    launches: usize,
    /// Measurement rounds (figures are medians).
    #[arg(long, default_value_t = TasksBenchConfig::default().rounds)]
    rounds: usize,
    /// Where the durable store is created (a fresh directory inside it, removed after).
    /// Defaults to the data directory: measure the disk you will run on.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
struct ContextArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Sessions written at once.
    #[arg(long, default_value_t = ContextBenchConfig::default().sessions)]
    sessions: usize,
    /// Writers per session.
    #[arg(long, default_value_t = ContextBenchConfig::default().writers)]
    writers: usize,
    /// In-memory updates per writer per round.
    #[arg(long, default_value_t = ContextBenchConfig::default().updates)]
    updates: usize,
    /// Bytes of each entry's value.
    #[arg(long, default_value_t = ContextBenchConfig::default().value_bytes)]
    value_bytes: usize,
    /// Durable updates per writer per round.
    #[arg(long, default_value_t = ContextBenchConfig::default().durable_updates)]
    durable_updates: usize,
    /// Operations in the session whose recovery is timed.
    #[arg(long, default_value_t = ContextBenchConfig::default().recovery_ops)]
    recovery_ops: u64,
    /// Measurement rounds (figures are medians).
    #[arg(long, default_value_t = ContextBenchConfig::default().rounds)]
    rounds: usize,
    /// Where the durable stores are created (fresh directories inside it, removed after).
    /// Defaults to the data directory: measure the disk you will run on.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
struct SwarmArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// How many agents.
    #[arg(long, default_value_t = 100_000)]
    agents: usize,
}

#[derive(Debug, Args)]
struct FanOutArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// How many recipients.
    #[arg(long, default_value_t = 100_000)]
    agents: usize,
    /// Where the durable stores are created (fresh directories inside it, removed after).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Kind {
    /// One tool run by N actors.
    Actors,
    /// N distinct tools, one actor each.
    Tools,
    /// N bare ractor actors: the baseline.
    Raw,
}

#[derive(Debug, Args)]
struct SpawnArgs {
    /// What to spawn.
    #[arg(long, value_enum, default_value_t = Kind::Actors)]
    kind: Kind,
    /// How many.
    #[arg(long, default_value_t = 10_000)]
    count: usize,
}

/// Everything `bench calls --json` prints.
#[derive(Debug, Serialize)]
struct Report {
    #[serde(flatten)]
    calls: CallsReport,
    actors_spawned: usize,
    actors_spawn_ms: f64,
    bytes_per_actor: f64,
    tools_spawned: usize,
    tools_spawn_ms: f64,
    bytes_per_tool: f64,
    /// The baseline: anonymous resident bytes per bare ractor actor, measured the same way.
    bytes_per_raw_actor: f64,
}

/// Shows phases on a progress bar when stderr is a terminal; hidden otherwise.
struct Bar(ProgressBar);

impl Stage for Bar {
    fn phase(&self, name: &str, total: u64) {
        self.0.set_length(total);
        self.0.set_position(0);
        self.0.set_message(name.to_owned());
    }

    fn step(&self) {
        self.0.inc(1);
    }
}

pub(crate) async fn run(
    args: BenchArgs,
    data_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    match args.which {
        Which::Calls(a) => calls(a).await,
        Which::Mailbox(a) => mailbox(a, data_dir).await,
        Which::Swarm(a) => swarm(a).await,
        Which::Fanout(a) => fan_out(a, data_dir).await,
        Which::Context(a) => context(a, data_dir).await,
        Which::Tasks(a) => tasks(a, data_dir).await,
        Which::Mcp(a) => mcp(a).await,
        Which::Tools(a) => tools(a).await,
        Which::Proxy(a) => proxy(a).await,
        Which::Storm(a) => storm(a).await,
        Which::Soak(a) => soak(a).await,
        Which::Hook(a) => hook(a).await,
        Which::Events(a) => events(a).await,
        #[cfg(feature = "a2a")]
        Which::A2a(a) => a2a(a).await,
        Which::Observer(a) => observer(a, data_dir).await,
        #[cfg(feature = "postgres")]
        Which::Cluster(a) => cluster(a).await,
        Which::McpFloor => {
            guildhall::mcp::serve_stdio(guildhall::bench::mcp::FloorServer).await?;
            Ok(())
        }
        Which::LaunchAgent { mcp_config } => {
            guildhall::bench::launch_agent(&mcp_config).await?;
            Ok(())
        }
        Which::Spawn(a) => {
            let kind = match a.kind {
                Kind::Actors => SpawnKind::Actors,
                Kind::Tools => SpawnKind::Tools,
                Kind::Raw => SpawnKind::Raw,
            };
            let report = guildhall::bench::spawn(kind, a.count).await;
            writeln!(
                std::io::stdout().lock(),
                "{}",
                serde_json::to_string(&report)?
            )?;
            Ok(())
        }
    }
}

async fn calls(a: CallsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = CallsConfig {
        rounds: a.rounds.max(1),
        batch: a.batch.max(1),
        crashes: a.crashes.max(1),
    };
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    stage.phase("spawn", 3);
    // Memory is measured in fresh processes so that no earlier phase's freed memory is reused.
    let actors = spawn_in_child("actors", a.spawn)?;
    stage.step();
    let tools = spawn_in_child("tools", a.spawn)?;
    stage.step();
    let raw = spawn_in_child("raw", a.spawn)?;
    stage.step();
    // Measure from a task on the runtime's workers, where a server's callers live, not from
    // the thread blocked in `block_on`.
    let calls = tokio::spawn(async move { guildhall::bench::calls(config, &stage).await }).await?;
    bar.finish_and_clear();
    let report = Report {
        calls,
        actors_spawned: actors.count,
        actors_spawn_ms: actors.ms,
        bytes_per_actor: actors.bytes_each,
        tools_spawned: tools.count,
        tools_spawn_ms: tools.ms,
        bytes_per_tool: tools.bytes_each,
        bytes_per_raw_actor: raw.bytes_each,
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        table(&mut out, &report)?;
    }
    Ok(())
}

fn progress_bar() -> Result<ProgressBar, Box<dyn std::error::Error>> {
    // indicatif draws only when stderr is a terminal, so pipes stay quiet.
    Ok(ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg:>15} [{bar:30}] {pos}/{len}")?.progress_chars("=> "),
    ))
}

async fn mcp(a: McpArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = McpBenchConfig {
        sequential: a.sequential.max(1),
        pipelined: a.pipelined.max(1),
        window: a.window.max(1),
        http_clients: a.http_clients.max(1),
        rounds: a.rounds.max(1),
        notify_sends: a.notify_sends.max(1),
    };
    let exe = std::env::current_exe()?;
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report = guildhall::bench::mcp::mcp(&exe, config, &stage)
        .await
        .map_err(|err| err.to_string())?;
    bar.finish_and_clear();
    let r = &report;
    print_report(
        a.json,
        r,
        &[
            (
                "floor (bare rmcp) stdio p50 (us)",
                r.floor_stdio_p50_us,
                "baseline",
            ),
            (
                "floor stdio calls/s, pipelined",
                r.floor_stdio_calls_per_sec,
                "baseline",
            ),
            (
                "floor cold start to tools/list (ms)",
                r.floor_stdio_cold_ms,
                "",
            ),
            ("serve --stdio p50 (us)", r.stdio_p50_us, ""),
            ("serve --stdio p99 (us)", r.stdio_p99_us, ""),
            (
                "serve --stdio calls/s, pipelined",
                r.stdio_calls_per_sec,
                "",
            ),
            ("serve --stdio cold start (ms)", r.stdio_cold_ms, ""),
            ("  p50 / floor p50", r.stdio_p50_ratio, "<= 1.3"),
            (
                "  floor calls/s / stdio calls/s",
                r.stdio_throughput_ratio,
                "<= 1.3",
            ),
            ("bridge (guildhall mcp) p50 (us)", r.bridge_p50_us, ""),
            ("bridge p99 (us)", r.bridge_p99_us, ""),
            ("bridge calls/s, pipelined", r.bridge_calls_per_sec, ""),
            ("bridge cold start (ms)", r.bridge_cold_ms, ""),
            ("  p50 / stdio p50", r.bridge_p50_ratio, "<= 2"),
            (
                "  stdio calls/s / bridge calls/s",
                r.bridge_throughput_ratio,
                "<= 2",
            ),
            ("HTTP (2026-07-28) p50 (us)", r.http_p50_us, ""),
            ("HTTP p99 (us)", r.http_p99_us, ""),
            ("  p99 / p50", r.http_p99_ratio, "<= 3"),
            ("HTTP calls/s, concurrent clients", r.http_calls_per_sec, ""),
            ("inbox notification p50 (ms)", r.notify_p50_ms, ""),
            ("inbox notification p99 (ms)", r.notify_p99_ms, "<= 50"),
        ],
    )
}

async fn mailbox(
    a: MailboxArgs,
    data_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = MailboxBenchConfig {
        agents: a.agents,
        per_agent: a.per_agent,
        rounds: a.rounds,
        pairs: a.pairs,
        trips: a.trips,
        durable_per_agent: a.durable_per_agent,
    };
    let dir = a.dir.unwrap_or_else(|| data_dir.to_owned());
    std::fs::create_dir_all(&dir)?;
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report =
        tokio::spawn(async move { guildhall::bench::mailbox(config, &dir, &stage).await }).await?;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            (
                "bare ractor request/ack (msgs/s)",
                report.raw_ractor_msgs_per_sec,
                "baseline",
            ),
            (
                "one-way in memory (msgs/s)",
                report.inmem_msgs_per_sec,
                ">= 1,000,000",
            ),
            ("  slowdown against bare ractor", report.inmem_slowdown, ""),
            (
                "request/reply round trips (/s)",
                report.roundtrip_msgs_per_sec,
                ">= 300,000",
            ),
            (
                "  watched: dashboard and watch (/s)",
                report.roundtrip_watched_msgs_per_sec,
                "",
            ),
            (
                "  drop when watched (share)",
                report.roundtrip_watched_drop,
                "<= 0.10",
            ),
            (
                "  events the watchers showed",
                report.roundtrip_watched_events as f64,
                "",
            ),
            (
                "  events they lost",
                report.roundtrip_watched_missed as f64,
                "",
            ),
            (
                "durable, acknowledged (msgs/s)",
                report.durable_msgs_per_sec,
                ">= 30,000",
            ),
            ("  group commits = fsyncs (/s)", report.fsyncs_per_sec, ""),
            ("  messages per fsync", report.msgs_per_fsync, ""),
        ],
    )
}

#[cfg(feature = "a2a")]
#[derive(Debug, Args)]
struct A2aArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Exchanges of each kind per round.
    #[arg(long, default_value_t = guildhall::bench::A2aBenchConfig::default().exchanges)]
    exchanges: usize,
    /// Rounds (figures are medians over rounds).
    #[arg(long, default_value_t = guildhall::bench::A2aBenchConfig::default().rounds)]
    rounds: usize,
}

#[cfg(feature = "a2a")]
async fn a2a(a: A2aArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = guildhall::bench::A2aBenchConfig {
        exchanges: a.exchanges.clamp(1, 100_000),
        rounds: a.rounds.clamp(1, 1_000),
    };
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report = tokio::spawn(async move { guildhall::bench::a2a(config, &stage).await }).await??;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            ("exchanges of each kind", report.exchanges as f64, ""),
            (
                "MCP send_message, reply p50 (ms)",
                report.mcp_p50_ms,
                "baseline",
            ),
            ("MCP send_message, reply p99 (ms)", report.mcp_p99_ms, ""),
            ("A2A SendMessage, reply p50 (ms)", report.a2a_p50_ms, ""),
            ("A2A SendMessage, reply p99 (ms)", report.a2a_p99_ms, ""),
            ("  A2A / MCP", report.ratio, ""),
        ],
    )
}

#[derive(Debug, Args)]
struct EventsArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Events per second to produce (two per call).
    #[arg(long, default_value_t = EventsBenchConfig::default().rate)]
    rate: u32,
    /// For how many seconds.
    #[arg(long, default_value_t = EventsBenchConfig::default().secs)]
    secs: f64,
    /// Rounds of the cost measurement (figures are medians).
    #[arg(long, default_value_t = EventsBenchConfig::default().rounds)]
    rounds: usize,
    /// Calls per batch of the cost measurement.
    #[arg(long, default_value_t = EventsBenchConfig::default().batch)]
    batch: usize,
}

async fn events(a: EventsArgs) -> Result<(), Box<dyn std::error::Error>> {
    if !(a.secs.is_finite() && a.secs > 0.0 && a.secs <= 600.0) {
        return Err(format!("--secs must be more than 0 and at most 600, not {}", a.secs).into());
    }
    let config = EventsBenchConfig {
        rate: a.rate.max(2),
        secs: a.secs,
        rounds: a.rounds.max(1),
        batch: a.batch.max(1),
    };
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report =
        tokio::spawn(async move { guildhall::bench::events(config, &stage).await }).await?;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            ("events asked for (/s)", f64::from(report.rate), ""),
            ("events a watcher took (/s)", report.delivered_per_sec, ""),
            ("event lag p50 (ms)", report.lag_p50_ms, ""),
            ("event lag p99 (ms)", report.lag_p99_ms, "<= 100"),
            ("events missed", report.missed as f64, ""),
            ("pipeline call (ns)", report.pipeline_ns, "baseline"),
            ("governed call (ns)", report.governed_ns, ""),
            ("  governed ratio", report.governed_ratio, "<= 1.5"),
            (
                "governed call, dashboard and watch (ns)",
                report.governed_watched_ns,
                "",
            ),
            ("  watched ratio", report.governed_watched_ratio, "<= 1.5"),
            (
                "  events the watchers showed",
                report.governed_watched_events as f64,
                "",
            ),
            (
                "  events they lost",
                report.governed_watched_missed as f64,
                "",
            ),
        ],
    )
}

#[derive(Debug, Args)]
struct ObserverArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Messages in the store.
    #[arg(long, default_value_t = guildhall::bench::ObserverBenchConfig::default().messages)]
    messages: usize,
    /// Tasks on the board.
    #[arg(long, default_value_t = guildhall::bench::ObserverBenchConfig::default().tasks)]
    tasks: usize,
    /// Searches timed.
    #[arg(long, default_value_t = guildhall::bench::ObserverBenchConfig::default().searches)]
    searches: usize,
    /// Times the first screen is loaded (figures are medians).
    #[arg(long, default_value_t = guildhall::bench::ObserverBenchConfig::default().rounds)]
    rounds: usize,
    /// Where the durable stores are created (fresh directories inside it, removed after).
    /// Defaults to the data directory: measure the disk you will run on.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

async fn observer(
    a: ObserverArgs,
    data_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = guildhall::bench::ObserverBenchConfig {
        messages: a.messages.max(1),
        tasks: a.tasks,
        searches: a.searches.max(1),
        rounds: a.rounds.max(1),
    };
    let dir = a.dir.unwrap_or_else(|| data_dir.to_owned());
    guildhall::private_fs::create_dir_all(&dir)?;
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report =
        tokio::spawn(async move { guildhall::bench::observer(config, &dir, &stage).await }).await?;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            ("messages in the store", report.messages as f64, ""),
            ("tasks on the board", report.tasks as f64, ""),
            ("filled in (s)", report.fill_secs, ""),
            (
                "first screen, empty store (ms)",
                report.empty_first_screen_ms,
                "baseline",
            ),
            (
                "first screen, first load (ms)",
                report.cold_first_screen_ms,
                "",
            ),
            ("first screen (ms)", report.first_screen_ms, "<= 1000"),
            ("  slowest (ms)", report.first_screen_max_ms, ""),
            (
                "index made by the first search (ms)",
                report.index_build_ms,
                "",
            ),
            ("  words", report.index_words as f64, ""),
            ("  bytes", report.index_bytes as f64, ""),
            (
                "  bytes per message",
                report.index_bytes as f64 / report.index_messages.max(1) as f64,
                "",
            ),
            (
                "scan of the texts in memory p95 (ms)",
                report.scan_p95_ms,
                "baseline",
            ),
            ("search p50 (ms)", report.search_p50_ms, ""),
            ("search p95 (ms)", report.search_p95_ms, "<= 50"),
            ("  slowest (ms)", report.search_max_ms, ""),
            ("  p95 / scan p95", report.search_ratio, ""),
        ],
    )
}

#[cfg(feature = "postgres")]
#[derive(Debug, Args)]
struct ClusterArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// The PostgreSQL server, as a connection string whose user may create databases.
    #[arg(
        long,
        env = "GUILDHALL_STORE",
        value_name = "URL",
        hide_env_values = true
    )]
    store: String,
    /// Agents sending at once.
    #[arg(long, default_value_t = 200)]
    agents: usize,
    /// Durable messages each agent sends per round (250: a round of about half a second,
    /// long beside its start and its tail, when fewer senders are left).
    #[arg(long, default_value_t = 250)]
    per_agent: usize,
    /// Rounds (figures are medians).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Request/reply round trips timed, on one server and across two.
    #[arg(long, default_value_t = 200)]
    round_trips: usize,
    /// Killed mailbox holders timed.
    #[arg(long, default_value_t = 10)]
    takeovers: usize,
}

#[cfg(feature = "postgres")]
async fn cluster(a: ClusterArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = guildhall::bench::ClusterBenchConfig {
        url: a.store,
        agents: a.agents.max(1),
        per_agent: a.per_agent.max(1),
        rounds: a.rounds.max(1),
        round_trips: a.round_trips.max(1),
        takeovers: a.takeovers.max(1),
        program: std::env::current_exe().ok(),
    };
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report = tokio::spawn(async move { guildhall::bench::cluster(config, &stage).await })
        .await?
        .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            ("senders at once", report.agents as f64, ""),
            (
                "plain INSERT + COMMIT loop (rows/s)",
                report.pg_floor_msgs_per_sec,
                "baseline",
            ),
            (
                "durable sends, acknowledged (msgs/s)",
                report.durable_msgs_per_sec,
                "",
            ),
            ("  ratio", report.ratio, ">= 0.7"),
            ("messages per group commit", report.msgs_per_commit, ""),
            ("  one group commit, mean (µs)", report.commit_mean_us, ""),
            (
                "round trip, one server, p50 (µs)",
                report.rtt_one_server_p50_us,
                "baseline",
            ),
            (
                "round trip, one server, p99 (µs)",
                report.rtt_one_server_p99_us,
                "",
            ),
            (
                "round trip, two servers, p50 (µs)",
                report.rtt_two_servers_p50_us,
                "",
            ),
            (
                "round trip, two servers, p99 (µs)",
                report.rtt_two_servers_p99_us,
                "",
            ),
            ("lease (ms)", report.lease_ms, ""),
            (
                "takeover after SIGKILL, p50 (ms)",
                report.takeover_p50_ms.unwrap_or(f64::NAN),
                "",
            ),
            (
                "takeover after SIGKILL, p99 (ms)",
                report.takeover_p99_ms.unwrap_or(f64::NAN),
                "",
            ),
        ],
    )
}

#[derive(Debug, Args)]
struct ProxyArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Sequential calls each way.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Concurrent callers for the throughput figure.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Kills of the proxied server, each timed until it serves again.
    #[arg(long, default_value_t = 20)]
    restarts: usize,
    /// The name of the server's `echo` argument (`message` for server-everything).
    #[arg(long, default_value = "text")]
    echo_arg: String,
    /// A tool of the server taking no arguments that answers an image, timed both ways
    /// (default: the floor's `image`, 320 KiB; `get-tiny-image` for server-everything).
    #[arg(long)]
    image_tool: Option<String>,
    /// Another stdio server with an `echo` tool to measure, after `--` (default: a bare
    /// rmcp server, `guildhall bench mcp-floor`), e.g. `-- node
    /// node_modules/@modelcontextprotocol/server-everything/dist/index.js stdio`.
    #[arg(last = true)]
    server: Vec<String>,
}

#[derive(Debug, Args)]
struct StormArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Servers crashing at once.
    #[arg(long, default_value_t = 20)]
    servers: usize,
    /// Crash cycles in all.
    #[arg(long, default_value_t = 100)]
    cycles: usize,
    /// The other agent's `check_inbox` calls timed while nothing crashes.
    #[arg(long, default_value_t = 5000)]
    quiet_calls: usize,
    /// The longest the storm runs; it then ends with the cycles done so far.
    #[arg(long, default_value = "10min", value_parser = humantime::parse_duration)]
    max_duration: std::time::Duration,
}

#[derive(Debug, Args)]
struct SoakArgs {
    /// Print each sample, then the report, as JSON lines on stdout.
    #[arg(long)]
    json: bool,
    /// Agents at work at once.
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// How long they work (`2m`, `1h`).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: std::time::Duration,
    /// Operations a second, all agents together.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Times the server is killed (SIGKILL) and started again, spread over the first half.
    #[arg(long, default_value_t = 1)]
    kills: usize,
    /// How often the server and the operations are sampled (`1m`, `10s`).
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    interval: std::time::Duration,
    /// Seeds the agents' choices and the faults' times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Start the server under this command, e.g. `heaptrack` to find what its memory holds
    /// (split at spaces; the server's command line follows it). Memory and thread figures
    /// are then the wrapper's; use it with `--kills 0`.
    #[arg(long, value_name = "COMMAND")]
    server_wrapper: Option<String>,
    /// The server's store cache, MiB (its `[store] cache_mib`; default 64). A short run
    /// judging memory wants a small one, full early, so that what grows after is not it.
    #[arg(long, value_name = "MIB")]
    cache_mib: Option<usize>,
    /// Agents that call through a stdio bridge process of their own (`guildhall mcp`), as
    /// Claude Code instances do; the others call over HTTP. Default: a tenth of them.
    #[arg(long)]
    bridged: Option<usize>,
    /// Report the server's memory growth without judging it (a run too short for the
    /// server to settle).
    #[arg(long)]
    no_memory_verdict: bool,
    /// Share a PostgreSQL database among the servers instead of a redb store: a connection
    /// string whose user may create databases. The soak makes a database of its own on that
    /// server and drops it after.
    #[cfg(feature = "postgres")]
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Servers at work at once (agent N calls server N mod this; kills take them in turn).
    /// Default: 3 with `--store`, else 1 (a redb store has one).
    #[arg(long)]
    servers: Option<usize>,
    /// A shell command that restarts PostgreSQL (e.g. `pg_ctl -D DIR -w -m fast restart`),
    /// run once at about half of the run; needs `--store`.
    #[arg(long, value_name = "COMMAND")]
    pg_restart: Option<String>,
}

async fn soak(a: SoakArgs) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::IsTerminal;
    if a.interval.is_zero() {
        return Err("--interval must be more than 0".into());
    }
    #[cfg(feature = "postgres")]
    let store = a.store;
    #[cfg(not(feature = "postgres"))]
    let store: Option<String> = None;
    let json = a.json;
    let terminal = std::io::stderr().is_terminal();
    let progress = move |sample: &guildhall::bench::SoakSample| {
        if json {
            if let Ok(line) = serde_json::to_string(sample) {
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
        } else if terminal {
            let worst = sample
                .ops
                .values()
                .map(|op| op.p99_ms)
                .filter(|p| p.is_finite())
                .fold(0.0, f64::max);
            let _ = writeln!(
                std::io::stderr().lock(),
                "{:>7.0} s  life {}  rss {:.1} MiB  threads {}  fds {}  store {:.1} MiB  unread {}  \
                 p99 {:.1} ms",
                sample.at_secs,
                sample.life,
                sample.rss_kib as f64 / 1024.0,
                sample.threads,
                sample.fds,
                sample.store_bytes as f64 / 1_048_576.0,
                sample.unread,
                worst
            );
        }
    };
    let report = guildhall::bench::soak(
        guildhall::bench::SoakBenchConfig {
            exe: std::env::current_exe()?,
            agents: a.agents,
            duration: a.duration,
            rate: a.rate,
            seed: a.seed,
            kills: a.kills,
            interval: a.interval,
            wrapper: a
                .server_wrapper
                .as_deref()
                .map(|w| w.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            cache_mib: a.cache_mib,
            bridged: a.bridged.unwrap_or(a.agents / 10),
            judge_memory: !a.no_memory_verdict,
            servers: a.servers.unwrap_or(if store.is_some() { 3 } else { 1 }),
            store,
            pg_restart: a.pg_restart,
        },
        &progress,
        super::serve::wait_for_stop_signal(),
    )
    .await?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        writeln!(
            out,
            "{} agents on {} server(s) ({}) for {:.0} s, {} kills; {} sends acknowledged, {} \
             lost, {} duplicated",
            report.agents,
            report.servers,
            report.store,
            report.duration_secs,
            report.kills,
            report.sends_acknowledged,
            report.lost,
            report.duplicated
        )?;
        writeln!(
            out,
            "mail history: {} acknowledged sends not listed (a copy holds them)",
            report.unlogged
        )?;
        writeln!(
            out,
            "tasks: {} claimed, {} finished; {} claimed never finished, {} finished lost, {} \
             finished twice",
            report.tasks.claimed,
            report.tasks.finished,
            report.tasks.claimed_unfinished,
            report.tasks.finished_lost,
            report.tasks.finished_twice
        )?;
        writeln!(
            out,
            "file edits: {} agents' files checked, {} lacking their last acknowledged edit",
            report.edits_checked, report.edits_lost
        )?;
        let struck: Vec<String> = report
            .peer_faults
            .iter()
            .map(|f| {
                format!(
                    "{} at {:.0} s ({} processes)",
                    f.fault, f.at_secs, f.processes
                )
            })
            .collect();
        writeln!(
            out,
            "proxied server: {}; answered after: {}; {} calls over stdio bridges; {} orphans",
            struck.join(", "),
            if report.peer_answers_after_faults {
                "yes"
            } else {
                "no"
            },
            report.bridged_calls,
            report.orphans
        )?;
        if !report.restarts_secs.is_empty() {
            let took: Vec<String> = report
                .restarts_secs
                .iter()
                .map(|s| format!("{s:.1} s"))
                .collect();
            writeln!(
                out,
                "killed servers answered again after {}",
                took.join(", ")
            )?;
        }
        for restart in &report.pg_restarts {
            writeln!(
                out,
                "PostgreSQL restarted at {:.0} s in {:.1} s: {}",
                restart.at_secs,
                restart.took_secs,
                restart.error.as_deref().unwrap_or("ok")
            )?;
        }
        for (kind, first) in &report.p99_first_tenth_ms {
            let last = report
                .p99_last_tenth_ms
                .get(kind)
                .copied()
                .unwrap_or(f64::NAN);
            writeln!(
                out,
                "{kind:<16} p99 first tenth {first:.1} ms, last tenth {last:.1} ms"
            )?;
        }
        writeln!(
            out,
            "memory growth {}",
            report
                .rss_growth_per_hour
                .zip(report.rss_growth_stderr_per_hour)
                .map_or_else(
                    || "not measured (too few samples)".to_owned(),
                    |(g, e)| format!("{:.2}% (± {:.2}%) of start an hour", g * 100.0, e * 100.0)
                )
        )?;
        for failure in &report.failures {
            writeln!(out, "FAILED: {failure}")?;
        }
    }
    if !report.passed() {
        std::process::exit(1);
    }
    Ok(())
}

async fn hook(a: HookArgs) -> Result<(), Box<dyn std::error::Error>> {
    let report = guildhall::bench::hook(guildhall::bench::HookBenchConfig {
        exe: std::env::current_exe()?,
        calls: a.calls,
    })
    .await?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "hook p50/p99        {:>10.2} / {:.2} ms, process start to answer ({} hooks, {} announcing mail)",
        report.hook_p50_ms, report.hook_p99_ms, report.calls, report.announced
    )?;
    writeln!(
        out,
        "binary start p50    {:>10.2} ms (a hook with no agent: it answers nothing)",
        report.spawn_p50_ms
    )?;
    Ok(())
}

async fn storm(a: StormArgs) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?.display().to_string();
    let report = guildhall::bench::storm(guildhall::bench::StormBenchConfig {
        floor: vec![exe, "bench".into(), "mcp-floor".into()],
        servers: a.servers.max(1),
        cycles: a.cycles.max(1),
        quiet_calls: a.quiet_calls.max(1),
        max_duration: a.max_duration,
    })
    .await?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "crash cycles        {:>10} over {} servers in {:.1} s ({} other outcomes)",
        report.cycles, report.servers, report.storm_secs, report.other_outcomes
    )?;
    writeln!(
        out,
        "check_inbox p50/p99 {:>10.1} / {:.1} µs quiet, {:.1} / {:.1} µs in the storm",
        report.quiet_p50_us, report.quiet_p99_us, report.storm_p50_us, report.storm_p99_us
    )?;
    writeln!(out, "p99 ratio           {:>10.2}", report.p99_ratio)?;
    let curve: Vec<String> = report
        .rss_by_tenth_kib
        .iter()
        .map(|kib| format!("{:.1}", *kib as f64 / 1024.0))
        .collect();
    writeln!(
        out,
        "memory (MiB)        by tenth of the cycles: {}; peak {:.1}",
        curve.join(" "),
        report.rss_peak_kib as f64 / 1024.0
    )?;
    writeln!(
        out,
        "second half growth  {:>9.1}%",
        report.rss_second_half_growth_pct
    )?;
    writeln!(
        out,
        "orphan processes    {:>10}; the server that cannot start: {} starts, breaker {}",
        report.orphans,
        report.failed_starts,
        if report.start_breaker_open {
            "open"
        } else {
            "closed"
        }
    )?;
    Ok(())
}

async fn proxy(a: ProxyArgs) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?.display().to_string();
    let (floor, image_tool) = if a.server.is_empty() {
        let image = a.image_tool.or_else(|| Some("image".into()));
        (vec![exe, "bench".into(), "mcp-floor".into()], image)
    } else {
        (a.server, a.image_tool)
    };
    let report = guildhall::bench::proxy(guildhall::bench::ProxyBenchConfig {
        floor,
        echo_arg: a.echo_arg,
        calls: a.calls.max(1),
        concurrency: a.concurrency.max(1),
        restarts: a.restarts,
        image_tool,
    })
    .await?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    writeln!(out, "direct call p50     {:>10.1} µs", report.direct_p50_us)?;
    writeln!(
        out,
        "proxied call p50    {:>10.1} µs",
        report.proxied_p50_us
    )?;
    writeln!(out, "proxy ratio         {:>10.2}", report.proxy_ratio)?;
    writeln!(
        out,
        "calls/s, {} callers {:>10.0} proxied, {:.0} direct",
        report.concurrency, report.proxied_calls_per_sec, report.direct_calls_per_sec
    )?;
    writeln!(
        out,
        "restart after kill  {:>10.1} ms p50, {:.1} ms p99 (start + handshake alone {:.1} ms)",
        report.restart_p50_ms, report.restart_p99_ms, report.spawn_handshake_p50_ms
    )?;
    if report.image_ratio > 0.0 {
        writeln!(
            out,
            "image ({} KiB) p50   {:>10.1} µs proxied, {:.1} µs direct: ratio {:.2}",
            report.image_bytes / 1024,
            report.image_proxied_p50_us,
            report.image_direct_p50_us,
            report.image_ratio
        )?;
    }
    Ok(())
}

#[derive(Debug, Args)]
struct ToolsArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Files in the generated tree.
    #[arg(long, default_value_t = ToolsBenchConfig::default().files)]
    files: usize,
    /// Their total size, in MiB.
    #[arg(long, default_value_t = ToolsBenchConfig::default().mebibytes)]
    mib: usize,
    /// Rounds of grep and rg each, alternating.
    #[arg(long, default_value_t = ToolsBenchConfig::default().rounds)]
    rounds: usize,
    /// Calls of read_file and edit_file each.
    #[arg(long, default_value_t = ToolsBenchConfig::default().io_calls)]
    io_calls: usize,
    /// The ripgrep binary.
    #[arg(long, default_value = "rg")]
    rg: PathBuf,
    /// Where the tree is generated (and removed afterwards); default the system's
    /// temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
}

async fn tools(a: ToolsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = ToolsBenchConfig {
        files: a.files.max(1),
        mebibytes: a.mib.max(1),
        rounds: a.rounds.max(1),
        io_calls: a.io_calls.max(1),
        rg: a.rg,
    };
    let dir = a.dir.unwrap_or_else(std::env::temp_dir);
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report =
        tokio::spawn(async move { guildhall::bench::tools(&config, &dir, &stage).await }).await??;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            ("files searched", report.files as f64, ""),
            ("rg -l over the tree (ms)", report.rg_ms, "baseline"),
            ("grep, files with matches (ms)", report.grep_ms, ""),
            ("  grep / rg", report.grep_ratio, "<= 1.5"),
            ("  files found by grep", report.grep_files_found as f64, ""),
            ("  files found by rg", report.rg_files_found as f64, ""),
            (
                "std::fs read of 20 KB, p50 (µs)",
                report.read_direct_p50_us,
                "baseline",
            ),
            ("read_file, p50 (µs)", report.read_p50_us, ""),
            ("  read_file / direct", report.read_ratio, ""),
            (
                "std::fs edit in place, p50 (µs)",
                report.edit_direct_p50_us,
                "baseline",
            ),
            (
                "edit_file, read check + atomic replace, p50 (µs)",
                report.edit_p50_us,
                "",
            ),
            ("  edit_file / direct", report.edit_ratio, ""),
            (
                "bash -c true, bare tokio Command, p50 (µs)",
                report.bash_direct_p50_us,
                "baseline",
            ),
            ("bash tool running true, p50 (µs)", report.bash_p50_us, ""),
            ("  bash / bare", report.bash_ratio, "<= 1.5"),
            (
                "bash tool, sandbox off, p50 (µs)",
                report.bash_unsandboxed_p50_us,
                "baseline",
            ),
            (
                "  sandboxed / unsandboxed",
                report.sandboxed_bash_ratio,
                "<= 1.5",
            ),
            ("  the sandbox's own cost (µs)", report.sandbox_cost_us, ""),
            (
                "HTTP GET to loopback, direct, p50 (µs)",
                report.fetch_direct_p50_us,
                "baseline",
            ),
            (
                "  through the egress proxy, p50 (µs)",
                report.fetch_proxied_p50_us,
                "",
            ),
            ("  the proxy adds (µs)", report.proxy_added_us, ""),
        ],
    )
}

async fn context(
    a: ContextArgs,
    data_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = ContextBenchConfig {
        sessions: a.sessions.max(1),
        writers: a.writers.max(1),
        updates: a.updates.max(1),
        value_bytes: a.value_bytes,
        keys: ContextBenchConfig::default().keys,
        rounds: a.rounds.max(1),
        durable_updates: a.durable_updates.max(1),
        recovery_ops: a.recovery_ops.max(1),
    };
    let dir = a.dir.unwrap_or_else(|| data_dir.to_owned());
    std::fs::create_dir_all(&dir)?;
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let report =
        tokio::spawn(async move { guildhall::bench::context(config, &dir, &stage).await }).await?;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            (
                "bare ractor map updates (/s)",
                report.raw_ractor_updates_per_sec,
                "baseline",
            ),
            (
                "1 KB updates in memory (/s)",
                report.inmem_updates_per_sec,
                ">= 500,000",
            ),
            ("  slowdown against bare ractor", report.inmem_slowdown, ""),
            (
                "durable, acknowledged (updates/s)",
                report.durable_updates_per_sec,
                "",
            ),
            ("  group commits = fsyncs (/s)", report.fsyncs_per_sec, ""),
            ("  updates per fsync", report.updates_per_fsync, ""),
            (
                "operations in the recovered session",
                report.recovery_ops as f64,
                "",
            ),
            (
                "recovery: snapshot + log tail (s)",
                report.recovery_secs_1m,
                "< 2",
            ),
            (
                "  full log replay, no snapshot (s)",
                report.replay_secs_1m,
                "",
            ),
        ],
    )
}

async fn tasks(a: TasksArgs, data_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let config = TasksBenchConfig {
        claimers: a.claimers.max(1),
        tasks: a.tasks.max(1),
        rounds: a.rounds.max(1),
    };
    let dir = a.dir.unwrap_or_else(|| data_dir.to_owned());
    guildhall::private_fs::create_dir_all(&dir)?;
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let mut report = {
        let stage = Bar(bar.clone());
        tokio::spawn(async move { guildhall::bench::tasks(config, &dir, &stage).await }).await?
    };
    if a.launches > 0 {
        let exe = std::env::current_exe()?;
        report.launch = Some(guildhall::bench::launch(&exe, a.launches, &stage).await?);
    }
    bar.finish_and_clear();
    let launch = report.launch.clone();
    let launch_rows = launch.iter().flat_map(|l| {
        [
            ("agents launched, one at a time", l.launches as f64, ""),
            (
                "bare spawn -> first MCP call p50 (ms)",
                l.direct_first_call_p50_ms,
                "baseline",
            ),
            (
                "spawn_agent -> first MCP call p50 (ms)",
                l.launch_first_call_p50_ms,
                "",
            ),
            (
                "  of it, the agent's connection (ms)",
                l.connect_first_call_p50_ms,
                "",
            ),
            ("  guildhall's share", l.guildhall_share, ""),
        ]
    });
    let rows: Vec<(&str, f64, &str)> = [
        ("claimers at once", report.claimers as f64, ""),
        ("tasks per round", report.tasks as f64, ""),
        (
            "durable sends, acknowledged (msgs/s)",
            report.durable_msgs_per_sec,
            "baseline",
        ),
        (
            "durable claims, acknowledged (/s)",
            report.claims_per_sec,
            "",
        ),
        ("  claims / sends", report.claims_ratio, ""),
        (
            "durable creates, acknowledged (/s)",
            report.creates_per_sec,
            "",
        ),
    ]
    .into_iter()
    .chain(launch_rows)
    .collect();
    print_report(a.json, &report, &rows)
}

async fn swarm(a: SwarmArgs) -> Result<(), Box<dyn std::error::Error>> {
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let agents = a.agents;
    let report =
        tokio::spawn(async move { guildhall::bench::swarm_bench(agents, &stage).await }).await?;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            ("agents", report.agents as f64, ""),
            ("register (s)", report.register_secs, ""),
            ("activate every mailbox (s)", report.spawn_secs, "< 1"),
            (
                "bytes per active agent (heap, stacks)",
                report.bytes_per_agent,
                "<= 8192",
            ),
            ("  of which the mailbox actor", report.bytes_per_mailbox, ""),
        ],
    )
}

async fn fan_out(
    a: FanOutArgs,
    data_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = a.dir.unwrap_or_else(|| data_dir.to_owned());
    guildhall::private_fs::create_dir_all(&dir)?;
    let bar = progress_bar()?;
    let stage = Bar(bar.clone());
    let agents = a.agents;
    let report =
        tokio::spawn(async move { guildhall::bench::fan_out_bench(agents, &dir, &stage).await })
            .await?;
    bar.finish_and_clear();
    print_report(
        a.json,
        &report,
        &[
            ("recipients", report.recipients as f64, ""),
            ("register, durable (s)", report.register_secs, ""),
            (
                "one send to * until committed (s)",
                report.fan_out_secs,
                "<= 2",
            ),
            (
                "  memory it added (MB)",
                report.fan_out_added_bytes / 1e6,
                "<= 200",
            ),
            (
                "floor: the records in one batch (s)",
                report.floor_secs,
                "baseline",
            ),
            ("  send / floor", report.fan_out_ratio, ""),
        ],
    )
}

/// Prints `report` as one JSON object, or `rows` (measurement, value, target) as a table.
fn print_report(
    json: bool,
    report: &impl Serialize,
    rows: &[(&str, f64, &str)],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(report)?)?;
        return Ok(());
    }
    write_rows(&mut out, rows)?;
    Ok(())
}

/// Writes `rows` (measurement, value, target) as a table, each figure that has a target
/// marked ✓ when it meets it and ✗ when it does not.
fn write_rows(out: &mut impl Write, rows: &[(&str, f64, &str)]) -> std::io::Result<()> {
    writeln!(out, "{:<44} {:>14}  target", "measurement", "value")?;
    for (name, value, target) in rows {
        let mark = match meets(*value, target) {
            Some(true) => " ✓",
            Some(false) => " ✗",
            None => "",
        };
        writeln!(out, "{name:<44} {value:>14.2}  {target}{mark}")?;
    }
    Ok(())
}

/// Whether `value` meets `target` (`<= 2`, `< 100`, `>= 1e6`, `> 0`); `None` for a target
/// that is not a bound (`baseline`, none).
fn meets(value: f64, target: &str) -> Option<bool> {
    let (op, bound) = ["<=", ">=", "<", ">"]
        .iter()
        .find_map(|op| target.strip_prefix(op).map(|rest| (*op, rest)))?;
    let bound: f64 = bound.trim().replace([',', '_'], "").parse().ok()?;
    Some(match op {
        "<=" => value <= bound,
        ">=" => value >= bound,
        "<" => value < bound,
        _ => value > bound,
    })
}

fn spawn_in_child(kind: &str, count: usize) -> Result<SpawnReport, Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let count = count.to_string();
    let out = Command::new(exe)
        .args(["bench", "spawn", "--kind", kind, "--count", &count])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "spawn measurement failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn table(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    let c = &r.calls;
    let rows = [
        ("direct call (ns)", c.direct_ns, ""),
        ("bare ractor call (ns)", c.raw_ractor_ns, "baseline"),
        ("guildhall pipeline call (ns)", c.pipeline_ns, ""),
        ("  with JSON in/out (ns)", c.json_pipeline_ns, ""),
        ("overhead ratio", c.overhead_ratio, "<= 2"),
        ("governed call, every stage on (ns)", c.governed_ns, ""),
        (
            "governed ratio (governed / pipeline)",
            c.governed_ratio,
            "<= 1.5",
        ),
        (
            "governed call, dashboard and watch attached (ns)",
            c.governed_watched_ns,
            "",
        ),
        (
            "watched ratio (watched governed / pipeline)",
            c.governed_watched_ratio,
            "<= 1.5",
        ),
        (
            "  events the watchers showed",
            c.governed_watched_events as f64,
            "",
        ),
        ("  events they lost", c.governed_watched_missed as f64, ""),
        (
            "two governed calls in turn (ns)",
            c.two_governed_ns,
            "baseline",
        ),
        ("  as a two-step composite (ns)", c.composite_ns, ""),
        ("  composite ratio", c.composite_ratio, "<= 1.1"),
        ("breaker check (ns)", c.breaker_check_ns, "< 100"),
        ("crash -> serving p50 (us)", c.crash_recovery_p50_us, ""),
        (
            "crash -> serving p99 (us)",
            c.crash_recovery_p99_us,
            "<= 100",
        ),
        (
            "spawn supervised tool actors (ms)",
            r.actors_spawn_ms,
            "< 100",
        ),
        (
            "bytes per tool actor (heap, stacks)",
            r.bytes_per_actor,
            "<= 8192",
        ),
        ("spawn distinct tools (ms)", r.tools_spawn_ms, ""),
        ("bytes per tool (heap, stacks)", r.bytes_per_tool, ""),
        (
            "bytes per bare ractor actor",
            r.bytes_per_raw_actor,
            "baseline",
        ),
    ];
    write_rows(out, &rows)?;
    writeln!(
        out,
        "{:<44} {:>14}",
        "actors / tools spawned",
        format!("{} / {}", r.actors_spawned, r.tools_spawned)
    )
}

#[cfg(test)]
mod tests {
    use super::meets;

    #[test]
    fn targets_are_judged_by_their_bound() {
        assert_eq!(meets(1.9, "<= 2"), Some(true));
        assert_eq!(meets(2.1, "<= 2"), Some(false));
        assert_eq!(meets(99.0, "< 100"), Some(true));
        assert_eq!(meets(100.0, "< 100"), Some(false));
        assert_eq!(meets(1.2e6, ">= 1e6"), Some(true));
        assert_eq!(meets(990_000.0, ">= 1,000,000"), Some(false));
        assert_eq!(meets(5.0, "baseline"), None);
        assert_eq!(meets(5.0, ""), None);
    }
}
