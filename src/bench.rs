//! The measurements behind `guildhall bench` and the criterion benches.
//!
//! Every figure that matters is a ratio against a baseline measured in the same process and
//! the same rounds, because the machines this runs on are shared and noisy: each round runs
//! one batch of every contender in turn, and the report takes the median over rounds.

#[cfg(feature = "a2a")]
mod a2a;
#[cfg(feature = "postgres")]
mod cluster;
mod context;
mod events;
mod hook;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod launch;
pub mod load;
mod mail;
pub mod mcp;
mod observer;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod proxy;
mod soak;
mod storm;
mod tasks;
mod tools;
mod watchers;

#[cfg(feature = "a2a")]
pub use a2a::{A2aBenchConfig, A2aReport, a2a};
#[cfg(feature = "postgres")]
pub use cluster::{ClusterBenchConfig, ClusterReport, cluster};
pub use context::{ContextBenchConfig, ContextReport, context};
pub use events::{EventsBenchConfig, EventsReport, events};
pub use hook::{HookBenchConfig, HookReport, hook};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub use launch::{LaunchReport, launch, launch_agent};
pub use mail::{
    FanOutReport, MailboxBenchConfig, MailboxReport, SwarmReport, fan_out_bench, mailbox,
    swarm_bench,
};
pub use mcp::{McpBenchConfig, McpReport};
pub use observer::{ObserverBenchConfig, ObserverReport, observer};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub use proxy::{ProxyBenchConfig, ProxyReport, proxy};
pub use soak::{
    OpFigures, PeerFaultStruck, PgRestart, SoakBenchConfig, SoakReport, SoakSample, TaskCheck, soak,
};
pub use storm::{StormBenchConfig, StormReport, storm};
pub use tasks::{TasksBenchConfig, TasksReport, tasks};
pub use tools::{ToolsBenchConfig, ToolsReport, tools};

use std::future::Future;
use std::hint::black_box;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::governance::{Action, GovernanceConfig, Principal, Rule, Trust};
use crate::supervision::{Backoff, BreakerConfig, SharedBreaker};
use crate::{CallContext, CallOptions, Runtime, Tool, ToolOptions};

/// A tool that returns its input: the cheapest possible tool body.
#[derive(Debug, Clone)]
pub struct Noop {
    name: String,
    actors: usize,
}

impl Noop {
    /// A sequential noop tool called `name`.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            actors: 1,
        }
    }

    /// The same tool run by `actors` actors.
    pub fn with_actors(mut self, actors: usize) -> Self {
        self.actors = actors;
        self
    }
}

/// Input and output of [`Noop`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub struct Number {
    /// Any number.
    pub n: u64,
}

impl Tool for Noop {
    type Input = Number;
    type Output = Number;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        "Returns its input."
    }

    fn concurrency(&self) -> crate::Concurrency {
        crate::Concurrency::up_to(self.actors)
    }

    async fn call(&self, _: &mut (), input: Number, _: CallContext) -> Result<Number, Self::Error> {
        Ok(input)
    }
}

/// A tool that panics when asked to.
#[derive(Debug, Clone, Copy)]
pub struct Crashy;

/// Input of [`Crashy`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub struct CrashInput {
    /// Panic instead of answering.
    pub panic: bool,
}

impl Tool for Crashy {
    type Input = CrashInput;
    type Output = Number;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        "crashy"
    }

    fn description(&self) -> &str {
        "Panics when asked to."
    }

    async fn call(
        &self,
        _: &mut (),
        input: CrashInput,
        _: CallContext,
    ) -> Result<Number, Self::Error> {
        assert!(!input.panic, "crash requested");
        Ok(Number { n: 1 })
    }
}

/// The baseline: a bare ractor actor answering a request/reply message.
#[derive(Debug, Clone, Copy)]
pub struct RawEcho;

/// [`RawEcho`]'s message.
#[derive(Debug)]
pub struct RawCall(pub u64, pub RpcReplyPort<u64>);

impl Actor for RawEcho {
    type Msg = RawCall;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<RawCall>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<RawCall>,
        RawCall(n, reply): RawCall,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let _ = reply.send(n);
        Ok(())
    }
}

