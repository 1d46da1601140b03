//! A task's id and where it is in its life: the words every other part of the board, its
//! errors included, is written in.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A task's id: numbered from 1 in order of creation, never reused.
pub type TaskId = u64;

/// Where a task is in its life: `open → in_progress → done | failed | cancelled`; an open
/// task may also end at once, and an ended one may be reopened.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Waiting for someone to take it.
    Open,
    /// Someone is on it.
    InProgress,
    /// Finished.
    Done,
    /// Given up on, with a note saying why.
    Failed,
    /// No longer wanted.
    Cancelled,
}

impl TaskStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [TaskStatus; 5] = [
        TaskStatus::Open,
        TaskStatus::InProgress,
        TaskStatus::Done,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// Whether the task has ended (done, failed or cancelled).
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            TaskStatus::Done | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    /// The status as written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Open => "open",
            TaskStatus::InProgress => "in_progress",
            TaskStatus::Done => "done",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}
