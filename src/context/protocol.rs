//! What context actors are sent and answer. Kept apart from the actor so the session
//! directory (which holds each actor's address) and the hub (which sends to it) depend on
//! the messages, not on the actor.

use std::sync::Arc;

use super::ContextError;
use super::model::{Applied, Change, Entry};
use super::query::{ContextView, Select};
use crate::agents::AgentId;
use crate::durable::Msg;
use crate::store::StoreError;

/// What a context actor does for a caller.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Update {
        changes: Arc<[Change]>,
        author: Option<AgentId>,
    },
    Read {
        select: Select,
        limit: usize,
    },
    Stat,
    /// Every entry, for an export.
    Export,
    /// Applies the first half of a batch in memory, then panics (fault injection for tests).
    #[cfg(feature = "test-util")]
    CrashMidUpdate(Arc<[Change]>),
}

/// A session's size and versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) version: u64,
    /// The oldest version history can be read at.
    pub(crate) base: u64,
    pub(crate) entries: usize,
    pub(crate) bytes: usize,
}

/// A context actor's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Applied(Applied),
    View(ContextView),
    Stat(Stat),
    Entries { version: u64, entries: Vec<Entry> },
    Failed(ContextError),
}

impl From<StoreError> for Reply {
    fn from(err: StoreError) -> Self {
        Reply::Failed(err.into())
    }
}

pub(crate) use crate::durable::Committed;

/// Messages a context actor handles: requests, passivation, and its commits' outcomes.
pub(crate) type ContextMsg = Msg<Op, Reply, Committed>;
