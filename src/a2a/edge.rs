//! The A2A server side: one [`RequestHandler`] per exposed agent or role, mounted through the
//! official crate's JSON-RPC and REST bindings.

use std::sync::Arc;
use std::time::Duration;

use a2a::{
    A2AError, AgentCard, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest, GetTaskPushNotificationConfigRequest, GetTaskRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    ListTasksRequest, ListTasksResponse, SendMessageRequest, SendMessageResponse, StreamResponse,
    SubscribeToTaskRequest, Task, TaskPushNotificationConfig,
};
use a2a_server::{RequestHandler, ServiceParams};
use axum::Json;
use axum::routing::get;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::caller::{Caller, identify, no_board};
use super::config::{
    A2aConfig, DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_CALLER, DEFAULT_WAIT, Target,
};
use super::follow::{Follow, Until};
use super::mirror::{self, View};
use super::push::Push;
use super::questions::A2aQuestions;
use super::waits::{Place, Waits};
use crate::runtime::{Runtime, WeakRuntime};
use crate::tasks::{TaskId, TaskQuery, TaskStatus as BoardStatus};

/// A request's `historyLength` (negative: none).
fn history_len(length: i32) -> usize {
    usize::try_from(length).unwrap_or(0)
}

/// Tasks one `ListTasks` looks at (each view reads the caller's replies) at most: a page
/// filtered by state ends there, its token where the next one starts.
const MAX_VIEWED: usize = 500;

/// Tasks one `ListTasks` page holds at most.
const MAX_PAGE: usize = 100;
/// A caller's tasks one `ListTasks` looks through at most, newest first (the total counts
/// them all).
const MAX_SCANNED: usize = 10_000;

/// The routes of every exposed target, for a server reached at `base`
/// (`http://127.0.0.1:8080`). `secured`: the server asks for a bearer token. `stop` ends
/// every stream and push delivery (the server stopping: its graceful shutdown would wait
/// on them).
///
/// # Errors
/// A target that cannot be exposed.
pub fn routes(
    runtime: &Runtime,
    config: &A2aConfig,
    base: &str,
    secured: bool,
    stop: CancellationToken,
) -> Result<axum::Router, String> {
    let targets = config.targets()?;
    if let Some(humans) = runtime.humans() {
        humans.route_task_questions(Arc::new(A2aQuestions(runtime.downgrade())));
    }
    let shared = Arc::new(Shared {
        base: base.trim_end_matches('/').to_owned(),
        wait: config.wait.unwrap_or(DEFAULT_WAIT),
        waits: Waits::new(
            config.max_streams.unwrap_or(DEFAULT_MAX_STREAMS),
            config
                .max_streams_per_caller
                .unwrap_or(DEFAULT_MAX_STREAMS_PER_CALLER),
        ),
        description: config.description.clone(),
        secured,
        push: Push::new(config.push_private, stop.clone()),
        stop,
    });
    let mut router = axum::Router::new();
    for (i, target) in targets.into_iter().enumerate() {
        let edge = Arc::new(Edge {
            runtime: runtime.downgrade(),
            target,
            shared: Arc::clone(&shared),
        });
        let path = edge.target.path();
        let card = {
            let edge = Arc::clone(&edge);
            move || {
                let edge = Arc::clone(&edge);
                async move { Json(edge.card()) }
            }
        };
        if i == 0 {
            router = router.route(a2a_server::WELL_KNOWN_AGENT_CARD_PATH, get(card.clone()));
        }
        router = router
            .route(
                &format!("{path}{}", a2a_server::WELL_KNOWN_AGENT_CARD_PATH),
                get(card),
            )
            .nest(
                &format!("{path}/rest"),
                a2a_server::rest::rest_router(Arc::clone(&edge)),
            )
            .nest(&path, a2a_server::jsonrpc::jsonrpc_router(edge));
    }
    Ok(router)
}

/// What every target's handler shares.
struct Shared {
    base: String,
    wait: Duration,
    waits: Waits,
    description: Option<String>,
    secured: bool,
    push: Push,
    stop: CancellationToken,
}

