//! [`Governed`]: a tool's governance stack (see [`layers`](super::layers)) as the registry
//! calls it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::layers::Either;
use guildhall_actors::{CallContext, CallError};
use tower::util::Oneshot;
use tower::{Service, ServiceExt};

use super::Governance;
use super::asker::Asker;
use super::call::{Call, CallScope, Decided, ToolMeta};
use super::layers::{Trail, announce};
use crate::pipeline::ToolCall;

/// A tool's governance stack `L`, with what its calls bring down it.
pub struct Governed<L, I, O> {
    stack: L,
    tool: Arc<ToolMeta<I>>,
    /// Where the hooks' notes go in a result: nowhere in a typed one, into a model's reply.
    attach: fn(&mut O, Vec<String>),
}

impl<L: Clone, I, O> Clone for Governed<L, I, O> {
    fn clone(&self) -> Self {
        Self {
            stack: self.stack.clone(),
            tool: Arc::clone(&self.tool),
            attach: self.attach,
        }
    }
}

impl<L, I, O> Governed<L, I, O>
where
    L: Service<Call<I>, Response = Decided<O>, Error = Infallible> + Clone,
{
    /// Governs calls to `tool` through `stack`, by the tool's governance; `attach` puts
    /// the hooks' notes in a result.
    pub fn new(stack: L, tool: Arc<ToolMeta<I>>, attach: fn(&mut O, Vec<String>)) -> Self {
        Self {
            stack,
            tool,
            attach,
        }
    }

    /// The governance the stack judges by.
    pub(crate) fn governance(&self) -> &Governance {
        &self.tool.gov
    }

    /// Makes one call, asking `asker` when a rule says `ask`.
    #[inline(always)] // See "Built in place" in `layers.rs`.
    pub fn call(
        &self,
        call: ToolCall<I>,
        asker: Option<Arc<dyn Asker>>,
    ) -> GovernedFuture<L, I, O> {
        let ToolCall { input, ctx } = call;
        let call = Call {
            input,
            tool: Arc::clone(&self.tool),
            scope: CallScope::new(ctx, asker),
        };
        let mut stack = self.stack.clone();
        // Every governance layer is ready whenever its pipeline is, and a tool's pipeline
        // always is: call at once rather than carry the stack and the call in a `Oneshot`
        // to the first poll. A stack that is not ready yet waits in one.
        let inner = match stack.poll_ready(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(Ok(())) => Either::left(stack.call(call)),
            Poll::Pending => Either::right(stack.oneshot(call)),
        };
        GovernedFuture {
            inner,
            attach: self.attach,
        }
    }

    /// Records a call refused before this stack could run (arguments that do not decode):
    /// audited and announced like any other, then answered with `err`.
    pub(crate) fn refuse(&self, ctx: &CallContext, err: CallError) -> Result<O, CallError> {
        announce(&self.tool, ctx);
        let mut decided = Decided::new(Err(err), Some(Arc::from("argument check")), 0);
        Trail::new(Arc::clone(&self.tool), ctx.clone()).finish(&mut decided);
        decided.result
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Governed`] call.
    pub struct GovernedFuture<L, I, O>
    where
        L: Service<Call<I>>,
    {
        #[pin]
        inner: Either<L::Future, Oneshot<L, Call<I>>>,
        attach: fn(&mut O, Vec<String>),
    }
}

impl<L, I, O> Future for GovernedFuture<L, I, O>
where
    L: Service<Call<I>, Response = Decided<O>, Error = Infallible>,
{
    type Output = Result<O, CallError>;

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(Decided {
            mut result, notes, ..
        }) = std::task::ready!(this.inner.poll(cx));
        if !notes.is_empty()
            && let Ok(out) = &mut result
        {
            (this.attach)(out, notes);
        }
        Poll::Ready(result)
    }
}
