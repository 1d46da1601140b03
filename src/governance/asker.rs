//! Asking someone whether a call may run: the `ask` action's other half.
//!
//! The runtime does not know who to ask; the caller brings an [`Asker`] with the call's
//! options (the MCP server brings one that asks the client through elicitation when the
//! client supports it). A call that must be asked about with no asker is denied with a
//! message saying how to allow it.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the asker is asked.
#[derive(Debug, Clone, Serialize)]
pub struct AskRequest {
    /// The tool to be called.
    pub tool: Arc<str>,
    /// The calling agent, if any.
    pub agent: Option<Arc<str>>,
    /// The call's session, if any.
    pub session: Option<Arc<str>>,
    /// The call's arguments.
    pub arguments: Value,
    /// Why it is asked: the rule or guard that asks, as text a person can read.
    pub reason: String,
}

/// The answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// This call only.
    Once,
    /// Calls like this one for the rest of the session.
    Session,
    /// Calls like this one by this agent from now on; kept in the store.
    Always,
    /// Not this call.
    Deny,
}

/// Asks a person (or a policy service) about a call. Implementations may take as long as
/// they need: the call's deadline still bounds the wait.
///
/// # Examples
/// A policy in miniature, brought with a call's options (a closure is an asker): reads are
/// let through once, anything else is refused.
/// ```
/// use std::sync::Arc;
///
/// use futures::FutureExt;
/// use guildhall::CallOptions;
/// use guildhall::governance::{Approval, AskRequest};
///
/// let policy = |request: AskRequest| {
///     let approval = if request.tool.starts_with("read_") {
///         Approval::Once
///     } else {
///         Approval::Deny
///     };
///     async move { approval }.boxed()
/// };
/// let options = CallOptions::new().asker(Arc::new(policy));
/// # let _ = options;
/// ```
pub trait Asker: Send + Sync + 'static {
    /// Asks about one call.
    fn ask(&self, request: AskRequest) -> BoxFuture<'static, Approval>;
}

impl<F> Asker for F
where
    F: Fn(AskRequest) -> BoxFuture<'static, Approval> + Send + Sync + 'static,
{
    fn ask(&self, request: AskRequest) -> BoxFuture<'static, Approval> {
        self(request)
    }
}