/// Calls the bare actor once.
///
/// # Cancel safety
/// Cancel safe: dropping it only stops waiting for the answers.
pub async fn raw_call(actor: &ActorRef<RawCall>, n: u64) -> u64 {
    match actor.call(|reply| RawCall(n, reply), None).await {
        Ok(ractor::rpc::CallResult::Success(v)) => v,
        other => panic!("raw actor call failed: {other:?}"),
    }
}

/// Stops bare baseline actors and waits until they are gone, so that their teardown does not
/// fall into the next measurement.
pub(crate) async fn stop_all<M: ractor::Message>(
    actors: &[ActorRef<M>],
    handles: Vec<tokio::task::JoinHandle<()>>,
) {
    for actor in actors {
        actor.stop(None);
    }
    for handle in handles {
        handle.await.expect("a bare actor stops");
    }
}

/// Options for a tool that must never back off or escalate while it is crashed on purpose.
pub fn crash_options() -> ToolOptions {
    ToolOptions::default()
        .backoff(Backoff::none())
        .breaker(BreakerConfig {
            max_failures: u32::MAX,
            ..BreakerConfig::default()
        })
}

/// Settings of `guildhall bench calls`.
#[derive(Debug, Clone, Copy)]
pub struct CallsConfig {
    /// Measurement rounds; each runs one batch of every contender.
    pub rounds: usize,
    /// Calls per batch.
    pub batch: usize,
    /// Crashes timed for the recovery figures.
    pub crashes: usize,
}

impl Default for CallsConfig {
    fn default() -> Self {
        Self {
            // About 4 s: at 60 rounds (under a second) the governed ratio moved ±0.05
            // from run to run, too much to judge a bound of 1.5; at 600, ±0.03.
            rounds: 600,
            batch: 2_000,
            crashes: 2_000,
        }
    }
}

/// What `guildhall bench calls` measured. Times are medians over rounds.
#[derive(Debug, Clone, Serialize)]
pub struct CallsReport {
    /// Awaiting the tool's `call` directly.
    pub direct_ns: f64,
    /// A request/reply to a bare ractor actor.
    pub raw_ractor_ns: f64,
    /// A typed call through the full pipeline to a supervised tool actor.
    pub pipeline_ns: f64,
    /// The same call with JSON arguments and result.
    pub json_pipeline_ns: f64,
    /// `pipeline_ns / raw_ractor_ns`.
    pub overhead_ratio: f64,
    /// The typed call with every governance stage on: rules in every scope, the loop
    /// guard, and the audit log written to a durable store (no hooks).
    pub governed_ns: f64,
    /// `governed_ns / pipeline_ns`.
    pub governed_ratio: f64,
    /// The same governed call in a runtime of its own watched all along by the dashboard's
    /// event stream and `guildhall watch` (two watchers sharing one rendering, as a
    /// server's do).
    pub governed_watched_ns: f64,
    /// `governed_watched_ns / pipeline_ns`.
    pub governed_watched_ratio: f64,
    /// Events the two watchers showed, summed over both.
    pub governed_watched_events: u64,
    /// Events they lost by falling behind (each loss told in a `missed` line).
    pub governed_watched_missed: u64,
    /// Two governed JSON calls made one after the other, the second on the first's result.
    pub two_governed_ns: f64,
    /// The same two calls as a composite's steps ([`crate::compose::Composite`]).
    pub composite_ns: f64,
    /// `composite_ns / two_governed_ns`: what composing adds.
    pub composite_ratio: f64,
    /// One breaker admission plus one outcome record.
    pub breaker_check_ns: f64,
    /// Median time from a caller receiving `crashed` to the next call succeeding.
    pub crash_recovery_p50_us: f64,
    /// 99th percentile of the same.
    pub crash_recovery_p99_us: f64,
}

/// What one spawn measurement found.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SpawnReport {
    /// How many were started.
    pub count: usize,
    /// Wall time to build the runtime that starts them.
    pub ms: f64,
    /// Anonymous resident memory added (heap and stacks), divided by `count`.
    pub bytes_each: f64,
    /// File-backed resident memory added in all (the code that ran for the first time),
    /// not divided: it does not grow with `count`.
    pub code_bytes: u64,
}

impl SpawnReport {
    fn new(count: usize, started: std::time::Instant, before: Resident) -> Self {
        let grown = Resident::now().since(before);
        Self {
            count,
            ms: started.elapsed().as_secs_f64() * 1_000.0,
            bytes_each: grown.anonymous as f64 / count as f64,
            code_bytes: grown.file,
        }
    }
}

