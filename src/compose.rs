//! Tools composed of tools: a step's result is the next step's arguments, steps run side by
//! side under a failure policy, and the whole is one call with one reply.
//!
//! ```text
//! Composite::<ReadInput, ReadOutput>::tool("read_file")      a step: one governed call
//!     .then(Composite::tool("summarise"))                    its result, the next's input
//! Composite::identity()                                      its input, as it is
//! Composite::all([a, b, c], Failure::CollectAll)             side by side: each one's result
//! ```
//!
//! - **Each step is a call as the caller's own**: made through the runtime
//!   ([`Runtime::call_json`]) as the agent the composite is run for, in its session and
//!   trace, so governance applies per step (permissions, trust, the loop guard, truncation,
//!   the audit record) and supervision too (a step's crash is that step's `crashed`, its
//!   breaker that tool's).
//! - **One deadline**: a step's own timeout ([`Composite::timeout`]) is cut to what is left
//!   of the composite's; the composite's cancellation drops the step in flight (whose call
//!   is cancelled as any dropped call is).
//! - **Laws by construction**: a plan is a flat sequence of stages; [`then`](Composite::then)
//!   concatenates sequences and the identity is the empty one. So `id.then(t)`, `t` and
//!   `t.then(id)` are one plan, and `(a.then(b)).then(c)` and `a.then(b.then(c))` are another:
//!   the same calls, the same results, the same errors (steps are numbered in the flat
//!   sequence), the same audit records. `tests/it/compose.rs` checks it over random plans,
//!   inputs and failing steps.
//! - **Typed** in the Rust API: `Composite<I, O>` takes an `I` and gives an `O`, and `then`
//!   only joins an `O` to a step taking `O`. Over MCP, `[pipelines.NAME]` in guildhall.toml
//!   declares the same plans over any tools, mapping one step's result to the next's
//!   arguments with JSON pointers ([`pipelines`]).

mod mapping;
pub mod pipelines;

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guildhall_actors::{CallError, TraceParent};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::options::CallOptions;
use crate::runtime::Runtime;

/// What a fan-out does when a branch fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// Every branch runs to its end; the result lists each one's result or error.
    #[default]
    CollectAll,
    /// The first failure ends the fan-out (the other branches are cancelled) and is the
    /// composite's error.
    FailFast,
}

/// A composed tool: a plan of steps, taking an `I` and giving an `O`.
pub struct Composite<I, O> {
    plan: Seq,
    types: PhantomData<fn(I) -> O>,
}

impl<I, O> Clone for Composite<I, O> {
    fn clone(&self) -> Self {
        Self {
            plan: self.plan.clone(),
            types: PhantomData,
        }
    }
}

impl<I, O> std::fmt::Debug for Composite<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Composite").field(&self.plan).finish()
    }
}

/// A plan: stages run one after the other, each taking the one before's result.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seq(pub(crate) Vec<Stage>);

/// One stage of a plan.
#[derive(Debug, Clone)]
pub(crate) enum Stage {
    /// A call of a tool.
    Step(Arc<Step>),
    /// Plans run side by side on the same input; the result is an array of theirs.
    All {
        branches: Vec<Seq>,
        failure: Failure,
    },
}

/// A call of one tool.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) tool: String,
    /// Its own bound, within the composite's.
    pub(crate) timeout: Option<Duration>,
    /// Its arguments from what came before (`None`: the previous result, as it is).
    pub(crate) args: Option<mapping::Mapping>,
}

impl<I> Composite<I, I> {
    /// The identity: its input is its result, and no call is made.
    pub fn identity() -> Self {
        Self {
            plan: Seq::default(),
            types: PhantomData,
        }
    }
}

impl<I, O> Composite<I, O> {
    /// One step: a call of tool `name`, whose arguments are `I` and result `O` (a tool's
    /// `Input` and `Output`, or any types of the same JSON).
    pub fn tool(name: impl Into<String>) -> Self {
        Self::of(Seq(vec![Stage::Step(Arc::new(Step {
            tool: name.into(),
            timeout: None,
            args: None,
        }))]))
    }

    pub(crate) fn of(plan: Seq) -> Self {
        Self {
            plan,
            types: PhantomData,
        }
    }

