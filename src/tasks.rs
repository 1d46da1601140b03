//! The task board: work the swarm divides among itself, durable and shared.
//!
//! A task has a title, a description, an assignee (an agent, `role:<name>`, or nobody), a
//! parent, the tasks blocking it, a priority, labels and a due time, and moves through
//! `open → in_progress → done | failed | cancelled`. Workers take tasks with a claim: the
//! most urgent open task that is ready (every blocker done) and free, held under a lease
//! that ends unless renewed, so a crashed worker's task returns to the pool. Changes are
//! versioned (`expected_version`, as in context) and kept as each task's history. Changes
//! that concern someone become mail: an assignment or a task becoming ready to its
//! assignee, a task done or failed to its creator and its parent's assignee.
//!
//! One board per runtime (a project), owned by one supervised actor started on first use
//! and passivated when idle and no lease is held; every change is committed to the
//! [`Store`](crate::store::Store) before it is acknowledged.
//!
//! Use [`Tasks`] (from [`Runtime::tasks`](crate::Runtime::tasks)) or the tools `task_create`,
//! `task_list`, `task_get`, `task_update`, `task_claim`, `task_heartbeat` and
//! `task_release` every runtime registers.

mod actor;
mod board;
mod error;
mod handle;
mod keys;
mod model;
mod notify;
mod protocol;
mod shared;
mod status;
pub mod tools;

use std::time::Duration;

pub(crate) use board::TaskBoard;
pub use error::TaskError;
pub use handle::Tasks;
pub use model::{
    Action, ClaimFilter, Lease, Note, Task, TaskChange, TaskEvent, TaskLimits, TaskQuery, TaskSpec,
};
pub use status::{TaskId, TaskStatus};

/// Limits and timings of the task board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskConfig {
    /// Sizes the board and its tasks may reach.
    pub limits: TaskLimits,
    /// The lease a claim gets unless it asks for another.
    pub lease: Duration,
    /// The longest lease a claim may ask for.
    pub max_lease: Duration,
    /// The board's actor idle this long (and holding no lease) is stopped; the board
    /// stays in the store.
    pub idle: Duration,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            limits: TaskLimits::default(),
            lease: Duration::from_secs(300),
            max_lease: Duration::from_secs(24 * 3600),
            idle: Duration::from_secs(60),
        }
    }
}
