//! `ask_human {"task": N}` for a task an A2A caller made: the question goes to that caller,
//! as a reply in the task's thread marked `"input_required": true` (which the A2A task shows
//! as `INPUT_REQUIRED`); the caller's next message in the task is the answer.

use futures::future::BoxFuture;
use uuid::Uuid;

use super::caller::ROLE;
use super::mirror;
use crate::agents::InboxQuery;
use crate::humans::TaskQuestions;
use crate::runtime::WeakRuntime;

/// Messages of the task's thread looked through for the caller's latest.
const LOOKED_AT: usize = 200;

/// The route of questions about A2A tasks, installed into the humans by [`super::routes`].
pub(super) struct A2aQuestions(pub(super) WeakRuntime);

impl TaskQuestions for A2aQuestions {
    fn route<'a>(&'a self, asker: &'a str, task: u64) -> BoxFuture<'a, Option<(Uuid, String)>> {
        Box::pin(async move {
            let runtime = self.0.upgrade()?;
            let task = runtime.tasks()?.get(task).await.ok()?;
            if !task.labels.iter().any(|l| l == mirror::LABEL) {
                return None;
            }
            let caller = mirror::label(&task, mirror::CALLER)?.to_owned();
            let thread = mirror::thread(&task)?;
            // A reply answers mail in the asker's own inbox: the caller's latest in the
            // thread (its first message, or a later answer).
            let inbox = runtime
                .agent(asker)
                .ok()?
                .check_inbox(InboxQuery {
                    unread_only: false,
                    thread: Some(thread),
                    limit: LOOKED_AT,
                    arrival_order: true,
                    ..InboxQuery::default()
                })
                .await
                .ok()?;
            let latest = inbox
                .messages
                .iter()
                .filter(|m| m.from.as_str() == caller)
                .max_by_key(|m| m.id)?;
            Some((latest.id, caller))
        })
    }

    fn answers_as(&self, agent: &str) -> bool {
        self.0
            .upgrade()
            .and_then(|rt| rt.lookup_agent(agent))
            .is_some_and(|record| record.role == ROLE)
    }
}
