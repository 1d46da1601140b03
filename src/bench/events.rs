//! `guildhall bench events`: how late the event stream reaches a watcher under load, and what
//! watching costs a call.
//!
//! - **Lag.** Calls are made at a steady rate (each gives two events, `invoked` and its end)
//!   while a subscriber takes every event as the JSON lines `guildhall watch` and the
//!   dashboard's stream send. Each `invoked` event is timed from just before its call was
//!   made until the subscriber has it.
//! - **Cost.** The governed call of `bench calls`, with and without two such subscribers
//!   (the dashboard open and `watch` attached), alternating in rounds, against the bare
//!   pipeline call of the same run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::watchers::{dashboard_and_watch, watcher};
use super::{Noop, Number, Stage, batch, median, percentile};
use crate::governance::GovernanceConfig;
use crate::observe::Feed;
use crate::{AgentSpec, CallOptions, Runtime};

/// What `bench events` does.
#[derive(Debug, Clone, Copy)]
pub struct EventsBenchConfig {
    /// Events per second to produce (two per call).
    pub rate: u32,
    /// For how long, in seconds.
    pub secs: f64,
    /// Rounds of the cost measurement.
    pub rounds: usize,
    /// Calls per batch of the cost measurement.
    pub batch: usize,
}

impl Default for EventsBenchConfig {
    fn default() -> Self {
        Self {
            rate: 5_000,
            secs: 3.0,
            rounds: 10,
            batch: 20_000,
        }
    }
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct EventsReport {
    /// Events per second asked for.
    pub rate: u32,
    /// Events per second the watcher took.
    pub delivered_per_sec: f64,
    /// From a call's start to its `invoked` event in the watcher's hands, median, in ms.
    pub lag_p50_ms: f64,
    /// The same, 99th percentile.
    pub lag_p99_ms: f64,
    /// Events the watcher lost by falling behind.
    pub missed: u64,
    /// Baseline: a pipeline call with governance off, in ns (median over rounds).
    pub pipeline_ns: f64,
    /// A governed call (every stage on), nobody watching, in ns.
    pub governed_ns: f64,
    /// The same call while two watchers (the dashboard's stream and `guildhall watch`) take
    /// every event as JSON lines, in ns.
    pub governed_watched_ns: f64,
    /// `governed_ns / pipeline_ns`.
    pub governed_ratio: f64,
    /// `governed_watched_ns / pipeline_ns`.
    pub governed_watched_ratio: f64,
    /// Events the two watchers of the watched calls showed, summed over both.
    pub governed_watched_events: u64,
    /// Events they lost by falling behind, summed over both.
    pub governed_watched_missed: u64,
}

/// Runs both measurements.
///
/// # Panics
/// If a runtime fails to start or a call fails.
pub async fn events(config: EventsBenchConfig, stage: &dyn Stage) -> EventsReport {
    let plain = Runtime::builder()
        .governance(GovernanceConfig::off())
        .tool(Noop::named("noop"))
        .build()
        .await
        .expect("bench runtime starts");
    let plain_noop = plain.handle::<Noop>("noop").expect("noop registered");
    let audit_dir = super::tempfile_in(&std::env::temp_dir());
    let governed_rt = Runtime::builder()
        .data_dir(&audit_dir)
        .governance(super::governed_config())
        .tool(Noop::named("noop"))
        .build()
        .await
        .expect("governed bench runtime starts");
    let agent = governed_rt
        .register_agent(AgentSpec::new("bench-1", "bench"))
        .await
        .expect("bench agent registers");
    let governed = governed_rt.handle::<Noop>("noop").expect("noop registered");

    // The cost: rounds alternate the three calls, the watcher only during its own batch.
    stage.phase("cost", config.rounds as u64);
    let (mut pipe, mut gov, mut watched) = (Vec::new(), Vec::new(), Vec::new());
    let mut seen = super::watchers::Watched::default();
    let mut n = 0u64;
    // Arguments change per call, as a working agent's do: the loop guard trips on none.
    let mut governed_call = || {
        n += 1;
        let call = governed.call_with(Number { n }, CallOptions::new().as_agent(&agent));
        async move {
            std::hint::black_box(call.await.ok());
        }
    };
    for _ in 0..config.rounds {
        pipe.push(
            batch(config.batch, || async {
                std::hint::black_box(plain_noop.call(Number { n: 7 }).await.ok());
            })
            .await,
        );
        gov.push(batch(config.batch, &mut governed_call).await);
        let watching = dashboard_and_watch(&governed_rt);
        watched.push(batch(config.batch, &mut governed_call).await);
        seen += watching.stop().await;
        stage.step();
    }

    // The lag: calls at the asked rate, in 10 ms ticks; the watcher matches each `invoked`
    // event with the start of its call (calls are made one after the other, so in order).
    let starts: Arc<Mutex<VecDeque<Instant>>> = Arc::default();
    let lags: Arc<Mutex<Vec<f64>>> = Arc::default();
    let (task, stop) = {
        let starts = Arc::clone(&starts);
        let lags = Arc::clone(&lags);
        watcher(&Feed::operator(&governed_rt), move |at| {
            let start = starts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front();
            if let Some(start) = start {
                lags.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(at.duration_since(start).as_secs_f64() * 1e3);
            }
        })
    };
    let calls_per_tick = (f64::from(config.rate) / 2.0 / 100.0).ceil().max(1.0) as u64;
    let ticks = (config.secs * 100.0).ceil().max(1.0) as u64;
    stage.phase("lag", ticks);
    let began = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut n = u64::MAX / 2;
    for _ in 0..ticks {
        tick.tick().await;
        for _ in 0..calls_per_tick {
            n += 1;
            starts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push_back(Instant::now());
            governed
                .call_with(Number { n }, CallOptions::new().as_agent(&agent))
                .await
                .expect("bench call succeeds");
        }
        stage.step();
    }
    // The last events reach the watcher: wait for them (bounded).
    let expected = calls_per_tick * ticks;
    for _ in 0..500 {
        if lags.lock().unwrap_or_else(PoisonError::into_inner).len() as u64 >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = began.elapsed().as_secs_f64();
    drop(stop);
    let super::watchers::Watched { taken, missed } = task.await.unwrap_or_default();
    plain.shutdown().await;
    governed_rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&audit_dir);

    let mut lags = std::mem::take(&mut *lags.lock().unwrap_or_else(PoisonError::into_inner));
    lags.sort_by(f64::total_cmp);
    let pipeline_ns = median(&mut pipe);
    let governed_ns = median(&mut gov);
    let governed_watched_ns = median(&mut watched);
    EventsReport {
        rate: config.rate,
        delivered_per_sec: taken as f64 / elapsed,
        lag_p50_ms: percentile(&lags, 0.50),
        lag_p99_ms: percentile(&lags, 0.99),
        missed,
        pipeline_ns,
        governed_ns,
        governed_watched_ns,
        governed_ratio: governed_ns / pipeline_ns,
        governed_watched_ratio: governed_watched_ns / pipeline_ns,
        governed_watched_events: seen.taken,
        governed_watched_missed: seen.missed,
    }
}
