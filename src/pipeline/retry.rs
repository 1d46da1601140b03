//! Retries transient failures of idempotent tools.

use std::time::Duration;

use guildhall_actors::CallError;

use super::ToolCall;

/// tower's retry layer with guildhall's policy.
pub type RetryLayer = tower::retry::RetryLayer<RetryPolicy>;

/// Retries a call whose error [`is_transient`](CallError::is_transient) (a crash, or a tool
/// error the tool marked transient) up to `max_retries` times, waiting 1 ms, 2 ms, 4 ms … in
/// between, and never once the call's deadline has passed. Only installed for tools annotated
/// idempotent: retrying anything else could repeat a side effect.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    max_retries: u32,
    retries: u32,
}

impl RetryPolicy {
    /// At most `max_retries` retries per call.
    pub fn new(max_retries: u32) -> Self {
        Self {
            max_retries,
            retries: 0,
        }
    }
}

impl<I: Clone, O> tower::retry::Policy<ToolCall<I>, O, CallError> for RetryPolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut ToolCall<I>,
        result: &mut Result<O, CallError>,
    ) -> Option<Self::Future> {
        let err = result.as_ref().err()?;
        if self.retries >= self.max_retries || !err.is_transient() || req.ctx.is_cancelled() {
            return None;
        }
        let delay = Duration::from_millis(1 << self.retries.min(10));
        if tokio::time::Instant::now() + delay >= req.ctx.deadline() {
            return None;
        }
        self.retries += 1;
        tracing::debug!(error = %guildhall_actors::ErrorChain(err), retry = self.retries, "retrying transient failure");
        Some(tokio::time::sleep(delay))
    }

    fn clone_request(&mut self, req: &ToolCall<I>) -> Option<ToolCall<I>> {
        (self.retries < self.max_retries).then(|| req.clone())
    }
}
