//! One tool of a proxied server, registered as a guildhall tool (`mcp__{server}__{tool}`): it
//! goes through the same pipeline and governance as every tool, and forwards the call to
//! the server's live connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use guildhall_actors::{Annotations, CallContext, Tool};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, PaginatedRequestParams, ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::Value;

use super::link::{Link, Phase};
use super::upstream_task;

/// A proxied tool's arguments: any JSON object, passed on as is. The server checks them
/// against the schema it declared, which is what clients are shown.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct Arguments(pub serde_json::Map<String, Value>);

/// Why a proxied call failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The server's tool ran and answered with an error (an `isError` result): the texts
    /// of its blocks, and the whole result, which an MCP client is given as the server
    /// sent it.
    #[error("{text}")]
    Failed {
        /// The texts of the result's text blocks, one per line.
        text: String,
        /// The server's result.
        result: Arc<CallToolResult>,
    },
    /// The server answered the request with a JSON-RPC error, or not in the protocol.
    #[error("{0}")]
    Remote(String),
    /// The server is not serving and will not soon: its breaker is open after failed starts,
    /// or it was stopped.
    #[error("server `{server}` is unavailable: {reason}")]
    Unavailable {
        /// The server.
        server: String,
        /// Why, and when it is tried again.
        reason: String,
    },
    /// The connection the call was on went away mid-call (the process exited or was
    /// killed): reported as `crashed`.
    #[error("server `{server}` went away mid-call: {reason}; it is being restarted")]
    Lost {
        /// The server.
        server: String,
        /// What happened, when known.
        reason: String,
    },
    /// The server answered with something a tool call cannot be (a task, a request for
    /// input).
    #[error("server `{server}` answered `{tool}` with {what}, which guildhall does not proxy")]
    Unsupported {
        /// The server.
        server: String,
        /// The server's tool.
        tool: String,
        /// What it answered.
        what: &'static str,
    },
    /// The call was cancelled (its deadline passed or its caller went away).
    #[error("cancelled")]
    Cancelled,
}

/// A server's tool as a guildhall tool.
pub(crate) struct ProxyTool {
    pub(crate) name: String,
    /// The tool's name on its server.
    pub(crate) remote: Arc<str>,
    pub(crate) description: String,
    pub(crate) input: Arc<Value>,
    pub(crate) output: Option<Arc<Value>>,
    pub(crate) annotations: Annotations,
    /// The server's instances (one unless `instances = N`): a call goes to one of them.
    pub(crate) pool: Pool,
    pub(crate) hang_grace: std::time::Duration,
    /// Whether the tool refused a plain call for want of task augmentation (2025-11-25):
    /// it is then always called as a task.
    pub(crate) as_task: AtomicBool,
}

/// The links of a server's instances.
#[derive(Clone)]
pub(crate) struct Pool {
    links: Arc<[Arc<Link>]>,
    /// Where the next search for a free instance starts, so calls spread over them.
    next: Arc<std::sync::atomic::AtomicUsize>,
}

impl Pool {
    pub(crate) fn new(links: Arc<[Arc<Link>]>) -> Self {
        Self {
            links,
            next: Arc::default(),
        }
    }

    /// The server's name (its first instance's).
    pub(crate) fn server(&self) -> &Arc<str> {
        &self.links[0].server
    }

    /// An instance for one call and its turn there: a serving instance with a free turn
    /// when there is one, otherwise the first whose turn comes.
    async fn pick(&self) -> (Arc<Link>, Option<tokio::sync::OwnedSemaphorePermit>) {
        let links = &self.links;
        if let [only] = &**links {
            return (Arc::clone(only), only.permit().await);
        }
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..links.len() {
            let link = &links[(start + i) % links.len()];
            if matches!(link.phase(), Phase::Up { .. })
                && let Some(permit) = link.try_permit()
            {
                return (Arc::clone(link), permit);
            }
        }
        let waits = links.iter().map(|link| {
            let link = Arc::clone(link);
            Box::pin(async move {
                let permit = link.permit().await;
                (link, permit)
            })
        });
        futures::future::select_all(waits).await.0
    }
}

impl Tool for ProxyTool {
    type Input = Arguments;
    /// The server's result as rmcp read it, typed; a model is given it whole
    /// ([`ToolReply::verbatim`](crate::governance::ToolReply::verbatim)).
    type Output = CallToolResult;
    type Error = ProxyError;
    type State = ();

    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn annotations(&self) -> Annotations {
        self.annotations.clone()
    }

    fn input_schema(&self) -> Option<Arc<Value>> {
        Some(Arc::clone(&self.input))
    }

    /// The server's, or none (`true`, any value): the output type is rmcp's result, whose
    /// schema is not what a client is to validate structured content against.
    fn output_schema(&self) -> Option<Arc<Value>> {
        Some(
            self.output
                .clone()
                .unwrap_or_else(|| Arc::new(Value::Bool(true))),
        )
    }

