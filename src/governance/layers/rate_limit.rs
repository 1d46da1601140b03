//! [`RateLimitLayer`]: turns a flood away before anything else costs anything (no hook
//! runs, nobody is asked).

use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::Either;
use tower::Service;

use crate::governance::call::{Call, Decided};

thin_layer!(
    /// Adds [`RateLimit`] to a stack.
    RateLimitLayer,
    /// Refuses a call over its tool's or its agent's rate (the configured ones).
    RateLimit
);

type Refused<O> = Ready<Result<Decided<O>, std::convert::Infallible>>;

impl<S, I, O> Service<Call<I>> for RateLimit<S>
where
    S: Service<Call<I>, Response = Decided<O>, Error = std::convert::Infallible>,
{
    type Response = Decided<O>;
    type Error = std::convert::Infallible;
    type Future = Either<Refused<O>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn call(&mut self, call: Call<I>) -> Self::Future {
        let limits = &call.gov().limits;
        if !limits.is_empty()
            && let Err(err) = limits.check(&call.tool.name, call.scope.ctx.agent_shared())
        {
            let refused = call.scope.answer(Err(err), Some(Arc::from("rate limit")));
            return Either::left(std::future::ready(Ok(refused)));
        }
        Either::right(self.inner.call(call))
    }
}
