//! A board task and its mail thread, seen as an A2A task: plain data in, plain data out.

use std::collections::HashMap;
use std::sync::Arc;

use a2a::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::agents::Message as Mail;
use crate::tasks::{Task as BoardTask, TaskStatus as BoardStatus};

/// Every A2A task is labelled so.
pub(super) const LABEL: &str = "a2a";
/// The label naming the caller that created a task: `a2a-caller:ID`.
pub(super) const CALLER: &str = "a2a-caller:";
/// The label naming the A2A context: `a2a-context:ID`.
pub(super) const CONTEXT: &str = "a2a-context:";
/// The label naming the A2A message that created it: `a2a-message:ID`.
pub(super) const MESSAGE: &str = "a2a-message:";
/// The caller's note that names the mail thread.
pub(super) const THREAD_NOTE: &str = "A2A: replies to the caller go in mail thread ";
/// The caller's note that carries one of its later messages.
pub(super) const MESSAGE_NOTE: &str = "A2A message: ";

/// The value of the label starting with `prefix`.
pub(super) fn label<'a>(task: &'a BoardTask, prefix: &str) -> Option<&'a str> {
    task.labels.iter().find_map(|l| l.strip_prefix(prefix))
}

/// The mail thread the caller's note names.
pub(super) fn thread(task: &BoardTask) -> Option<Uuid> {
    task.notes
        .iter()
        .find_map(|n| n.text.strip_prefix(THREAD_NOTE))
        .and_then(|id| Uuid::parse_str(id.trim()).ok())
}

/// One task as A2A shows it: the board's task, and the replies its caller received in the
/// task's thread, oldest first.
pub(super) struct View<'a> {
    pub(super) task: &'a BoardTask,
    pub(super) caller: &'a str,
    pub(super) replies: &'a [Arc<Mail>],
}

