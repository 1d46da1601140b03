//! [`AuditLayer`]: times every call, announces it, and records exactly one outcome for it,
//! whatever decided it below (a call dropped before its end is recorded `cancelled`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use guildhall_actors::{CallContext, CallError};
use tower::{Service, ServiceExt};

use crate::governance::ToolEvent;
use crate::governance::audit::{Entry, Outcome};
use crate::governance::call::{Call, Decided, ToolMeta};
use crate::governance::call_stats::Ended;
use crate::governance::rules::Action;

thin_layer!(
    /// Adds [`Audit`] to a stack.
    AuditLayer,
    /// Records each call's outcome in the audit log and announces it as events.
    Audit
);

impl<S, I, O> Service<Call<I>> for Audit<S>
where
    S: Service<Call<I>, Response = Decided<O>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    I: Send + 'static,
    O: Send + 'static,
{
    type Response = Decided<O>;
    type Error = Infallible;
    type Future = AuditFuture<S::Future, I, O>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn call(&mut self, call: Call<I>) -> Self::Future {
        let trail = Trail::new(Arc::clone(&call.tool), call.scope.ctx.clone());
        let state = match call.gov().audit() {
            // The writer is far behind: wait for room before the call starts (boxed: rare),
            // so a record is never held back once its call is done.
            Some(audit) if !audit.has_room() => {
                let (audit, inner) = (audit.clone(), self.inner.clone());
                State::Waiting {
                    wait: Box::pin(async move {
                        audit.room().await;
                        announce(&call.tool, &call.scope.ctx);
                        let Ok(decided) = inner.oneshot(call).await;
                        decided
                    }),
                }
            }
            _ => {
                announce(&call.tool, &call.scope.ctx);
                State::Running {
                    inner: self.inner.call(call),
                }
            }
        };
        AuditFuture { state, trail }
    }
}

/// Announces that a call to `tool` starts.
pub(crate) fn announce<I>(tool: &ToolMeta<I>, ctx: &CallContext) {
    tool.gov.emit_call(|| ToolEvent::Invoked {
        call_id: ctx.call_id(),
        tool: Arc::clone(&tool.name),
        agent: ctx.agent_shared().cloned(),
        trace: ctx.trace(),
    });
}

pin_project_lite::pin_project! {
    /// The future of an [`Audit`] call.
    pub struct AuditFuture<F, I, O> {
        #[pin]
        state: State<F, O>,
        trail: Trail<I>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, O> {
        Running { #[pin] inner: F },
        Waiting { wait: BoxFuture<'static, Decided<O>> },
    }
}

impl<F, I, O> Future for AuditFuture<F, I, O>
where
    F: Future<Output = Result<Decided<O>, Infallible>>,
{
    type Output = Result<Decided<O>, Infallible>;

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut decided = match this.state.project() {
            StateProj::Running { inner } => {
                let Ok(decided) = std::task::ready!(inner.poll(cx));
                decided
            }
            StateProj::Waiting { wait } => std::task::ready!(wait.as_mut().poll(cx)),
        };
        this.trail.finish(&mut decided);
        Poll::Ready(Ok(decided))
    }
}

/// A call's audit record in the making. Dropped unfinished (the caller went away), it is
/// recorded as `cancelled`.
pub(crate) struct Trail<I> {
    /// The tool, its name and its governance: one shared handle (see [`ToolMeta`]).
    tool: Arc<ToolMeta<I>>,
    /// The call's context; taken when the record is made.
    ctx: Option<CallContext>,
}

impl<I> Trail<I> {
    pub(crate) fn new(tool: Arc<ToolMeta<I>>, ctx: CallContext) -> Self {
        Self {
            tool,
            ctx: Some(ctx),
        }
    }

    fn entry(
        &self,
        ctx: &CallContext,
        outcome: Outcome,
        rule: Option<Arc<str>>,
        digest: u64,
    ) -> Entry {
        Entry {
            call_id: ctx.call_id(),
            agent: ctx.agent_shared().cloned(),
            session: ctx.session_shared().cloned(),
            tool: Arc::clone(&self.tool.name),
            digest,
            decision: if outcome == Outcome::Denied {
                Action::Deny
            } else {
                Action::Allow
            },
            rule,
            duration_us: duration_us(ctx.started().elapsed()),
            outcome,
            parent: ctx.trace().map_or(0, |t| u64::from_be_bytes(t.span_id)),
            cause: None,
        }
    }

    /// Records the call's end and announces it, once. The rule moves from `decided` into
    /// the record: nothing above the audit reads it.
    pub(crate) fn finish<O>(&mut self, decided: &mut Decided<O>) {
        let Some(ctx) = self.ctx.take() else {
            return;
        };
        let outcome = match &decided.result {
            Ok(_) => Outcome::Ok,
            Err(err) => Outcome::of(err),
        };
        let mut entry = self.entry(&ctx, outcome, decided.rule.take(), decided.digest);
        if let Err(err) = &decided.result {
            entry.cause = crate::governance::audit::cause_of(err);
        }
        let gov = &self.tool.gov;
        let ended = match &decided.result {
            Ok(_) => Ended::Ok {
                duration_us: entry.duration_us,
            },
            Err(err) => Ended::Failed(err.kind()),
        };
        gov.call_stats().record(&self.tool.stats, ended);
        gov.emit_call(|| match &decided.result {
            Ok(_) => ToolEvent::Completed {
                call_id: entry.call_id,
                tool: Arc::clone(&entry.tool),
                duration_us: entry.duration_us,
            },
            Err(CallError::Denied { reason, .. }) => ToolEvent::Denied {
                call_id: entry.call_id,
                tool: Arc::clone(&entry.tool),
                reason: reason.clone(),
            },
            Err(err) => ToolEvent::Failed {
                call_id: entry.call_id,
                tool: Arc::clone(&entry.tool),
                kind: err.kind().as_str(),
                message: err.to_string(),
            },
        });
        if let Some(audit) = gov.audit() {
            audit.append(entry);
        }
    }
}

impl<I> Drop for Trail<I> {
    fn drop(&mut self) {
        let Some(ctx) = self.ctx.take() else {
            return;
        };
        let gov = &self.tool.gov;
        gov.call_stats().record(&self.tool.stats, Ended::Cancelled);
        if let Some(audit) = gov.audit() {
            audit.append(self.entry(&ctx, Outcome::Cancelled, None, 0));
        }
    }
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