    /// This, then `next` on its result.
    #[must_use]
    pub fn then<P>(mut self, next: Composite<O, P>) -> Composite<I, P> {
        self.plan.0.extend(next.plan.0);
        Composite::of(self.plan)
    }

    /// Bounds each step of this composite (that has no bound of its own) to `timeout`,
    /// within the deadline of the call it runs in.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.plan = self.plan.bounded(timeout);
        self
    }

    /// `branches` side by side on the same input, their results in their order; on a
    /// failure, as `failure` says. With [`Failure::CollectAll`] each result is the branch's
    /// result or `{"error": "…"}`.
    pub fn all(
        branches: impl IntoIterator<Item = Composite<I, O>>,
        failure: Failure,
    ) -> Composite<I, Vec<Value>> {
        Composite::of(Seq(vec![Stage::All {
            branches: branches.into_iter().map(|b| b.plan).collect(),
            failure,
        }]))
    }

    /// How many tool calls it makes (a fan-out's branches counted each).
    pub fn steps(&self) -> usize {
        self.plan.steps()
    }

    /// Runs it for `options`' agent, session and trace, within `options`' timeout (60 s
    /// when it names none).
    ///
    /// # Errors
    /// [`ComposeError`] naming the step that failed and how.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the step in flight (as a dropped call is); the steps
    /// before it stay done.
    pub async fn run(
        &self,
        runtime: &Runtime,
        input: I,
        options: CallOptions,
    ) -> Result<O, ComposeError>
    where
        I: Serialize,
        O: DeserializeOwned,
    {
        let input = serde_json::to_value(input).map_err(|e| ComposeError::Type(e.to_string()))?;
        let by = By::new(&options);
        let out = self.plan.run(runtime, input, &by).await?;
        serde_json::from_value(out).map_err(|e| ComposeError::Type(e.to_string()))
    }
}

impl Seq {
    fn steps(&self) -> usize {
        self.0
            .iter()
            .map(|stage| match stage {
                Stage::Step(_) => 1,
                Stage::All { branches, .. } => branches.iter().map(Seq::steps).sum(),
            })
            .sum()
    }

    fn bounded(self, timeout: Duration) -> Self {
        Seq(self
            .0
            .into_iter()
            .map(|stage| match stage {
                Stage::Step(step) if step.timeout.is_none() => Stage::Step(Arc::new(Step {
                    tool: step.tool.clone(),
                    timeout: Some(timeout),
                    args: step.args.clone(),
                })),
                Stage::All { branches, failure } => Stage::All {
                    branches: branches.into_iter().map(|b| b.bounded(timeout)).collect(),
                    failure,
                },
                stage => stage,
            })
            .collect())
    }

    /// Runs the stages in order on `input`: the last one's result. Step numbers count from
    /// `by.first` in the flat sequence.
    pub(crate) fn run<'a>(
        &'a self,
        runtime: &'a Runtime,
        input: Value,
        by: &'a By,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ComposeError>> + Send + 'a>> {
        Box::pin(async move {
            // The input is kept only for steps that map their arguments from it.
            let mapped = self
                .0
                .iter()
                .any(|stage| matches!(stage, Stage::Step(step) if step.args.is_some()));
            let kept = if mapped { input.clone() } else { Value::Null };
            let mut value = input;
            let mut number = by.first;
            for stage in &self.0 {
                value = match stage {
                    Stage::Step(step) => {
                        number += 1;
                        step.run(runtime, &kept, value, number, by).await?
                    }
                    Stage::All { branches, failure } => {
                        let out = fan_out(runtime, branches, *failure, value, number, by).await?;
                        number += branches.iter().map(Seq::steps).sum::<usize>();
                        out
                    }
                };
            }
            Ok(value)
        })
    }
}

