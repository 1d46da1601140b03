//! A proxied tool call the server runs as a task, followed to its end inside the call.
//!
//! Two eras of MCP tasks reach a proxy:
//! - **The tasks extension** (`io.modelcontextprotocol/tasks`, SEP-2663), which guildhall
//!   declares to every server: the server may answer any `tools/call` with a task
//!   (`CreateTaskResult`); guildhall polls `tasks/get` at the interval the server suggests
//!   until the task ends, whose result is inlined.
//! - **Task augmentation** (2025-11-25, SEP-1686): a tool whose `execution.taskSupport` is
//!   `required` refuses a plain call. rmcp's tool type does not carry `execution`, so
//!   guildhall learns it from that refusal (`-32601`, "requires task augmentation"), which
//!   comes before the tool ran, and calls it again with `task`; the tool is called that way
//!   from then on. The result is read with `tasks/result`, which the server answers when
//!   the task ends.
//!
//! Either way the caller sees one call with the server's result, under the call's deadline
//! and cancellation: a call cancelled (its deadline, its caller gone, a guildhall task's
//! `tasks/cancel`) sends `tasks/cancel` to the server. A connection lost meanwhile ends the
//! call `crashed`, as any call. A call long enough becomes a task of guildhall's own for a
//! client that declared the extension (`mcp::tasks`), as every long call does.

use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::CallContext;
use rmcp::model::{
    CallToolResult, CancelTaskParams, CancelTaskRequest, ClientRequest, CustomRequest,
    GetTaskParams, GetTaskRequest, ServerResult, Task, TaskPayload,
};
use serde_json::{Map, Value, json};

use super::forward::{ProxyError, gone, lost, send};
use super::link::{Link, Phase};

/// The shortest and longest wait between two `tasks/get`, whatever the server suggests.
const POLL_BOUNDS: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(5));
/// The wait between two `tasks/get` when the server suggests none.
const POLL_DEFAULT: Duration = Duration::from_millis(500);
/// How long the server has to answer `tasks/cancel`.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// Whether a server's refusal of a plain call says the tool must be called as a task
/// (2025-11-25: `-32601`, "requires task augmentation"; the TypeScript SDK sends it as an
/// `isError` result whose text carries the code).
pub(crate) fn needs_task(refusal: &str) -> bool {
    let refusal = refusal.to_ascii_lowercase();
    refusal.contains("task augmentation")
        || (refusal.contains("-32601") && refusal.contains("task"))
}

/// Follows `task`, which the server created for a call (the tasks extension), until it
/// ends: the result it inlines.
pub(crate) async fn follow(
    link: &Arc<Link>,
    generation: u64,
    task: Task,
    ctx: &CallContext,
    grace: Duration,
) -> Result<ServerResult, ProxyError> {
    link.task_followed();
    let mut cancel = CancelUpstream::new(link, generation, &task.task_id, Era::Extension);
    let mut every = poll_interval(task.poll_interval_ms, POLL_DEFAULT);
    let mut phase = link.watch();
    loop {
        tokio::select! {
            biased;
            () = ctx.cancellation().cancelled() => return Err(ProxyError::Cancelled),
            reason = gone(&mut phase, generation) => {
                cancel.disarm();
                return Err(lost(link, reason));
            }
            () = tokio::time::sleep(every) => {}
        }
        let get = GetTaskRequest::new(GetTaskParams::new(task.task_id.clone()));
        let (answer, on) = send(link, ClientRequest::GetTaskRequest(get), ctx, grace).await?;
        if on != generation {
            cancel.disarm();
            return Err(lost(link, "the server restarted".into()));
        }
        let ServerResult::GetTaskResult(got) = answer else {
            return Err(ProxyError::Remote(format!(
                "server `{}` answered `tasks/get` with something else",
                link.server
            )));
        };
        every = poll_interval(got.task.task.poll_interval_ms, every);
        match got.task.payload {
            TaskPayload::Working => {}
            TaskPayload::InputRequired { .. } => {
                return Err(ProxyError::Remote(format!(
                    "server `{}` asked for input inside a task, which guildhall does not relay; the task was cancelled",
                    link.server
                )));
            }
            TaskPayload::Completed { result } => {
                cancel.disarm();
                return serde_json::from_value::<CallToolResult>(Value::Object(result))
                    .map(ServerResult::CallToolResult)
                    .map_err(|err| {
                        ProxyError::Remote(format!(
                            "server `{}` ended its task with a result that is not a tool's: {err}",
                            link.server
                        ))
                    });
            }
            TaskPayload::Failed { error } => {
                cancel.disarm();
                let message = error.get("message").and_then(Value::as_str);
                return Err(ProxyError::Remote(
                    message.unwrap_or("its task failed").to_owned(),
                ));
            }
            TaskPayload::Cancelled => {
                cancel.disarm();
                return Err(ProxyError::Remote(format!(
                    "server `{}` cancelled the task",
                    link.server
                )));
            }
            // A status of a later revision: polled on, within the call's deadline.
            _ => {}
        }
    }
}

