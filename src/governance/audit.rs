//! The audit log: one record per call, whatever became of it, kept in the store.
//!
//! Calls push their record onto a shared buffer and go on, waking nobody; a writer task
//! drains the buffer every 25 ms (sooner when it fills), encodes the records and commits
//! them as one batch, so the store's group commit pays one fsync for many calls. A call's
//! record is therefore durable shortly after the call returns, not before:
//! [`AuditLog::flush`] waits for everything handed over so far.
//!
//! The records of one drain are stored together, in the order their calls ended, as
//! blocks of at most [`BLOCK`] records, each keyed by the newest call id in it: one
//! store write per block instead of one per call, which is most of the writer's cost.
//! A block keeps each agent, session, tool and rule it mentions once ([`IndexedBlock`]):
//! a record is about 36 bytes instead of about 100, and what the writer costs a call is
//! mostly the bytes the store copies, checksums and syncs.
//! A block's key is at least every id in it, so the blocks that can hold calls started at
//! or after a time are those keyed at or after it. Blocks older than the retention are
//! pruned hourly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::rules::Action;
use crate::store::{self, Batch, Store, StoreError, Table, codec};

/// Records waiting for the writer before it is woken early, and (at twice this) before
/// new calls wait for it.
const QUEUE: usize = 32_768;
/// How often the writer drains the buffer. Each drain is a commit of its own, whose two
/// fsyncs and page writes cost the store about as much as the records in it under load
/// (at 10 ms, about half the store thread's time went to commits, not records).
const CADENCE: Duration = Duration::from_millis(25);

/// Records the writer's spare buffer keeps room for between drains (under 1 MiB). A server
/// at the bench's rate makes about 12,500 in one [`CADENCE`]: such a drain regrows the buffer
/// once, and the room past this bound is given back, so an idle writer holds little.
const KEPT_CAPACITY: usize = 8_192;
/// Records stored under one key at most.
const BLOCK: usize = 512;
/// The byte after a block's call id in its key: an [`IndexedBlock`]. Logs written before
/// 2026-11-27 hold blocks of whole [`AuditRecord`]s, marked [`FULL_BLOCK_MARK`], and from
/// before blocks, one record per key: a bare 16-byte call id. Every form is read.
const BLOCK_MARK: u8 = b'i';
/// The mark of a block of whole records, written before indexed blocks.
const FULL_BLOCK_MARK: u8 = b'b';
/// Keys pruned in one batch at most.
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
    /// Every outcome in declaration order, which is the order of their codes in an
    /// [`IndexedBlock`]: a new outcome goes last.
    const ALL: [Self; 10] = [
        Self::Ok,
        Self::ToolError,
        Self::InvalidArguments,
        Self::Crashed,
        Self::Timeout,
        Self::Denied,
        Self::CircuitOpen,
        Self::RateLimited,
        Self::Unavailable,
        Self::Cancelled,
    ];

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
    /// A digest (XXH3-64, hex) of the arguments' canonical form (MessagePack, fields by
    /// name): equal arguments, equal digests; the arguments themselves are not kept.
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
    /// The span it was called within (16 hex digits), when it was called within one: a
    /// composite's step, a call made while another ran. A call's own span id is its call
    /// id's last eight bytes, so a timeline nests calls by this.
    #[serde(default)]
    pub parent: Option<String>,
    /// What its tool said when it crashed, timed out or was unavailable (at most
    /// [`CAUSE_BYTES`]): why a restart or an opened breaker followed. Other failures keep no
    /// text: a tool's own error may quote what it was given.
    #[serde(default)]
    pub cause: Option<String>,
}

/// The longest cause kept with an audit record, in bytes.
pub const CAUSE_BYTES: usize = 512;

