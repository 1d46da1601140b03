//! Fails fast while a tool's circuit is open; records crashes and timeouts.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use guildhall_actors::CallError;
use guildhall_supervision::SharedBreaker;
use guildhall_supervision::breaker::Admission;
use pin_project_lite::pin_project;
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
    S: Service<R, Error = CallError>,
{
    type Response = S::Response;
    type Error = CallError;
    type Future = BreakerFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        match self.breaker.try_acquire() {
            Ok(admission) => BreakerFuture {
                state: State::Admitted {
                    inner: self.inner.call(req),
                },
                outcome: Some(Outcome {
                    breaker: Arc::clone(&self.breaker),
                    admission,
                }),
            },
            Err(open) => BreakerFuture {
                state: State::Rejected {
                    error: Some(Box::new(CallError::CircuitOpen {
                        tool: self.tool.to_string(),
                        retry_after: open.retry_after,
                    })),
                },
                outcome: None,
            },
        }
    }
}

pin_project! {
    /// The future of a [`Breaker`] call.
    pub struct BreakerFuture<F> {
        #[pin]
        state: State<F>,
        outcome: Option<Outcome>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Admitted { #[pin] inner: F },
        Rejected { error: Option<Box<CallError>> },
    }
}

impl<F, T> Future for BreakerFuture<F>
where
    F: Future<Output = Result<T, CallError>>,
{
    type Output = Result<T, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Rejected { error } => {
                Poll::Ready(Err(*error.take().expect("polled after completion")))
            }
            StateProj::Admitted { inner } => {
                let result = ready!(inner.poll(cx));
                if let Some(outcome) = this.outcome.take() {
                    let failed = result.as_ref().is_err_and(CallError::is_breaker_failure);
                    outcome.record(!failed);
                }
                Poll::Ready(result)
            }
        }
    }
}

/// Records the call's outcome once; a probe dropped before its outcome frees the probe slot.
struct Outcome {
    breaker: Arc<SharedBreaker>,
    admission: Admission,
}

impl Outcome {
    fn record(self, success: bool) {
        if let Some(transition) = self.breaker.record(self.admission, success) {
            tracing::info!(?transition, "circuit breaker changed state");
        }
        std::mem::forget(self);
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if self.admission == Admission::Probe {
            self.breaker.abandon_probe();
        }
    }
}