/// What is spawned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnKind {
    /// `count` supervised tool actors: one tool run by `count` actors.
    Actors,
    /// `count` distinct tools, each with one actor, its own pipeline, breaker and registry
    /// entry.
    Tools,
    /// The baseline: `count` bare ractor actors, unsupervised, with no runtime around them.
    Raw,
}

/// Builds a runtime that starts `count` actors or tools and reports time and memory. Run it
/// in a fresh process for a clean memory figure: freed memory from earlier work would be
/// reused and hide growth.
///
/// # Panics
/// If the runtime fails to start.
///
/// # Cancel safety
/// Not cancel safe: dropped part way, the actors it started keep running until the process
/// ends.
pub async fn spawn(kind: SpawnKind, count: usize) -> SpawnReport {
    let count = count.max(1);
    let builder = match kind {
        SpawnKind::Actors => Runtime::builder().tool(Noop::named("noop").with_actors(count)),
        SpawnKind::Tools => (0..count)
            .map(|i| Noop::named(format!("noop_{i}")))
            .fold(Runtime::builder(), |b, t| b.tool(t)),
        SpawnKind::Raw => return spawn_raw(count).await,
    };
    let before = Resident::now();
    let start = std::time::Instant::now();
    let rt = builder.build().await.expect("spawn runtime starts");
    let report = SpawnReport::new(count, start, before);
    rt.shutdown().await;
    report
}

async fn spawn_raw(count: usize) -> SpawnReport {
    let before = Resident::now();
    let start = std::time::Instant::now();
    let (mut actors, mut handles) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for _ in 0..count {
        let (actor, handle) = Actor::spawn(None, RawEcho, ())
            .await
            .expect("raw actor starts");
        actors.push(actor);
        handles.push(handle);
    }
    let report = SpawnReport::new(count, start, before);
    stop_all(&actors, handles).await;
    report
}

/// Reports progress of a long measurement.
pub trait Stage: Send + Sync {
    /// A new phase begins with `total` steps.
    fn phase(&self, name: &str, total: u64);
    /// One step is done.
    fn step(&self);
}