/// The cause an audit record keeps of `err`: its text when the tool crashed, timed out or
/// was unavailable, cut at [`CAUSE_BYTES`].
pub(crate) fn cause_of(err: &guildhall_actors::CallError) -> Option<Box<str>> {
    if !matches!(
        Outcome::of(err),
        Outcome::Crashed | Outcome::Timeout | Outcome::Unavailable
    ) {
        return None;
    }
    let mut text = err.to_string();
    if text.len() > CAUSE_BYTES {
        let mut end = CAUSE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    Some(text.into_boxed_str())
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
    /// The parent span's id (0: none).
    pub(crate) parent: u64,
    /// See [`AuditRecord::cause`].
    pub(crate) cause: Option<Box<str>>,
}

/// A block of records as stored: every distinct string once, in `strings`, and records
/// that point into it. Read through serde; written by [`encode_block`].
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct IndexedBlock {
    strings: Vec<String>,
    records: Vec<IndexedRecord>,
}

/// An [`AuditRecord`] in an [`IndexedBlock`]: strings as 1-based indices into the block's
/// strings (0: none), the digest as a number, the decision and outcome as codes, and no
/// start time (the call id holds it).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct IndexedRecord {
    call_id: Uuid,
    agent: u32,
    session: u32,
    tool: u32,
    digest: u64,
    decision: u8,
    rule: u32,
    duration_us: u64,
    outcome: u8,
    /// Absent from records written before 2026-12-07, as the next.
    #[serde(default)]
    parent: u64,
    #[serde(default)]
    cause: u32,
}

/// The strings of a block being written, each once.
#[derive(Default)]
struct Strings<'a> {
    list: Vec<&'a str>,
    index: rustc_hash::FxHashMap<&'a str, u32>,
    /// The string last looked up in each field (address, length) and its index: the
    /// records of one block mostly repeat their neighbours' tool, agent and rule, found
    /// here without hashing them. The entries borrowed are alive, so an address is theirs.
    last: [(usize, usize, u32); 5],
}

impl<'a> Strings<'a> {
    /// `text`'s 1-based index, added if new; 0 for none. `field` picks the one-entry cache.
    fn index(&mut self, field: usize, text: Option<&'a str>) -> u32 {
        let Some(text) = text else {
            return 0;
        };
        let (address, len) = (text.as_ptr() as usize, text.len());
        if let (a, l, index @ 1..) = self.last[field]
            && (a, l) == (address, len)
        {
            return index;
        }
        let list = &mut self.list;
        let index = *self.index.entry(text).or_insert_with(|| {
            list.push(text);
            u32::try_from(list.len()).unwrap_or(u32::MAX)
        });
        self.last[field] = (address, len, index);
        index
    }
}

/// Encodes `entries` as one [`IndexedBlock`], in the value format [`codec::decode`] reads.
/// Written with `rmp` directly: through serde it cost the writer 2.7 times the instructions.
fn encode_block(entries: &[Entry]) -> Vec<u8> {
    use rmp::encode::{write_array_len, write_bin, write_str, write_uint};
    let mut strings = Strings::default();
    // Most records take 35 to 43 bytes; the Vec grows for the rest.
    let mut records = Vec::with_capacity(entries.len() * 44);
    for e in entries {
        // Writing to a Vec cannot fail.
        let _ = write_array_len(&mut records, 11);
        let _ = write_bin(&mut records, e.call_id.as_bytes());
        for field in [
            strings.index(0, e.agent.as_deref()),
            strings.index(1, e.session.as_deref()),
            strings.index(2, Some(&e.tool)),
        ] {
            let _ = write_uint(&mut records, u64::from(field));
        }
        let _ = write_uint(&mut records, e.digest);
        let _ = write_uint(&mut records, e.decision as u64);
        let _ = write_uint(&mut records, u64::from(strings.index(3, e.rule.as_deref())));
        let _ = write_uint(&mut records, e.duration_us);
        let _ = write_uint(&mut records, e.outcome as u64);
        let _ = write_uint(&mut records, e.parent);
        let _ = write_uint(
            &mut records,
            u64::from(strings.index(4, e.cause.as_deref())),
        );
    }
    let text: usize = strings.list.iter().map(|s| s.len() + 5).sum();
    let mut value = Vec::with_capacity(16 + text + records.len());
    value.push(codec::VALUE_FORMAT);
    let _ = write_array_len(&mut value, 2);
    let _ = write_array_len(
        &mut value,
        u32::try_from(strings.list.len()).unwrap_or(u32::MAX),
    );
    for s in &strings.list {
        let _ = write_str(&mut value, s);
    }
    let _ = write_array_len(&mut value, u32::try_from(entries.len()).unwrap_or(u32::MAX));
    value.extend_from_slice(&records);
    value
}

