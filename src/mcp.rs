//! The MCP server: every runtime tool over stdio, Streamable HTTP and a local socket.
//!
//! - [`McpServer`]: the protocol handler (both eras, through rmcp), one clone per
//!   connection with that connection's agent and tool filter.
//! - [`ToolFilter`]: `--tools` names and globs.
//! - [`http`]: the Streamable HTTP endpoint (axum): Host and Origin checks, bearer token.
//! - [`local`]: the Unix socket a `guildhall mcp` bridge (or the CLI) reaches a running
//!   server through; a one-line hello binds the connection to an agent.
//! - [`framing`]: decoding incoming messages, and answering every one that cannot be taken
//!   (stdio and the socket through [`framing::LineTransport`], HTTP bodies).
//! - `fixtures`: the conformance suite's tools, resources and prompts.
//! - `error_meta`: the `_meta` key that marks guildhall's own errors.
//! - `disclosure`: large tool sets listed as agents find them (`[mcp] disclose_after`).
//! - `federated`: the proxied servers' resources, templates, prompts and completions,
//!   served beside guildhall's own.

mod disclosure;
mod error_meta;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod federated;
mod filter;
#[cfg(feature = "conformance")]
mod fixtures;
pub mod framing;
mod handler;
pub mod http;
pub mod local;
pub mod models;
mod observer;
mod page;
mod prompts;
mod resources;
pub mod tasks;

pub use filter::{FilterError, ToolFilter};
pub use handler::{AGENT_HEADER, MODEL_HEADER, McpServer, PARENT_HEADER, ROLE_HEADER};
pub use resources::{
    AGENTS as AGENTS_RESOURCE, EVENTS as EVENTS_RESOURCE, INBOX as INBOX_RESOURCE,
    TASKS as TASKS_RESOURCE,
};

/// Serves `server` to one client over this process's stdin and stdout until stdin closes.
/// When both are pipes (as an MCP client launches a server) they are driven by the I/O
/// reactor rather than the blocking thread pool, which saves a thread hand-off per message.
///
/// # Errors
/// The transport's error if the session cannot start or ends abnormally.
///
/// # Cancel safety
/// Dropping the future ends the session: rmcp cancels the service when its handle drops, and
/// calls in flight lose their caller, which cancels them.
pub async fn serve_stdio<S: rmcp::ServerHandler>(server: S) -> std::io::Result<()> {
    serve_stream(server, rmcp::transport::stdio_pipes()).await
}

/// Serves `server` on one byte stream (a pipe pair, a socket, an in-memory duplex) until the
/// client hangs up.
///
/// # Errors
/// As [`serve_stdio`].
///
/// # Cancel safety
/// As [`serve_stdio`].
pub async fn serve_stream<S, R, W>(server: S, (read, write): (R, W)) -> std::io::Result<()>
where
    S: rmcp::ServerHandler,
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    use rmcp::ServiceExt;
    let running = server
        .serve(framing::LineTransport::new(read, write))
        .await
        .map_err(std::io::Error::other)?;
    running.waiting().await.map_err(std::io::Error::other)?;
    Ok(())
}
