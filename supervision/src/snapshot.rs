//! A point-in-time view of a supervision tree.

use serde::{Deserialize, Serialize};

use crate::breaker::BreakerStatus;

/// Whether a child is a worker or a supervisor (whose own tree appears in snapshots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildKind {
    /// A plain actor.
    Worker,
    /// A [`SupervisorActor`](crate::SupervisorActor).
    Supervisor,
}

/// Whether a child is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildStatus {
    /// Alive and serving.
    Running,
    /// Exited and waiting for (or in the middle of) a restart.
    Restarting,
    /// Exited and will not be restarted.
    Stopped,
}

/// One child of a supervisor, and its subtree if it is a supervisor itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildSnapshot {
    /// The child's id within its supervisor.
    pub id: String,
    /// Worker or supervisor.
    pub kind: ChildKind,
    /// Running, restarting or stopped.
    pub status: ChildStatus,
    /// How many times the supervisor restarted this child.
    pub restarts: u32,
    /// The attached circuit breaker's state, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerStatus>,
    /// The children of a supervisor node (empty for workers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildSnapshot>,
}

impl ChildSnapshot {
    /// Finds a node by its path of ids below this one, e.g. `["tools", "echo"]`.
    pub fn find(&self, path: &[&str]) -> Option<&ChildSnapshot> {
        match path.split_first() {
            None => Some(self),
            Some((head, rest)) => self
                .children
                .iter()
                .find(|c| c.id == *head)
                .and_then(|c| c.find(rest)),
        }
    }
}
