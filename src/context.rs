//! Session context: entries that agents read and update together.
//!
//! A session holds keyed entries (JSON values with a kind, an author, times and a version).
//! Agents change them in atomic batches, each change a `replace`, a `merge` (RFC 7396) or an
//! `append`, optionally guarded by the version it expects. Each session is owned by a context
//! actor: supervised, started on first use and passivated when idle. Every batch is logged
//! to the [`Store`](crate::store::Store) before it is acknowledged, with periodic snapshots,
//! so a session survives crashes and restarts, keeps its history (readable as of any kept
//! version), and exports to JSON and back.
//!
//! Use [`Sessions`] (from [`Runtime::sessions`](crate::Runtime::sessions)) and [`Context`], or
//! the tools `context_get`, `context_update` and `context_history` every runtime registers.

mod actor;
mod error;
mod export;
mod handle;
mod hub;
pub(crate) mod log;
mod model;
mod protocol;
mod query;
mod session;
mod shared;
pub mod tools;

use std::time::Duration;

pub use error::ContextError;
pub use export::{EXPORT_FORMAT, SessionExport};
pub use handle::{Context, SessionInfo, Sessions};
pub(crate) use hub::ContextHub;
pub use log::{History, HistoryQuery, LoggedBatch};
pub use model::{
    Applied, Change, ContextLimits, Entry, EntryChange, EntryKind, SessionContext, Strategy,
};
pub use query::{ContextView, Select};
pub use session::{SessionId, SessionRecord, SessionSpec};

/// Limits and timings of session contexts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextConfig {
    /// Sizes a session and its entries may reach.
    pub limits: ContextLimits,
    /// A context actor idle this long is stopped; its state stays in the store.
    pub idle: Duration,
    /// A snapshot is written after this many batches, so a restart replays at most that many.
    pub snapshot_every: u64,
    /// History older than this is pruned (at snapshots); `None` keeps it all.
    pub history_retention: Option<Duration>,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            limits: ContextLimits::default(),
            idle: Duration::from_secs(60),
            snapshot_every: 10_000,
            history_retention: Some(Duration::from_secs(30 * 24 * 3600)),
        }
    }
}