/// One exposed agent or role.
struct Edge {
    runtime: WeakRuntime,
    target: Target,
    shared: Arc<Shared>,
}

impl Edge {
    async fn caller(&self, params: &ServiceParams) -> Result<Caller, A2AError> {
        identify(&self.runtime, params).await
    }

    /// Task `id`'s number, when the caller may see it.
    async fn own_task(&self, params: &ServiceParams, id: &str) -> Result<TaskId, A2AError> {
        let caller = self.caller(params).await?;
        Ok(caller.task(id).await?.id)
    }

    fn card(&self) -> AgentCard {
        let runtime = self.runtime.upgrade();
        super::card::card(
            runtime.as_ref(),
            &self.target,
            &format!("{}{}", self.shared.base, self.target.path()),
            self.shared.description.as_deref(),
            self.shared.secured,
        )
    }

    /// Sends `request` and answers with the task as it stands, after waiting (when asked to)
    /// until it ends, asks, or the wait runs out.
    async fn send(
        &self,
        params: &ServiceParams,
        caller: &Caller,
        request: SendMessageRequest,
    ) -> Result<(Task, TaskId), A2AError> {
        let message = &request.message;
        let (text, data) = mirror::content(message);
        if text.trim().is_empty() && data.is_empty() {
            return Err(A2AError::invalid_params(
                "the message has no text or data part: guildhall carries text and JSON data \
                 (file parts are not carried)",
            ));
        }
        let id = match &message.task_id {
            Some(id) if !id.is_empty() => {
                self.continue_task(caller, id, &message.message_id, &text, &data)
                    .await?
            }
            _ => self.start_task(caller, &request, &text, data).await?,
        };
        let configuration = request.configuration;
        let history = configuration
            .as_ref()
            .and_then(|c| c.history_length)
            .map(history_len);
        let task = caller.view(&id.to_string(), history).await?;
        if let Some(hook) = configuration.and_then(|c| c.task_push_notification_config) {
            let follower = identify(&self.runtime, params).await?;
            self.shared.push.add(follower, &task, hook)?;
        }
        Ok((task, id))
    }

