//! Streamable HTTP: one `/mcp` endpoint served by rmcp's tower service inside axum.
//!
//! DNS-rebinding protection: `Host` must name the bound address (loopback by default) and a
//! browser's `Origin` must be a loopback one, else 403. A bearer token is optional on
//! loopback and required on any other address; with a token off loopback any `Host` is
//! accepted, since a rebinding page cannot send the token.
//!
//! Every POST body is screened before rmcp sees it ([`screen`]): one over
//! [`MAX_MESSAGE_BYTES`] is read to its end (within a bound) and answered 413, so the client
//! gets an answer rather than a reset connection; one that is not a valid message is
//! answered 400 with the JSON-RPC error; an `initialize` past the session cap is answered
//! 503 with `Retry-After`. A `DELETE` closing a session is answered 204, or 404 for a
//! session the server does not have. Sessions idle longer than [`HttpOptions::session_idle`]
//! are closed.
//!
//! The observer's read-only routes (the dashboard, its status and sessions, `/events`,
//! `/metrics`: [`observer`](super::observer)) share the listener, under the same `Host`
//! check and bearer token: a rebinding page must not read them either.

use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use futures::StreamExt;
use rmcp::model::{ClientRequest, JsonRpcMessage, JsonRpcRequest};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::framing::{self, MAX_MESSAGE_BYTES, Refusal};
use super::{McpServer, ToolFilter};
use crate::agents::constant_time_eq;

/// How much of an oversized body is read (and dropped) so that its client can read the 413
/// answer; a larger one gets the answer and a closed connection.
const MAX_DRAINED_BYTES: usize = 64 * 1024 * 1024;

/// The endpoint's path.
pub const PATH: &str = "/mcp";

/// How the HTTP endpoint is exposed.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Required as `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
    /// Further `Host` values to accept (names or `host:port`), for a server behind a name.
    pub allowed_hosts: Vec<String>,
    /// Further browser origins to accept (`scheme://host[:port]`, `:*` for any port).
    pub allowed_origins: Vec<String>,
    /// The most sessions open at once; an `initialize` past it is answered 503.
    pub max_sessions: usize,
    /// A session with no request for this long is closed.
    pub session_idle: Duration,
    /// Served at `GET /metrics` when given.
    pub metrics: Option<Arc<crate::observe::Metrics>>,
    /// The dashboard at `GET /` (and its `GET /api/status`) when given: the server's control,
    /// for its uptime, connections, servers and launched agents.
    pub dashboard: Option<super::local::Control>,
    /// Further routes served beside `/mcp` (A2A's), under the same `Host` and `Origin`
    /// checks and bearer token.
    pub edge: Option<axum::Router>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            token: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_sessions: 1_000,
            session_idle: Duration::from_secs(10 * 60),
            metrics: None,
            dashboard: None,
            edge: None,
        }
    }
}

/// A configuration that would expose the server unsafely.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A non-loopback address without a token.
    #[error(
        "refusing to serve HTTP on {addr} without a token: any host that can reach it could \
         act as any agent; pass --token (or GUILDHALL_TOKEN), or bind to 127.0.0.1"
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// A token that is empty (or only spaces): it would protect nothing.
    #[error("the HTTP token is empty: give a real secret with --token (or GUILDHALL_TOKEN)")]
    EmptyToken,
}

/// The axum router for `server` bound at `addr`.
///
/// # Errors
/// [`HttpError::TokenRequired`] for a non-loopback `addr` without a token.
pub fn router(
    server: McpServer,
    addr: SocketAddr,
    options: HttpOptions,
    shutdown: CancellationToken,
) -> Result<axum::Router, HttpError> {
    if options
        .token
        .as_deref()
        .is_some_and(|t| t.trim().is_empty())
    {
        return Err(HttpError::EmptyToken);
    }
    // Event streams end when the server stops, or its graceful shutdown would wait on them.
    let shutdown_events = shutdown.clone();
    let off_loopback = !addr.ip().is_loopback();
    if off_loopback && options.token.is_none() {
        return Err(HttpError::TokenRequired { addr });
    }
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if !addr.ip().is_unspecified() {
        hosts.push(addr.ip().to_string());
    }
    hosts.extend(options.allowed_hosts.iter().cloned());
    let mut origins: Vec<String> = vec![
        "http://localhost:*".into(),
        "http://127.0.0.1:*".into(),
        "http://[::1]:*".into(),
    ];
    origins.extend(options.allowed_origins.iter().cloned());
    let observer_origins: Arc<[String]> = origins.clone().into();
    // The observer's routes: any Host once a token guards a server off loopback, as for /mcp.
    let observer_hosts: Option<Arc<[String]>> = (!off_loopback).then(|| hosts.clone().into());
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_cancellation_token(shutdown)
        .with_max_request_body_bytes(MAX_MESSAGE_BYTES);
    config = if off_loopback {
        // Remote clients name the host however they reach it; the token is what admits them.
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(hosts)
    };
    let mut sessions = LocalSessionManager::default();
    let mut session_config = SessionConfig::default();
    session_config.keep_alive = Some(options.session_idle);
    sessions.session_config = session_config;
    let sessions = Arc::new(sessions);
    let (server_runtime, feeds) = (server.runtime().clone(), server.feeds().clone());
    let dashboard_server = server.connection(None, ToolFilter::all());
    let service = StreamableHttpService::new(
        move || Ok(server.connection(None, ToolFilter::all())),
        Arc::clone(&sessions),
        config,
    );
    let screen_state = Arc::new(Screen {
        sessions,
        max_sessions: options.max_sessions.max(1),
        retry_after: options.session_idle.as_secs().clamp(1, 60),
    });
    let mut router = axum::Router::new()
        .nest_service(PATH, service)
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let screen_state = Arc::clone(&screen_state);
            async move { screen(&screen_state, request, next).await }
        }));
    let observer = super::observer::Observer {
        dashboard: options.dashboard.map(|control| (dashboard_server, control)),
        metrics: options.metrics,
        hosts: observer_hosts,
        origins: observer_origins,
        authenticated: options.token.is_some(),
        stop: shutdown_events,
    };
    if let Some(edge) = options.edge {
        router = router.merge(super::observer::guarded(
            edge,
            observer.hosts.clone(),
            Arc::clone(&observer.origins),
        ));
    }
    router = router.merge(observer.routes(server_runtime, feeds));
    if let Some(token) = options.token {
        let expected: Arc<str> = Arc::from(format!("Bearer {token}"));
        router = router.layer(middleware::from_fn(move |request: Request, next: Next| {
            let expected = Arc::clone(&expected);
            async move { require_bearer(&expected, request, next).await }
        }));
    }
    Ok(router)
}

