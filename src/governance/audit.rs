//! The audit log: one record per call, whatever became of it, kept in the store.
//!
//! Calls hand their record to a writer task over a bounded channel and go on; the task
//! encodes records and commits them in batches, so the store's group commit pays one fsync
//! for many calls. A call's record is therefore durable shortly after the call returns, not
//! before: [`AuditLog::flush`] waits for everything handed over so far. Records are keyed
//! by call id (UUID v7), so the log is in time order; records older than the retention are
//! pruned hourly.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::rules::Action;
use crate::store::{self, Batch, Store, StoreError, Table, codec};

/// Records waiting for the writer before callers wait too.
const QUEUE: usize = 65_536;
/// Records committed in one batch at most.
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
    pub(crate) rule: Arc<str>,
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
            rule: self.rule.to_string(),
            duration_us: self.duration_us,
            outcome: self.outcome,
        }
    }
}

enum Job {
    Record(Entry),
    Flush(oneshot::Sender<Result<(), StoreError>>),
}

/// The writer's handle.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Job>,
    store: Arc<dyn Store>,
}

impl AuditLog {
    /// Starts the writer for `store`, pruning records older than `retention`.
    pub(crate) fn start(store: Arc<dyn Store>, retention: Duration) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_loop(Arc::clone(&store), rx, retention));
        Self { tx, store }
    }

    /// Hands a record to the writer; waits only when the writer is far behind.
    pub(crate) async fn append(&self, entry: Entry) {
        let job = Job::Record(entry);
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(job)) => {
                let _ = self.tx.send(job).await;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Hands a record over without waiting (for a call being dropped), dropping it only if
    /// the writer is far behind.
    pub(crate) fn append_now(&self, entry: Entry) {
        if self.tx.try_send(Job::Record(entry)).is_err() {
            tracing::warn!("audit writer is behind; a cancelled call's record was dropped");
        }
    }

    /// Waits until every record handed over so far is committed.
    ///
    /// # Errors
    /// The store's error if a commit failed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Job::Flush(tx)).await.is_err() {
            return Err(StoreError::Closed);
        }
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

async fn write_loop(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Job>, retention: Duration) {
    let mut jobs = Vec::with_capacity(BATCH);
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut jobs, BATCH) => {
                if n == 0 {
                    return;
                }
            }
            _ = prune.tick() => {
                prune_older_than(&*store, retention).await;
                continue;
            }
        }
        let mut batch = Batch::new();
        let mut waiters = Vec::new();
        for job in jobs.drain(..) {
            match job {
                Job::Record(entry) => {
                    let record = entry.into_record();
                    batch.put(
                        Table::Audit,
                        record.call_id.as_bytes().to_vec(),
                        codec::encode(&record),
                    );
                }
                Job::Flush(tx) => waiters.push(tx),
            }
        }
        if waiters.is_empty() {
            // Nobody waits: let the store group this batch with others and go on.
            if !batch.is_empty() {
                store.submit(
                    batch,
                    Box::new(|result| {
                        if let Err(err) = result {
                            tracing::error!(%err, "audit records could not be written");
                        }
                    }),
                );
            }
        } else {
            // An empty batch is a barrier: it commits after everything submitted before it.
            let result = store::commit(&*store, batch).await;
            for tx in waiters {
                let _ = tx.send(result.clone());
            }
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