impl Step {
    /// Calls the tool with its arguments (mapped from `input`, the composite's, and `value`,
    /// the previous result), as the caller, within what is left of the deadline.
    async fn run(
        &self,
        runtime: &Runtime,
        input: &Value,
        value: Value,
        number: usize,
        by: &By,
    ) -> Result<Value, ComposeError> {
        let failed = |reason: StepFailure| ComposeError::Step {
            step: number,
            tool: self.tool.clone(),
            reason,
        };
        let args = match &self.args {
            Some(mapping) => mapping
                .apply(input, &value)
                .map_err(|r| failed(StepFailure::Mapping(r)))?,
            None => value,
        };
        let left = by.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(failed(StepFailure::NoTimeLeft));
        }
        let budget = self.timeout.map_or(left, |own| own.min(left));
        let call = runtime.call_json(&self.tool, args, by.options(budget));
        let Some(cancel) = &by.cancel else {
            return call.await.map_err(|e| failed(StepFailure::Call(e)));
        };
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(ComposeError::Cancelled),
            out = call => out.map_err(|e| failed(StepFailure::Call(e))),
        }
    }
}

/// `branches` side by side on `input`, numbered from `number`.
async fn fan_out(
    runtime: &Runtime,
    branches: &[Seq],
    failure: Failure,
    input: Value,
    number: usize,
    by: &By,
) -> Result<Value, ComposeError> {
    let mut first = number;
    let runs = branches.iter().map(|branch| {
        let at = By {
            first,
            ..by.clone()
        };
        first += branch.steps();
        let input = input.clone();
        async move { branch.run(runtime, input, &at).await }
    });
    match failure {
        Failure::FailFast => {
            let all = futures::future::try_join_all(runs).await?;
            Ok(Value::Array(all))
        }
        Failure::CollectAll => {
            let all = futures::future::join_all(runs).await;
            if all
                .iter()
                .any(|r| matches!(r, Err(ComposeError::Cancelled)))
            {
                return Err(ComposeError::Cancelled);
            }
            Ok(Value::Array(
                all.into_iter()
                    .map(|r| {
                        r.unwrap_or_else(|err| serde_json::json!({ "error": err.to_string() }))
                    })
                    .collect(),
            ))
        }
    }
}

/// Who a composite runs for, and within what.
#[derive(Clone)]
pub(crate) struct By {
    agent: Option<Arc<str>>,
    session: Option<Arc<str>>,
    trace: Option<TraceParent>,
    deadline: Instant,
    cancel: Option<tokio_util::sync::CancellationToken>,
    /// The number of the step before this plan's first, in the whole composite.
    first: usize,
}

/// A composite's bound when its caller names none.
const DEFAULT_BUDGET: Duration = Duration::from_secs(60);

impl By {
    fn new(options: &CallOptions) -> Self {
        Self {
            agent: options.agent.clone(),
            session: options.session.clone(),
            trace: options.trace,
            deadline: Instant::now() + options.timeout.unwrap_or(DEFAULT_BUDGET),
            cancel: None,
            first: 0,
        }
    }

    /// For a composite run as a tool: its call's caller, deadline and cancellation. Its
    /// steps are spans under the composite's own (a timeline nests them in it).
    pub(crate) fn of_call(ctx: &guildhall_actors::CallContext) -> Self {
        Self {
            agent: ctx.agent_shared().cloned(),
            session: ctx.session_shared().cloned(),
            trace: Some(ctx.span()),
            deadline: ctx.deadline().into_std(),
            cancel: Some(ctx.cancellation().clone()),
            first: 0,
        }
    }

    fn options(&self, budget: Duration) -> CallOptions {
        let mut options = CallOptions::new().timeout(budget);
        options.agent = self.agent.clone();
        options.session = self.session.clone();
        options.trace = self.trace;
        options
    }
}

/// Why a composite failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ComposeError {
    /// Step `step` (counted from 1 in the flat sequence) failed.
    #[error("step {step} (`{tool}`): {reason}")]
    Step {
        /// Its number.
        step: usize,
        /// Its tool.
        tool: String,
        /// How.
        reason: StepFailure,
    },
    /// The composite's call was cancelled (its deadline, or its caller gone).
    #[error("the composite was cancelled")]
    Cancelled,
    /// Its input or result is not of its type.
    #[error("not of the composite's type: {0}")]
    Type(String),
}

/// How a step failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StepFailure {
    /// The call's own outcome: refused, failed, crashed, timed out, its circuit open.
    #[error(transparent)]
    Call(CallError),
    /// Its arguments could not be made from what came before.
    #[error("its arguments: {0}")]
    Mapping(String),
    /// The composite's deadline passed before it began.
    #[error("no time was left for it within the composite's deadline")]
    NoTimeLeft,
}
