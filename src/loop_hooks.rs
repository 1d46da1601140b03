//! What an agent's client is told at points of its own loop: Claude Code's hooks
//! (`guildhall hook`), answered by the running server.
//!
//! A model learns of mail only when it calls `check_inbox`, which it rarely does mid-task.
//! The client's hooks close that loop without polling:
//! - **session start**: who the agent is (role, parent), its unread count with the newest
//!   subjects, the tasks it holds;
//! - **each prompt and each tool result**: the mail that arrived since the agent was last
//!   told, urgent first, each message once: what was announced (or read) is never announced
//!   again, across server restarts (the agent's `announced` cursor, in the store);
//! - **stop**: for an agent of a role that keeps going (`[roles.X] keep_going = true`), a
//!   reason to go on while it has unread urgent mail or a claimed task still `in_progress`,
//!   at most [`LoopHooks::max_continuations`] times in a row and never while the client
//!   says a stop hook already continued it (`stop_hook_active`).
//!
//! The answer is what the client is to add to the model's context, or why it should go on;
//! `guildhall hook` renders it in the client's format.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::agents::{AgentId, Inbox, InboxQuery, Message, Priority};
use crate::runtime::Runtime;
use crate::tasks::TaskStatus;

/// Messages an announcement names; the rest are counted, with a pointer to `check_inbox`.
pub const NAMED: usize = 5;
/// New messages one announcement takes in at most (named or counted).
pub const TAKEN: usize = 200;
/// A body's first characters shown in an announcement.
pub const BODY_CHARS: usize = 200;
/// Tasks a session start names.
const TASKS_NAMED: usize = 10;

/// The point of the agent's loop a hook runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Point {
    /// A session began or resumed.
    SessionStart,
    /// A prompt was submitted.
    Prompt,
    /// A tool call returned.
    ToolResult,
    /// The agent (or one of its subagents) is about to stop.
    Stop,
}

/// One hook's question, as the client's hook command sends it to the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookEvent {
    /// Where in the loop.
    pub point: Point,
    /// The client's session (Claude Code's `session_id`), which continuations are counted
    /// by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The client says a stop hook already kept this turn going.
    #[serde(default)]
    pub stop_hook_active: bool,
}

/// What the client is to do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookAnswer {
    /// Text for the model's context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// At a stop: why the agent should go on instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_going: Option<String>,
}

/// The hooks' settings and the continuations granted so far.
#[derive(Debug)]
pub struct LoopHooks {
    /// Roles whose agents are kept going at a stop while work waits for them.
    keep_going: BTreeSet<String>,
    /// Continuations granted in a row, by agent and a hash of its client's session id (a
    /// session id is the client's to choose, of any length: only 8 bytes of it are kept);
    /// a stop let through resets it.
    granted: Mutex<HashMap<(AgentId, u64), u32>>,
}

impl Default for LoopHooks {
    fn default() -> Self {
        Self::new(BTreeSet::new())
    }
}

impl LoopHooks {
    /// Continuations in a row a session gets by default.
    pub const MAX_CONTINUATIONS: u32 = 3;
    /// Sessions whose continuations are remembered at once; past it the oldest count is
    /// forgotten (a session then gets its continuations anew, still bounded per turn).
    const SESSIONS: usize = 4096;

    /// Hooks that keep the agents of `keep_going` roles going at a stop.
    pub fn new(keep_going: BTreeSet<String>) -> Self {
        Self {
            keep_going,
            granted: Mutex::new(HashMap::new()),
        }
    }

    /// Answers `event` for `agent`.
    ///
    /// # Errors
    /// The agent is unknown, or its mailbox or the store failed: a message naming it.
    ///
    /// # Cancel safety
    /// Cancel safe as far as the agent's mail goes (it only reads); dropped after it moved
    /// the announced cursor, the messages it was to announce count as announced.
    pub async fn answer(
        &self,
        runtime: &Runtime,
        agent: &str,
        event: &HookEvent,
    ) -> Result<HookAnswer, String> {
        match event.point {
            Point::SessionStart => session_start(runtime, agent).await,
            Point::Prompt | Point::ToolResult => Ok(HookAnswer {
                context: announce(runtime, agent).await?,
                keep_going: None,
            }),
            Point::Stop => self.stop(runtime, agent, event).await,
        }
    }

    async fn stop(
        &self,
        runtime: &Runtime,
        agent: &str,
        event: &HookEvent,
    ) -> Result<HookAnswer, String> {
        let record = runtime
            .lookup_agent(agent)
            .ok_or_else(|| format!("no agent `{agent}`"))?;
        let key = (record.id.clone(), {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            event.session.hash(&mut hasher);
            hasher.finish()
        });
        let mut reasons = Vec::new();
        if self.keep_going.contains(&record.role) {
            let urgent = unread(runtime, agent, Priority::Urgent, TAKEN)
                .await?
                .messages;
            if !urgent.is_empty() {
                reasons.push(format!(
                    "{} unread urgent message(s) ({}): read them with check_inbox",
                    urgent.len(),
                    subjects(&urgent)
                ));
            }
            let working = held(runtime, agent, &[TaskStatus::InProgress]).await?;
            if !working.is_empty() {
                reasons.push(format!(
                    "task(s) you claimed still in_progress: {}; finish them, or release them with task_release",
                    working.join("; ")
                ));
            }
        }
        let mut granted = self.granted.lock().unwrap_or_else(PoisonError::into_inner);
        if reasons.is_empty() || event.stop_hook_active {
            granted.remove(&key);
            return Ok(HookAnswer::default());
        }
        if granted.len() >= Self::SESSIONS && !granted.contains_key(&key) {
            granted.clear();
        }
        let count = granted.entry(key.clone()).or_insert(0);
        if *count >= Self::MAX_CONTINUATIONS {
            granted.remove(&key);
            return Ok(HookAnswer::default());
        }
        *count += 1;
        Ok(HookAnswer {
            context: None,
            keep_going: Some(format!("Before stopping: {}.", reasons.join("; "))),
        })
    }
}