/// Decodes an [`IndexedBlock`] into whole records.
fn decode_block(value: &[u8]) -> Result<Vec<AuditRecord>, StoreError> {
    let block: IndexedBlock = codec::decode(Table::Audit, value)?;
    let bad = |reason: String| StoreError::Decode {
        table: Table::Audit.name(),
        reason,
    };
    let string = |index: u32| -> Result<Option<String>, StoreError> {
        match index {
            0 => Ok(None),
            i => block
                .strings
                .get(i as usize - 1)
                .cloned()
                .map(Some)
                .ok_or_else(|| {
                    bad(format!(
                        "an audit record names string {i} of a block that has {}",
                        block.strings.len()
                    ))
                }),
        }
    };
    block
        .records
        .iter()
        .map(|r| {
            Ok(AuditRecord {
                call_id: r.call_id,
                at_ms: start_ms(r.call_id),
                agent: string(r.agent)?,
                session: string(r.session)?,
                tool: string(r.tool)?.ok_or_else(|| bad("an audit record names no tool".into()))?,
                args_digest: format!("{:016x}", r.digest),
                decision: by_code(&Action::ALL, r.decision, "decision")?,
                rule: string(r.rule)?.unwrap_or_default(),
                duration_us: r.duration_us,
                outcome: by_code(&Outcome::ALL, r.outcome, "outcome")?,
                parent: (r.parent != 0).then(|| format!("{:016x}", r.parent)),
                cause: string(r.cause)?,
            })
        })
        .collect()
}

/// The value of a `what` stored as its `code`: its position in `all`.
fn by_code<T: Copy>(all: &[T], code: u8, what: &str) -> Result<T, StoreError> {
    all.get(usize::from(code))
        .copied()
        .ok_or_else(|| StoreError::Decode {
            table: Table::Audit.name(),
            reason: format!("unknown audit {what} code {code}"),
        })
}

/// A UUID v7's start time in ms since the Unix epoch.
fn start_ms(id: Uuid) -> u64 {
    id.get_timestamp().map_or(0, |t| {
        let (secs, nanos) = t.to_unix();
        secs * 1000 + u64::from(nanos) / 1_000_000
    })
}

/// Adds `entries` to `batch` as blocks, each keyed by the newest call id in it.
fn put_blocks(batch: &mut Batch, entries: &[Entry]) {
    // Not sorted: ids within one millisecond are random (UUID v7), so sorting a drain of
    // thousands cost the writer more than encoding it, and nothing needs the order. A
    // block keyed by its newest id is found by every scan from a time at or before any
    // record in it, and a query sorts what it found.
    for block in entries.chunks(BLOCK) {
        let Some(newest) = block.iter().map(|e| e.call_id).max() else {
            continue;
        };
        let mut key = Vec::with_capacity(17);
        key.extend_from_slice(newest.as_bytes());
        key.push(BLOCK_MARK);
        batch.put(Table::Audit, key, encode_block(block));
    }
}

/// The records stored under one key: a block, or a lone record from before blocks.
fn decode_stored(key: &[u8], value: &[u8]) -> Result<Vec<AuditRecord>, StoreError> {
    match key {
        [.., FULL_BLOCK_MARK] if key.len() == 17 => codec::decode(Table::Audit, value),
        [.., BLOCK_MARK] if key.len() == 17 => decode_block(value),
        _ => codec::decode(Table::Audit, value).map(|r| vec![r]),
    }
}

/// What callers and the writer share.
struct Shared {
    buffer: std::sync::Mutex<Vec<Entry>>,
    /// Wakes the writer before its next tick (a full buffer, a flush, shutdown).
    wake: Arc<tokio::sync::Notify>,
    /// Set while the buffer holds too many records: new calls wait for [`AuditLog::room`].
    full: AtomicBool,
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
            full: AtomicBool::new(false),
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

    /// Whether a call may start without waiting for the writer (its buffer is not full).
    pub(crate) fn has_room(&self) -> bool {
        !self.shared.full.load(Ordering::Acquire)
    }

    /// Waits while the writer is far behind (a full buffer); calls wait here before they
    /// start, so a record is never held back once its call is done.
    pub(crate) async fn room(&self) {
        while self.shared.full.load(Ordering::Acquire) {
            // Registered before the second look, so a drain in between is not missed.
            let drained = self.shared.drained.notified();
            if !self.shared.full.load(Ordering::Acquire) {
                return;
            }
            self.shared.wake.notify_one();
            drained.await;
        }
    }

