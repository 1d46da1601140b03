//! A remote A2A agent as a tool, `a2a__NAME__send`: a supervised actor like every tool, so
//! the pipeline's breaker, deadline and cancellation, and governance's rules and audit,
//! stand between agents and the remote. Its description carries the card's skills.

use std::sync::Arc;
use std::time::Duration;

use a2a::{
    A2AError, AgentCard, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    SendMessageResponse, Task,
};
use a2a_client::{A2AClient, A2AClientFactory, Transport};
use guildhall_actors::{Annotations, CallContext, Concurrency, InitState, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::RemoteConfig;
use super::mirror;

/// How long reading a remote's card may take.
const CARD_TIMEOUT: Duration = Duration::from_secs(10);
/// The most text of one answer the tool returns (a remote's long answer is cut, marked).
const MAX_TEXT: usize = 64 * 1024;

/// A remote A2A agent could not be reached or refused.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The remote could not be reached, died mid-call, or failed inside (an A2A internal
    /// error): reported as the call crashing, so the breaker counts it.
    #[error("the remote A2A agent `{name}` at {url} failed: {message}")]
    Unreachable {
        /// The remote's name in the config.
        name: String,
        /// Its URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The remote refused the request (a task it does not know, bad parameters…).
    #[error("the remote A2A agent `{name}` at {url} refused: {message}")]
    Remote {
        /// The remote's name in the config.
        name: String,
        /// Its URL.
        url: String,
        /// What it said, or why it could not be reached.
        message: String,
    },
    /// The call gives nothing to send.
    #[error("nothing to send: give `text` or `data`")]
    Empty,
    /// The HTTP client could not be built.
    #[error("the HTTP client for `{name}` cannot be built: {reason}")]
    Client {
        /// The remote's name.
        name: String,
        /// Why.
        reason: String,
    },
}

/// The tool's input.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendInput {
    /// What to say to the remote agent.
    #[serde(default)]
    pub text: Option<String>,
    /// Structured data to send beside the text (a JSON value).
    #[serde(default)]
    pub data: Option<Value>,
    /// Continue this remote task (an answer to its question): the `task_id` an earlier call
    /// returned.
    #[serde(default)]
    pub task_id: Option<String>,
    /// Group the exchange under this context (an earlier call's `context_id`).
    #[serde(default)]
    pub context_id: Option<String>,
    /// Return at once with the task as it stands instead of waiting for its end.
    #[serde(default)]
    pub no_wait: Option<bool>,
}

/// What the remote answered.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SendOutput {
    /// The remote task's id (absent when it answered with a message alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Its context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// Its state (`TASK_STATE_COMPLETED`, `TASK_STATE_INPUT_REQUIRED`…); `message` when it
    /// answered with a message alone.
    pub state: String,
    /// The answer's text: the artifacts' text, else the agent's last message.
    pub text: String,
    /// The data parts of the answer.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<Value>,
}

/// One remote agent: where it is, how to reach it, what its card said.
struct Remote {
    /// NAME, as the config gives it.
    name: String,
    url: String,
    /// The card's description and skills, for the tools' descriptions.
    about: String,
    http: reqwest::Client,
}

/// The tool `a2a__NAME__send`: a message to the remote agent, and its answer.
pub struct RemoteAgent {
    name: String,
    description: String,
    remote: Arc<Remote>,
}

/// The tool `a2a__NAME__task`: a remote task read, or cancelled (long work sent with
/// `no_wait`).
pub struct RemoteTask {
    name: String,
    description: String,
    remote: Arc<Remote>,
}

/// A connected client, the actor's state: made at the first call, dropped after a failure
/// so the next call connects afresh.
pub struct Connection(Option<A2AClient<Box<dyn Transport>>>);

/// The two tools of remote `name`, `a2a__NAME__send` and `a2a__NAME__task`: its card read
/// now, for their descriptions (a remote that does not answer yet gets a plain one, and its
/// card is read again at the first call).
///
/// # Errors
/// [`RemoteError::Client`] when the HTTP client cannot be built (a bad token variable).
///
/// # Cancel safety
/// Dropping the future only drops the card's request.
pub async fn remote_tools(
    name: &str,
    config: &RemoteConfig,
) -> Result<(RemoteAgent, RemoteTask), RemoteError> {
    let remote = Arc::new(Remote::new(name, config).await?);
    Ok((
        RemoteAgent {
            name: format!("a2a__{name}__send"),
            description: format!(
                "{}\nA task that asks a question answers `TASK_STATE_INPUT_REQUIRED`: call \
                 again with its `task_id` and your answer. For long work, send with \
                 `no_wait` and follow it with `a2a__{name}__task`.",
                remote.about
            ),
            remote: Arc::clone(&remote),
        },
        RemoteTask {
            name: format!("a2a__{name}__task"),
            description: format!(
                "Read a task of the remote A2A agent `{name}` (its state and answer so far), \
                 or cancel it with `cancel`: a task `a2a__{name}__send` started."
            ),
            remote,
        },
    ))
}

