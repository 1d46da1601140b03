//! Streamable HTTP: one `/mcp` endpoint served by rmcp's tower service inside axum.
//!
//! DNS-rebinding protection: `Host` must name the bound address (loopback by default) and a
//! browser's `Origin` must be a loopback one, else 403. A bearer token is optional on
//! loopback and required on any other address.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::{McpServer, ToolFilter};

/// The endpoint's path.
pub const PATH: &str = "/mcp";

/// How the HTTP endpoint is exposed.
#[derive(Clone, Debug, Default)]
pub struct HttpOptions {
    /// Required as `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
    /// Further `Host` values to accept (names or `host:port`), for a server behind a name.
    pub allowed_hosts: Vec<String>,
    /// Further browser origins to accept (`scheme://host[:port]`, `:*` for any port).
    pub allowed_origins: Vec<String>,
}

/// A configuration that would expose the server unsafely.
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
    if !addr.ip().is_loopback() && options.token.is_none() {
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
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_cancellation_token(shutdown);
    let service = StreamableHttpService::new(
        move || Ok(server.connection(None, ToolFilter::all())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let mut router = axum::Router::new().nest_service(PATH, service);
    if let Some(token) = options.token {
        let expected: Arc<str> = Arc::from(format!("Bearer {token}"));
        router = router.layer(middleware::from_fn(move |request: Request, next: Next| {
            let expected = Arc::clone(&expected);
            async move { require_bearer(&expected, request, next).await }
        }));
    }
    Ok(router)
}

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

/// Compares without an early exit, so the time taken does not reveal a matching prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serves `router` on `listener` until `shutdown` fires.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
