//! The measurements behind `guildhall bench context`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use serde_json::{Value, json};

use super::{Stage, median};
use crate::Runtime;
use crate::context::log::{self, Snapshot};
use crate::context::{
    Change, ContextConfig, ContextLimits, LoggedBatch, SessionContext, SessionSpec, Strategy,
};
use crate::store::{self, Batch, Table, codec};

/// Settings of `guildhall bench context`.
#[derive(Debug, Clone, Copy)]
pub struct ContextBenchConfig {
    /// Sessions written at once.
    pub sessions: usize,
    /// Writers per session, each updating one entry at a time.
    pub writers: usize,
    /// Updates each writer makes per round, in memory.
    pub updates: usize,
    /// Bytes of each entry's value.
    pub value_bytes: usize,
    /// Distinct keys per session.
    pub keys: usize,
    /// Measurement rounds; figures are medians.
    pub rounds: usize,
    /// Durable updates each writer makes per round.
    pub durable_updates: usize,
    /// Operations in the session whose recovery is timed.
    pub recovery_ops: u64,
}

impl Default for ContextBenchConfig {
    fn default() -> Self {
        Self {
            sessions: 64,
            writers: 4,
            updates: 1_000,
            value_bytes: 1_024,
            keys: 100,
            rounds: 3,
            durable_updates: 100,
            recovery_ops: 1_000_000,
        }
    }
}

/// What `guildhall bench context` measured (medians over rounds).
#[derive(Debug, Clone, Serialize)]
pub struct ContextReport {
    /// Replace updates of 1 KB entries, in memory, each acknowledged.
    pub inmem_updates_per_sec: f64,
    /// Baseline: bare ractor actors holding a map, at the same concurrency.
    pub raw_ractor_updates_per_sec: f64,
    /// `raw_ractor_updates_per_sec / inmem_updates_per_sec`.
    pub inmem_slowdown: f64,
    /// Durable updates acknowledged per second (each committed and synced).
    pub durable_updates_per_sec: f64,
    /// Group commits (one fsync each) per second during the durable run.
    pub fsyncs_per_sec: f64,
    /// Updates per group commit, on average.
    pub updates_per_fsync: f64,
    /// Operations in the recovered session.
    pub recovery_ops: u64,
    /// Opening the store and the session of `recovery_ops` operations until it answers, as a
    /// restart does: the latest snapshot plus the log after it.
    pub recovery_secs_1m: f64,
    /// The same with no snapshot: every operation replayed from the log.
    pub replay_secs_1m: f64,
}

fn value_of(bytes: usize) -> Value {
    Value::String("x".repeat(bytes.saturating_sub(2)))
}

/// Updates per second, and store commits per second while they ran.
struct Rates {
    updates: f64,
    commits: f64,
}