/// Who the agent is, its mail and its tasks; the unread mail counts as announced.
async fn session_start(runtime: &Runtime, agent: &str) -> Result<HookAnswer, String> {
    let record = runtime
        .lookup_agent(agent)
        .ok_or_else(|| format!("no agent `{agent}`"))?;
    let mut text = format!(
        "You are agent `{}` (role {}) in a guildhall swarm",
        record.id.as_str(),
        record.role
    );
    match &record.parent {
        Some(parent) => text.push_str(&format!(
            ", reporting to `{}`: send it your results with send_message.",
            parent.as_str()
        )),
        None => text.push('.'),
    }
    // One listing: the newest (most urgent first) and the unread total.
    let inbox = unread(runtime, agent, Priority::Low, TAKEN).await?;
    if inbox.unread == 0 {
        text.push_str("\nNo unread mail.");
    } else {
        text.push_str(&format!("\n{} unread message(s)", inbox.unread));
        text.push_str(&listing(&inbox.messages, inbox.unread));
        advance(runtime, agent, &inbox.messages).await?;
    }
    let tasks = held(runtime, agent, &[TaskStatus::Open, TaskStatus::InProgress]).await?;
    if !tasks.is_empty() {
        text.push_str(&format!("\nTasks you hold: {}.", tasks.join("; ")));
    }
    Ok(HookAnswer {
        context: Some(text),
        keep_going: None,
    })
}

/// The mail that arrived since the agent was last told, as context; none when nothing did.
async fn announce(runtime: &Runtime, agent: &str) -> Result<Option<String>, String> {
    let since = cursor(runtime, agent)?;
    let mailbox = runtime.agent(agent).map_err(|e| e.to_string())?;
    let inbox = mailbox
        .check_inbox(InboxQuery {
            limit: TAKEN,
            since,
            ..InboxQuery::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    if inbox.messages.is_empty() {
        return Ok(None);
    }
    let new = inbox.messages.len();
    let mut text = format!("New mail for you ({new})");
    text.push_str(&listing(&inbox.messages, new));
    if inbox.unread > new {
        text.push_str(&format!("\n{} unread in all.", inbox.unread));
    }
    advance(runtime, agent, &inbox.messages).await?;
    Ok(Some(text))
}

/// `messages` (most urgent first) as lines: the first [`NAMED`] with sender, subject and the
/// start of the body; a count of the rest of `of`; a pointer to `check_inbox`.
fn listing(messages: &[std::sync::Arc<Message>], of: usize) -> String {
    let mut text = String::from(":");
    for message in messages.iter().take(NAMED) {
        let urgency = message.priority.tag();
        let mut chars = message.body.chars();
        let body: String = chars.by_ref().take(BODY_CHARS).collect();
        let cut = if chars.next().is_some() { "…" } else { "" };
        text.push_str(&format!(
            "\n- {urgency}from `{}`: \"{}\" — {body}{cut} (id {})",
            message.from.as_str(),
            message.subject,
            message.id
        ));
    }
    let named = messages.len().min(NAMED);
    if of > named {
        text.push_str(&format!("\n… and {} more.", of - named));
    }
    text.push_str("\nRead them with check_inbox (read_message for one id).");
    text
}

/// The subjects of `messages`, quoted, comma-separated.
fn subjects(messages: &[std::sync::Arc<Message>]) -> String {
    messages
        .iter()
        .take(NAMED)
        .map(|m| format!("\"{}\"", m.subject))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The agent's unread messages at least `min` urgent, most urgent first, and its unread
/// total.
async fn unread(
    runtime: &Runtime,
    agent: &str,
    min: Priority,
    limit: usize,
) -> Result<Inbox, String> {
    let mailbox = runtime.agent(agent).map_err(|e| e.to_string())?;
    mailbox
        .check_inbox(InboxQuery {
            limit,
            min_priority: min,
            ..InboxQuery::default()
        })
        .await
        .map_err(|e| e.to_string())
}

/// The tasks `agent` holds (claimed, its lease live) in one of `statuses`, as `#id "title"
/// (status)`.
async fn held(
    runtime: &Runtime,
    agent: &str,
    statuses: &[TaskStatus],
) -> Result<Vec<String>, String> {
    let Some(tasks) = runtime.tasks() else {
        return Ok(Vec::new());
    };
    let held = tasks
        .held_by(agent, statuses, TASKS_NAMED)
        .await
        .map_err(|e| e.to_string())?;
    Ok(held
        .into_iter()
        .map(|t| format!("#{} \"{}\" ({})", t.id, t.title, t.status.as_str()))
        .collect())
}

/// The cursor of what the agent's client was told of.
const ANNOUNCED: &str = "announced";

/// The newest message id the agent was told of, if any.
fn cursor(runtime: &Runtime, agent: &str) -> Result<Option<Uuid>, String> {
    crate::agents::cursors::cursor(&*runtime.store(), agent, ANNOUNCED).map_err(|e| e.to_string())
}

/// Moves the agent's announced cursor to the newest of `told`, never back.
async fn advance(
    runtime: &Runtime,
    agent: &str,
    told: &[std::sync::Arc<Message>],
) -> Result<(), String> {
    let Some(newest) = told.iter().map(|m| m.id).max() else {
        return Ok(());
    };
    crate::agents::cursors::advance_cursor(&*runtime.store(), agent, ANNOUNCED, newest)
        .await
        .map_err(|e| e.to_string())
}
