//! Fails fast while a tool's circuit is open; records crashes and timeouts, each against
//! the caller it happened to (see [`guildhall_supervision::breaker`]: one caller's failures
//! open only that caller's circuit).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use guildhall_actors::CallError;
use guildhall_supervision::SharedBreaker;
use guildhall_supervision::breaker::{Caller, Ticket, Transition};

use crate::events::{Events, ToolEvent};
use crate::pipeline::ToolCall;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

/// A request that names who it is made for, so the breaker can attribute its failure.
pub trait Attributed {
    /// The caller (a hash of its identity); `None` for the embedding program's own calls,
    /// which are trusted: their failures count as the tool's.
    fn caller(&self) -> Option<Caller>;
}

impl<I> Attributed for ToolCall<I> {
    fn caller(&self) -> Option<Caller> {
        self.ctx
            .agent()
            .map(|agent| xxhash_rust::xxh3::xxh3_64(agent.as_bytes()))
    }
}

/// Adds a [`Breaker`] in front of a service.
#[derive(Debug, Clone)]
pub struct BreakerLayer {
    guard: Arc<Guard>,
}

/// A tool's breaker, its name, and where its state changes are announced.
#[derive(Debug)]
struct Guard {
    breaker: Arc<SharedBreaker>,
    tool: Arc<str>,
    events: Option<Events>,
}

impl BreakerLayer {
    /// Guards calls to `tool` with `breaker`.
    pub fn new(breaker: Arc<SharedBreaker>, tool: Arc<str>) -> Self {
        Self {
            guard: Arc::new(Guard {
                breaker,
                tool,
                events: None,
            }),
        }
    }

    /// Announces the circuit opening and closing on `events`.
    #[must_use]
    pub fn events(self, events: Events) -> Self {
        Self {
            guard: Arc::new(Guard {
                breaker: Arc::clone(&self.guard.breaker),
                tool: Arc::clone(&self.guard.tool),
                events: Some(events),
            }),
        }
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            guard: Arc::clone(&self.guard),
        }
    }
}

/// Rejects calls with [`CallError::CircuitOpen`] while the circuit is open; otherwise passes
/// them on and records whether they crashed or timed out.
#[derive(Debug, Clone)]
pub struct Breaker<S> {
    inner: S,
    guard: Arc<Guard>,
}

impl<S, R> Service<R> for Breaker<S>
where
    S: Service<R, Error = CallError>,
    R: Attributed,
{
    type Response = S::Response;
    type Error = CallError;
    type Future = BreakerFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        match self.guard.breaker.try_acquire(req.caller()) {
            Ok(ticket) => BreakerFuture {
                state: State::Admitted {
                    inner: self.inner.call(req),
                },
                outcome: Some(Outcome {
                    guard: Arc::clone(&self.guard),
                    ticket: Some(ticket),
                }),
            },
            Err(open) => BreakerFuture {
                state: State::Rejected {
                    error: Some(Box::new(CallError::CircuitOpen {
                        tool: self.guard.tool.to_string(),
                        retry_after: open.retry_after,
                        own: open.own,
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
    guard: Arc<Guard>,
    /// Taken when the outcome is recorded, so `Drop` knows it was.
    ticket: Option<Ticket>,
}

impl Outcome {
    fn record(mut self, success: bool) {
        let guard = &self.guard;
        if let Some(ticket) = self.ticket.take()
            && let Some(transition) = guard.breaker.record(ticket, success)
        {
            tracing::info!(tool = %guard.tool, ?transition, "circuit breaker changed state");
            if let Some(events) = &guard.events {
                let tool = Arc::clone(&guard.tool);
                events.emit(|| match transition {
                    Transition::Opened { .. } => ToolEvent::CircuitOpened { tool },
                    Transition::Closed => ToolEvent::CircuitClosed { tool },
                });
            }
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.guard.breaker.abandon(ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use guildhall_supervision::BreakerConfig;
    use tower::ServiceExt;

    /// The tests' calls are the embedding program's own.
    impl Attributed for bool {
        fn caller(&self) -> Option<Caller> {
            None
        }
    }

    #[tokio::test]
    async fn calls_hold_the_breaker_only_while_in_flight() {
        let breaker = Arc::new(SharedBreaker::new(BreakerConfig::default()));
        let layer = BreakerLayer::new(Arc::clone(&breaker), Arc::from("t"));
        let service = layer.layer(tower::service_fn(|ok: bool| async move {
            if ok {
                Ok(())
            } else {
                Err(CallError::Crashed {
                    tool: "t".into(),
                    reason: "test".into(),
                })
            }
        }));
        for ok in [true, false, true] {
            let _ = service.clone().oneshot(ok).await;
        }
        // Only the layer and the service hold the guard now: no call kept it.
        assert_eq!(Arc::strong_count(&layer.guard), 2);
    }

    #[tokio::test]
    async fn a_dropped_probe_lets_the_next_call_probe() {
        let config = BreakerConfig {
            max_failures: 1,
            reset_timeout: std::time::Duration::ZERO,
            ..BreakerConfig::default()
        };
        let breaker = Arc::new(SharedBreaker::new(config));
        let layer = BreakerLayer::new(Arc::clone(&breaker), Arc::from("t"));
        // `true` fails at once; `false` never finishes.
        let service = layer.layer(tower::service_fn(|fail: bool| async move {
            if fail {
                Err(CallError::Crashed {
                    tool: "t".into(),
                    reason: "test".into(),
                })
            } else {
                std::future::pending::<Result<(), CallError>>().await
            }
        }));
        assert!(service.clone().oneshot(true).await.is_err());
        // The probe's caller gives up.
        let probe = service.clone().oneshot(false);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(1), probe)
                .await
                .is_err()
        );
        // Its slot is free: the next call is admitted as a probe, not rejected.
        let err = service.clone().oneshot(true).await.unwrap_err();
        assert_eq!(err.kind(), guildhall_actors::ErrorKind::Crashed);
    }
}
