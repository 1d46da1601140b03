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

use crate::governance::audit::{Entry, Outcome};
use crate::governance::call::{Call, Decided};
use crate::governance::rules::Action;
use crate::governance::{Governance, ToolEvent};

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
    type Future = AuditFuture<S::Future, O>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn call(&mut self, call: Call<I>) -> Self::Future {
        let trail = Trail::new(
            Arc::clone(&call.gov),
            Arc::clone(&call.tool.name),
            call.scope.ctx.clone(),
        );
        let state = match call.gov.audit() {
            // The writer is far behind: wait for room before the call starts (boxed: rare),
            // so a record is never held back once its call is done.
            Some(audit) if !audit.has_room() => {
                let (audit, inner) = (audit.clone(), self.inner.clone());
                State::Waiting {
                    wait: Box::pin(async move {
                        audit.room().await;
                        announce(&call.gov, &call.tool.name, &call.scope.ctx);
                        let Ok(decided) = inner.oneshot(call).await;
                        decided
                    }),
                }
            }
            _ => {
                announce(&call.gov, &call.tool.name, &call.scope.ctx);
                State::Running {
                    inner: self.inner.call(call),
                }
            }
        };
        AuditFuture {
            state,
            trail: Some(trail),
        }
    }
}

/// Announces that a call to `tool` starts.
pub(crate) fn announce(gov: &Governance, tool: &Arc<str>, ctx: &CallContext) {
    gov.emit(|| ToolEvent::Invoked {
        call_id: ctx.call_id(),
        tool: Arc::clone(tool),
        agent: ctx.agent_shared().cloned(),
        trace: ctx.trace(),
    });
}

pin_project_lite::pin_project! {
    /// The future of an [`Audit`] call.
    pub struct AuditFuture<F, O> {
        #[pin]
        state: State<F, O>,
        trail: Option<Trail>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, O> {
        Running { #[pin] inner: F },
        Waiting { wait: BoxFuture<'static, Decided<O>> },
    }
}

impl<F, O> Future for AuditFuture<F, O>
where
    F: Future<Output = Result<Decided<O>, Infallible>>,
{
    type Output = Result<Decided<O>, Infallible>;

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let decided = match this.state.project() {
            StateProj::Running { inner } => {
                let Ok(decided) = std::task::ready!(inner.poll(cx));
                decided
            }
            StateProj::Waiting { wait } => std::task::ready!(wait.as_mut().poll(cx)),
        };
        if let Some(trail) = this.trail.take() {
            trail.finish(&decided);
        }
        Poll::Ready(Ok(decided))
    }
}

/// A call's audit record in the making. Dropped unfinished (the caller went away), it is
/// recorded as `cancelled`.
pub(crate) struct Trail {
    gov: Arc<Governance>,
    tool: Arc<str>,
    ctx: CallContext,
    finished: bool,
}

impl Trail {
    pub(crate) fn new(gov: Arc<Governance>, tool: Arc<str>, ctx: CallContext) -> Self {
        Self {
            gov,
            tool,
            ctx,
            finished: false,
        }
    }

    fn entry(&self, outcome: Outcome, rule: Option<Arc<str>>, digest: u64) -> Entry {
        Entry {
            call_id: self.ctx.call_id(),
            agent: self.ctx.agent_shared().cloned(),
            session: self.ctx.session_shared().cloned(),
            tool: Arc::clone(&self.tool),
            digest,
            decision: if outcome == Outcome::Denied {
                Action::Deny
            } else {
                Action::Allow
            },
            rule,
            duration_us: duration_us(self.ctx.started().elapsed()),
            outcome,
        }
    }

    /// Records the call's end and announces it.
    pub(crate) fn finish<O>(mut self, decided: &Decided<O>) {
        self.finished = true;
        let outcome = match &decided.result {
            Ok(_) => Outcome::Ok,
            Err(err) => Outcome::of(err),
        };
        let entry = self.entry(outcome, decided.rule.clone(), decided.digest);
        self.gov.emit(|| match &decided.result {
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
        if let Some(audit) = self.gov.audit() {
            audit.append(entry);
        }
    }
}

impl Drop for Trail {
    fn drop(&mut self) {
        if !self.finished
            && let Some(audit) = self.gov.audit()
        {
            audit.append(self.entry(Outcome::Cancelled, None, 0));
        }
    }
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
