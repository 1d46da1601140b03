//! [`LoopGuardLayer`]: an agent repeating itself is told to change course. Below the
//! permission layer, so a denied call never counts toward a streak. A read-only tool is
//! judged after it ran, by its result too: polling that sees new mail is not a loop
//! (see [`doom`](crate::governance::doom)).

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use super::Either;
use serde::Serialize;
use tower::{Service, ServiceExt};

use super::question::Question;
use crate::governance::Governance;
use crate::governance::call::{Call, Decided, denied, digest};
use crate::governance::rules::Action;

/// What the loop guard records as the rule that stopped a call.
const LOOP_GUARD: &str = "loop guard";

thin_layer!(
    /// Adds [`LoopGuarded`] to a stack.
    LoopGuardLayer,
    /// Counts each agent's identical calls in a row, and acts on a streak.
    LoopGuarded
);

type Answer<O> = Result<Decided<O>, Infallible>;

impl<S, I, O> Service<Call<I>> for LoopGuarded<S>
where
    S: Service<Call<I>, Response = Decided<O>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    I: Serialize + Send + Sync + 'static,
    O: Serialize + Send + 'static,
{
    type Response = Decided<O>;
    type Error = Infallible;
    #[allow(clippy::type_complexity)]
    type Future =
        Either<Ready<Answer<O>>, Either<JudgedFuture<S::Future, O>, BoxFuture<'static, Answer<O>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn call(&mut self, mut call: Call<I>) -> Self::Future {
        let guarded = call.gov().loops.is_on() && !(call.tool.polls)(&call.input);
        let Some(agent) = call.scope.ctx.agent_shared().filter(|_| guarded) else {
            return Either::right(Either::left(JudgedFuture::unjudged(self.inner.call(call))));
        };
        if call.tool.spec.annotations.read_only_hint {
            // Judged after it ran. The question is made now, while the call is at hand, and
            // only when a tripped guard would ask; its reason is known only then.
            let agent = Arc::clone(agent);
            let question = (call.gov().loops.action() == Action::Ask)
                .then(|| Box::new(Question::about(&mut call, String::new(), None)));
            let judge = Judge {
                gov: Arc::clone(call.gov()),
                tool: Arc::clone(&call.tool.name),
                tool_id: call.tool.id,
                agent,
                digest: call.scope.digest,
                question,
            };
            return Either::right(Either::left(JudgedFuture {
                state: State::Running {
                    inner: self.inner.call(call),
                },
                judge: Some(judge),
                forget: None,
            }));
        }
        let Some(count) = call
            .gov()
            .loops
            .count(agent, call.tool.id, call.scope.digest)
        else {
            let forget = Forget {
                gov: Arc::clone(call.gov()),
                agent: Arc::clone(agent),
            };
            return Either::right(Either::left(JudgedFuture {
                state: State::Running {
                    inner: self.inner.call(call),
                },
                judge: None,
                forget: Some(forget),
            }));
        };
        let agent = Arc::clone(agent);
        match repeated(&self.inner, call, count, agent) {
            Repeated::Through(call) => {
                Either::right(Either::left(JudgedFuture::unjudged(self.inner.call(call))))
            }
            Repeated::Refused(refused) => Either::left(std::future::ready(Ok(refused))),
            Repeated::Asking(asking) => Either::right(Either::right(asking)),
        }
    }
}

