//! The audit log: one record per call, whatever became of it, kept in the store.
//!
//! Calls push their record onto a shared buffer and go on, waking nobody; a writer task
//! drains the buffer every 10 ms (sooner when it fills), encodes the records and commits
//! them as one batch, so the store's group commit pays one fsync for many calls. A call's
//! record is therefore durable shortly after the call returns, not before:
//! [`AuditLog::flush`] waits for everything handed over so far. Records are keyed
//! by call id (UUID v7), so the log is in time order; records older than the retention are
//! pruned hourly.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::rules::Action;
use crate::store::{self, Batch, Store, StoreError, Table, codec};

/// Records waiting for the writer before it is woken early, and (at twice this) before
/// callers wait for it.
const QUEUE: usize = 32_768;
/// How often the writer drains the buffer.
const CADENCE: Duration = Duration::from_millis(10);
/// Records pruned in one batch at most.
const BATCH: usize = 4096;
/// How often old records are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It returned a result.
    Ok,
    /// The tool returned its own error.
    ToolError,
    /// The arguments did not fit the tool's schema; it did not run.
    InvalidArguments,
    /// The tool crashed handling it.
    Crashed,
    /// It passed its deadline.
    Timeout,
    /// Governance refused it.
    Denied,
    /// The tool's circuit was open.
    CircuitOpen,
    /// A rate limit refused it.
    RateLimited,
    /// The tool was unavailable (shutting down), or its output could not be encoded.
    Unavailable,
    /// The caller went away before it finished.
    Cancelled,
}

impl Outcome {
    /// The outcome's name (`ok`, `tool_error`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ToolError => "tool_error",
            Self::InvalidArguments => "invalid_arguments",
            Self::Crashed => "crashed",
            Self::Timeout => "timeout",
            Self::Denied => "denied",
            Self::CircuitOpen => "circuit_open",
            Self::RateLimited => "rate_limited",
            Self::Unavailable => "unavailable",
            Self::Cancelled => "cancelled",
        }
    }

    /// The outcome of a failed call.
    pub fn of(err: &guildhall_actors::CallError) -> Self {
        use guildhall_actors::CallError as E;
        match err {
            E::Tool { .. } => Self::ToolError,
            E::InvalidArguments { .. } | E::UnknownTool { .. } => Self::InvalidArguments,
            E::Crashed { .. } => Self::Crashed,
            E::Timeout { .. } => Self::Timeout,
            E::Denied { .. } => Self::Denied,
            E::CircuitOpen { .. } => Self::CircuitOpen,
            E::RateLimited { .. } => Self::RateLimited,
            _ => Self::Unavailable,
        }
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        serde_json::from_value(serde_json::Value::from(s)).map_err(|_| {
            format!(
                "unknown outcome `{s}`; one of ok, tool_error, invalid_arguments, crashed, timeout, denied, circuit_open, rate_limited, unavailable, cancelled"
            )
        })
    }
}

/// One call, as the audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// The call's id (UUID v7: its first 48 bits are the start time in ms).
    pub call_id: Uuid,
    /// When it started, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The caller, if named.
    pub agent: Option<String>,
    /// The session, if any.
    pub session: Option<String>,
    /// The tool.
    pub tool: String,
    /// A digest (XXH3-64, hex) of the canonical JSON arguments: equal arguments, equal
    /// digests; the arguments themselves are not kept.
    pub args_digest: String,
    /// The permission decision the call got (`allow`, or `deny`; an `ask` ends as one of
    /// those and the rule says who answered).
    pub decision: Action,
    /// The rule, hook, guard or limit behind the decision.
    pub rule: String,
    /// How long the call took, in microseconds.
    pub duration_us: u64,
    /// How it ended.
    pub outcome: Outcome,
}

/// Which records to list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditQuery {
    /// Only this agent's calls.
    pub agent: Option<String>,
    /// Only calls to tools matching this glob.
    pub tool: Option<super::Glob>,
    /// Only calls that ended so.
    pub outcome: Option<Outcome>,
    /// Only calls started at or after this time (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Only calls started before this time (ms since the epoch).
    pub until_ms: Option<u64>,
    /// The most recent this many (all when `None`).
    pub limit: Option<usize>,
}

