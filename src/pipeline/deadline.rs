//! Enforces each call's deadline: a layer that answers `timeout` when it passes.
//!
//! The deadlines themselves are watched by the runtime's one [`Sweeper`] (in the actors
//! crate, beside the [`CallContext`] whose deadline state only it may touch); this layer adds
//! a call to it when the call starts, removes it when the call ends, and turns a fired
//! deadline into [`CallError::Timeout`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use guildhall_actors::deadline::Sweeper;
use guildhall_actors::{CallContext, CallError};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::ToolCall;

/// Adds a [`Deadline`] to a service.
#[derive(Debug, Clone)]
pub struct DeadlineLayer {
    tool: Arc<str>,
    sweeper: Arc<Sweeper>,
}

impl DeadlineLayer {
    /// Enforces deadlines on calls to `tool`, watched by `sweeper`.
    pub fn new(tool: Arc<str>, sweeper: Arc<Sweeper>) -> Self {
        Self { tool, sweeper }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            tool: Arc::clone(&self.tool),
            sweeper: Arc::clone(&self.sweeper),
        }
    }
}

/// Answers [`CallError::Timeout`] at the call's deadline, cancelling its token so the tool
/// can stop; a tool that does not is restarted by its actor after the grace period.
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    tool: Arc<str>,
    sweeper: Arc<Sweeper>,
}

impl<S, I> Service<ToolCall<I>> for Deadline<S>
where
    S: Service<ToolCall<I>, Error = CallError>,
{
    type Response = S::Response;
    type Error = CallError;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolCall<I>) -> Self::Future {
        self.sweeper.watch(&req.ctx);
        DeadlineFuture {
            finish: Finish {
                ctx: req.ctx.clone(),
                sweeper: Arc::clone(&self.sweeper),
                answered: false,
            },
            inner: self.inner.call(req),
            tool: Arc::clone(&self.tool),
        }
    }
}

pin_project! {
    /// The future of a [`Deadline`] call.
    pub struct DeadlineFuture<F> {
        #[pin]
        inner: F,
        finish: Finish,
        tool: Arc<str>,
    }
}

/// Stops watching the call when its future completes or is dropped, and cancels the call if
/// it is dropped unanswered (its caller went away), so the tool can stop.
struct Finish {
    ctx: CallContext,
    sweeper: Arc<Sweeper>,
    answered: bool,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.sweeper.unwatch(&self.ctx);
        if !self.answered {
            self.ctx.cancel();
        }
    }
}

impl<F, T> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<T, CallError>>,
{
    type Output = Result<T, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Past the deadline the answer is `timeout`, even if a cooperative tool managed to
        // reply after its token fired: the caller asked for an answer by the deadline.
        if expired(&this.finish.ctx) {
            this.finish.answered = true;
            return Poll::Ready(Err(timeout(this.tool, &this.finish.ctx)));
        }
        if let Poll::Ready(result) = this.inner.poll(cx) {
            this.finish.answered = true;
            return Poll::Ready(result);
        }
        this.finish
            .sweeper
            .wake_at_deadline(&this.finish.ctx, cx.waker());
        // The sweeper may have fired between the check above and the registration.
        if expired(&this.finish.ctx) {
            this.finish.answered = true;
            return Poll::Ready(Err(timeout(this.tool, &this.finish.ctx)));
        }
        Poll::Pending
    }
}

/// Whether the call's deadline has passed and fired. The clock is read only once the token
/// has been cancelled, which for a live call happens only at its deadline.
fn expired(ctx: &CallContext) -> bool {
    ctx.is_cancelled() && Instant::now() >= ctx.deadline()
}

fn timeout(tool: &str, ctx: &CallContext) -> CallError {
    CallError::Timeout {
        tool: tool.to_owned(),
        after: ctx.budget(),
    }
}