/// Every writer of every session replaces random keys with a value of the configured size.
async fn updates(
    rt: &Runtime,
    config: &ContextBenchConfig,
    round: usize,
    per_writer: usize,
) -> Rates {
    let value = value_of(config.value_bytes);
    let keys: Arc<Vec<String>> = Arc::new((0..config.keys).map(|k| format!("key-{k}")).collect());
    let mut contexts = Vec::with_capacity(config.sessions);
    for s in 0..config.sessions {
        let ctx = rt
            .sessions()
            .open(&format!("r{round}-s{s}"), None)
            .await
            .expect("bench session opens");
        // Started before the clock: activation is measured elsewhere.
        ctx.version().await.expect("bench session loads");
        contexts.push(ctx);
    }
    let before = rt.store().stats().commits;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(config.sessions * config.writers);
    for (s, ctx) in contexts.iter().enumerate() {
        for w in 0..config.writers {
            let ctx = ctx.clone();
            let keys = Arc::clone(&keys);
            let value = value.clone();
            let mut rng = fastrand::Rng::with_seed((round * 1_000_000 + s * 1_000 + w) as u64);
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_writer {
                    let key = keys[rng.usize(..keys.len())].clone();
                    ctx.update(vec![Change::new(key, Strategy::Replace, value.clone())])
                        .await
                        .expect("bench update succeeds");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("writer finishes");
    }
    let secs = start.elapsed().as_secs_f64();
    let rates = Rates {
        updates: (config.sessions * config.writers * per_writer) as f64 / secs,
        commits: (rt.store().stats().commits - before) as f64 / secs,
    };
    for s in 0..config.sessions {
        rt.sessions()
            .delete(&format!("r{round}-s{s}"))
            .await
            .expect("bench session deletes");
    }
    rates
}

/// A bare actor holding a session's entries in a map.
struct RawSession;

type RawUpdate = (String, Value, RpcReplyPort<u64>);

impl Actor for RawSession {
    type Msg = RawUpdate;
    type State = (HashMap<String, Value>, u64);
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<RawUpdate>,
        (): (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok((HashMap::new(), 0))
    }

    async fn handle(
        &self,
        _: ActorRef<RawUpdate>,
        (key, value, reply): RawUpdate,
        (map, version): &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        map.insert(key, value);
        *version += 1;
        let _ = reply.send(*version);
        Ok(())
    }
}

/// The same traffic to bare ractor actors.
async fn raw_updates(config: &ContextBenchConfig, round: usize) -> f64 {
    let value = value_of(config.value_bytes);
    let keys: Arc<Vec<String>> = Arc::new((0..config.keys).map(|k| format!("key-{k}")).collect());
    let (mut actors, mut handles) = (Vec::new(), Vec::new());
    for _ in 0..config.sessions {
        let (actor, handle) = Actor::spawn(None, RawSession, ()).await.expect("raw actor");
        actors.push(actor);
        handles.push(handle);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (s, actor) in actors.iter().enumerate() {
        for w in 0..config.writers {
            let actor = actor.clone();
            let keys = Arc::clone(&keys);
            let value = value.clone();
            let per_writer = config.updates;
            let mut rng = fastrand::Rng::with_seed((round * 1_000_000 + s * 1_000 + w) as u64);
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_writer {
                    let key = keys[rng.usize(..keys.len())].clone();
                    let value = value.clone();
                    ractor::call!(actor, |reply| (key, value, reply)).expect("raw update");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("raw writer finishes");
    }
    let rate =
        (config.sessions * config.writers * config.updates) as f64 / start.elapsed().as_secs_f64();
    super::stop_all(&actors, handles).await;
    rate
}

/// Writes a session of `ops` operations into the store of `rt` as the context actor would
/// have: the log, and a snapshot every `snapshot_every` (only the latest kept). Returns the
/// session's expected final state.
async fn write_long_session(
    rt: &Runtime,
    ops: u64,
    snapshot_every: u64,
    stage: &dyn Stage,
) -> SessionContext {
    let session = rt
        .sessions()
        .create(SessionSpec::new("recovery"))
        .await
        .expect("recovery session is created");
    let store = rt.store();
    let mut ctx = SessionContext::new();
    let mut batch = Batch::new();
    let mut previous_snapshot = None;
    let chunk = (ops / 20).max(1);
    for i in 0..ops {
        let key = format!("k{}", i % 1_000);
        let change = if i % 2 == 0 {
            Change::new(
                key,
                Strategy::Replace,
                json!({"n": i, "note": "replaced by the bench"}),
            )
        } else {
            Change::new(key, Strategy::Merge, json!({"m": i}))
        };
        let changes = vec![change];
        let applied = ctx
            .apply(
                &changes,
                None,
                1_700_000_000_000 + i,
                &ContextLimits::UNLIMITED,
            )
            .expect("bench batch applies");
        let logged = LoggedBatch {
            version: applied.version,
            at_ms: 1_700_000_000_000 + i,
            author: None,
            changes,
            versions: applied
                .changes
                .iter()
                .map(|c| [c.before, c.after])
                .collect(),
        };
        batch.put(
            Table::ContextLog,
            log::key(&session.id, applied.version),
            codec::encode(&logged),
        );
        // Snapshots fall so that the last one is `snapshot_every - 1` operations before the
        // end: recovery replays the longest tail it can meet.
        if (ops - applied.version) % snapshot_every == snapshot_every - 1 {
            if let Some(previous) = previous_snapshot.replace(applied.version) {
                batch.delete(Table::ContextSnapshots, log::key(&session.id, previous));
            }
            let snapshot = Snapshot {
                version: applied.version,
                at_ms: logged.at_ms,
                base: 0,
                entries: ctx.entries().cloned().collect(),
            };
            batch.put(
                Table::ContextSnapshots,
                log::key(&session.id, applied.version),
                codec::encode(&snapshot),
            );
        }
        if (i + 1) % chunk == 0 || i + 1 == ops {
            store::commit(&*store, std::mem::take(&mut batch))
                .await
                .expect("bench log commits");
            stage.step();
        }
    }
    ctx
}

/// Opens the runtime in `dir` and times it until the session answers with `expected`'s
/// version.
async fn time_recovery(dir: &Path, config: &ContextConfig, expected: &SessionContext) -> f64 {
    let start = Instant::now();
    let rt = Runtime::builder()
        .data_dir(dir)
        .context_config(config.clone())
        .build()
        .await
        .expect("runtime reopens");
    let ctx = rt.sessions().context("recovery").expect("session is there");
    let version = ctx.version().await.expect("session recovers");
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(version, expected.version(), "recovered to the last version");
    let view = ctx
        .read(crate::context::Select::All, usize::MAX)
        .await
        .expect("recovered session reads");
    assert!(
        view.entries.iter().eq(expected.entries()),
        "recovered entries are the written ones"
    );
    rt.shutdown().await;
    secs
}

/// Runs every measurement of `guildhall bench context`; the durable store goes in `dir`.
///
/// # Panics
/// If a runtime fails to start or an update fails.
pub async fn context(config: ContextBenchConfig, dir: &Path, stage: &dyn Stage) -> ContextReport {
    let rounds = config.rounds.max(1);
    let rt = Runtime::builder().build().await.expect("runtime starts");
    stage.phase("in memory", rounds as u64);
    let (mut inmem, mut raw) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        raw.push(raw_updates(&config, r).await);
        inmem.push(updates(&rt, &config, r, config.updates).await.updates);
        stage.step();
    }
    rt.shutdown().await;

    stage.phase("durable", rounds as u64);
    let durable_dir = super::tempfile_in(dir);
    let rt = Runtime::builder()
        .data_dir(&durable_dir)
        .build()
        .await
        .expect("durable runtime starts");
    let (mut durable, mut fsyncs, mut per_fsync) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let rates = updates(&rt, &config, r, config.durable_updates).await;
        durable.push(rates.updates);
        fsyncs.push(rates.commits);
        per_fsync.push(rates.updates / rates.commits.max(f64::MIN_POSITIVE));
        stage.step();
    }
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&durable_dir);

    let recovery_dir = super::tempfile_in(dir);
    let context_config = ContextConfig::default();
    stage.phase("write 1M ops", 20);
    let rt = Runtime::builder()
        .data_dir(&recovery_dir)
        .build()
        .await
        .expect("recovery runtime starts");
    let expected = write_long_session(
        &rt,
        config.recovery_ops,
        context_config.snapshot_every,
        stage,
    )
    .await;
    rt.shutdown().await;
    stage.phase("recover", 2);
    let recovery = time_recovery(&recovery_dir, &context_config, &expected).await;
    stage.step();
    // Again without snapshots: the whole log replays.
    {
        let store = store::open(&recovery_dir).expect("store reopens");
        let mut batch = Batch::new();
        store::delete_prefix(&*store, Table::ContextSnapshots, b"", &mut batch)
            .expect("snapshots listed");
        store::commit(&*store, batch)
            .await
            .expect("snapshots deleted");
        store.close();
    }
    let replay = time_recovery(&recovery_dir, &context_config, &expected).await;
    stage.step();
    let _ = std::fs::remove_dir_all(&recovery_dir);

    let inmem = median(&mut inmem);
    let raw = median(&mut raw);
    ContextReport {
        inmem_updates_per_sec: inmem,
        raw_ractor_updates_per_sec: raw,
        inmem_slowdown: raw / inmem,
        durable_updates_per_sec: median(&mut durable),
        fsyncs_per_sec: median(&mut fsyncs),
        updates_per_fsync: median(&mut per_fsync),
        recovery_ops: config.recovery_ops,
        recovery_secs_1m: recovery,
        replay_secs_1m: replay,
    }
}