/// A record as a call hands it over: shared strings, encoded later by the writer.
pub(crate) struct Entry {
    pub(crate) call_id: Uuid,
    pub(crate) agent: Option<Arc<str>>,
    pub(crate) session: Option<Arc<str>>,
    pub(crate) tool: Arc<str>,
    pub(crate) digest: u64,
    pub(crate) decision: Action,
    pub(crate) rule: Option<Arc<str>>,
    pub(crate) duration_us: u64,
    pub(crate) outcome: Outcome,
}

impl Entry {
    fn into_record(self) -> AuditRecord {
        let at_ms = self.call_id.get_timestamp().map_or(0, |t| {
            let (secs, nanos) = t.to_unix();
            secs * 1000 + u64::from(nanos) / 1_000_000
        });
        AuditRecord {
            call_id: self.call_id,
            at_ms,
            agent: self.agent.map(|a| a.to_string()),
            session: self.session.map(|s| s.to_string()),
            tool: self.tool.to_string(),
            args_digest: format!("{:016x}", self.digest),
            decision: self.decision,
            rule: self.rule.map(|r| r.to_string()).unwrap_or_default(),
            duration_us: self.duration_us,
            outcome: self.outcome,
        }
    }
}

/// What callers and the writer share.
struct Shared {
    buffer: std::sync::Mutex<Vec<Entry>>,
    /// Wakes the writer before its next tick (a full buffer, a flush, shutdown).
    wake: Arc<tokio::sync::Notify>,
    /// Wakes callers waiting for room.
    drained: tokio::sync::Notify,
    /// Flushes waiting for the next commit.
    flushes: std::sync::Mutex<Vec<oneshot::Sender<Result<(), StoreError>>>>,
}

/// The writer's handle.
#[derive(Clone)]
pub struct AuditLog {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
}

impl AuditLog {
    /// Starts the writer for `store`, pruning records older than `retention`. The writer
    /// stops once every handle is gone, after writing what is left.
    pub(crate) fn start(store: Arc<dyn Store>, retention: Duration) -> Self {
        let shared = Arc::new(Shared {
            buffer: std::sync::Mutex::new(Vec::with_capacity(1024)),
            wake: Arc::default(),
            drained: tokio::sync::Notify::new(),
            flushes: std::sync::Mutex::default(),
        });
        tokio::spawn(write_loop(
            Arc::clone(&store),
            Arc::downgrade(&shared),
            Arc::clone(&shared.wake),
            retention,
        ));
        Self { shared, store }
    }

    /// Pushes a record; waits only when the writer is far behind.
    pub(crate) async fn append(&self, entry: Entry) {
        let mut entry = Some(entry);
        loop {
            let drained = self.shared.drained.notified();
            let len = {
                let mut buffer = self
                    .shared
                    .buffer
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if buffer.len() < 2 * QUEUE {
                    buffer.extend(entry.take());
                    buffer.len()
                } else {
                    0
                }
            };
            if len == QUEUE {
                self.shared.wake.notify_one();
            }
            if len > 0 {
                return;
            }
            self.shared.wake.notify_one();
            drained.await;
        }
    }

    /// Pushes a record without waiting (for a call being dropped).
    pub(crate) fn append_now(&self, entry: Entry) {
        self.shared
            .buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(entry);
    }

    /// Waits until every record pushed so far is committed.
    ///
    /// # Errors
    /// The store's error if a commit failed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .flushes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(tx);
        self.shared.wake.notify_one();
        rx.await.unwrap_or(Err(StoreError::Closed))
    }

    /// The records `query` selects, oldest first. Records still on their way to the store
    /// are not included: [`flush`](Self::flush) first to see every finished call.
    ///
    /// # Errors
    /// A store read or decode error.
    pub fn query(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        self::query(&*self.store, query)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The writer holds only a weak handle: let it notice and write what is left.
        self.wake.notify_one();
    }
}

