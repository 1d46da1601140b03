//! [`HooksLayer`]: the before-hooks see (and may rewrite) the arguments before the rules
//! judge them, and give their word to the permission layer; the after-hooks see every
//! outcome; the notes of both reach the model. Below this layer the arguments no longer
//! change, so it fixes their digest.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use super::Either;
use guildhall_actors::CallError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower::{Service, ServiceExt};

use crate::governance::audit::Outcome;
use crate::governance::call::{Call, Decided, digest};
use crate::governance::hooks::{HookInput, Phase};

thin_layer!(
    /// Adds [`WithHooks`] to a stack.
    HooksLayer,
    /// Runs a tool's configured before- and after-hooks around the layers below.
    WithHooks
);

impl<S, I, O> Service<Call<I>> for WithHooks<S>
where
    S: Service<Call<I>, Response = Decided<O>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    I: Serialize + DeserializeOwned + Send + 'static,
    O: Serialize + Send + 'static,
{
    type Response = Decided<O>;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<'static, Result<Decided<O>, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn call(&mut self, mut call: Call<I>) -> Self::Future {
        let before = call.gov().hooks.any(Phase::Before, &call.tool.name);
        let after = call.gov().hooks.any(Phase::After, &call.tool.name);
        if !before && !after {
            call.scope.digest = digest(&call.input);
            return Either::left(self.inner.call(call));
        }
        // Hooks run programs or callbacks: boxed, so calls without hooks stay small.
        let inner = self.inner.clone();
        Either::right(Box::pin(async move {
            Ok(run(inner, call, before, after).await)
        }))
    }
}

async fn run<S, I, O>(inner: S, mut call: Call<I>, before: bool, after: bool) -> Decided<O>
where
    S: Service<Call<I>, Response = Decided<O>, Error = Infallible>,
    I: Serialize + DeserializeOwned,
    O: Serialize,
{
    let (gov, tool) = (Arc::clone(call.gov()), Arc::clone(&call.tool.name));
    let mut notes = Vec::new();
    if before {
        let arguments = serde_json::to_value(&call.input).unwrap_or(Value::Null);
        let input = HookInput::new(
            Phase::Before,
            Arc::clone(&tool),
            &call.scope.ctx,
            arguments.clone(),
        );
        let said = gov.hooks.before(input).await;
        notes = said.notes;
        call.scope.hook_decision = said.decision;
        call.scope.json = Some(match said.arguments {
            Some(rewritten) => match serde_json::from_value(rewritten.clone()) {
                Ok(input) => {
                    call.input = input;
                    rewritten
                }
                Err(err) => {
                    let err = CallError::InvalidArguments {
                        tool: tool.to_string(),
                        path: ".".into(),
                        reason: format!(
                            "a hook rewrote the arguments into something the tool does not take: {err}"
                        ),
                    };
                    return call.scope.answer(Err(err), None);
                }
            },
            None => arguments,
        });
    }
    call.scope.digest = digest(&call.input);
    // The arguments as the after-hooks are to see them, kept only for them.
    let arguments = if after {
        call.scope.json(&call.input)
    } else {
        None
    };
    let ctx = call.scope.ctx.clone();
    let Ok(mut decided) = inner.oneshot(call).await;
    if after {
        let (outcome, value, error) = match &decided.result {
            Ok(out) => ("ok", serde_json::to_value(out).ok(), None),
            Err(err) => (Outcome::of(err).as_str(), None, Some(err.to_string())),
        };
        let input = HookInput {
            outcome: Some(outcome),
            result: value,
            error,
            ..HookInput::new(Phase::After, tool, &ctx, arguments.unwrap_or(Value::Null))
        };
        let said = gov.hooks.after(input).await;
        notes.extend(said);
    }
    // Before-hooks' notes first, then the after-hooks', then any from below.
    notes.append(&mut decided.notes);
    decided.notes = notes;
    decided
}
