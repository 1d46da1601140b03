//! [`TruncateLayer`]: cuts what the model sees of a long JSON result and spills the whole
//! to a file it is told about. Right inside the audit, so it cuts every result the model
//! gets (fresh or cached) after the after-hooks saw it whole, and never what is cached.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use serde_json::Value;
use tower::Service;

use crate::governance::call::{Call, Decided};
use crate::governance::truncate::exceeds;
use crate::governance::{Governance, ToolReply};

thin_layer!(
    /// Adds [`Truncate`] to a stack.
    TruncateLayer,
    /// Cuts a result over its tool's limits (or the default ones).
    Truncate
);

type Answer = Result<Decided<ToolReply>, Infallible>;

impl<S, I> Service<Call<I>> for Truncate<S>
where
    S: Service<Call<I>, Response = Decided<ToolReply>, Error = Infallible>,
{
    type Response = Decided<ToolReply>;
    type Error = Infallible;
    type Future = TruncateFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call<I>) -> Self::Future {
        let cut = (
            Arc::clone(call.gov()),
            Arc::clone(&call.tool.name),
            call.scope.ctx.call_id(),
        );
        TruncateFuture {
            state: State::Running {
                inner: self.inner.call(call),
            },
            cut: Some(cut),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Truncate`] call.
    pub struct TruncateFuture<F> {
        #[pin]
        state: State<F>,
        cut: Option<(Arc<Governance>, Arc<str>, uuid::Uuid)>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F> {
        Running { #[pin] inner: F },
        Spilling { spill: BoxFuture<'static, Answer> },
    }
}

impl<F> Future for TruncateFuture<F>
where
    F: Future<Output = Answer>,
{
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Spilling { spill } => return spill.as_mut().poll(cx),
                StateProj::Running { inner } => {
                    let Ok(decided) = std::task::ready!(inner.poll(cx));
                    let Some((gov, tool, call_id)) = this.cut.take() else {
                        return Poll::Ready(Ok(decided));
                    };
                    let limits = gov
                        .tool_policy(&tool)
                        .and_then(|p| p.truncate)
                        .unwrap_or(gov.config.truncate);
                    let Ok(reply) = &decided.result else {
                        return Poll::Ready(Ok(decided));
                    };
                    if reply.image().is_some() || !exceeds(limits, &reply.value, &reply.text) {
                        return Poll::Ready(Ok(decided));
                    }
                    // Writing the spill file: boxed, as only long results come here.
                    let spill = gov.spill.clone();
                    this.state.set(State::Spilling {
                        spill: Box::pin(async move {
                            let mut decided = decided;
                            if let Ok(reply) = &mut decided.result {
                                // Of a server's own blocks only the text is cut: an
                                // image or a resource beside it is kept as it is.
                                let text_only;
                                let value = match &reply.verbatim {
                                    Some(result)
                                        if result
                                            .structured_content
                                            .as_ref()
                                            .is_none_or(Value::is_null) =>
                                    {
                                        text_only = Value::String(reply.text.clone());
                                        &text_only
                                    }
                                    _ => &reply.value,
                                };
                                let cut =
                                    spill.apply(limits, &tool, call_id, value, &reply.text).await;
                                match cut {
                                    Ok(cut) => reply.truncated = cut,
                                    Err(err) => tracing::warn!(
                                        %tool, error = %guildhall_actors::ErrorChain(&err),
                                        "a long result could not be spilled to a file; it is returned whole"
                                    ),
                                }
                            }
                            Ok(decided)
                        }),
                    });
                }
            }
        }
    }
}
