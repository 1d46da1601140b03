//! [`PermissionLayer`]: the rules by scope, combined with the before-hooks' word (deny wins;
//! a hook's allow skips a rule's ask); `ask` goes to the caller's asker.

use std::convert::Infallible;
use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use super::Either;
use serde::Serialize;
use tower::{Service, ServiceExt};

use super::question::Question;
use crate::governance::call::{Call, Decided, Ruled, denied, json_once};
use crate::governance::rules::{Action, Rule};

thin_layer!(
    /// Adds [`Permission`] to a stack.
    PermissionLayer,
    /// Lets a call through, refuses it, or asks about it.
    Permission
);

type Answer<O> = Result<Decided<O>, Infallible>;

impl<S, I, O> Service<Call<I>> for Permission<S>
where
    S: Service<Call<I>, Response = Decided<O>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    I: Serialize + Send + Sync + 'static,
    O: Send + 'static,
{
    type Response = Decided<O>;
    type Error = Infallible;
    #[allow(clippy::type_complexity)]
    type Future = Either<Ready<Answer<O>>, Either<Ruled<S::Future>, BoxFuture<'static, Answer<O>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn call(&mut self, mut call: Call<I>) -> Self::Future {
        let Call { input, tool, scope } = &mut call;
        let json = &mut scope.json;
        let ruling = tool.gov.decide(
            scope.ctx.agent_shared(),
            scope.ctx.session_shared(),
            &tool.spec,
            tool.id,
            &mut || json_once(json, input),
        );
        let (action, why): (Action, Arc<str>) = match scope.hook_decision.take() {
            Some((Action::Deny, why)) => (Action::Deny, Arc::from(why)),
            _ if ruling.action == Action::Deny => (Action::Deny, ruling.label),
            Some((Action::Allow, why)) => (Action::Allow, Arc::from(why)),
            Some((Action::Ask, why)) => (Action::Ask, Arc::from(why)),
            None => (ruling.action, ruling.label),
        };
        match action {
            Action::Allow => Either::right(Either::left(Ruled::new(self.inner.call(call), why))),
            Action::Deny => Either::left(std::future::ready(refuse(call, why))),
            Action::Ask => Either::right(Either::right(ask(
                self.inner.clone(),
                call,
                why,
                ruling.asking_rule,
            ))),
        }
    }
}

/// Refuses `call`, as `why` says.
#[cold]
fn refuse<I, O>(call: Call<I>, why: Arc<str>) -> Answer<O> {
    let err = denied(&call.tool.name, why.to_string());
    Ok(call.scope.answer(Err(err), Some(why)))
}

/// Asks the caller's asker about `call`, which `asking_rule` (or else nothing) asked about,
/// and runs it through `inner` once allowed. Asking waits for a person: boxed, so other
/// calls' futures stay small.
#[cold]
fn ask<S, I, O>(
    inner: S,
    mut call: Call<I>,
    why: Arc<str>,
    asking_rule: Option<Rule>,
) -> BoxFuture<'static, Answer<O>>
where
    S: Service<Call<I>, Response = Decided<O>, Error = Infallible> + Send + 'static,
    S::Future: Send,
    I: Serialize + Send + Sync + 'static,
    O: Send + 'static,
{
    // An approval covers what the asking rule covered, or else the whole tool.
    let covering = asking_rule.or_else(|| Rule::new(&call.tool.name, Action::Allow).ok());
    let question = Question::about(&mut call, why.to_string(), covering);
    Box::pin(async move {
        match question.ask().await {
            Ok(answer) => Ruled::new(inner.oneshot(call), answer).await,
            Err(err) => Ok(call.scope.answer(Err(err), Some(why))),
        }
    })
}
