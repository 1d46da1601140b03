//! What the board actor is sent and answers. Kept apart from the actor so the hub (which
//! sends to it) depends on the messages, not on the actor.

use super::TaskError;
use super::model::{ClaimFilter, Task, TaskChange, TaskQuery, TaskSpec};
use super::status::TaskId;
use crate::agents::AgentId;
use crate::store::StoreError;
use guildhall_supervision::lazy::{self, Bounce};

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
    /// A listing: the tasks, and how many matched before the limit.
    Tasks(Vec<Task>, usize),
    Failed(TaskError),
    /// The request never reached a live actor; here it is back.
    Bounced(Op),
}

impl Bounce for Reply {
    type Op = Op;
    fn bounced(op: Op) -> Self {
        Reply::Bounced(op)
    }

    fn into_bounced(self) -> Result<Op, Self> {
        match self {
            Reply::Bounced(op) => Ok(op),
            other => Err(other),
        }
    }
}

pub(crate) type Request = lazy::Request<Reply>;

/// Messages the board actor handles.
pub(crate) enum BoardMsg {
    Request(Request),
    /// The commit in flight finished (its operations are already answered).
    Committed(Result<(), StoreError>),
    /// Return the tasks whose leases ended to the pool.
    Expire,
    /// Stop if idle (sent by the passivation sweep).
    Passivate,
}
