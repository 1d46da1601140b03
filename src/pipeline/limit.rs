//! Bounds the calls in flight to one tool; calls that wait by design are not counted.
//!
//! Like tower's `ConcurrencyLimit`, with one difference: a call whose tool says it waits or
//! polls by design ([`Tool::polls`](guildhall_actors::Tool::polls), e.g. `check_inbox` with
//! a `wait_secs`) takes no permit. Such a call occupies nothing of the tool while it waits
//! (its tool detaches it), so a permit held for its whole wait would only lock other callers
//! out: 1,024 waiting agents would stall every other agent's inbox check until their waits
//! ran out. What bounds waiting calls is the thing they wait on (a mailbox admits a bounded
//! number of waiters). The permit is taken when the call is made rather than in
//! `poll_ready`, because whether a call waits is known only from its input.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use guildhall_actors::CallError;
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service, ServiceExt};

use super::ToolCall;

/// Adds a [`Limit`] of `max` calls in flight, `exempt` saying which calls wait by design.
pub struct LimitLayer<I> {
    permits: Arc<Semaphore>,
    exempt: fn(&I) -> bool,
}

impl<I> LimitLayer<I> {
    /// At most `max` counted calls in flight at once (at least one).
    pub fn new(max: usize, exempt: fn(&I) -> bool) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max.clamp(1, Semaphore::MAX_PERMITS))),
            exempt,
        }
    }
}

impl<S, I> Layer<S> for LimitLayer<I> {
    type Service = Limit<S, I>;

    fn layer(&self, inner: S) -> Limit<S, I> {
        Limit {
            inner,
            permits: Arc::clone(&self.permits),
            exempt: self.exempt,
        }
    }
}

/// Admits a call when a permit is free (or when it waits by design); queues it, first come
/// first served, otherwise.
pub struct Limit<S, I> {
    inner: S,
    permits: Arc<Semaphore>,
    exempt: fn(&I) -> bool,
}

impl<S: Clone, I> Clone for Limit<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            permits: Arc::clone(&self.permits),
            exempt: self.exempt,
        }
    }
}

impl<S, I> Service<ToolCall<I>> for Limit<S, I>
where
    S: Service<ToolCall<I>, Error = CallError> + Clone + Send + 'static,
    S::Future: Send,
    I: Send + 'static,
{
    type Response = S::Response;
    type Error = CallError;
    type Future = LimitFuture<S::Future, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall<I>) -> Self::Future {
        if (self.exempt)(&call.input) {
            return LimitFuture {
                state: State::Admitted {
                    inner: self.inner.call(call),
                    permit: None,
                },
            };
        }
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => LimitFuture {
                state: State::Admitted {
                    inner: self.inner.call(call),
                    permit: Some(permit),
                },
            },
            // Contended: wait for a permit in a task of the call's own (boxed: rare).
            Err(_) => {
                let permits = Arc::clone(&self.permits);
                // A clone, ready, for the call made once the permit comes.
                let inner = self.inner.clone();
                LimitFuture {
                    state: State::Queued {
                        wait: Box::pin(async move {
                            // Never closed, so this always yields a permit.
                            let _permit = permits.acquire_owned().await.ok();
                            inner.oneshot(call).await
                        }),
                    },
                }
            }
        }
    }
}

pin_project! {
    /// The future of a [`Limit`] call.
    pub struct LimitFuture<F, R> {
        #[pin]
        state: State<F, R>,
    }
}

pin_project! {
    #[project = LimitProj]
    enum State<F, R> {
        /// Running, holding its permit (none when it waits by design).
        Admitted {
            #[pin]
            inner: F,
            permit: Option<OwnedSemaphorePermit>,
        },
        /// Waiting for a permit, then running.
        Queued { wait: BoxFuture<'static, Result<R, CallError>> },
    }
}

impl<F, R> Future for LimitFuture<F, R>
where
    F: Future<Output = Result<R, CallError>>,
{
    type Output = Result<R, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            LimitProj::Admitted { inner, .. } => inner.poll(cx),
            LimitProj::Queued { wait } => wait.as_mut().poll(cx),
        }
    }
}