/// What the guard does with a call repeated too often, as its action says.
enum Repeated<I, O> {
    /// Let through, with a warning in the log.
    Through(Call<I>),
    /// Refused, answered so.
    Refused(Decided<O>),
    /// Asked about; runs once allowed.
    Asking(BoxFuture<'static, Answer<O>>),
}

/// What becomes of a call the guard saw `count` times in a row from `agent` (`inner` runs
/// it once an asked person allows it).
#[cold]
fn repeated<S, I, O>(inner: &S, mut call: Call<I>, count: u32, agent: Arc<str>) -> Repeated<I, O>
where
    S: Service<Call<I>, Response = Decided<O>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    I: Serialize + Send + Sync + 'static,
    O: Send + 'static,
{
    let name = Arc::clone(&call.tool.name);
    let why = format!(
        "`{name}` was called {count} times in a row by `{agent}` with the same arguments; \
         the result will not change. Try different arguments or another approach."
    );
    match call.gov().loops.action() {
        Action::Allow => {
            tracing::warn!(%agent, tool = %name, count, "repeated call");
            Repeated::Through(call)
        }
        Action::Deny => Repeated::Refused(
            call.scope
                .answer(Err(denied(&name, why)), Some(Arc::from(LOOP_GUARD))),
        ),
        Action::Ask => {
            let question = Question::about(&mut call, why, None);
            let inner = inner.clone();
            Repeated::Asking(Box::pin(async move {
                match question.ask().await {
                    Ok(answer) => {
                        call.gov().loops.reset(&agent);
                        let Ok(mut decided) = inner.oneshot(call).await;
                        decided.rule = Some(answer);
                        Ok(decided)
                    }
                    Err(err) => Ok(call.scope.answer(Err(err), Some(Arc::from(LOOP_GUARD)))),
                }
            }))
        }
    }
}

/// What judging a read by its result takes.
struct Judge {
    gov: Arc<Governance>,
    tool: Arc<str>,
    tool_id: u64,
    agent: Arc<str>,
    digest: u64,
    /// The question to ask, made only when a tripped guard asks.
    question: Option<Box<Question>>,
}

pin_project_lite::pin_project! {
    /// The future of a [`LoopGuarded`] call that runs.
    pub struct JudgedFuture<F, O> {
        #[pin]
        state: State<F, O>,
        judge: Option<Judge>,
        forget: Option<Forget>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, O> {
        Running { #[pin] inner: F },
        Asking { ask: BoxFuture<'static, Answer<O>> },
    }
}

impl<F, O> JudgedFuture<F, O> {
    fn unjudged(inner: F) -> Self {
        Self {
            state: State::Running { inner },
            judge: None,
            forget: None,
        }
    }
}

impl<F, O> Future for JudgedFuture<F, O>
where
    F: Future<Output = Answer<O>>,
    O: Serialize + Send + 'static,
{
    type Output = Answer<O>;

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer<O>> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Asking { ask } => return ask.as_mut().poll(cx),
                StateProj::Running { inner } => {
                    let Ok(decided) = std::task::ready!(inner.poll(cx));
                    if let Some(forget) = this.forget.take() {
                        forget.after(&decided);
                    }
                    let Some(judge) = this.judge.take() else {
                        return Poll::Ready(Ok(decided));
                    };
                    match judge.judge(decided) {
                        Verdict::Done(decided) => return Poll::Ready(Ok(decided)),
                        Verdict::Ask(ask) => this.state.set(State::Asking { ask }),
                    }
                }
            }
        }
    }
}

enum Verdict<O> {
    Done(Decided<O>),
    Ask(BoxFuture<'static, Answer<O>>),
}

/// What a counted call that fails for a passing reason takes back: its agent's streak.
struct Forget {
    gov: Arc<Governance>,
    agent: Arc<str>,
}

impl Forget {
    /// Forgets the agent's streak when the call failed for a reason that may pass: the
    /// same call again is a retry, not a loop (a task finished again while the database
    /// restarts).
    fn after<O>(self, decided: &Decided<O>) {
        if decided.result.as_ref().err().is_some_and(may_pass) {
            self.gov.loops.reset(&self.agent);
        }
    }
}

/// Whether the same call may succeed later, so that repeating it is a retry: a crash, a
/// deadline, a tool unavailable, open or rate-limited, or an error the tool calls transient.
/// Not a refusal: a call the guard itself denied must not end its own streak.
fn may_pass(err: &guildhall_actors::CallError) -> bool {
    use guildhall_actors::CallError as E;
    err.is_transient()
        || matches!(
            err,
            E::Timeout { .. }
                | E::Unavailable { .. }
                | E::CircuitOpen { .. }
                | E::RateLimited { .. }
        )
}

impl Judge {
    /// Counts a finished read: a repeat only when its arguments and its result both match
    /// the agent's last call. A read that failed for a passing reason is a retry, not one.
    fn judge<O: Serialize + Send + 'static>(self, decided: Decided<O>) -> Verdict<O> {
        let answer = match &decided.result {
            Ok(out) => digest(out),
            Err(err) if may_pass(err) => {
                self.gov.loops.reset(&self.agent);
                return Verdict::Done(decided);
            }
            Err(err) => xxhash_rust::xxh3::xxh3_64(err.to_string().as_bytes()),
        };
        let Some(count) = self
            .gov
            .loops
            .count_read(&self.agent, self.tool_id, self.digest, answer)
        else {
            return Verdict::Done(decided);
        };
        let (name, agent) = (&self.tool, &self.agent);
        let why = format!(
            "`{name}` was called {count} times in a row by `{agent}` with the same \
             arguments and gave the same result each time. Wait for something to change \
             (e.g. `wait_secs`), or try different arguments or another approach."
        );
        match (self.gov.loops.action(), self.question) {
            (Action::Allow, _) => {
                tracing::warn!(%agent, tool = %name, count, "repeated call");
                Verdict::Done(decided)
            }
            (Action::Ask, Some(mut question)) => {
                question.why = why;
                let (gov, agent) = (self.gov, self.agent);
                Verdict::Ask(Box::pin(async move {
                    let mut decided = decided;
                    match question.ask().await {
                        Ok(answer) => {
                            gov.loops.reset(&agent);
                            decided.rule = Some(answer);
                        }
                        Err(err) => {
                            decided.result = Err(err);
                            decided.rule = Some(Arc::from(LOOP_GUARD));
                        }
                    }
                    Ok(decided)
                }))
            }
            _ => Verdict::Done(Decided {
                result: Err(denied(name, why)),
                rule: Some(Arc::from(LOOP_GUARD)),
                ..decided
            }),
        }
    }
}