    /// Hands a record to the writer; wakes it early when the buffer fills.
    pub(crate) fn append(&self, entry: Entry) {
        let len = {
            let mut buffer = self
                .shared
                .buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            buffer.push(entry);
            buffer.len()
        };
        if len == QUEUE {
            self.shared.wake.notify_one();
        } else if len == 2 * QUEUE {
            self.shared.full.store(true, Ordering::Release);
        }
    }

    /// Waits until every record pushed so far is committed.
    ///
    /// # Errors
    /// The store's error if a commit failed.
    ///
    /// # Cancel safety
    /// Cancel safe: the audit writer writes the records whether or not anyone waits.
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
    let since = query.since_ms.unwrap_or(0);
    let until = query.until_ms.unwrap_or(u64::MAX);
    let mut found = Vec::new();
    let mut failed = None;
    // A call that ran long is stored with later ones, so every block from `since` on is
    // read; the records come out of the blocks roughly in order and are sorted at the end.
    store.scan_from(Table::Audit, &[], &time_key(since), &mut |key, value| {
        let records = match decode_stored(key, value) {
            Ok(records) => records,
            Err(err) => {
                failed = Some(err);
                return false;
            }
        };
        found.extend(records.into_iter().filter(|r| {
            (since..until).contains(&r.at_ms)
                && query
                    .agent
                    .as_ref()
                    .is_none_or(|a| r.agent.as_ref() == Some(a))
                && query.tool.as_ref().is_none_or(|t| t.matches(&r.tool))
                && query.outcome.is_none_or(|o| r.outcome == o)
        }));
        if let Some(limit) = query.limit
            && found.len() > limit.saturating_mul(2).max(BLOCK)
        {
            keep_newest(&mut found, limit);
        }
        true
    })?;
    if let Some(err) = failed {
        return Err(err);
    }
    keep_newest(&mut found, query.limit.unwrap_or(usize::MAX));
    Ok(found)
}