impl Remote {
    async fn new(name: &str, config: &RemoteConfig) -> Result<Self, RemoteError> {
        crate::tls::install();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(var) = &config.token_env {
            let token = std::env::var(var).map_err(|_| RemoteError::Client {
                name: name.to_owned(),
                reason: format!("the environment variable `{var}` (token_env) is not set"),
            })?;
            let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| RemoteError::Client {
                    name: name.to_owned(),
                    reason: format!("the token in `{var}` is not a valid header value"),
                })?;
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(CARD_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(|err| RemoteError::Client {
                name: name.to_owned(),
                reason: err.to_string(),
            })?;
        let url = config.url.trim().trim_end_matches('/').to_owned();
        let card = tokio::time::timeout(CARD_TIMEOUT, resolve(&http, &url)).await;
        let about = match card {
            Ok(Ok(card)) => describe(name, &card),
            Ok(Err(err)) => {
                tracing::warn!(remote = name, %url, error = %err.message, "a remote A2A agent's card could not be read");
                plain(name, &url)
            }
            Err(_) => {
                tracing::warn!(remote = name, %url, "a remote A2A agent's card did not come in time");
                plain(name, &url)
            }
        };
        Ok(Self {
            name: name.to_owned(),
            url,
            about,
            http,
        })
    }

    fn error(&self, message: impl Into<String>) -> RemoteError {
        RemoteError::Unreachable {
            name: self.name.clone(),
            url: self.url.clone(),
            message: message.into(),
        }
    }

    /// The remote's error: its own failure (A2A's internal error, which is also how the
    /// client reports a transport failing) or a refusal of this request.
    fn answered(&self, err: A2AError) -> RemoteError {
        if err.code == a2a::error_code::INTERNAL_ERROR {
            self.error(err.message)
        } else {
            RemoteError::Remote {
                name: self.name.clone(),
                url: self.url.clone(),
                message: format!("{} ({})", err.message, a2a::error_reason(err.code)),
            }
        }
    }

    async fn connect(&self) -> Result<A2AClient<Box<dyn Transport>>, RemoteError> {
        let card = resolve(&self.http, &self.url)
            .await
            .map_err(|err| self.error(format!("its card: {}", err.message)))?;
        let factory = A2AClientFactory::builder()
            .no_defaults()
            .register(Arc::new(a2a_client::jsonrpc::JsonRpcTransportFactory::new(
                Some(self.http.clone()),
            )))
            .register(Arc::new(a2a_client::rest::RestTransportFactory::new(Some(
                self.http.clone(),
            ))))
            .build();
        factory
            .create_from_card(&card)
            .await
            .map_err(|err| self.error(format!("connecting: {}", err.message)))
    }
}

impl Remote {
    /// The actor's connection, made first when there is none.
    async fn client(
        &self,
        connection: &mut Connection,
    ) -> Result<A2AClient<Box<dyn Transport>>, RemoteError> {
        match connection.0.take() {
            Some(client) => Ok(client),
            None => self.connect().await,
        }
    }

    /// A call's end: an answer keeps the connection; a failure, or the call cancelled
    /// (`None`), drops it, so the next call reads the card and connects again.
    fn finish<T>(
        &self,
        connection: &mut Connection,
        client: A2AClient<Box<dyn Transport>>,
        answer: Option<Result<T, A2AError>>,
    ) -> Result<T, RemoteError> {
        match answer {
            Some(Ok(answer)) => {
                connection.0 = Some(client);
                Ok(answer)
            }
            Some(Err(err)) => Err(self.answered(err)),
            None => Err(self.error("the call was cancelled")),
        }
    }
}

async fn resolve(http: &reqwest::Client, url: &str) -> Result<AgentCard, A2AError> {
    a2a_client::agent_card::AgentCardResolver::new(Some(http.clone()))
        .resolve(url)
        .await
}

fn plain(name: &str, url: &str) -> String {
    format!(
        "Send a message to the remote A2A agent `{name}` ({url}) and get its answer. Its card \
         could not be read when this tool was made."
    )
}

/// The tool's description: the card's description and skills.
fn describe(name: &str, card: &AgentCard) -> String {
    let mut text = format!(
        "Send a message to the remote A2A agent `{name}` ({}) and get its answer: {}",
        card.name,
        card.description.trim()
    );
    if !card.skills.is_empty() {
        text.push_str("\nSkills:");
        for skill in card.skills.iter().take(20) {
            text.push_str(&format!("\n- {}: {}", skill.name, skill.description.trim()));
        }
    }
    text
}

impl Tool for RemoteAgent {
    type Input = SendInput;
    type Output = SendOutput;
    type Error = RemoteError;
    type State = Connection;

    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title(format!("A2A agent {}", self.remote.name))
            .destructive(false)
            .open_world(true)
    }