/// Runs every measurement of `guildhall bench calls`.
///
/// # Panics
/// If the runtime under test fails to start or a baseline call fails.
///
/// # Cancel safety
/// As [`spawn`].
pub async fn calls(config: CallsConfig, stage: &dyn Stage) -> CallsReport {
    let rt = Runtime::builder()
        .governance(GovernanceConfig::off())
        .tool(Noop::named("noop"))
        .tool_with(Crashy, crash_options())
        .build()
        .await
        .expect("bench runtime starts");
    let handle = rt.handle::<Noop>("noop").expect("noop registered");
    let (governed_rt, audit_dir, agent) = governed_runtime().await;
    let governed = governed_rt.handle::<Noop>("noop").expect("noop registered");
    // Watched: a runtime of its own, so that the dashboard and `watch` stay attached for the
    // whole run (as they are on a server) and the unwatched runtime emits nothing.
    let (watched_rt, watched_dir, watched_agent) = governed_runtime().await;
    let watched = watched_rt.handle::<Noop>("noop").expect("noop registered");
    let watchers = watchers::dashboard_and_watch(&watched_rt);
    let mut n = 0u64;
    let (raw, _) = Actor::spawn(None, RawEcho, ())
        .await
        .expect("raw actor starts");
    let tool = Noop::named("direct");
    let ctx = CallContext::new(None, None, Duration::from_secs(3600), None);
    let breaker = SharedBreaker::new(BreakerConfig::default());
    let json_args = serde_json::json!({ "n": 7 });

    let two = crate::compose::Composite::<Number, Number>::tool("noop")
        .then(crate::compose::Composite::<Number, Number>::tool("noop"));

    stage.phase("calls", config.rounds as u64);
    let (mut direct, mut raw_ns, mut pipe, mut json, mut brk, mut gov, mut gov_watched) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut twice, mut composed) = (vec![], vec![]);
    for _ in 0..config.rounds {
        direct.push(
            batch(config.batch, || async {
                black_box(tool.call(&mut (), Number { n: 7 }, ctx.clone()).await.ok());
            })
            .await,
        );
        raw_ns.push(
            batch(config.batch, || async {
                black_box(raw_call(&raw, 7).await);
            })
            .await,
        );
        pipe.push(
            batch(config.batch, || async {
                black_box(handle.call(Number { n: 7 }).await.ok());
            })
            .await,
        );
        gov.push(
            batch(config.batch, || {
                // Arguments change per call, as a working agent's do: the loop guard counts
                // every call and trips none.
                n += 1;
                let call = governed.call_with(Number { n }, CallOptions::new().as_agent(&agent));
                async move {
                    black_box(call.await.ok());
                }
            })
            .await,
        );
        // A two-step composite against the same two governed calls made by hand: the second
        // takes the first's result, as the composite's does.
        twice.push(
            batch(config.batch, || {
                n += 1;
                let (rt, agent) = (&governed_rt, &agent);
                async move {
                    let options = || CallOptions::new().as_agent(agent);
                    let first = rt.call_json("noop", serde_json::json!({ "n": n }), options());
                    if let Ok(out) = first.await {
                        black_box(rt.call_json("noop", out, options()).await.ok());
                    }
                }
            })
            .await,
        );
        composed.push(
            batch(config.batch, || {
                n += 1;
                let run = two.run(
                    &governed_rt,
                    Number { n },
                    CallOptions::new().as_agent(&agent),
                );
                async move {
                    black_box(run.await.ok());
                }
            })
            .await,
        );
        // Before the JSON calls: what the watchers render after this batch ends falls on
        // them, whose figure has no bound, rather than on the baselines.
        gov_watched.push(
            batch(config.batch, || {
                n += 1;
                let options = CallOptions::new().as_agent(&watched_agent);
                let call = watched.call_with(Number { n }, options);
                async move {
                    black_box(call.await.ok());
                }
            })
            .await,
        );
        json.push(
            batch(config.batch, || async {
                black_box(
                    rt.call_json("noop", json_args.clone(), CallOptions::new())
                        .await
                        .ok(),
                );
            })
            .await,
        );
        brk.push(
            batch(config.batch * 10, || async {
                if let Ok(a) = breaker.try_acquire(None) {
                    black_box(breaker.record(a, true));
                }
            })
            .await,
        );
        stage.step();
    }

    stage.phase("crash recovery", config.crashes as u64);
    let recovery = crash_recovery(&rt, config.crashes, stage).await;

    let seen = watchers.stop().await;
    raw.stop(None);
    rt.shutdown().await;
    for (runtime, dir) in [(governed_rt, audit_dir), (watched_rt, watched_dir)] {
        runtime.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    let raw_ractor_ns = median(&mut raw_ns);
    let pipeline_ns = median(&mut pipe);
    let governed_ns = median(&mut gov);
    let governed_watched_ns = median(&mut gov_watched);
    let (two_governed_ns, composite_ns) = (median(&mut twice), median(&mut composed));
    CallsReport {
        direct_ns: median(&mut direct),
        raw_ractor_ns,
        pipeline_ns,
        json_pipeline_ns: median(&mut json),
        overhead_ratio: pipeline_ns / raw_ractor_ns,
        governed_ns,
        governed_ratio: governed_ns / pipeline_ns,
        governed_watched_ns,
        governed_watched_ratio: governed_watched_ns / pipeline_ns,
        governed_watched_events: seen.taken,
        governed_watched_missed: seen.missed,
        two_governed_ns,
        composite_ns,
        composite_ratio: composite_ns / two_governed_ns,
        breaker_check_ns: median(&mut brk),
        crash_recovery_p50_us: percentile(&recovery, 0.50),
        crash_recovery_p99_us: percentile(&recovery, 0.99),
    }
}

/// A runtime governed by [`governed_config`], its audit in a fresh directory (returned, to
/// remove after), with the agent its calls are made as.
async fn governed_runtime() -> (Runtime, std::path::PathBuf, crate::Agent) {
    let audit_dir = tempfile_in(&std::env::temp_dir());
    let runtime = Runtime::builder()
        .data_dir(&audit_dir)
        .governance(governed_config())
        .tool(Noop::named("noop"))
        .build()
        .await
        .expect("governed bench runtime starts");
    let agent = runtime
        .register_agent(crate::AgentSpec::new("bench-1", "bench"))
        .await
        .expect("bench agent registers");
    (runtime, audit_dir, agent)
}