impl View<'_> {
    /// The context id (the task's own id when it was given none).
    pub(super) fn context(&self) -> String {
        label(self.task, CONTEXT).map_or_else(|| self.task.id.to_string(), str::to_owned)
    }

    /// When the caller last spoke: the task's creation or its latest message note.
    fn caller_spoke_ms(&self) -> u64 {
        self.task
            .notes
            .iter()
            .filter(|n| self.by_caller(n.by.as_ref()) && n.text.starts_with(MESSAGE_NOTE))
            .map(|n| n.at_ms)
            .max()
            .unwrap_or(self.task.created_ms)
    }

    fn by_caller(&self, by: Option<&crate::agents::AgentId>) -> bool {
        by.is_some_and(|by| by.as_str() == self.caller)
    }

    /// The A2A state.
    pub(super) fn state(&self) -> TaskState {
        match self.task.status {
            BoardStatus::Done => TaskState::Completed,
            BoardStatus::Failed => TaskState::Failed,
            BoardStatus::Cancelled => TaskState::Canceled,
            BoardStatus::Open | BoardStatus::InProgress => {
                let spoke = self.caller_spoke_ms();
                let asked = self
                    .replies
                    .iter()
                    .rev()
                    .find(|m| m.created_ms >= spoke)
                    .is_some_and(|m| asks_for_input(m));
                if asked {
                    TaskState::InputRequired
                } else if self.task.status == BoardStatus::Open {
                    TaskState::Submitted
                } else {
                    TaskState::Working
                }
            }
        }
    }

    /// The agent's last message since the caller last spoke, shown with the status.
    fn status_message(&self) -> Option<Message> {
        let spoke = self.caller_spoke_ms();
        self.replies
            .last()
            .filter(|m| m.created_ms >= spoke)
            .map(|m| self.reply(m))
    }

    /// The status as A2A shows it.
    pub(super) fn status(&self) -> TaskStatus {
        TaskStatus {
            state: self.state(),
            message: self.status_message(),
            timestamp: Some(at(self.task.updated_ms)),
        }
    }

    /// A reply as an agent's message.
    pub(super) fn reply(&self, mail: &Mail) -> Message {
        let mut parts = vec![Part::text(mail.body.to_string())];
        if let Some(payload) = &mail.payload {
            parts.push(Part::data(Value::clone(payload)));
        }
        Message {
            message_id: mail.id.to_string(),
            context_id: Some(self.context()),
            task_id: Some(self.task.id.to_string()),
            role: Role::Agent,
            parts,
            metadata: Some(HashMap::from([(
                "from".to_owned(),
                Value::String(mail.from.to_string()),
            )])),
            extensions: None,
            reference_task_ids: None,
        }
    }

    /// The conversation: the task's description, the caller's later messages and the
    /// agent's replies, oldest first; the last `limit` when given.
    pub(super) fn history(&self, limit: Option<usize>) -> Vec<Message> {
        let mut history: Vec<(u64, Message)> = Vec::new();
        let user = |id: String, text: &str| Message {
            message_id: id,
            context_id: Some(self.context()),
            task_id: Some(self.task.id.to_string()),
            role: Role::User,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: None,
            reference_task_ids: None,
        };
        let first = label(self.task, MESSAGE)
            .map_or_else(|| format!("task-{}-0", self.task.id), str::to_owned);
        history.push((self.task.created_ms, user(first, &self.task.description)));
        for (i, note) in self.task.notes.iter().enumerate() {
            if let Some(text) = note.text.strip_prefix(MESSAGE_NOTE)
                && self.by_caller(note.by.as_ref())
            {
                history.push((
                    note.at_ms,
                    user(format!("task-{}-{}", self.task.id, i + 1), text),
                ));
            }
        }
        history.extend(self.replies.iter().map(|m| (m.created_ms, self.reply(m))));
        history.sort_by_key(|(at, _)| *at);
        let skip = limit.map_or(0, |l| history.len().saturating_sub(l));
        history.into_iter().skip(skip).map(|(_, m)| m).collect()
    }

    /// A completed task's result: the last note someone other than the caller left (its
    /// thread and message notes are the caller's), else the agent's last reply.
    pub(super) fn artifact(&self) -> Option<Artifact> {
        if self.task.status != BoardStatus::Done {
            return None;
        }
        let text = self
            .task
            .notes
            .iter()
            .rev()
            .find(|n| !self.by_caller(n.by.as_ref()))
            .map(|n| n.text.clone())
            .or_else(|| self.replies.last().map(|m| m.body.to_string()))?;
        Some(Artifact {
            artifact_id: format!("task-{}-result", self.task.id),
            name: Some("result".to_owned()),
            description: Some(format!("The result of task #{}", self.task.id)),
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: None,
        })
    }

    /// The whole task.
    pub(super) fn task(&self, history: Option<usize>) -> Task {
        Task {
            id: self.task.id.to_string(),
            context_id: self.context(),
            status: self.status(),
            artifacts: self.artifact().map(|a| vec![a]),
            history: (history != Some(0)).then(|| self.history(history)),
            metadata: Some(HashMap::from([
                ("title".to_owned(), Value::String(self.task.title.clone())),
                (
                    "board_status".to_owned(),
                    Value::String(self.task.status.as_str().to_owned()),
                ),
            ])),
        }
    }
}

/// Whether a reply asks the caller something: its payload holds `"input_required": true`.
fn asks_for_input(mail: &Mail) -> bool {
    mail.payload
        .as_deref()
        .and_then(|p| p.get("input_required"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// A stored time as A2A writes it.
fn at(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default()
}

/// Whether A2A calls the state an interruption (the caller must act) or an end: where a
/// blocking send and a stream stop.
pub(super) fn settled(state: &TaskState) -> bool {
    state.is_terminal() || matches!(state, TaskState::InputRequired | TaskState::AuthRequired)
}

/// The text of a message's text parts, joined by blank lines, and its data parts.
pub(super) fn content(message: &Message) -> (String, Vec<Value>) {
    let mut text = Vec::new();
    let mut data = Vec::new();
    for part in &message.parts {
        match &part.content {
            a2a::PartContent::Text(t) => text.push(t.as_str()),
            a2a::PartContent::Data(d) => data.push(d.clone()),
            a2a::PartContent::Url(u) => text.push(u.as_str()),
            a2a::PartContent::Raw(_) => {}
        }
    }
    (text.join("\n\n"), data)
}
