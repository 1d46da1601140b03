//! [`CacheLayer`]: JSON calls to tools declared deterministic (`cache_ttl`) are answered from
//! a cache of recent results. Below permission and the loop guard, so a cached result is
//! never served to a caller who may not call the tool; keyed by the session's context
//! generation, so a changed context is never answered from before the change.

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::Either;
use tower::Service;

use crate::governance::call::{Call, Decided};
use crate::governance::{Governance, ToolReply};

thin_layer!(
    /// Adds [`Cached`] to a stack.
    CacheLayer,
    /// Answers a repeated call from the cache, and caches what the tool answers.
    Cached
);

type Answer = Result<Decided<ToolReply>, Infallible>;

impl<S, I> Service<Call<I>> for Cached<S>
where
    S: Service<Call<I>, Response = Decided<ToolReply>, Error = Infallible>,
{
    type Response = Decided<ToolReply>;
    type Error = Infallible;
    type Future = Either<Ready<Answer>, CacheFuture<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call<I>) -> Self::Future {
        let Some(ttl) = call
            .gov()
            .tool_policy(&call.tool.name)
            .and_then(|policy| policy.cache_ttl)
        else {
            return Either::right(CacheFuture {
                inner: self.inner.call(call),
                put: None,
            });
        };
        let session = call.scope.ctx.session_shared().cloned();
        let generation = call.gov().context_generation(session.as_deref());
        let digest = call.scope.digest;
        if let Some(hit) =
            call.gov()
                .cache
                .get(&call.tool.name, session.as_ref(), digest, generation)
        {
            let reply = ToolReply::clone(&hit);
            return Either::left(std::future::ready(Ok(call.scope.answer(Ok(reply), None))));
        }
        let put = Put {
            gov: Arc::clone(call.gov()),
            tool: Arc::clone(&call.tool.name),
            session,
            digest,
            generation,
            ttl,
        };
        Either::right(CacheFuture {
            inner: self.inner.call(call),
            put: Some(put),
        })
    }
}

/// Where a fresh result goes in the cache.
struct Put {
    gov: Arc<Governance>,
    tool: Arc<str>,
    session: Option<Arc<str>>,
    digest: u64,
    generation: u64,
    ttl: Duration,
}

pin_project_lite::pin_project! {
    /// The future of a [`Cached`] call the cache could not answer.
    pub struct CacheFuture<F> {
        #[pin]
        inner: F,
        put: Option<Put>,
    }
}

impl<F> Future for CacheFuture<F>
where
    F: Future<Output = Answer>,
{
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let this = self.project();
        let Ok(decided) = std::task::ready!(this.inner.poll(cx));
        if let (Some(put), Ok(reply)) = (this.put.take(), &decided.result) {
            put.gov.cache.put(
                &put.tool,
                put.session.as_ref(),
                put.digest,
                put.generation,
                put.ttl,
                Arc::new(reply.clone()),
            );
        }
        Poll::Ready(Ok(decided))
    }
}