/// Governance as a careful deployment has it: rules in the config, role and agent scopes
/// (some reading arguments, for other tools), bounded trust, the loop guard, and audit.
fn governed_config() -> GovernanceConfig {
    let rule = |tool: &str, action| Rule::new(tool, action).expect("valid bench rule");
    let mut config = GovernanceConfig {
        trust: Trust::Bounded,
        rules: vec![
            rule("shell", Action::Ask),
            rule("shell", Action::Allow)
                .with_arg("command", "git *")
                .expect("valid bench rule"),
            rule("net_*", Action::Deny),
            rule("noop", Action::Ask),
        ],
        ..GovernanceConfig::default()
    };
    config.roles.insert(
        "bench".into(),
        Principal {
            trust: Some(Trust::Suggest),
            rules: vec![
                rule("context_*", Action::Allow),
                rule("noop", Action::Allow),
            ],
            role: None,
        },
    );
    config.agents.insert(
        "bench-1".into(),
        Principal {
            trust: None,
            rules: vec![rule("send_message", Action::Allow)],
            // Given by the config, so the role's allow rules apply to it.
            role: Some("bench".into()),
        },
    );
    config
}

/// Mean nanoseconds per call over one batch of `n` sequential calls.
async fn batch<F, Fut>(n: usize, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let start = std::time::Instant::now();
    for _ in 0..n {
        f().await;
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

/// Microseconds from each `crashed` reply to the next successful call, sorted.
async fn crash_recovery(rt: &Runtime, crashes: usize, stage: &dyn Stage) -> Vec<f64> {
    let crashy = rt.handle::<Crashy>("crashy").expect("crashy registered");
    // The default hook would print every intended panic; the hook runs before the reply is
    // sent, so silencing it does not shorten the interval measured.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut samples = Vec::with_capacity(crashes);
    for _ in 0..crashes {
        let err = crashy.call(CrashInput { panic: true }).await;
        assert!(err.is_err(), "crashy must crash");
        let crashed_at = std::time::Instant::now();
        crashy
            .call(CrashInput { panic: false })
            .await
            .expect("serving after restart");
        samples.push(crashed_at.elapsed().as_nanos() as f64 / 1_000.0);
        stage.step();
    }
    std::panic::set_hook(hook);
    samples.sort_by(f64::total_cmp);
    samples
}

/// Times `iters` sequential runs of `f` inside a task spawned on `rt`'s workers, where a
/// server's callers live (for criterion's `iter_custom`: its own async driver would call
/// from the thread blocked in `block_on` and measure cross-thread wake-ups instead).
///
/// # Panics
/// If `f` panics.
pub fn timed_in_task<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, f: F) -> Duration
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    rt.block_on(async move {
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                f().await;
            }
            start.elapsed()
        })
        .await
        .expect("the timed task finishes")
    })
}

/// Resident memory from `/proc/self/statm` (zeros where that does not exist).
#[derive(Debug, Clone, Copy, Default)]
pub struct Resident {
    /// Anonymous pages: the heap and stacks, what actors and their state cost.
    pub anonymous: u64,
    /// File-backed pages, mostly the executable's code, faulted in the first time a code
    /// path runs. Paid once per process, not per actor, so per-actor figures leave them out.
    pub file: u64,
}

impl Resident {
    /// Now.
    pub fn now() -> Self {
        let pages = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| {
                let mut fields = s.split_whitespace().skip(1).map(str::parse::<u64>);
                Some((fields.next()?.ok()?, fields.next()?.ok()?))
            });
        pages.map_or_else(Self::default, |(resident, shared)| Self {
            anonymous: resident.saturating_sub(shared) * 4096,
            file: shared * 4096,
        })
    }

    /// What grew from `before` to `self`.
    pub fn since(self, before: Self) -> Self {
        Self {
            anonymous: self.anonymous.saturating_sub(before.anonymous),
            file: self.file.saturating_sub(before.file),
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(v, 0.5)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
/// A fresh directory under `parent` for one durable run.
pub(super) fn tempfile_in(parent: &std::path::Path) -> std::path::PathBuf {
    parent.join(format!(
        "bench-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ))
}
