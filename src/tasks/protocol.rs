//! What the board actor is sent and answers. Kept apart from the actor so the hub (which
//! sends to it) depends on the messages, not on the actor.

use super::TaskError;
use super::model::{ClaimFilter, Listing, Task, TaskChange, TaskQuery, TaskSpec};
use super::status::TaskId;
use crate::agents::AgentId;
use crate::durable::{Committed, Msg};
use crate::store::StoreError;

/// What the board does for a caller.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Create {
        by: Option<AgentId>,
        spec: TaskSpec,
    },
    Update {
        by: Option<AgentId>,
        id: TaskId,
        change: TaskChange,
    },
    Claim {
        by: AgentId,
        role: String,
        filter: ClaimFilter,
        lease_ms: u64,
    },
    Heartbeat {
        by: AgentId,
        id: TaskId,
    },
    Release {
        by: AgentId,
        id: TaskId,
        note: Option<String>,
    },
    Get(TaskId),
    List(TaskQuery),
}

/// The board's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The task as the operation left it.
    Task(Box<Task>),
    /// A claim that found nothing to take.
    Nothing,
    /// A listing of the tasks in memory, for the caller to complete with the archived ones.
    Listing(Listing),
    Failed(TaskError),
}

impl From<StoreError> for Reply {
    fn from(err: StoreError) -> Self {
        Reply::Failed(TaskError::Store(err))
    }
}

/// The board actor's own messages.
pub(crate) enum BoardOwn {
    /// The commit in flight finished (its operations are already answered).
    Committed(Committed),
    /// Return the tasks whose leases ended to the pool.
    Expire,
}

impl From<Committed> for BoardOwn {
    fn from(committed: Committed) -> Self {
        BoardOwn::Committed(committed)
    }
}

/// Messages the board actor handles: requests, passivation and its own.
pub(crate) type BoardMsg = Msg<Op, Reply, BoardOwn>;