    /// Every call runs in the caller's task: it needs nothing of the actor, the server
    /// multiplexes calls on one connection, and a hop to the actor and back would be a
    /// visible share of a call that is one round trip to another process.
    fn apart(&self, _: &Arguments) -> Option<()> {
        Some(())
    }

    fn is_crash(error: &ProxyError) -> bool {
        matches!(error, ProxyError::Lost { .. })
    }

    async fn call(
        &self,
        _: &mut (),
        input: Arguments,
        ctx: CallContext,
    ) -> Result<CallToolResult, ProxyError> {
        let turn = Turn::take(&self.pool, &ctx).await?;
        let link = &turn.link;
        if self.as_task.load(Ordering::Relaxed) {
            let answer =
                upstream_task::augmented(link, &self.remote, input.0, &ctx, self.hang_grace);
            return self.outcome(answer.await?);
        }
        let params =
            CallToolRequestParams::new(self.remote.to_string()).with_arguments(input.0.clone());
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let (answer, generation) = send(link, request, &ctx, self.hang_grace).await?;
        let answer = match answer {
            ServerResult::CreateTaskResult(created) => {
                link.task_followed();
                upstream_task::follow(link, generation, created.task, &ctx, self.hang_grace).await?
            }
            answer => answer,
        };
        match self.outcome(answer) {
            // Refused before it ran: the tool must be called as a task, from now on.
            Err(ProxyError::Failed { text, .. } | ProxyError::Remote(text))
                if upstream_task::needs_task(&text) =>
            {
                tracing::debug!(server = %link.server, tool = %self.remote, "the tool requires task augmentation; called as a task from now on");
                self.as_task.store(true, Ordering::Relaxed);
                link.task_followed();
                let answer =
                    upstream_task::augmented(link, &self.remote, input.0, &ctx, self.hang_grace);
                self.outcome(answer.await?)
            }
            outcome => outcome,
        }
    }
}

impl ProxyTool {
    /// A tool call's result, or the server's error result as [`ProxyError::Failed`].
    fn outcome(&self, answer: ServerResult) -> Result<CallToolResult, ProxyError> {
        match answer {
            ServerResult::CallToolResult(result) if result.is_error == Some(true) => {
                Err(ProxyError::Failed {
                    text: crate::governance::texts(&result.content),
                    result: Arc::new(result),
                })
            }
            ServerResult::CallToolResult(result) => Ok(result),
            ServerResult::CreateTaskResult(_) => Err(self.unsupported("a task inside a task")),
            ServerResult::InputRequiredResult(_) => Err(self.unsupported("a request for input")),
            _ => Err(self.unsupported("a result of another request")),
        }
    }
}

/// Sends `request` to one of `pool`'s instances for the call of `ctx` and waits for its
/// answer: a call waits for its instance to (re)start; a connection lost mid-call is
/// [`ProxyError::Lost`]; a request abandoned (cancelled, or this future dropped) is
/// cancelled on the server, which is then probed and, silent for `hang_grace`, restarted.
pub(crate) async fn forward(
    pool: &Pool,
    request: ClientRequest,
    ctx: &CallContext,
    hang_grace: std::time::Duration,
) -> Result<ServerResult, ProxyError> {
    let turn = Turn::take(pool, ctx).await?;
    Ok(send(&turn.link, request, ctx, hang_grace).await?.0)
}

