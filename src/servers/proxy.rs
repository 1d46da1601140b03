//! One tool of a proxied server, registered as a guildhall tool (`mcp__{server}__{tool}`): it
//! goes through the same pipeline and governance as every tool, and forwards the call to
//! the server's live connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use guildhall_actors::{Annotations, CallContext, Tool};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ServerResult,
};
use serde_json::Value;

pub use super::forward::ProxyError;
use super::forward::{Pool, Turn, send};
use super::link::Link;
use super::upstream_task;

/// A proxied tool's arguments: any JSON object, passed on as is. The server checks them
/// against the schema it declared, which is what clients are shown.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct Arguments(pub serde_json::Map<String, Value>);

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
        let arguments = if self.as_task.load(Ordering::Relaxed) {
            input.0
        } else {
            // Kept for a second call only where a tool may refuse the first for want of
            // task augmentation (2025-11-25): elsewhere no call pays for the copy.
            let again = link.may_require_tasks().then(|| input.0.clone());
            match (self.plain(link, input.0, &ctx).await, again) {
                // Refused before it ran: the tool is called as a task, from now on.
                (
                    Err(ProxyError::Failed { text, .. } | ProxyError::Remote(text)),
                    Some(arguments),
                ) if upstream_task::needs_task(&text) => {
                    tracing::debug!(server = %link.server, tool = %self.remote, "the tool requires task augmentation; called as a task from now on");
                    self.as_task.store(true, Ordering::Relaxed);
                    arguments
                }
                (outcome, _) => return outcome,
            }
        };
        let answer = upstream_task::augmented(link, &self.remote, arguments, &ctx, self.hang_grace);
        self.outcome(answer.await?)
    }
}

impl ProxyTool {
    /// A plain `tools/call` on `link`, followed to its end when the server runs it as a
    /// task (the tasks extension).
    async fn plain(
        &self,
        link: &Arc<Link>,
        arguments: serde_json::Map<String, Value>,
        ctx: &CallContext,
    ) -> Result<CallToolResult, ProxyError> {
        let params = CallToolRequestParams::new(self.remote.to_string()).with_arguments(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let answer = match send(link, request, ctx, self.hang_grace).await? {
            (ServerResult::CreateTaskResult(created), generation) => {
                upstream_task::follow(link, generation, created.task, ctx, self.hang_grace).await?
            }
            (answer, _) => answer,
        };
        self.outcome(answer)
    }

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

    fn unsupported(&self, what: &'static str) -> ProxyError {
        ProxyError::Unsupported {
            server: self.pool.server().to_string(),
            tool: self.remote.to_string(),
            what,
        }
    }
}
