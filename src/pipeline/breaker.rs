//! Fails fast while a tool's circuit is open; records crashes and timeouts.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use guildhall_actors::CallError;
use guildhall_supervision::SharedBreaker;
use guildhall_supervision::breaker::Admission;
use tower::{Layer, Service};

/// Adds a [`Breaker`] in front of a service.
#[derive(Debug, Clone)]
pub struct BreakerLayer {
    breaker: Arc<SharedBreaker>,
    tool: Arc<str>,
}

impl BreakerLayer {
    /// Guards calls to `tool` with `breaker`.
    pub fn new(breaker: Arc<SharedBreaker>, tool: Arc<str>) -> Self {
        Self { breaker, tool }
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            breaker: Arc::clone(&self.breaker),
            tool: Arc::clone(&self.tool),
        }
    }
}

/// Rejects calls with [`CallError::CircuitOpen`] while the circuit is open; otherwise passes
/// them on and records whether they crashed or timed out.
#[derive(Debug, Clone)]
pub struct Breaker<S> {
    inner: S,
    breaker: Arc<SharedBreaker>,
    tool: Arc<str>,
}

impl<S, R> Service<R> for Breaker<S>
where
    S: Service<R, Error = CallError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = CallError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, CallError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let admission = match self.breaker.try_acquire() {
            Ok(admission) => admission,
            Err(open) => {
                let err = CallError::CircuitOpen {
                    tool: self.tool.to_string(),
                    retry_after: open.retry_after,
                };
                return Box::pin(std::future::ready(Err(err)));
            }
        };
        let guard = Outcome {
            breaker: Arc::clone(&self.breaker),
            admission,
            recorded: false,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut guard = guard;
            let result = fut.await;
            let failed = result.as_ref().is_err_and(CallError::is_breaker_failure);
            guard.record(!failed);
            result
        })
    }
}

/// Records the call's outcome once; a probe dropped before its outcome frees the probe slot.
struct Outcome {
    breaker: Arc<SharedBreaker>,
    admission: Admission,
    recorded: bool,
}

impl Outcome {
    fn record(&mut self, success: bool) {
        self.recorded = true;
        if let Some(transition) = self.breaker.record(self.admission, success) {
            tracing::info!(?transition, "circuit breaker changed state");
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.recorded && self.admission == Admission::Probe {
            self.breaker.abandon_probe();
        }
    }
}