    /// A new task on the board, assigned to the target, and the message mailed to it.
    async fn start_task(
        &self,
        caller: &Caller,
        request: &SendMessageRequest,
        text: &str,
        data: Vec<Value>,
    ) -> Result<TaskId, A2AError> {
        let message = &request.message;
        let message_label = format!("{}{}", mirror::MESSAGE, message.message_id);
        // A retried send (same message id) finds the task its first try made.
        if let Some(existing) = self.made_by(caller, &message_label).await? {
            return Ok(existing);
        }
        let context = message
            .context_id
            .clone()
            .filter(|c| !c.is_empty())
            .unwrap_or_else(a2a::new_context_id);
        let title: String = text
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("A2A request")
            .chars()
            .take(120)
            .collect();
        let address = self.target.address();
        let created = caller
            .call(
                "task_create",
                json!({
                    "title": title,
                    "description": text,
                    "assignee": address,
                    "labels": [
                        mirror::LABEL,
                        format!("{}{}", mirror::CALLER, caller.id()),
                        format!("{}{context}", mirror::CONTEXT),
                        message_label,
                    ],
                }),
            )
            .await?;
        let id = created
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| A2AError::internal("task_create answered no id"))?;
        match self
            .deliver(
                caller,
                id,
                &title,
                text,
                data,
                &context,
                &message.message_id,
            )
            .await
        {
            Ok(()) => Ok(id),
            Err(err) => {
                // Nobody heard of it: the task would wait for nothing.
                let _ = caller
                    .call(
                        "task_update",
                        json!({ "id": id, "status": BoardStatus::Cancelled,
                                "note": format!("Not delivered: {}", err.message) }),
                    )
                    .await;
                Err(err)
            }
        }
    }

    /// Mails task `id`'s first message to the target, and notes its thread on the task.
    #[allow(clippy::too_many_arguments)]
    async fn deliver(
        &self,
        caller: &Caller,
        id: TaskId,
        title: &str,
        text: &str,
        data: Vec<Value>,
        context: &str,
        message_id: &str,
    ) -> Result<(), A2AError> {
        let address = self.target.address();
        let mut payload = json!({ "a2a": { "task": id, "context": context } });
        if !data.is_empty() {
            payload["data"] = Value::Array(data);
        }
        let sent = caller
            .call(
                "send_message",
                json!({
                    "to": address,
                    "subject": format!("A2A task #{id}: {title}"),
                    "body": format!(
                        "{text}\n\n(From the A2A caller `{caller}`, as task #{id}. Reply in \
                         this thread; a reply whose payload holds \"input_required\": true asks \
                         the caller a question. When done, set the task done with a note: the \
                         note is the result the caller receives.)",
                        caller = caller.id(),
                    ),
                    "payload": payload,
                    "request_id": format!("a2a:{message_id}"),
                }),
            )
            .await?;
        let thread = sent
            .get("thread")
            .and_then(Value::as_str)
            .ok_or_else(|| A2AError::internal("send_message answered no thread"))?;
        caller
            .call(
                "task_update",
                json!({ "id": id, "note": format!("{}{thread}", mirror::THREAD_NOTE) }),
            )
            .await?;
        Ok(())
    }

    /// The task this caller made from the message labelled `label`, if any.
    async fn made_by(&self, caller: &Caller, label: &str) -> Result<Option<TaskId>, A2AError> {
        let tasks = caller.runtime.tasks().ok_or_else(no_board)?;
        let (found, _) = tasks
            .list(TaskQuery {
                label: Some(label.to_owned()),
                limit: 10,
                ..TaskQuery::default()
            })
            .await
            .map_err(|err| A2AError::internal(err.to_string()))?;
        Ok(found
            .iter()
            .find(|t| mirror::label(t, mirror::CALLER) == Some(caller.id()))
            .map(|t| t.id))
    }

    /// The caller's next message in a task: a note on it, and a reply in its thread to
    /// whoever holds it (the target while nobody does).
    async fn continue_task(
        &self,
        caller: &Caller,
        id: &str,
        message_id: &str,
        text: &str,
        data: &[Value],
    ) -> Result<TaskId, A2AError> {
        let task = caller.task(id).await?;
        if task.status.is_ended() {
            return Err(A2AError::new(
                -32004,
                format!(
                    "task {id} is {}: it takes no more messages; send one without a task id \
                     to start another",
                    task.status
                ),
            ));
        }
        caller
            .call(
                "task_update",
                json!({ "id": task.id, "note": format!("{}{text}", mirror::MESSAGE_NOTE) }),
            )
            .await?;
        let to = task
            .lease
            .as_ref()
            .map_or_else(|| self.target.address(), |l| l.holder.to_string());
        let mut args = json!({
            "to": to,
            "subject": format!("A2A task #{}: {}", task.id, task.title),
            "body": text,
            "payload": { "a2a": { "task": task.id }, "data": data },
            "request_id": format!("a2a:{message_id}"),
        });
        // A reply must answer mail in the sender's own mailbox: the agent's latest reply.
        // Before any, the message starts a thread of its own (the task's notes hold it too).
        if let Some(last) = caller.replies(&task).await?.last() {
            args["reply_to"] = Value::String(last.id.to_string());
        }
        caller.call("send_message", args).await?;
        Ok(task.id)
    }

    /// Waits until task `id` ends or asks, or `wait` passes; then its view.
    async fn settle(
        &self,
        caller: &Caller,
        id: TaskId,
        wait: Duration,
        history: Option<usize>,
    ) -> Result<Task, A2AError> {
        let (mut task_changed, mut inbox_changed) = caller.watch(id);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let view = caller.view(&id.to_string(), history).await?;
            if mirror::settled(&view.status.state) {
                return Ok(view);
            }
            tokio::select! {
                () = task_changed.changed() => {}
                () = inbox_changed.changed() => {}
                () = tokio::time::sleep_until(deadline) => return caller.view(&id.to_string(), history).await,
                () = self.shared.stop.cancelled() => return caller.view(&id.to_string(), history).await,
            }
        }
    }

    /// A stream of the changes of the task `first` shows, from it, until it ends or asks.
    fn stream(
        &self,
        caller: Caller,
        first: &Task,
        place: Place,
    ) -> BoxStream<'static, Result<StreamResponse, A2AError>> {
        let follow = Follow::new(
            caller,
            first,
            true,
            Until::Settled,
            self.shared.stop.clone(),
        );
        Box::pin(futures::stream::unfold(
            (follow, place),
            |(mut follow, place)| async move {
                let event = follow.next().await?;
                Some((event, (follow, place)))
            },
        ))
    }
}