/// One call's instance of a server and its turn there (the `concurrency` bound), held
/// until the call ends, follow-up requests of a task included.
pub(crate) struct Turn {
    pub(crate) link: Arc<Link>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Turn {
    /// Waits for an instance of `pool` with a free turn, or for the call's cancellation.
    async fn take(pool: &Pool, ctx: &CallContext) -> Result<Self, ProxyError> {
        tokio::select! {
            biased;
            () = ctx.cancellation().cancelled() => Err(ProxyError::Cancelled),
            (link, permit) = pool.pick() => Ok(Self { link, _permit: permit }),
        }
    }
}

/// Sends `request` on `link`'s connection (waited for while it (re)starts) and waits for
/// its answer, as [`forward`] does; the answer and the generation of the connection that
/// gave it.
pub(crate) async fn send(
    link: &Arc<Link>,
    request: ClientRequest,
    ctx: &CallContext,
    hang_grace: std::time::Duration,
) -> Result<(ServerResult, u64), ProxyError> {
    let cancelled = ctx.cancellation().clone();
    let (peer, generation) = tokio::select! {
        biased;
        () = cancelled.cancelled() => return Err(ProxyError::Cancelled),
        up = connection(link) => up?,
    };
    let handle = peer
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .map_err(|err| failed(link, err))?;
    let _progress = link.route_progress(&handle.progress_token, ctx.clone());
    let _counted = link.sent();
    let mut abandoned = Abandoned {
        peer: Some(peer),
        id: handle.id.clone(),
        link: Arc::clone(link),
        generation,
        grace: hang_grace,
    };
    let mut phase = link.watch();
    let answer = tokio::select! {
        biased;
        answer = handle.await_response() => answer,
        // The guard's drop tells the server and probes it, as it does when this
        // future is dropped (the caller gone, the pipeline's deadline).
        () = cancelled.cancelled() => return Err(ProxyError::Cancelled),
        reason = gone(&mut phase, generation) => {
            abandoned.peer = None;
            return Err(lost(link, reason));
        }
    };
    abandoned.peer = None;
    answer
        .map(|answer| (answer, generation))
        .map_err(|err| failed(link, err))
}

/// The call's connection to `link`'s server went away: why.
pub(crate) fn lost(link: &Link, reason: String) -> ProxyError {
    ProxyError::Lost {
        server: link.server.to_string(),
        reason,
    }
}

/// The live connection of `link`, waited for while the instance (re)starts.
pub(crate) async fn connection(
    link: &Link,
) -> Result<(rmcp::Peer<rmcp::RoleClient>, u64), ProxyError> {
    let mut phase = link.watch();
    loop {
        match &*phase.borrow_and_update() {
            Phase::Up {
                peer, generation, ..
            } => return Ok((peer.clone(), *generation)),
            Phase::Stopped { reason } => {
                return Err(ProxyError::Unavailable {
                    server: link.server.to_string(),
                    reason: reason.to_string(),
                });
            }
            Phase::Starting { .. } | Phase::Down { .. } => {}
        }
        if let guildhall_supervision::BreakerStatus::Open { retry_after, .. } = link.start_breaker()
        {
            let reason = match &*phase.borrow() {
                Phase::Down { reason }
                | Phase::Starting {
                    after: Some(reason),
                } => format!("{reason}; "),
                _ => String::new(),
            };
            return Err(ProxyError::Unavailable {
                server: link.server.to_string(),
                reason: format!(
                    "{reason}its starts keep failing, so its breaker is open; the next start is tried in {} ms",
                    retry_after.as_millis()
                ),
            });
        }
        if phase.changed().await.is_err() {
            return Err(ProxyError::Unavailable {
                server: link.server.to_string(),
                reason: "it was removed".into(),
            });
        }
    }
}

/// Asks the server for its tool list (a request every tool server answers) after a
/// cancelled call: no answer within `grace` means it is hung.
async fn probe(
    link: Arc<Link>,
    grace: std::time::Duration,
    peer: rmcp::Peer<rmcp::RoleClient>,
    generation: u64,
) {
    let request = ClientRequest::ListToolsRequest(rmcp::model::ListToolsRequest {
        method: Default::default(),
        params: None::<PaginatedRequestParams>,
        extensions: Default::default(),
    });
    match tokio::time::timeout(grace, peer.send_request(request)).await {
        Err(_) => {
            tracing::warn!(server = %link.server, ?grace, "server did not answer a probe after a cancelled call; restarting it");
            link.hung(generation);
        }
        Ok(answer) => {
            tracing::debug!(server = %link.server, ok = answer.is_ok(), "probe after a cancelled call answered")
        }
    }
}

fn failed(link: &Link, err: ServiceError) -> ProxyError {
    match err {
        ServiceError::McpError(err) => ProxyError::Remote(err.message.to_string()),
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => ProxyError::Lost {
            server: link.server.to_string(),
            reason: "the connection closed (its process exited or was killed, or its HTTP endpoint went away)".into(),
        },
        other => ProxyError::Remote(other.to_string()),
    }
}

impl ProxyTool {
    fn unsupported(&self, what: &'static str) -> ProxyError {
        ProxyError::Unsupported {
            server: self.pool.server().to_string(),
            tool: self.remote.to_string(),
            what,
        }
    }
}

/// Resolves when the connection of `generation` is gone: why.
pub(crate) async fn gone(
    phase: &mut tokio::sync::watch::Receiver<Phase>,
    generation: u64,
) -> String {
    loop {
        match &*phase.borrow_and_update() {
            Phase::Up { generation: g, .. } if *g == generation => {}
            Phase::Down { reason } | Phase::Stopped { reason } => return reason.to_string(),
            _ => return "the server restarted".into(),
        }
        if phase.changed().await.is_err() {
            return "the server was removed".into();
        }
    }
}

/// A request in flight. Dropped before it is disarmed (`peer` taken: answered, or its
/// connection lost), the request was abandoned, by cancellation or because the call's future
/// was dropped: the server is told (`notifications/cancelled`), then probed, and a server
/// that does not even answer the probe is taken for hung, killed and restarted.
struct Abandoned {
    peer: Option<rmcp::Peer<rmcp::RoleClient>>,
    id: rmcp::model::RequestId,
    link: Arc<Link>,
    generation: u64,
    grace: std::time::Duration,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else { return };
        let (id, link, generation, grace) = (
            self.id.clone(),
            Arc::clone(&self.link),
            self.generation,
            self.grace,
        );
        tokio::spawn(async move {
            let _ = peer
                .notify_cancelled(CancelledNotificationParam::new(
                    Some(id),
                    Some("the caller's deadline passed or it went away".into()),
                ))
                .await;
            probe(link, grace, peer, generation).await;
        });
    }
}