/// Calls `tool` with `arguments` as a task (2025-11-25 task augmentation), kept for at most
/// the call's deadline, and waits for its result with `tasks/result`.
pub(crate) async fn augmented(
    link: &Arc<Link>,
    tool: &str,
    arguments: Map<String, Value>,
    ctx: &CallContext,
    grace: Duration,
) -> Result<ServerResult, ProxyError> {
    let ttl = ctx
        .deadline()
        .saturating_duration_since(tokio::time::Instant::now());
    let call = json!({
        "name": tool,
        "arguments": arguments,
        "task": { "ttl": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX) },
    });
    let request = ClientRequest::CustomRequest(CustomRequest::new("tools/call", Some(call)));
    let (created, generation) = send(link, request, ctx, grace).await?;
    let task_id = match created {
        ServerResult::CustomResult(created) => created
            .0
            .pointer("/task/taskId")
            .and_then(Value::as_str)
            .map(str::to_owned),
        // It ran the call at once after all.
        answer @ ServerResult::CallToolResult(_) => return Ok(answer),
        _ => None,
    };
    let Some(task_id) = task_id else {
        return Err(ProxyError::Remote(format!(
            "server `{}` answered a call made as a task without a task",
            link.server
        )));
    };
    link.task_followed();
    let mut cancel = CancelUpstream::new(link, generation, &task_id, Era::Augmented);
    let result = CustomRequest::new("tasks/result", Some(json!({ "taskId": task_id })));
    let answer = send(link, ClientRequest::CustomRequest(result), ctx, grace).await;
    match answer {
        Ok((answer, on)) if on == generation => {
            cancel.disarm();
            Ok(answer)
        }
        Ok(_) => {
            cancel.disarm();
            Err(lost(link, "the server restarted".into()))
        }
        Err(err @ (ProxyError::Remote(_) | ProxyError::Lost { .. })) => {
            cancel.disarm();
            Err(err)
        }
        Err(err) => Err(err),
    }
}

/// The suggested interval within [`POLL_BOUNDS`], or `before` when there is none.
fn poll_interval(suggested: Option<u64>, before: Duration) -> Duration {
    suggested
        .map_or(before, Duration::from_millis)
        .clamp(POLL_BOUNDS.0, POLL_BOUNDS.1)
}

/// Which protocol a task was created in, for the form of its `tasks/cancel`.
#[derive(Clone, Copy)]
enum Era {
    Extension,
    Augmented,
}

/// A task on the server that is cancelled there when this is dropped armed: the call ended
/// before the task did (cancelled, or its future dropped at a deadline).
struct CancelUpstream {
    link: Option<Arc<Link>>,
    generation: u64,
    task_id: String,
    era: Era,
}

impl CancelUpstream {
    fn new(link: &Arc<Link>, generation: u64, task_id: &str, era: Era) -> Self {
        Self {
            link: Some(Arc::clone(link)),
            generation,
            task_id: task_id.to_owned(),
            era,
        }
    }

    /// The task ended on the server (or went with its connection): nothing to cancel.
    fn disarm(&mut self) {
        self.link = None;
    }
}

impl Drop for CancelUpstream {
    fn drop(&mut self) {
        let Some(link) = self.link.take() else { return };
        let Phase::Up {
            peer, generation, ..
        } = link.phase()
        else {
            return;
        };
        if generation != self.generation {
            return;
        }
        // Told from inside a runtime only: a future dropped with its runtime has no server
        // left to tell either.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let request = match self.era {
            Era::Extension => ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
                CancelTaskParams::new(std::mem::take(&mut self.task_id)),
            )),
            Era::Augmented => ClientRequest::CustomRequest(CustomRequest::new(
                "tasks/cancel",
                Some(json!({ "taskId": std::mem::take(&mut self.task_id) })),
            )),
        };
        runtime.spawn(async move {
            let answered = tokio::time::timeout(CANCEL_WAIT, peer.send_request(request)).await;
            tracing::debug!(server = %link.server, answered = ?answered.map(|a| a.is_ok()), "task cancelled on the server");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_want_of_a_task_is_told_from_other_errors() {
        // The TypeScript SDK's, as an `isError` text, and the spec's wording.
        assert!(needs_task(
            "MCP error -32601: Tool simulate-research-query requires task augmentation (taskSupport: 'required')"
        ));
        assert!(needs_task("Tool x requires Task Augmentation"));
        assert!(!needs_task("MCP error -32601: Method not found"));
        assert!(!needs_task("the task list is empty"));
    }

    #[test]
    fn polling_keeps_within_its_bounds() {
        assert_eq!(poll_interval(Some(1), POLL_DEFAULT), POLL_BOUNDS.0);
        assert_eq!(poll_interval(Some(600_000), POLL_DEFAULT), POLL_BOUNDS.1);
        assert_eq!(
            poll_interval(None, Duration::from_millis(700)),
            Duration::from_millis(700)
        );
    }
}