#[async_trait::async_trait]
impl RequestHandler for Edge {
    async fn send_message(
        &self,
        params: &ServiceParams,
        request: SendMessageRequest,
    ) -> Result<SendMessageResponse, A2AError> {
        let caller = self.caller(params).await?;
        let immediately = request
            .configuration
            .as_ref()
            .and_then(|c| c.return_immediately)
            .unwrap_or(false);
        let history = request
            .configuration
            .as_ref()
            .and_then(|c| c.history_length)
            .map(history_len);
        let (task, id) = self.send(params, &caller, request).await?;
        if immediately || mirror::settled(&task.status.state) {
            return Ok(SendMessageResponse::Task(task));
        }
        // A blocking send waits in a place like a stream's; with none free it answers at
        // once, as the task stands (the caller polls), rather than failing a send made.
        let Ok(_place) = self.shared.waits.take(caller.id()) else {
            return Ok(SendMessageResponse::Task(task));
        };
        let task = self.settle(&caller, id, self.shared.wait, history).await?;
        Ok(SendMessageResponse::Task(task))
    }

    async fn send_streaming_message(
        &self,
        params: &ServiceParams,
        request: SendMessageRequest,
    ) -> Result<BoxStream<'static, Result<StreamResponse, A2AError>>, A2AError> {
        let caller = self.caller(params).await?;
        let place = self.shared.waits.take(caller.id())?;
        let (task, _) = self.send(params, &caller, request).await?;
        Ok(self.stream(caller, &task, place))
    }

    async fn get_task(
        &self,
        params: &ServiceParams,
        request: GetTaskRequest,
    ) -> Result<Task, A2AError> {
        let caller = self.caller(params).await?;
        let history = request.history_length.map(history_len);
        caller.view(&request.id, history).await
    }

    async fn list_tasks(
        &self,
        params: &ServiceParams,
        request: ListTasksRequest,
    ) -> Result<ListTasksResponse, A2AError> {
        let caller = self.caller(params).await?;
        let tasks = caller.runtime.tasks().ok_or_else(no_board)?;
        let page = request
            .page_size
            .map_or(50, |s| usize::try_from(s).unwrap_or(1))
            .clamp(1, MAX_PAGE);
        // The page token is the id the previous page ended before (newest first).
        let before: Option<TaskId> = match request.page_token.as_deref() {
            None | Some("") => None,
            Some(token) => Some(token.parse().map_err(|_| {
                A2AError::invalid_params(format!(
                    "page token `{token}` is not one this server gave"
                ))
            })?),
        };
        let (mine, total) = tasks
            .list(TaskQuery {
                label: Some(format!("{}{}", mirror::CALLER, caller.id())),
                newest_first: true,
                limit: MAX_SCANNED,
                ..TaskQuery::default()
            })
            .await
            .map_err(|err| A2AError::internal(err.to_string()))?;
        let history = request.history_length.map(history_len).or(Some(0));
        let mut out = Vec::new();
        let mut next = String::new();
        for (viewed, task) in mine
            .iter()
            .filter(|t| before.is_none_or(|b| t.id < b))
            .filter(|t| {
                request
                    .context_id
                    .as_deref()
                    .is_none_or(|c| mirror::label(t, mirror::CONTEXT) == Some(c))
            })
            .enumerate()
        {
            if out.len() == page {
                next = out.last().map(|t: &Task| t.id.clone()).unwrap_or_default();
                break;
            }
            if viewed == MAX_VIEWED {
                // The tasks before this one come on the next page.
                next = (task.id + 1).to_string();
                break;
            }
            let replies = caller.replies(task).await?;
            let mut view = View {
                task,
                caller: caller.id(),
                replies: &replies,
            }
            .task(history);
            if request
                .status
                .as_ref()
                .is_some_and(|s| *s != view.status.state)
            {
                continue;
            }
            if request.include_artifacts != Some(true) {
                view.artifacts = None;
            }
            out.push(view);
        }
        Ok(ListTasksResponse {
            page_size: i32::try_from(out.len()).unwrap_or(i32::MAX),
            total_size: i32::try_from(total).unwrap_or(i32::MAX),
            tasks: out,
            next_page_token: next,
        })
    }

    async fn cancel_task(
        &self,
        params: &ServiceParams,
        request: CancelTaskRequest,
    ) -> Result<Task, A2AError> {
        let caller = self.caller(params).await?;
        let task = caller.task(&request.id).await?;
        if task.status.is_ended() {
            return Err(A2AError::task_not_cancelable(&request.id));
        }
        caller
            .call(
                "task_update",
                json!({ "id": task.id, "status": BoardStatus::Cancelled,
                        "note": "Cancelled by its A2A caller." }),
            )
            .await?;
        caller.view(&request.id, None).await
    }

    async fn subscribe_to_task(
        &self,
        params: &ServiceParams,
        request: SubscribeToTaskRequest,
    ) -> Result<BoxStream<'static, Result<StreamResponse, A2AError>>, A2AError> {
        let caller = self.caller(params).await?;
        let place = self.shared.waits.take(caller.id())?;
        let task = caller.view(&request.id, None).await?;
        if task.status.state.is_terminal() {
            return Err(A2AError::unsupported_operation(format!(
                "task {} has ended: read it with GetTask",
                request.id
            )));
        }
        Ok(self.stream(caller, &task, place))
    }

    async fn create_push_config(
        &self,
        params: &ServiceParams,
        config: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, A2AError> {
        let caller = self.caller(params).await?;
        let task = caller.view(&config.task_id, Some(0)).await?;
        self.shared.push.add(caller, &task, config)
    }

    async fn get_push_config(
        &self,
        params: &ServiceParams,
        request: GetTaskPushNotificationConfigRequest,
    ) -> Result<TaskPushNotificationConfig, A2AError> {
        let id = self.own_task(params, &request.task_id).await?;
        self.shared
            .push
            .list(id)
            .into_iter()
            .find(|c| c.id.as_deref() == Some(request.id.as_str()))
            .ok_or_else(|| {
                A2AError::invalid_params(format!(
                    "task {} has no webhook `{}`",
                    request.task_id, request.id
                ))
            })
    }

    async fn list_push_configs(
        &self,
        params: &ServiceParams,
        request: ListTaskPushNotificationConfigsRequest,
    ) -> Result<ListTaskPushNotificationConfigsResponse, A2AError> {
        let id = self.own_task(params, &request.task_id).await?;
        Ok(ListTaskPushNotificationConfigsResponse {
            configs: self.shared.push.list(id),
            next_page_token: None,
        })
    }

    async fn delete_push_config(
        &self,
        params: &ServiceParams,
        request: DeleteTaskPushNotificationConfigRequest,
    ) -> Result<(), A2AError> {
        let id = self.own_task(params, &request.task_id).await?;
        if self.shared.push.remove(id, &request.id) {
            Ok(())
        } else {
            Err(A2AError::invalid_params(format!(
                "task {} has no webhook `{}`",
                request.task_id, request.id
            )))
        }
    }

    async fn get_extended_agent_card(
        &self,
        _: &ServiceParams,
        _: GetExtendedAgentCardRequest,
    ) -> Result<AgentCard, A2AError> {
        Err(A2AError::extended_card_not_configured())
    }
}