pub use super::observer::{
    AGENTS_PATH, DASHBOARD_PATH, EVENTS_PATH, MAIL_PATH, METRICS_PATH, SESSIONS_PATH, STATUS_PATH,
    TASKS_PATH,
};

async fn require_bearer(expected: &str, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(axum::http::HeaderValue::as_bytes)
        .unwrap_or_default();
    if constant_time_eq(given, expected.as_bytes()) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a valid `Authorization: Bearer <token>` header is required\n",
        )
            .into_response()
    }
}

/// What [`screen`] checks bodies against.
struct Screen {
    sessions: Arc<LocalSessionManager>,
    max_sessions: usize,
    /// Seconds a client over the session cap is told to wait.
    retry_after: u64,
}

/// Screens a POST body before rmcp takes it; see the module docs.
async fn screen(state: &Screen, request: Request, next: Next) -> Response {
    if request.method() == Method::DELETE {
        return close_session(state, request, next).await;
    }
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body).await {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge) => {
            let refusal = Refusal {
                id: serde_json::Value::Null,
                code: framing::INVALID_REQUEST,
                message: format!("the request body is over the limit of {MAX_MESSAGE_BYTES} bytes"),
            };
            return rpc_error(StatusCode::PAYLOAD_TOO_LARGE, &refusal);
        }
        Err(BodyError::Read(err)) => {
            tracing::debug!(error = %guildhall_actors::ErrorChain(&err), "an HTTP request body could not be read");
            return StatusCode::BAD_REQUEST.into_response();
        }
    };
    match framing::decode(&bytes) {
        Err(refusal) => return rpc_error(StatusCode::BAD_REQUEST, &refusal),
        Ok(Some(JsonRpcMessage::Request(JsonRpcRequest {
            id,
            request: ClientRequest::InitializeRequest(_),
            ..
        }))) if !parts.headers.contains_key("mcp-session-id") => {
            let open = state.sessions.sessions.read().await.len();
            if open >= state.max_sessions {
                tracing::warn!(open, "HTTP session cap reached; an initialize was refused");
                let refusal = Refusal {
                    id: serde_json::to_value(&id).unwrap_or_default(),
                    code: -32000,
                    message: format!(
                        "the server has {open} sessions open, its limit; retry after {} s",
                        state.retry_after
                    ),
                };
                let mut response = rpc_error(StatusCode::SERVICE_UNAVAILABLE, &refusal);
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(state.retry_after));
                return response;
            }
        }
        Ok(_) => {}
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A client closing its session: 204 once closed, 404 for a session this server does not
/// have (never had, or already closed), as the spec and the Python SDK expect.
async fn close_session(state: &Screen, request: Request, next: Next) -> Response {
    let known = match request
        .headers()
        .get("mcp-session-id")
        .map(HeaderValue::to_str)
    {
        Some(Ok(id)) => state.sessions.sessions.read().await.contains_key(id),
        Some(Err(_)) => false,
        None => {
            return (
                StatusCode::BAD_REQUEST,
                "closing a session needs its `Mcp-Session-Id` header",
            )
                .into_response();
        }
    };
    if !known {
        return (StatusCode::NOT_FOUND, "no such session").into_response();
    }
    let response = next.run(request).await;
    if response.status().is_success() {
        StatusCode::NO_CONTENT.into_response()
    } else {
        response
    }
}

enum BodyError {
    TooLarge,
    Read(axum::Error),
}

/// The body, up to [`MAX_MESSAGE_BYTES`]; past that, the rest is read and dropped (up to
/// [`MAX_DRAINED_BYTES`]) so the client is done sending when the 413 comes.
async fn read_body(body: Body) -> Result<Vec<u8>, BodyError> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyError::Read)?;
        seen = seen.saturating_add(chunk.len());
        if seen > MAX_DRAINED_BYTES {
            return Err(BodyError::TooLarge);
        }
        if seen <= MAX_MESSAGE_BYTES {
            bytes.extend_from_slice(&chunk);
        }
    }
    if seen > MAX_MESSAGE_BYTES {
        return Err(BodyError::TooLarge);
    }
    Ok(bytes)
}

fn rpc_error(status: StatusCode, refusal: &Refusal) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        refusal.to_json(),
    )
        .into_response()
}

/// Serves `router` on `listener` until `shutdown` fires.
///
/// # Errors
/// The listener's I/O error.
///
/// # Cancel safety
/// Dropping the future stops the listener and closes its connections at once; firing `shutdown`
/// instead lets requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    // Without TCP_NODELAY a response's last segment waits for the client's delayed ACK:
    // sequential calls then stall 40 ms at a time.
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %guildhall_actors::ErrorChain(&err), "TCP_NODELAY could not be set");
        }
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
