//! A remote A2A caller: the agent of this swarm it acts as, and what it may see of the
//! board (the tasks it created, and the replies it received in their threads).

use std::sync::Arc;

use a2a::{A2AError, Task};
use a2a_server::ServiceParams;
use serde_json::Value;

use super::mirror::{self, View};
use crate::agents::{Agent, AgentSpec, InboxQuery, Message as Mail, TOKEN_HEADER};
use crate::changes::{Subject, Watch};
use crate::mcp::AGENT_HEADER;
use crate::runtime::{Runtime, WeakRuntime};
use crate::tasks::{Task as BoardTask, TaskId};
use crate::{CallError, CallOptions};

/// The caller a request that names none acts as.
pub const ANONYMOUS: &str = "a2a-remote";
/// The role remote callers are registered in: rules can name it.
pub const ROLE: &str = "a2a";
/// Replies of one thread read at most: a longer conversation shows its latest.
const MAX_REPLIES: usize = 200;

/// Who is calling: the agent the `Guildhall-Agent` header names (proven by its token when
/// the config gives one), registered in role `a2a` when new; else [`ANONYMOUS`].
pub(super) async fn identify(
    runtime: &WeakRuntime,
    params: &ServiceParams,
) -> Result<Caller, A2AError> {
    let runtime = runtime
        .upgrade()
        .ok_or_else(|| A2AError::internal("the server is stopping"))?;
    let header = |name: &str| params.get(name).and_then(|v| v.first()).map(String::as_str);
    let id = header(AGENT_HEADER).unwrap_or(ANONYMOUS);
    runtime
        .credentials()
        .check(id, header(TOKEN_HEADER))
        .map_err(|err| A2AError::new(-32001, err.to_string()))?;
    let agent = match runtime.agent(id) {
        Ok(agent) => agent,
        Err(_) => runtime
            .register_agent(AgentSpec::new(id, ROLE))
            .await
            .map_err(|err| {
                A2AError::invalid_request(format!(
                    "cannot act as `{id}` (named by `{AGENT_HEADER}`): {err}"
                ))
            })?,
    };
    Ok(Caller { runtime, agent })
}

/// A remote caller, as the agent it acts as.
pub(super) struct Caller {
    pub(super) runtime: Runtime,
    agent: Agent,
}

impl Caller {
    pub(super) fn id(&self) -> &str {
        self.agent.id().as_str()
    }

    fn options(&self) -> CallOptions {
        CallOptions::new().as_agent(&self.agent)
    }

    /// Calls `tool` as this caller: governed and audited as its own call.
    pub(super) async fn call(&self, tool: &str, args: Value) -> Result<Value, A2AError> {
        self.runtime
            .call_json(tool, args, self.options())
            .await
            .map_err(|err| refused(tool, &err))
    }

    /// The board task `id`, when this caller created it (another's is "not found": a caller
    /// learns nothing of tasks it did not make).
    pub(super) async fn task(&self, id: &str) -> Result<BoardTask, A2AError> {
        let not_found = || A2AError::task_not_found(id);
        let number: TaskId = id.parse().map_err(|_| not_found())?;
        let tasks = self.runtime.tasks().ok_or_else(no_board)?;
        let task = tasks.get(number).await.map_err(|_| not_found())?;
        let mine = mirror::label(&task, mirror::CALLER) == Some(self.id())
            && task.labels.iter().any(|l| l == mirror::LABEL);
        if mine { Ok(task) } else { Err(not_found()) }
    }

    /// The replies this caller received in the task's thread, oldest first.
    pub(super) async fn replies(&self, task: &BoardTask) -> Result<Vec<Arc<Mail>>, A2AError> {
        let Some(thread) = mirror::thread(task) else {
            return Ok(Vec::new());
        };
        let inbox = self
            .agent
            .check_inbox(InboxQuery {
                unread_only: false,
                limit: MAX_REPLIES,
                thread: Some(thread),
                arrival_order: true,
                ..InboxQuery::default()
            })
            .await
            .map_err(|err| A2AError::internal(format!("the caller's inbox: {err}")))?;
        let mut replies = inbox.messages;
        replies.sort_by_key(|m| m.id);
        Ok(replies)
    }

    /// The A2A view of task `id`.
    pub(super) async fn view(&self, id: &str, history: Option<usize>) -> Result<Task, A2AError> {
        let task = self.task(id).await?;
        let replies = self.replies(&task).await?;
        Ok(View {
            task: &task,
            caller: self.id(),
            replies: &replies,
        }
        .task(history))
    }

    /// Watches what changes the task's view: the task, and the caller's inbox.
    pub(super) fn watch(&self, id: TaskId) -> (Watch, Watch) {
        let changes = self.runtime.changes();
        (
            changes.watch(Subject::Task(id)),
            changes.watch(Subject::Inbox(Arc::from(self.id()))),
        )
    }
}

/// A tool call refused or failed, as A2A tells it: the caller's fault (bad input, a rule,
/// a rate limit) is "invalid params", the server's is "internal".
pub(super) fn refused(tool: &str, err: &CallError) -> A2AError {
    let text = format!("{tool}: {}", guildhall_actors::ErrorChain(err));
    match err {
        CallError::Crashed { .. }
        | CallError::Timeout { .. }
        | CallError::CircuitOpen { .. }
        | CallError::Unavailable { .. }
        | CallError::InvalidOutput { .. }
        | CallError::UnknownTool { .. } => A2AError::internal(text),
        _ => A2AError::invalid_params(text),
    }
}

pub(super) fn no_board() -> A2AError {
    A2AError::internal("this server has no task board")
}
