//! Long calls as MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663).
//!
//! When a client declares the extension, a call that may outlast a client's request timeout
//! (a tool whose deadline is [`LONG_CALL`] or more: `ask_human`, `confirm`, a waiting
//! `check_inbox`, `bash`, `web_fetch`, a proxied server's tool) and is still running after
//! [`GRACE`] becomes a task: the client gets a task id at once and polls `tasks/get`, which
//! inlines the result when it ends. A faster call answers as usual (the spec allows that
//! shortcut).
//!
//! A task is the same supervised call: `tasks/cancel` drops it, which cancels the call in its
//! tool (and kills a tool that ignores that, as a deadline does); a crash or a deadline ends
//! the task `failed` with the error's kind and message; a tool's own error is a `completed`
//! task whose result has `isError`. Tasks live in the server, not in the connection: a
//! client that disconnects and comes back as the same agent reads its result by id until
//! [`TTL`] after it was created. Each task belongs to the agent that started it; another
//! agent's id is an unknown task. An agent has at most [`MAX_RUNNING`] tasks running.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, DetailedTask, InputResponses, Task};
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture, TaskManager, TaskOptions};

/// Calls whose tool may run this long or longer may become tasks.
pub const LONG_CALL: Duration = Duration::from_secs(60);
/// How long a long call may run before it becomes a task (a quicker one answers directly).
pub const GRACE: Duration = Duration::from_millis(250);
/// How long a task and its result are kept after it was created.
pub const TTL: Duration = Duration::from_secs(3600);
/// The polling interval suggested to clients.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Tasks one agent may have running at once.
pub const MAX_RUNNING: usize = 64;

/// The tasks of one server (all its connections), each with the agent that owns it.
#[derive(Default)]
pub(crate) struct CallTasks {
    manager: TaskManager,
    /// Task id and owner (`None`: a connection with no agent), oldest first.
    owners: Mutex<Vec<(String, Option<Arc<str>>)>>,
}

impl CallTasks {
    /// Starts `make_future` as a task owned by `owner`; its seed state for a
    /// `CreateTaskResult`. The task can be read with [`get`](Self::get) before this returns.
    ///
    /// # Errors
    /// `owner` already has [`MAX_RUNNING`] tasks running.
    pub(crate) fn spawn(
        &self,
        owner: Option<Arc<str>>,
        make_future: impl FnOnce(TaskContext) -> TaskFuture,
    ) -> Result<Task, McpError> {
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget tasks the manager has dropped (past their TTL), and count the owner's.
        owners.retain(|(id, _)| self.manager.get_task(id).is_ok());
        let running = owners
            .iter()
            .filter(|(id, by)| *by == owner && self.is_running(id))
            .count();
        if running >= MAX_RUNNING {
            return Err(McpError::invalid_request(
                format!(
                    "{} already has {MAX_RUNNING} tasks running: wait for one to end, or \
                     cancel one with tasks/cancel",
                    owner.as_deref().unwrap_or("this connection")
                ),
                None,
            ));
        }
        let options = TaskOptions::new()
            .with_ttl_ms(millis(TTL))
            .with_poll_interval_ms(millis(POLL_INTERVAL));
        let task = self.manager.spawn(options, make_future);
        owners.push((task.task_id.clone(), owner));
        Ok(task)
    }

    /// `tasks/get` for `caller`.
    ///
    /// # Errors
    /// -32602 for an id that is unknown, expired, or another agent's.
    pub(crate) fn get(&self, caller: Option<&str>, id: &str) -> Result<DetailedTask, McpError> {
        self.check_owner(caller, id)?;
        self.manager.get_task(id)
    }

    /// `tasks/update` for `caller`: answers to the task's input requests.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    pub(crate) fn update(
        &self,
        caller: Option<&str>,
        id: &str,
        responses: InputResponses,
    ) -> Result<(), McpError> {
        self.check_owner(caller, id)?;
        self.manager.update_task(id, responses)
    }

    /// `tasks/cancel` for `caller`: the call is dropped, which cancels it in its tool.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    pub(crate) fn cancel(&self, caller: Option<&str>, id: &str) -> Result<(), McpError> {
        self.check_owner(caller, id)?;
        self.manager.cancel_task(id)
    }

    fn is_running(&self, id: &str) -> bool {
        self.manager
            .get_task(id)
            .is_ok_and(|task| !task.status().is_terminal())
    }

    fn check_owner(&self, caller: Option<&str>, id: &str) -> Result<(), McpError> {
        let owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        let owned = owners
            .iter()
            .any(|(task, owner)| task == id && owner.as_deref() == caller);
        if owned {
            Ok(())
        } else {
            // The same answer as for an id that never existed: another agent's tasks are
            // not visible, not even as existing.
            Err(McpError::invalid_params(
                format!("unknown task `{id}`"),
                None,
            ))
        }
    }
}

impl Drop for CallTasks {
    fn drop(&mut self) {
        // The server is going: its calls go with it.
        self.manager.shutdown();
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs `call` as a task body: dropped (and so cancelled in its tool) when the task is
/// cancelled.
pub(crate) async fn cancellable(
    context: TaskContext,
    call: impl Future<Output = Result<CallToolResult, TaskExit>>,
) -> Result<CallToolResult, TaskExit> {
    tokio::select! {
        biased;
        () = context.cancelled() => Err(TaskExit::Cancelled),
        outcome = call => outcome,
    }
}