/// Sorts `records` by call id and keeps the newest `limit`.
fn keep_newest(records: &mut Vec<AuditRecord>, limit: usize) {
    records.sort_unstable_by_key(|r| r.call_id);
    let excess = records.len().saturating_sub(limit);
    records.drain(..excess);
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
    // The buffer calls push onto next, swapped in at each drain: a drain's records then
    // go into room the last drain left, instead of a vector that grows from nothing by
    // copying itself (past 128 KiB each growth maps fresh pages, faulted in by the calls).
    let mut spare: Vec<Entry> = Vec::with_capacity(1024);
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
        let entries = {
            let mut buffer = live
                .buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            live.full.store(false, Ordering::Release);
            std::mem::replace(&mut *buffer, std::mem::take(&mut spare))
        };
        let waiters = std::mem::take(
            &mut *live
                .flushes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        live.drained.notify_waiters();
        drop(live);
        let mut batch = Batch::new();
        put_blocks(&mut batch, &entries);
        spare = entries;
        spare.clear();
        spare.shrink_to(KEPT_CAPACITY);
        if waiters.is_empty() {
            // Nobody waits: let the store group this batch with others and go on.
            store.submit(
                batch,
                Box::new(|result| {
                    if let Err(err) = result {
                        tracing::error!(error = %guildhall_actors::ErrorChain(&err), "audit records could not be written");
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
            tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "audit pruning could not read the log");
            return;
        }
        let full = batch.len() >= BATCH;
        if batch.is_empty() {
            return;
        }
        if let Err(err) = store::commit(store, batch).await {
            tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "audit pruning could not delete old records");
            return;
        }
        if !full {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn entry(ms: u64, tool: &str, outcome: Outcome) -> Entry {
        let ts =
            uuid::Timestamp::from_unix(uuid::NoContext, ms / 1000, (ms % 1000) as u32 * 1_000_000);
        Entry {
            call_id: Uuid::new_v7(ts),
            agent: Some(Arc::from("a1")),
            session: None,
            tool: Arc::from(tool),
            digest: 0x0123_4567_89ab_cdef,
            decision: Action::Allow,
            rule: Some(Arc::from("trust autonomous")),
            duration_us: 7,
            outcome,
            parent: 0,
            cause: None,
        }
    }

    /// `e` as a whole record, the form older logs stored.
    fn whole(e: &Entry) -> AuditRecord {
        AuditRecord {
            call_id: e.call_id,
            at_ms: start_ms(e.call_id),
            agent: e.agent.as_deref().map(String::from),
            session: e.session.as_deref().map(String::from),
            tool: e.tool.to_string(),
            args_digest: format!("{:016x}", e.digest),
            decision: e.decision,
            rule: e.rule.as_deref().unwrap_or_default().to_string(),
            duration_us: e.duration_us,
            outcome: e.outcome,
            parent: (e.parent != 0).then(|| format!("{:016x}", e.parent)),
            cause: e.cause.as_deref().map(String::from),
        }
    }

    #[test]
    fn a_block_written_before_parents_and_causes_still_decodes() {
        #[derive(Serialize)]
        struct Before {
            call_id: Uuid,
            agent: u32,
            session: u32,
            tool: u32,
            digest: u64,
            decision: u8,
            rule: u32,
            duration_us: u64,
            outcome: u8,
        }
        #[derive(Serialize)]
        struct Block {
            strings: Vec<String>,
            records: Vec<Before>,
        }
        let e = entry(1_700_000_000_000, "shell", Outcome::Crashed);
        let bytes = codec::encode(&Block {
            strings: vec!["shell".into()],
            records: vec![Before {
                call_id: e.call_id,
                agent: 0,
                session: 0,
                tool: 1,
                digest: 1,
                decision: 0,
                rule: 0,
                duration_us: 7,
                outcome: 3,
            }],
        });
        let decoded = decode_block(&bytes).unwrap();
        assert_eq!(decoded[0].outcome, Outcome::Crashed);
        assert_eq!((&decoded[0].parent, &decoded[0].cause), (&None, &None));
    }

    #[test]
    fn a_block_decodes_into_the_records_written() {
        let entries: Vec<Entry> = Outcome::ALL
            .iter()
            .enumerate()
            .map(|(i, &outcome)| Entry {
                agent: (i % 3 != 0).then(|| Arc::from(format!("agent-{}", i % 2))),
                session: (i % 2 == 0).then(|| Arc::from("s1")),
                decision: Action::ALL[i % 3],
                rule: (i % 4 != 0).then(|| Arc::from(if i == 1 { "" } else { "role pm" })),
                duration_us: 1 << (i * 6),
                digest: u64::MAX - i as u64,
                parent: if i % 2 == 0 {
                    0
                } else {
                    0xfeed_0000_0000_0001 + i as u64
                },
                cause: (outcome == Outcome::Crashed).then(|| Box::from("panicked: boom")),
                ..entry(1_700_000_000_000 + i as u64, "shell", outcome)
            })
            .collect();
        let bytes = encode_block(&entries);
        let decoded = decode_block(&bytes).unwrap();
        assert_eq!(decoded, entries.iter().map(whole).collect::<Vec<_>>());
        assert_eq!(decoded[3].at_ms, 1_700_000_000_003);
        assert_eq!(decoded[0].args_digest, "ffffffffffffffff");
        // Each string once, whether shared or equal: the records themselves stay small.
        let shared: Arc<str> = Arc::from("noop");
        let repeated: Vec<Entry> = (0..BLOCK as u64)
            .map(|i| Entry {
                tool: if i % 3 == 0 {
                    Arc::from("noop")
                } else {
                    Arc::clone(&shared)
                },
                agent: Some(Arc::from(if i % 2 == 0 { "a1" } else { "a2" })),
                ..entry(1_700_000_000_000 + i, "", Outcome::Ok)
            })
            .collect();
        let bytes = encode_block(&repeated);
        assert!(bytes.len() < 40 * BLOCK, "{} bytes", bytes.len());
        let block: IndexedBlock = codec::decode(Table::Audit, &bytes).unwrap();
        assert_eq!(block.strings.len(), 4, "{:?}", block.strings);
        let decoded = decode_block(&bytes).unwrap();
        assert_eq!(decoded, repeated.iter().map(whole).collect::<Vec<_>>());
        for (i, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*outcome as usize, i, "codes follow declaration order");
        }
        for (i, action) in Action::ALL.iter().enumerate() {
            assert_eq!(*action as usize, i, "codes follow declaration order");
        }
    }

    #[test]
    fn a_block_pointing_past_its_strings_is_a_decode_error() {
        let mut block: IndexedBlock = codec::decode(
            Table::Audit,
            &encode_block(&[entry(1_000, "noop", Outcome::Ok)]),
        )
        .unwrap();
        block.records[0].tool = 9;
        let err = decode_block(&codec::encode(&block)).unwrap_err();
        assert!(err.to_string().contains("string 9"), "{err}");
        block.records[0].tool = 1;
        block.records[0].outcome = 200;
        let err = decode_block(&codec::encode(&block)).unwrap_err();
        assert!(err.to_string().contains("outcome code 200"), "{err}");
    }

    #[tokio::test]
    async fn queries_read_every_form_of_block_and_lone_records_in_call_order() {
        let store = MemoryStore::new();
        let mut batch = Batch::new();
        // A record from before blocks: keyed by its bare call id.
        let lone = entry(1_000, "old", Outcome::Ok);
        batch.put(
            Table::Audit,
            lone.call_id.as_bytes().to_vec(),
            codec::encode(&whole(&lone)),
        );
        // A block of whole records, from before indexed blocks.
        let older = [
            entry(1_100, "older", Outcome::Ok),
            entry(1_050, "older", Outcome::Ok),
        ];
        let mut key = older[0].call_id.as_bytes().to_vec();
        key.push(FULL_BLOCK_MARK);
        batch.put(
            Table::Audit,
            key,
            codec::encode(&older.iter().map(whole).collect::<Vec<_>>()),
        );
        // More than one block, handed over out of order, with a long call started early.
        let mut entries: Vec<Entry> = (0..BLOCK as u64 + 10)
            .rev()
            .map(|i| entry(2_000 + i, "noop", Outcome::Ok))
            .collect();
        entries.push(entry(1_500, "slow", Outcome::Timeout));
        put_blocks(&mut batch, &entries);
        store::commit(&store, batch).await.unwrap();

        let all = query(&store, &AuditQuery::default()).unwrap();
        assert_eq!(all.len(), BLOCK + 14);
        assert!(all.windows(2).all(|w| w[0].call_id < w[1].call_id));
        let first: Vec<&str> = all[..4].iter().map(|r| r.tool.as_str()).collect();
        assert_eq!(first, ["old", "older", "older", "slow"]);
        assert_eq!(all[1].at_ms, 1_050);

        let recent = query(
            &store,
            &AuditQuery {
                limit: Some(3),
                ..AuditQuery::default()
            },
        )
        .unwrap();
        let times: Vec<u64> = recent.iter().map(|r| r.at_ms).collect();
        assert_eq!(
            times,
            [
                2_000 + BLOCK as u64 + 7,
                2_000 + BLOCK as u64 + 8,
                2_000 + BLOCK as u64 + 9
            ]
        );

        let window = AuditQuery {
            since_ms: Some(1_200),
            until_ms: Some(2_002),
            ..AuditQuery::default()
        };
        let tools: Vec<String> = query(&store, &window)
            .unwrap()
            .into_iter()
            .map(|r| r.tool)
            .collect();
        assert_eq!(tools, ["slow", "noop", "noop"]);

        let timeouts = AuditQuery {
            outcome: Some(Outcome::Timeout),
            ..AuditQuery::default()
        };
        assert_eq!(query(&store, &timeouts).unwrap().len(), 1);
    }

    #[tokio::test]
    async fn pruning_drops_whole_blocks_older_than_the_retention() {
        let store = MemoryStore::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let mut batch = Batch::new();
        put_blocks(&mut batch, &[entry(now - 120_000, "old", Outcome::Ok)]);
        put_blocks(&mut batch, &[entry(now - 1_000, "new", Outcome::Ok)]);
        store::commit(&store, batch).await.unwrap();
        prune_older_than(&store, Duration::from_secs(60)).await;
        let left: Vec<String> = query(&store, &AuditQuery::default())
            .unwrap()
            .into_iter()
            .map(|r| r.tool)
            .collect();
        assert_eq!(left, ["new"]);
    }

    #[tokio::test]
    async fn a_full_buffer_holds_new_calls_until_the_writer_drains_it() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let log = AuditLog::start(Arc::clone(&store), Duration::from_secs(3600));
        // On this single-threaded runtime the writer cannot run until the test awaits.
        for i in 0..2 * QUEUE as u64 {
            log.append(entry(1_000 + i, "noop", Outcome::Ok));
        }
        assert!(log.shared.full.load(Ordering::Acquire));
        log.room().await;
        assert!(!log.shared.full.load(Ordering::Acquire));
        log.flush().await.unwrap();
        let all = query(&*store, &AuditQuery::default()).unwrap();
        assert_eq!(all.len(), 2 * QUEUE);
    }
}
