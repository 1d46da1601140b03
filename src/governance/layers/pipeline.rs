//! [`Pipeline`]: the tool's own stack (breaker, deadline, retries, concurrency limit,
//! dispatch) as the innermost governed service, its response converted to the stack's
//! output (itself for typed calls, JSON for a model).

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::Either;
use guildhall_actors::CallError;
use tower::Service;

use crate::governance::ToolMeta;
use crate::governance::call::{Call, Decided};
use crate::pipeline::ToolCall;

/// Turns the pipeline's response `R` into the stack's output; the `&str` is the tool's name.
pub type Convert<R, O> = fn(R, &str) -> Result<O, CallError>;

/// The innermost governed service: calls the tool's pipeline, whose responses are `R`.
pub struct Pipeline<S, R, O> {
    inner: S,
    convert: Convert<R, O>,
    /// What the pipeline said when asked whether it was ready, if it failed: the next
    /// call's answer. The governed layers cannot fail as services.
    unready: Option<CallError>,
}

impl<S, R, O> Pipeline<S, R, O> {
    /// Calls `inner`, converting its responses with `convert`.
    pub fn new(inner: S, convert: Convert<R, O>) -> Self {
        Self {
            inner,
            convert,
            unready: None,
        }
    }
}

impl<S: Clone, R, O> Clone for Pipeline<S, R, O> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), self.convert)
    }
}

type Answer<O> = Result<Decided<O>, Infallible>;

impl<S, I, R, O> Service<Call<I>> for Pipeline<S, R, O>
where
    S: Service<ToolCall<I>, Response = R, Error = CallError>,
{
    type Response = Decided<O>;
    type Error = Infallible;
    type Future = Either<Ready<Answer<O>>, PipelineFuture<S::Future, I, R, O>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if let Err(err) = std::task::ready!(self.inner.poll_ready(cx)) {
            self.unready = Some(err);
        }
        Poll::Ready(Ok(()))
    }

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn call(&mut self, call: Call<I>) -> Self::Future {
        let Call {
            input, tool, scope, ..
        } = call;
        if let Some(err) = self.unready.take() {
            return Either::left(std::future::ready(Ok(scope.answer(Err(err), None))));
        }
        Either::right(PipelineFuture {
            inner: self.inner.call(ToolCall {
                input,
                ctx: scope.ctx,
            }),
            tool,
            convert: self.convert,
            digest: scope.digest,
        })
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Pipeline`] call.
    pub struct PipelineFuture<F, I, R, O> {
        #[pin]
        inner: F,
        tool: Arc<ToolMeta<I>>,
        convert: Convert<R, O>,
        digest: u64,
    }
}

impl<F, I, R, O> Future for PipelineFuture<F, I, R, O>
where
    F: Future<Output = Result<R, CallError>>,
{
    type Output = Answer<O>;

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx));
        let result = response.and_then(|r| (this.convert)(r, &this.tool.name));
        Poll::Ready(Ok(Decided::new(result, None, *this.digest)))
    }
}