    fn concurrency(&self) -> Concurrency {
        Concurrency::up_to(4)
    }

    fn is_crash(error: &RemoteError) -> bool {
        matches!(error, RemoteError::Unreachable { .. })
    }

    async fn call(
        &self,
        connection: &mut Connection,
        input: SendInput,
        ctx: CallContext,
    ) -> Result<SendOutput, RemoteError> {
        let mut parts = Vec::new();
        if let Some(text) = input.text.filter(|t| !t.trim().is_empty()) {
            parts.push(Part::text(text));
        }
        if let Some(data) = input.data {
            parts.push(Part::data(data));
        }
        if parts.is_empty() {
            return Err(RemoteError::Empty);
        }
        let mut message = Message::new(Role::User, parts);
        message.task_id = input.task_id;
        message.context_id = input.context_id;
        let request = SendMessageRequest {
            message,
            configuration: Some(SendMessageConfiguration {
                accepted_output_modes: None,
                task_push_notification_config: None,
                history_length: Some(1),
                return_immediately: input.no_wait,
            }),
            metadata: None,
            tenant: None,
        };
        let client = self.remote.client(connection).await?;
        let answer = tokio::select! {
            answer = client.send_message(&request) => Some(answer),
            () = ctx.cancellation().cancelled() => None,
        };
        Ok(output(self.remote.finish(connection, client, answer)?))
    }
}

impl InitState for RemoteAgent {
    async fn init(&self) -> Result<Connection, RemoteError> {
        Ok(Connection(None))
    }
}

/// The input of `a2a__NAME__task`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskInput {
    /// The remote task's id (from `a2a__NAME__send`).
    pub task_id: String,
    /// Cancel it instead of reading it.
    #[serde(default)]
    pub cancel: bool,
}

impl Tool for RemoteTask {
    type Input = TaskInput;
    type Output = SendOutput;
    type Error = RemoteError;
    type State = Connection;

    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title(format!("A2A agent {}: a task", self.remote.name))
            .destructive(false)
            .open_world(true)
    }

    fn concurrency(&self) -> Concurrency {
        Concurrency::up_to(4)
    }

    /// Following a long task means asking again.
    fn polls(input: &TaskInput) -> bool {
        !input.cancel
    }

    fn is_crash(error: &RemoteError) -> bool {
        matches!(error, RemoteError::Unreachable { .. })
    }

    async fn call(
        &self,
        connection: &mut Connection,
        input: TaskInput,
        ctx: CallContext,
    ) -> Result<SendOutput, RemoteError> {
        let client = self.remote.client(connection).await?;
        let id = input.task_id;
        let call = async {
            if input.cancel {
                let request = a2a::CancelTaskRequest {
                    id,
                    metadata: None,
                    tenant: None,
                };
                client.cancel_task(&request).await
            } else {
                let request = a2a::GetTaskRequest {
                    id,
                    history_length: Some(1),
                    tenant: None,
                };
                client.get_task(&request).await
            }
        };
        let answer = tokio::select! {
            answer = call => Some(answer),
            () = ctx.cancellation().cancelled() => None,
        };
        Ok(of_task(self.remote.finish(connection, client, answer)?))
    }
}

impl InitState for RemoteTask {
    async fn init(&self) -> Result<Connection, RemoteError> {
        Ok(Connection(None))
    }
}

fn output(answer: SendMessageResponse) -> SendOutput {
    match answer {
        SendMessageResponse::Message(message) => {
            let (text, data) = mirror::content(&message);
            SendOutput {
                task_id: message.task_id,
                context_id: message.context_id,
                state: "message".to_owned(),
                text: cut(text),
                data,
            }
        }
        SendMessageResponse::Task(task) => of_task(task),
    }
}

fn of_task(task: Task) -> SendOutput {
    let mut text = Vec::new();
    let mut data = Vec::new();
    for artifact in task.artifacts.iter().flatten() {
        for part in &artifact.parts {
            match &part.content {
                a2a::PartContent::Text(t) => text.push(t.clone()),
                a2a::PartContent::Data(d) => data.push(d.clone()),
                _ => {}
            }
        }
    }
    if text.is_empty()
        && let Some(message) = &task.status.message
    {
        let (t, d) = mirror::content(message);
        text.push(t);
        data.extend(d);
    }
    let state = serde_json::to_value(&task.status.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    SendOutput {
        task_id: Some(task.id),
        context_id: Some(task.context_id),
        state,
        text: cut(text.join("\n\n")),
        data,
    }
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("\n[… cut: the remote's answer was longer]");
    }
    text
}
