//! Enforces each call's deadline and fires its cancellation token when it passes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use guildhall_actors::CallError;
use tower::{Layer, Service};

use super::ToolCall;

/// Adds a [`Deadline`] to a service.
#[derive(Debug, Clone)]
pub struct DeadlineLayer {
    tool: Arc<str>,
}

impl DeadlineLayer {
    /// Enforces deadlines on calls to `tool`.
    pub fn new(tool: Arc<str>) -> Self {
        Self { tool }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            tool: Arc::clone(&self.tool),
        }
    }
}

/// Answers [`CallError::Timeout`] at the call's deadline, cancelling its token so the tool
/// can stop; a tool that does not is restarted by its actor after the grace period.
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    tool: Arc<str>,
}

impl<S, I> Service<ToolCall<I>> for Deadline<S>
where
    S: Service<ToolCall<I>, Error = CallError> + Send + 'static,
    S::Future: Send + 'static,
    I: Send + 'static,
{
    type Response = S::Response;
    type Error = CallError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, CallError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolCall<I>) -> Self::Future {
        let deadline = req.ctx.deadline();
        let budget = req.ctx.budget();
        let token = req.ctx.cancellation().clone();
        let tool = Arc::clone(&self.tool);
        let fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout_at(deadline, fut).await {
                Ok(result) => result,
                Err(_) => {
                    token.cancel();
                    Err(CallError::Timeout {
                        tool: tool.to_string(),
                        after: budget,
                    })
                }
            }
        })
    }
}
