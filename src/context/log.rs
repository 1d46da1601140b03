//! How a session is stored: an op log of its batches, and snapshots of its entries.
//!
//! - `ContextLog`: session id, a 0 byte, the session version (8 bytes, big-endian) → the
//!   [`LoggedBatch`] that made that version. Keys sort by version.
//! - `ContextSnapshots`: same keys → a [`Snapshot`] of every entry at that version.
//!
//! A session's state is its latest snapshot with the batches after it replayed. Snapshots
//! are taken every `snapshot_every` batches; at most two are kept: the latest, and the
//! *base*, the oldest version history can still be read at, before which the log is pruned.
//! Stored types are positional (see [`codec`](crate::store::codec)): new fields go last.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::model::{Change, ContextLimits, Entry, EntryChange, SessionContext};
use super::session::SessionId;
use crate::agents::AgentId;
use crate::store::{self, Store, StoreError, Table};

/// One applied batch, as the log holds it: enough to replay it, and to show who changed what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoggedBatch {
    /// The session version this batch made.
    pub version: u64,
    /// When it was applied, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Who applied it.
    pub author: Option<AgentId>,
    /// The changes, in order.
    pub changes: Vec<Change>,
    /// Each change's entry version before and after (0: absent / deleted).
    pub versions: Vec<[u64; 2]>,
}

impl LoggedBatch {
    /// What each change did.
    pub fn effects(&self) -> Vec<EntryChange> {
        self.changes
            .iter()
            .zip(&self.versions)
            .map(|(c, [before, after])| EntryChange {
                key: c.key.clone(),
                strategy: c.strategy,
                before: *before,
                after: *after,
            })
            .collect()
    }
}

/// Every entry of a session at one version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub(crate) version: u64,
    /// When the batch of `version` was applied.
    pub(crate) at_ms: u64,
    /// The base when this snapshot was written: history is kept from there on.
    pub(crate) base: u64,
    pub(crate) entries: Vec<Entry>,
}

/// The key prefix of everything stored for `session` in the log and snapshot tables.
pub(crate) fn prefix(session: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session.as_str().len() + 9);
    key.extend_from_slice(session.as_str().as_bytes());
    key.push(0);
    key
}

/// The key of `version` of `session`.
pub(crate) fn key(session: &SessionId, version: u64) -> Vec<u8> {
    let mut key = prefix(session);
    key.extend_from_slice(&version.to_be_bytes());
    key
}

/// Visits the logged batches of `session` from version `from` on, in order, until `visit`
/// returns `false`.
pub(crate) fn replay(
    store: &dyn Store,
    session: &SessionId,
    from: u64,
    mut visit: impl FnMut(LoggedBatch) -> bool,
) -> Result<(), StoreError> {
    store::scan_values_from(
        store,
        Table::ContextLog,
        &prefix(session),
        &key(session, from),
        |_, batch| visit(batch),
    )
}

/// A session rebuilt from the store.
pub(crate) struct Restored {
    pub(crate) ctx: SessionContext,
    /// The `base` recorded by the snapshot started from (0 without one).
    pub(crate) base: u64,
    /// That snapshot's version and time (0, 0: none).
    pub(crate) snapshot: (u64, u64),
    /// When the last batch replayed (or the snapshot's) was applied.
    pub(crate) last_at_ms: u64,
}

/// Why a session could not be rebuilt.
pub(crate) enum RestoreError {
    Store(StoreError),
    /// The log does not follow on from the snapshot (pruned, or damaged), or a batch does not
    /// replay.
    Broken(String),
}

impl From<StoreError> for RestoreError {
    fn from(err: StoreError) -> Self {
        Self::Store(err)
    }
}

/// Rebuilds `session` as of `up_to` (`u64::MAX`: its latest version): the latest snapshot at
/// or before it, and the log after that replayed, each batch checked to follow the one before.
/// What was accepted once replays whatever the limits are now.
pub(crate) fn restore(
    store: &dyn Store,
    session: &SessionId,
    up_to: u64,
) -> Result<Restored, RestoreError> {
    let mut restored = match snapshots(store, session)?
        .into_iter()
        .rfind(|s| s.version <= up_to)
    {
        Some(s) => Restored {
            base: s.base,
            snapshot: (s.version, s.at_ms),
            last_at_ms: s.at_ms,
            ctx: SessionContext::from_entries(s.version, s.entries),
        },
        None => Restored {
            ctx: SessionContext::new(),
            base: 0,
            snapshot: (0, 0),
            last_at_ms: 0,
        },
    };
    let mut broken = None;
    let ctx = &mut restored.ctx;
    replay(store, session, ctx.version() + 1, |batch| {
        if batch.version > up_to {
            return false;
        }
        if batch.version != ctx.version() + 1 {
            broken = Some(format!(
                "the log jumps from version {} to {}",
                ctx.version(),
                batch.version
            ));
        } else if let Err(err) = ctx.apply(
            &batch.changes,
            batch.author.as_ref(),
            batch.at_ms,
            &ContextLimits::UNLIMITED,
        ) {
            broken = Some(format!("batch {} does not replay: {err}", batch.version));
        } else {
            restored.last_at_ms = batch.at_ms;
        }
        broken.is_none()
    })?;
    broken.map_or(Ok(restored), |reason| Err(RestoreError::Broken(reason)))
}

/// The snapshots of `session`, oldest first.
pub(crate) fn snapshots(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Vec<Snapshot>, StoreError> {
    let mut all = Vec::new();
    store::scan_values(store, Table::ContextSnapshots, &prefix(session), |_, s| {
        all.push(s);
    })?;
    Ok(all)
}

/// Which part of a session's history to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Batches after this version, oldest first; without it, the latest ones.
    pub after: Option<u64>,
    /// Only batches that changed this key.
    pub key: Option<String>,
    /// At most this many batches.
    pub limit: usize,
}

impl Default for HistoryQuery {
    fn default() -> Self {
        Self {
            after: None,
            key: None,
            limit: 50,
        }
    }
}

/// Part of a session's history.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct History {
    /// The session's version.
    pub version: u64,
    /// The oldest version history can be read at; batches before it were pruned.
    pub oldest: u64,
    /// The batches, oldest first.
    pub batches: Vec<LoggedBatch>,
}
