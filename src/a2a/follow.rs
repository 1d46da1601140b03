//! Following one task: the A2A events its changes make, woken by the task's and the caller's
//! inbox's changes (never a timer). Streams follow a task until it ends or asks; push
//! notifications until it ends.

use std::collections::VecDeque;

use a2a::{
    A2AError, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState, TaskStatusUpdateEvent,
};
use tokio_util::sync::CancellationToken;

use super::caller::Caller;
use super::mirror;
use crate::changes::Watch;
use crate::tasks::TaskId;

/// Where following stops.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Until {
    /// At an end or a question (a stream: the caller must act).
    Settled,
    /// At an end (push notifications go on through questions).
    Ended,
}

/// One followed task.
pub(super) struct Follow {
    caller: Caller,
    id: TaskId,
    watches: (Watch, Watch),
    seen: Seen,
    queue: VecDeque<StreamResponse>,
    until: Until,
    done: bool,
    /// Whether a view was read since the watches began: a change between `first` and the
    /// watches would otherwise wait for the next one.
    fresh: bool,
    stop: CancellationToken,
}

/// What has been told.
struct Seen {
    state: TaskState,
    message: Option<String>,
    artifact: bool,
}

impl Follow {
    /// Follows the task `first` shows, from it (told first when `tell_first`). `stop` ends
    /// it (the server stopping).
    pub(super) fn new(
        caller: Caller,
        first: &Task,
        tell_first: bool,
        until: Until,
        stop: CancellationToken,
    ) -> Self {
        let id: TaskId = first.id.parse().unwrap_or_default();
        let watches = caller.watch(id);
        let done = match until {
            Until::Settled => mirror::settled(&first.status.state),
            Until::Ended => first.status.state.is_terminal(),
        };
        Self {
            caller,
            id,
            watches,
            seen: Seen {
                state: first.status.state.clone(),
                message: first.status.message.as_ref().map(|m| m.message_id.clone()),
                artifact: first.artifacts.as_ref().is_some_and(|a| !a.is_empty()),
            },
            queue: if tell_first {
                VecDeque::from([StreamResponse::Task(first.clone())])
            } else {
                VecDeque::new()
            },
            until,
            done,
            fresh: false,
            stop,
        }
    }

    /// The next event; `None` once the task reached where following stops, or the server
    /// stops.
    ///
    /// # Cancel safety
    /// Cancel safe: a change seen meanwhile is seen by the next call.
    pub(super) async fn next(&mut self) -> Option<Result<StreamResponse, A2AError>> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            if self.fresh {
                let (task_changed, inbox_changed) = &mut self.watches;
                tokio::select! {
                    () = task_changed.changed() => {}
                    () = inbox_changed.changed() => {}
                    () = self.stop.cancelled() => return None,
                }
            }
            self.fresh = true;
            match self.caller.view(&self.id.to_string(), Some(0)).await {
                Ok(view) => self.news(&view),
                Err(err) => {
                    self.done = true;
                    return Some(Err(err));
                }
            }
        }
    }

    /// Queues what changed in `view`: an artifact, then the status (with the agent's latest
    /// message).
    fn news(&mut self, view: &Task) {
        if !self.seen.artifact
            && let Some(artifact) = view.artifacts.as_ref().and_then(|a| a.first())
        {
            self.seen.artifact = true;
            self.queue
                .push_back(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                    task_id: view.id.clone(),
                    context_id: view.context_id.clone(),
                    artifact: artifact.clone(),
                    append: Some(false),
                    last_chunk: Some(true),
                    metadata: None,
                }));
        }
        let message = view.status.message.as_ref().map(|m| m.message_id.clone());
        if view.status.state != self.seen.state || message != self.seen.message {
            self.seen.state = view.status.state.clone();
            self.seen.message = message;
            self.queue
                .push_back(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
                    task_id: view.id.clone(),
                    context_id: view.context_id.clone(),
                    status: view.status.clone(),
                    metadata: None,
                }));
        }
        self.done = match self.until {
            Until::Settled => mirror::settled(&view.status.state),
            Until::Ended => view.status.state.is_terminal(),
        };
    }
}
