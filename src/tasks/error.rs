//! What can go wrong with the task board.

use crate::agents::MailError;
use crate::store::StoreError;

use super::status::{TaskId, TaskStatus};

/// Why a task board operation failed. Nothing of a refused operation is applied.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// No task has this id.
    #[error("no task {id} on the board")]
    UnknownTask {
        /// The id asked for.
        id: TaskId,
    },
    /// The task changed since the caller read it.
    #[error(
        "version conflict on task {id}: expected version {expected}, but it is at {actual}; \
         read it again and retry (nothing was changed)"
    )]
    Conflict {
        /// The task.
        id: TaskId,
        /// The version the caller expected.
        expected: u64,
        /// The version it is at.
        actual: u64,
    },
    /// A status change the lifecycle does not allow.
    #[error("task {id} cannot go from {from} to {to}: {reason}")]
    BadTransition {
        /// The task.
        id: TaskId,
        /// Its status.
        from: TaskStatus,
        /// The status asked for.
        to: TaskStatus,
        /// Why not, and what to do instead.
        reason: String,
    },
    /// `blocked_by` or `parent` would make a cycle.
    #[error("task {id} cannot {what}: that would make a cycle ({path})")]
    Cycle {
        /// The task.
        id: TaskId,
        /// What was asked (`be blocked by 7`, `have 3 as its parent`).
        what: String,
        /// The cycle, as task ids.
        path: String,
    },
    /// Someone else holds the task's lease.
    #[error(
        "task {id} is claimed by `{holder}` (lease for {remaining_secs} more seconds): only \
         its holder may {what}"
    )]
    Held {
        /// The task.
        id: TaskId,
        /// Who holds it.
        holder: String,
        /// Seconds left on the lease.
        remaining_secs: u64,
        /// What was refused.
        what: &'static str,
    },
    /// The caller holds as many tasks as one agent may (`[tasks] max_held`).
    #[error(
        "`{agent}` already holds {held} tasks, the most one agent may (`[tasks] max_held`): \
         finish or release one first"
    )]
    HoldsTooMany {
        /// The caller.
        agent: String,
        /// How many it holds.
        held: usize,
    },
    /// The caller does not hold the task's lease (to heartbeat or release it).
    #[error("task {id} is not claimed by `{agent}`: {reason}")]
    NotHolder {
        /// The task.
        id: TaskId,
        /// The caller.
        agent: String,
        /// Who holds it, if anyone.
        reason: String,
    },
    /// A field out of range or malformed.
    #[error("invalid `{name}`: {reason}")]
    InvalidArgument {
        /// The field.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The board holds as many tasks as it may.
    #[error(
        "the task board holds {limit} unfinished tasks, its limit (`[tasks] max_tasks`); \
         nothing was created"
    )]
    BoardFull {
        /// The limit.
        limit: usize,
    },
    /// The call has no agent identity, and the operation needs one.
    #[error(
        "this needs an agent identity: connect as an agent (`guildhall mcp --agent ID`) or \
         pass one"
    )]
    NoIdentity,
    /// An agent id, or the caller, that is not registered.
    #[error(transparent)]
    Agent(#[from] MailError),
    /// The board's actor could not be reached (it kept failing to start).
    #[error("the task board is unavailable: {reason}")]
    Unavailable {
        /// What went wrong.
        reason: String,
    },
    /// The store failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TaskError {
    /// Whether the same call may succeed later: the board or the store unavailable for now
    /// (the database restarting).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Store(err) => err.is_transient(),
            Self::Agent(err) => err.is_transient(),
            _ => false,
        }
    }
}
