//! `guildhall bench storm`: proxied servers crashing on every call, and one that cannot even
//! start, while another agent checks its inbox. It reports what the storm cost that agent
//! (its `check_inbox` p50 and p99 quiet and during the storm, same run), guildhall's memory
//! across the crash cycles, and the processes left behind once the servers are removed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::percentile;
use crate::runtime::Runtime;
use crate::servers::{ServerConfig, Servers};
use crate::{AgentSpec, BreakerStatus, CallError, CallOptions};

/// What `bench storm` does.
#[derive(Debug, Clone)]
pub struct StormBenchConfig {
    /// The crashing server's command line: the `guildhall` binary's `bench mcp-floor`,
    /// whose `crash` tool ends its process without answering.
    pub floor: Vec<String>,
    /// Servers crashing at once.
    pub servers: usize,
    /// Crash cycles in all (a call that ends `crashed`, the restart that follows).
    pub cycles: usize,
    /// The bystander's `check_inbox` calls timed while nothing crashes.
    pub quiet_calls: usize,
    /// The longest the storm runs: it ends then with the cycles done so far (crashing
    /// servers back off ever longer, so many cycles over few servers take long).
    pub max_duration: Duration,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct StormReport {
    /// Crash cycles done.
    pub cycles: usize,
    /// Servers crashing at once.
    pub servers: usize,
    /// How long the storm took, in seconds.
    pub storm_secs: f64,
    /// Calls of the crashing tools that ended otherwise than `crashed` (a deadline, the
    /// server unavailable); each still had one answer.
    pub other_outcomes: usize,
    /// The bystander's `check_inbox` median while nothing crashed, in µs.
    pub quiet_p50_us: f64,
    /// Its 99th percentile then.
    pub quiet_p99_us: f64,
    /// Its median during the storm.
    pub storm_p50_us: f64,
    /// Its 99th percentile during the storm.
    pub storm_p99_us: f64,
    /// `storm_p99_us / quiet_p99_us`.
    pub p99_ratio: f64,
    /// The bystander's calls timed during the storm.
    pub storm_calls: usize,
    /// guildhall's resident memory once each tenth of the cycles was done (a tenth, two
    /// tenths, …), in KiB: its curve over the storm.
    pub rss_by_tenth_kib: Vec<u64>,
    /// How much the resident memory grew over the second half of the storm (from half the
    /// cycles done to the end), in percent of what it was at half: near 0 when it is flat.
    pub rss_second_half_growth_pct: f64,
    /// Its resident memory at the end of the storm, in KiB.
    pub rss_end_kib: u64,
    /// Its highest resident memory sampled during the storm, in KiB.
    pub rss_peak_kib: u64,
    /// Processes of the servers left once every server was removed (0 expected).
    pub orphans: usize,
    /// Starts of the server that cannot start.
    pub failed_starts: u64,
    /// Whether its start breaker was open at the end (it is quarantined, backing off).
    pub start_breaker_open: bool,
}

/// Runs the storm.
///
/// # Errors
/// A message naming what failed (the runtime, a server that did not start).
pub async fn storm(config: StormBenchConfig) -> Result<StormReport, String> {
    let (program, args) = config
        .floor
        .split_first()
        .ok_or("the floor server's command line is empty")?;
    // No audit: the other agent's million calls would each add a record kept in memory
    // (its retention bounds it, not this run), and the memory measured is the storm's.
    let governance = crate::governance::GovernanceConfig {
        audit: false,
        ..Default::default()
    };
    let runtime = Runtime::builder()
        .governance(governance)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let servers = Servers::start(&runtime, std::env::temp_dir(), None)
        .await
        .map_err(|e| e.to_string())?;
    let bystander = runtime
        .register_agent(AgentSpec::new("bystander", "agent"))
        .await
        .map_err(|e| e.to_string())?;
    // Each check asks for a different page size, so the loop guard (on, as for any agent)
    // never takes the checks for a loop.
    let checks = AtomicUsize::new(0);
    let check = || {
        let options = CallOptions::new().as_agent(&bystander);
        let runtime = runtime.clone();
        let limit = 1 + checks.fetch_add(1, Ordering::Relaxed) % 50;
        async move {
            let at = Instant::now();
            runtime
                .call_json("check_inbox", json!({ "limit": limit }), options)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<f64, String>(at.elapsed().as_secs_f64() * 1e6)
        }
    };
    for _ in 0..100 {
        check().await?;
    }
    let mut quiet = Vec::with_capacity(config.quiet_calls);
    for _ in 0..config.quiet_calls.max(1) {
        quiet.push(check().await?);
    }

    // Every process the storm starts carries this mark in its environment: what is left
    // of them at the end is found by it, whoever its parent is by then (an orphan is
    // adopted by init), and no other process of this one is counted.
    let mark = format!("{}={}", MARK, uuid::Uuid::now_v7());
    let mut floor = ServerConfig::command(program.clone(), args.iter().cloned());
    let (key, value) = mark.split_once('=').unwrap_or_default();
    floor.env.insert(key.into(), value.into());
    let count = config.servers.max(1);
    for i in 0..count {
        servers
            .add(&format!("storm{i}"), floor.clone())
            .await
            .map_err(|e| e.to_string())?;
    }
    // A server that exits as it starts: its start breaker holds it off.
    let mut dead = ServerConfig::command("false", Vec::<String>::new());
    dead.env.insert(key.into(), value.into());
    servers.add("dead", dead).await.map_err(|e| e.to_string())?;
    servers.settled(Duration::from_secs(30)).await;
    for i in 0..count {
        if runtime.tool(&format!("mcp__storm{i}__crash")).is_none() {
            return Err(format!("server storm{i} did not serve within 30 s"));
        }
    }

    let crashes = Arc::new(AtomicUsize::new(0));
    let other = Arc::new(AtomicUsize::new(0));
    // The bystander's timings, a uniform sample of fixed size taken before the storm: a
    // million of them kept whole grew this process by 16 MiB, which read as the storm's.
    let mut timed = Reservoir::new(KEPT_TIMINGS);
    let started = Instant::now();
    let storm = futures::future::join_all((0..count).map(|i| {
        let (runtime, crashes, other) = (runtime.clone(), Arc::clone(&crashes), Arc::clone(&other));
        let tool = format!("mcp__storm{i}__crash");
        async move {
            // As an agent would: calling again at once after a crash, after the breaker's
            // `retry_after` when it is open, and a little later after anything else.
            while crashes.load(Ordering::Relaxed) < config.cycles
                && started.elapsed() < config.max_duration
            {
                match runtime
                    .call_json(&tool, json!({}), CallOptions::new())
                    .await
                {
                    Err(CallError::Crashed { .. }) => {
                        crashes.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(CallError::CircuitOpen { retry_after, .. }) => {
                        other.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(retry_after.max(Duration::from_millis(1))).await;
                    }
                    _ => {
                        other.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
    }));
    let watch = async {
        let (mut tenths, mut peak) = (Vec::new(), 0);
        while crashes.load(Ordering::Relaxed) < config.cycles
            && started.elapsed() < config.max_duration
        {
            timed.add(check().await?);
            if timed.seen.is_multiple_of(64) {
                let rss = rss_kib();
                peak = peak.max(rss);
                let done = crashes.load(Ordering::Relaxed);
                while tenths.len() < 9 && done >= config.cycles * (tenths.len() + 1) / 10 {
                    tenths.push(rss);
                }
            }
        }
        Ok::<_, String>((tenths, peak))
    };
    let (_, watched) = tokio::join!(storm, watch);
    let (mut rss_by_tenth_kib, rss_peak_kib) = watched?;
    let storm_calls = usize::try_from(timed.seen).unwrap_or(usize::MAX);
    let mut during = timed.kept;
    let storm_secs = started.elapsed().as_secs_f64();
    let rss_end_kib = rss_kib();
    rss_by_tenth_kib.resize(9, rss_end_kib);
    rss_by_tenth_kib.push(rss_end_kib);
    let half = rss_by_tenth_kib[4].max(1) as f64;

    let dead = servers
        .list()
        .await
        .into_iter()
        .find(|s| s.name == "dead")
        .ok_or("the server that cannot start is not listed")?;
    for i in 0..count {
        servers
            .remove(&format!("storm{i}"))
            .await
            .map_err(|e| e.to_string())?;
    }
    servers.remove("dead").await.map_err(|e| e.to_string())?;
    // Each removed server's group is killed; what is left after a grace is an orphan.
    let gone_by = Instant::now() + Duration::from_secs(10);
    while marked(&mark) > 0 && Instant::now() < gone_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let orphans = marked(&mark);
    runtime.shutdown().await;

    quiet.sort_by(f64::total_cmp);
    during.sort_by(f64::total_cmp);
    let quiet_p99_us = percentile(&quiet, 0.99);
    let storm_p99_us = percentile(&during, 0.99);
    Ok(StormReport {
        cycles: crashes.load(Ordering::Relaxed),
        servers: count,
        storm_secs,
        other_outcomes: other.load(Ordering::Relaxed),
        quiet_p50_us: percentile(&quiet, 0.5),
        quiet_p99_us,
        storm_p50_us: percentile(&during, 0.5),
        storm_p99_us,
        p99_ratio: storm_p99_us / quiet_p99_us,
        storm_calls,
        rss_second_half_growth_pct: (rss_end_kib as f64 - half) / half * 100.0,
        rss_by_tenth_kib,
        rss_end_kib,
        rss_peak_kib: rss_peak_kib.max(rss_end_kib),
        orphans,
        failed_starts: dead.starts,
        start_breaker_open: matches!(dead.breaker, BreakerStatus::Open { .. }),
    })
}

/// The bystander's timings kept during the storm (a uniform sample past that).
const KEPT_TIMINGS: usize = 100_000;

/// A uniform sample of at most `capacity` of the values it is given (Algorithm R), in
/// memory allocated once.
struct Reservoir {
    kept: Vec<f64>,
    seen: u64,
    /// xorshift64 state: any sequence that is uniform enough will do.
    state: u64,
}

impl Reservoir {
    fn new(capacity: usize) -> Self {
        Self {
            kept: Vec::with_capacity(capacity),
            seen: 0,
            state: 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn add(&mut self, value: f64) {
        self.seen += 1;
        if self.kept.len() < self.kept.capacity() {
            self.kept.push(value);
            return;
        }
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let slot = self.state % self.seen;
        if let Ok(slot) = usize::try_from(slot)
            && let Some(kept) = self.kept.get_mut(slot)
        {
            *kept = value;
        }
    }
}

/// This process's resident memory, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The environment variable that marks the storm's processes.
const MARK: &str = "STORM_MARK";

/// Live processes (zombies left out) whose environment holds `mark` (`NAME=value`).
fn marked(mark: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            let live = std::fs::read_to_string(e.path().join("stat")).is_ok_and(|stat| {
                // The state follows the command (which may hold spaces) and its `)`.
                stat.rfind(')')
                    .and_then(|at| stat.get(at + 2..at + 3))
                    .is_some_and(|state| state != "Z")
            });
            live && std::fs::read(e.path().join("environ"))
                .is_ok_and(|environ| environ.split(|&b| b == 0).any(|var| var == mark.as_bytes()))
        })
        .count()
}