/// The records `query` selects from `store`'s audit log, oldest first.
///
/// # Errors
/// A store read or decode error.
pub fn query(store: &dyn Store, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
    let start = query.since_ms.map(time_key).unwrap_or_default();
    let until = query.until_ms.map(time_key);
    let mut found = std::collections::VecDeque::new();
    store::scan_values_from(store, Table::Audit, &[], &start, |key, r: AuditRecord| {
        if until.as_ref().is_some_and(|u| key >= u.as_slice()) {
            return false;
        }
        let wanted = query
            .agent
            .as_ref()
            .is_none_or(|a| r.agent.as_ref() == Some(a))
            && query.tool.as_ref().is_none_or(|t| t.matches(&r.tool))
            && query.outcome.is_none_or(|o| r.outcome == o);
        if wanted {
            found.push_back(r);
            if query.limit.is_some_and(|l| found.len() > l) {
                found.pop_front();
            }
        }
        true
    })?;
    Ok(found.into())
}

/// The smallest key of a call started at `ms`: a UUID v7's first 48 bits.
fn time_key(ms: u64) -> Vec<u8> {
    let mut key = vec![0; 16];
    key[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    key
}

async fn write_loop(
    store: Arc<dyn Store>,
    shared: std::sync::Weak<Shared>,
    wake: Arc<tokio::sync::Notify>,
    retention: Duration,
) {
    let mut tick = tokio::time::interval(CADENCE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_prune = tokio::time::Instant::now();
    let _ = prune_older_than(&*store, retention).await;
    loop {
        let Some(live) = shared.upgrade() else {
            return;
        };
        {
            let woken = wake.notified();
            tokio::pin!(woken);
            // Registered before the check, so a wake between the two is not lost.
            woken.as_mut().enable();
            let idle = live
                .buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_empty()
                && live
                    .flushes
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .is_empty();
            if idle {
                // Hold no strong handle while asleep, so dropping the log ends the loop.
                drop(live);
                tokio::select! {
                    () = &mut woken => {}
                    _ = tick.tick() => {}
                }
                continue;
            }
        }
        let entries = std::mem::take(
            &mut *live
                .buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let waiters = std::mem::take(
            &mut *live
                .flushes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        live.drained.notify_waiters();
        drop(live);
        let mut batch = Batch::new();
        for entry in entries {
            let record = entry.into_record();
            batch.put(
                Table::Audit,
                record.call_id.as_bytes().to_vec(),
                codec::encode(&record),
            );
        }
        if waiters.is_empty() {
            // Nobody waits: let the store group this batch with others and go on.
            store.submit(
                batch,
                Box::new(|result| {
                    if let Err(err) = result {
                        tracing::error!(%err, "audit records could not be written");
                    }
                }),
            );
        } else {
            // An empty batch is a barrier: it commits after everything submitted before it.
            let result = store::commit(&*store, batch).await;
            for tx in waiters {
                let _ = tx.send(result.clone());
            }
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = tokio::time::Instant::now();
            prune_older_than(&*store, retention).await;
        }
    }
}

async fn prune_older_than(store: &dyn Store, retention: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let Some(cutoff) = now.checked_sub(retention) else {
        return;
    };
    let cutoff = time_key(u64::try_from(cutoff.as_millis()).unwrap_or(u64::MAX));
    loop {
        let mut batch = Batch::new();
        let scanned = store.scan(Table::Audit, &[], &mut |key, _| {
            if key >= cutoff.as_slice() || batch.len() >= BATCH {
                return false;
            }
            batch.delete(Table::Audit, key.to_vec());
            true
        });
        if let Err(err) = scanned {
            tracing::warn!(%err, "audit pruning could not read the log");
            return;
        }
        let full = batch.len() >= BATCH;
        if batch.is_empty() {
            return;
        }
        if let Err(err) = store::commit(store, batch).await {
            tracing::warn!(%err, "audit pruning could not delete old records");
            return;
        }
        if !full {
            return;
        }
    }
}
