//! A request to a proxied server on behalf of one call: an instance picked and its turn
//! taken, the request sent on its live connection, its answer waited for; a connection lost
//! meanwhile, a cancellation, an abandoned request (cancelled on the server, which is then
//! probed) each answered once. Proxied tools, access tools and followed tasks all send
//! through it.

use std::sync::Arc;

use guildhall_actors::CallContext;
use rmcp::model::{
    CallToolResult, CancelledNotificationParam, ClientRequest, PaginatedRequestParams, ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};

use super::link::{Link, Phase};

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
    pub(crate) async fn take(pool: &Pool, ctx: &CallContext) -> Result<Self, ProxyError> {
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
