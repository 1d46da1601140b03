//! [`Governed`]: the tower layer that runs the governance stages around a tool's pipeline.

use std::any::Any;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use guildhall_actors::{CallContext, CallError, ToolSpec};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower::{Service, ServiceExt};

use super::asker::{AskRequest, Asker};
use super::audit::{Entry, Outcome};
use super::hooks::{HookInput, Phase};
use super::rules::{Action, Rule};
use super::truncate::Truncated;
use super::{Approval, Governance, ToolEvent};
use crate::pipeline::ToolCall;

/// A call as the governed stack takes it: the pipeline's call plus who to ask.
pub struct Request<I> {
    /// The call.
    pub call: ToolCall<I>,
    /// Who to ask when a rule says `ask`; without one such calls are denied.
    pub asker: Option<Arc<dyn Asker>>,
}

/// A JSON call's result as a model is to see it. Serializes as its value.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    /// The whole result.
    pub value: Value,
    /// The result as text: a string result as is, anything else as compact JSON.
    pub text: String,
    /// Notes from hooks, for the model.
    pub notes: Vec<String>,
    /// Set when the text is over the tool's limits: what the model should see instead.
    pub truncated: Option<Truncated>,
}

impl ToolReply {
    /// A reply holding `value`.
    pub fn new(value: Value) -> Self {
        let text = match &value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Self {
            value,
            text,
            notes: Vec::new(),
            truncated: None,
        }
    }
}

impl Serialize for ToolReply {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

/// What governance knows of one tool. Shared by its typed and JSON stacks.
pub struct ToolMeta<I> {
    /// A number no other tool of this process had or will have: what the loop guard and
    /// the decision cache compare (a name can be registered again after a failure).
    pub id: u64,
    /// The tool's interned name.
    pub name: Arc<str>,
    /// Its contract.
    pub spec: ToolSpec,
    /// Whether a call waits or polls by design (exempt from the loop guard).
    pub polls: fn(&I) -> bool,
}

impl<I> ToolMeta<I> {
    /// The meta of a tool being registered, with a fresh [`id`](Self::id).
    pub fn new(name: Arc<str>, spec: ToolSpec, polls: fn(&I) -> bool) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            name,
            spec,
            polls,
        }
    }
}

/// Turns the pipeline's response into the stack's (identity for typed calls, JSON encoding
/// for JSON calls).
type Convert<R, O> = fn(R, &str) -> Result<O, CallError>;

/// The outermost layer of a tool's stack; see [the module docs](super) for its stages.
pub struct Governed<S, I, O>
where
    S: Service<ToolCall<I>>,
{
    inner: S,
    gov: Arc<Governance>,
    tool: Arc<ToolMeta<I>>,
    convert: Convert<S::Response, O>,
}

impl<S, I, O> Clone for Governed<S, I, O>
where
    S: Service<ToolCall<I>> + Clone,
{
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            gov: Arc::clone(&self.gov),
            tool: Arc::clone(&self.tool),
            convert: self.convert,
        }
    }
}

impl<S, I, O> Governed<S, I, O>
where
    S: Service<ToolCall<I>>,
{
    /// Governs calls to `inner`, converting its responses with `convert`.
    pub fn new(
        inner: S,
        gov: Arc<Governance>,
        tool: Arc<ToolMeta<I>>,
        convert: Convert<S::Response, O>,
    ) -> Self {
        Self {
            inner,
            gov,
            tool,
            convert,
        }
    }
}

impl<S, I, O> Service<Request<I>> for Governed<S, I, O>
where
    S: Service<ToolCall<I>, Error = CallError> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    I: Serialize + DeserializeOwned + Send + Sync + 'static,
    O: Serialize + Send + 'static,
{
    type Response = O;
    type Error = CallError;
    type Future = GovernedFuture<S, I, O>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        // Readiness is the inner stack's business, awaited per call on its own clone.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<I>) -> Self::Future {
        self.call_ref(req)
    }
}

impl<S, I, O> Governed<S, I, O>
where
    S: Service<ToolCall<I>, Error = CallError> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    I: Serialize + DeserializeOwned + Send + Sync + 'static,
    O: Serialize + Send + 'static,
{
    /// The bare pipeline, when governance has nothing to do for this call's kind (nothing
    /// configured, nobody subscribed to events, not a JSON call): the typed handle then
    /// calls it directly, exactly as it would without governance.
    pub(crate) fn bypass(&self) -> Option<&S> {
        (self.gov.is_passive() && !is::<O, ToolReply>() && !self.gov.events.has_subscribers())
            .then_some(&self.inner)
    }

    /// Records a call refused before this stack could run (arguments that do not decode):
    /// audited and announced like any other, then answered with `err`.
    pub(crate) fn refuse(
        &self,
        ctx: &CallContext,
        err: CallError,
    ) -> impl std::future::Future<Output = Result<O, CallError>> + Send + 'static {
        let gov = Arc::clone(&self.gov);
        let tool = Arc::clone(&self.tool.name);
        let ctx = ctx.clone();
        async move {
            let mut trail = Trail::new(&gov, &tool, &ctx);
            trail.rule = Some(Arc::from("argument check"));
            gov.emit(|| ToolEvent::Invoked {
                call_id: ctx.call_id(),
                tool: Arc::clone(&tool),
                agent: ctx.agent_shared().cloned(),
            });
            trail.finish(Err(err))
        }
    }

    /// Makes one call, cloning of this stack only what the call needs.
    pub fn call_ref(&self, req: Request<I>) -> GovernedFuture<S, I, O> {
        if let Some(pipeline) = self.bypass() {
            // Straight to the pipeline, with no allocation.
            return GovernedFuture {
                state: FutureState::Passive {
                    inner: pipeline.clone().oneshot(req.call),
                    convert: self.convert,
                    tool: Arc::clone(&self.tool),
                },
            };
        }
        GovernedFuture {
            state: FutureState::Governed {
                run: Box::pin(self.clone().run(req)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Governed`] call.
    pub struct GovernedFuture<S, I, O>
    where
        S: Service<ToolCall<I>>,
    {
        #[pin]
        state: FutureState<S, I, O>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum FutureState<S, I, O>
    where
        S: Service<ToolCall<I>>,
    {
        Passive {
            #[pin]
            inner: tower::util::Oneshot<S, ToolCall<I>>,
            convert: Convert<S::Response, O>,
            tool: Arc<ToolMeta<I>>,
        },
        Governed {
            run: BoxFuture<'static, Result<O, CallError>>,
        },
    }
}

impl<S, I, O> std::future::Future for GovernedFuture<S, I, O>
where
    S: Service<ToolCall<I>, Error = CallError>,
{
    type Output = Result<O, CallError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Passive {
                inner,
                convert,
                tool,
            } => {
                let response = std::task::ready!(inner.poll(cx));
                Poll::Ready(response.and_then(|r| convert(r, &tool.name)))
            }
            StateProj::Governed { run } => run.as_mut().poll(cx),
        }
    }
}

impl<S, I, O> Governed<S, I, O>
where
    S: Service<ToolCall<I>, Error = CallError> + Send + 'static,
    S::Future: Send,
    I: Serialize + DeserializeOwned + Send + Sync + 'static,
    O: Serialize + Send + 'static,
{
    /// Runs the stages for one call, owning this clone of the stack.
    async fn run(self, req: Request<I>) -> Result<O, CallError> {
        let Governed {
            inner,
            gov,
            tool,
            convert,
        } = self;
        let Request {
            call: ToolCall { input, ctx },
            asker,
        } = req;
        let mut trail = Trail::new(&gov, &tool.name, &ctx);
        if let Some(audit) = gov.audit() {
            // After the trail exists, so a call dropped while it waits is audited too.
            audit.room().await;
        }
        let result = stages(inner, &tool, convert, input, asker, &mut trail).await;
        trail.finish(result)
    }
}

/// The stages inside audit, in order; records the decision and its rule on `trail`.
async fn stages<S, I, O>(
    inner: S,
    tool: &ToolMeta<I>,
    convert: Convert<S::Response, O>,
    mut input: I,
    asker: Option<Arc<dyn Asker>>,
    trail: &mut Trail<'_>,
) -> Result<O, CallError>
where
    S: Service<ToolCall<I>, Error = CallError> + Send + 'static,
    S::Future: Send,
    I: Serialize + DeserializeOwned + Send + Sync + 'static,
    O: Serialize + Send + 'static,
{
    let (gov, ctx) = (trail.gov, trail.ctx);
    let name = &tool.name;
    gov.emit(|| ToolEvent::Invoked {
        call_id: ctx.call_id(),
        tool: Arc::clone(name),
        agent: ctx.agent_shared().cloned(),
    });
    // Borrowed from the call's context, which outlives the stages (the pipeline gets a clone).
    let agent = ctx.agent_shared();
    let session = ctx.session_shared();

    if !gov.limits.is_empty()
        && let Err(err) = gov.limits.check(name, agent)
    {
        trail.rule = Some(Arc::from("rate limit"));
        return Err(err);
    }

    // Before-hooks see (and may rewrite) the arguments before the rules judge them.
    let mut json: Option<Value> = None;
    let mut notes = Vec::new();
    let mut hook_decision = None;
    if gov.hooks.any(Phase::Before, name) {
        let arguments = serde_json::to_value(&input).unwrap_or(Value::Null);
        let before = Box::pin(gov.hooks.before(HookInput {
            phase: Phase::Before,
            call_id: ctx.call_id().to_string(),
            tool: Arc::clone(name),
            agent: agent.cloned(),
            session: session.cloned(),
            arguments: arguments.clone(),
            outcome: None,
            result: None,
            error: None,
        }))
        .await;
        notes = before.notes;
        hook_decision = before.decision;
        json = Some(match before.arguments {
            Some(rewritten) => {
                input = match serde_json::from_value(rewritten.clone()) {
                    Ok(input) => input,
                    Err(err) => {
                        let err = CallError::InvalidArguments {
                            tool: name.to_string(),
                            path: ".".into(),
                            reason: format!(
                                "a hook rewrote the arguments into something the tool does not take: {err}"
                            ),
                        };
                        return Err(err);
                    }
                };
                rewritten
            }
            None => arguments,
        });
    }
    trail.digest = digest(&input);

    // Permission: the rules, then the hooks' word (deny wins; a hook's allow skips an ask).
    let verdict = gov.decide(agent, session, &tool.spec, tool.id, &mut || {
        if json.is_none() {
            json = serde_json::to_value(&input).ok();
        }
        json.clone()
    });
    let (action, why): (Action, Arc<str>) = match hook_decision {
        Some((Action::Deny, why)) => (Action::Deny, Arc::from(why)),
        _ if verdict.action == Action::Deny => (Action::Deny, Arc::clone(&verdict.label)),
        Some((Action::Allow, why)) => (Action::Allow, Arc::from(why)),
        Some((Action::Ask, why)) => (Action::Ask, Arc::from(why)),
        None => (verdict.action, Arc::clone(&verdict.label)),
    };
    // The rules and the loop guard both ask; only the reason, what an approval covers and
    // whom it names differ.
    let input_ref = &input;
    let ask_about = |why: Arc<str>, covering: Option<Rule>, agent| {
        let asker = asker.as_deref();
        Box::pin(async move {
            ask(
                gov, name, ctx, asker, input_ref, &why, covering, agent, session,
            )
            .await
        })
    };
    match action {
        Action::Allow => trail.rule = Some(why),
        Action::Deny => {
            let err = denied(name, why.to_string());
            trail.rule = Some(why);
            return Err(err);
        }
        Action::Ask => {
            // An approval covers what the asking rule covered, or else the whole tool.
            let covering = verdict
                .asking_rule
                .clone()
                .or_else(|| Rule::new(name, Action::Allow).ok());
            let outcome = ask_about(Arc::clone(&why), covering, agent).await;
            match outcome {
                Ok(answer) => trail.rule = Some(answer),
                Err(err) => {
                    trail.rule = Some(why);
                    return Err(err);
                }
            }
        }
    }

    // The loop guard: an agent repeating itself gets told to change course. A read-only
    // tool is judged after it ran, by its result too (see `doom`).
    let guarded = agent.filter(|_| gov.loops.is_on() && !(tool.polls)(&input));
    let judged_by_result = tool.spec.annotations.read_only_hint;
    if let Some(agent) = guarded
        && !judged_by_result
        && let Some(count) = gov.loops.count(agent, tool.id, trail.digest)
    {
        let why = format!(
            "`{name}` was called {count} times in a row by `{agent}` with the same arguments; \
             the result will not change. Try different arguments or another approach."
        );
        match gov.loops.action() {
            Action::Allow => tracing::warn!(%agent, tool = %name, count, "repeated call"),
            Action::Deny => {
                trail.rule = Some(Arc::from("loop guard"));
                return Err(denied(name, why));
            }
            Action::Ask => {
                let asked = ask_about(Arc::from(why), None, Some(agent)).await;
                match asked {
                    Ok(answer) => {
                        gov.loops.reset(agent);
                        trail.rule = Some(answer);
                    }
                    Err(err) => {
                        trail.rule = Some(Arc::from("loop guard"));
                        return Err(err);
                    }
                }
            }
        }
    }
    // A read judged after it ran may need to ask then: keep what asking takes, only then.
    let ask_after = guarded
        .filter(|_| judged_by_result && gov.loops.action() == Action::Ask)
        .map(|_| {
            Box::new((
                asker.clone(),
                json.clone()
                    .or_else(|| serde_json::to_value(&input).ok())
                    .unwrap_or(Value::Null),
            ))
        });

    // The result cache (JSON calls to tools declared deterministic).
    let cache = gov
        .tool_policy(name)
        .and_then(|p| p.cache_ttl)
        .filter(|_| is::<O, ToolReply>())
        .map(|ttl| (ttl, gov.context_generation(session.map(|s| &**s))));
    if let Some((_, generation)) = cache
        && let Some(hit) = gov.cache.get(name, session, trail.digest, generation)
    {
        let reply = ToolReply::new(Value::clone(&hit));
        let out = as_output::<O>(reply);
        return out.map(|mut o| {
            if let Some(r) = downcast_mut::<O, ToolReply>(&mut o) {
                r.notes.extend(notes);
            }
            o
        });
    }

    // Dropped here rather than at the end, so the call's future keeps no room for them
    // across the pipeline call.
    drop((verdict, asker));

    // What the after-hooks and the reply need, kept across the pipeline call only when
    // hooks gave or want something: boxed, so other calls' futures stay small.
    let after_hooks = gov.hooks.any(Phase::After, name);
    let mut hooked = (after_hooks || !notes.is_empty()).then(|| {
        Box::new(Hooked {
            json: json.filter(|_| after_hooks),
            notes,
        })
    });
    let result = inner
        .oneshot(ToolCall {
            input,
            ctx: ctx.clone(),
        })
        .await;
    let mut result = result.and_then(|r| convert(r, name));

    if let Some(agent) = guarded.filter(|_| judged_by_result) {
        let answer = match &result {
            Ok(out) => digest(out),
            Err(err) => xxhash_rust::xxh3::xxh3_64(err.to_string().as_bytes()),
        };
        if let Some(count) = gov.loops.count_read(agent, tool.id, trail.digest, answer) {
            let why = format!(
                "`{name}` was called {count} times in a row by `{agent}` with the same \
                 arguments and gave the same result each time. Wait for something to change \
                 (e.g. `wait_secs`), or try different arguments or another approach."
            );
            match (gov.loops.action(), ask_after) {
                (Action::Allow, _) => {
                    tracing::warn!(%agent, tool = %name, count, "repeated call");
                }
                (Action::Ask, Some(asking)) => {
                    trail.rule = Some(Arc::from("loop guard"));
                    let (asker, arguments) = *asking;
                    let answer = Box::pin(ask(
                        gov,
                        name,
                        ctx,
                        asker.as_deref(),
                        &arguments,
                        &why,
                        None,
                        Some(agent),
                        session,
                    ))
                    .await?;
                    gov.loops.reset(agent);
                    trail.rule = Some(answer);
                }
                _ => {
                    trail.rule = Some(Arc::from("loop guard"));
                    return Err(denied(name, why));
                }
            }
        }
    }

    if after_hooks && let Some(hooked) = &mut hooked {
        let (outcome, value, error) = match &result {
            Ok(out) => ("ok", serde_json::to_value(out).ok(), None),
            Err(err) => (Outcome::of(err).as_str(), None, Some(err.to_string())),
        };
        let after = Box::pin(gov.hooks.after(HookInput {
            phase: Phase::After,
            call_id: ctx.call_id().to_string(),
            tool: Arc::clone(name),
            agent: agent.cloned(),
            session: session.cloned(),
            arguments: hooked.json.take().unwrap_or(Value::Null),
            outcome: Some(outcome),
            result: value,
            error,
        }))
        .await;
        hooked.notes.extend(after);
    }

    if let Ok(out) = &mut result
        && let Some(reply) = downcast_mut::<O, ToolReply>(out)
    {
        if let Some(hooked) = hooked {
            reply.notes.extend(hooked.notes);
        }
        if let Some((ttl, generation)) = cache {
            gov.cache.put(
                name,
                session,
                trail.digest,
                generation,
                ttl,
                Arc::new(reply.value.clone()),
            );
        }
        let limits = gov
            .tool_policy(name)
            .and_then(|p| p.truncate)
            .unwrap_or(gov.config.truncate);
        // Boxed, like the other rare stages, to keep every call's future small.
        match Box::pin(
            gov.spill
                .apply(limits, name, ctx.call_id(), &reply.value, &reply.text),
        )
        .await
        {
            Ok(cut) => reply.truncated = cut,
            Err(err) => {
                tracing::warn!(tool = %name, %err, "a long result could not be spilled to a file; it is returned whole")
            }
        }
    }
    result
}

/// What the hooks of a call carry past the pipeline: the arguments as the after-hooks are
/// to see them, and notes for the model.
struct Hooked {
    json: Option<Value>,
    notes: Vec<String>,
}

/// Asks about a call and applies the answer; the approval's label, or the denial.
#[allow(clippy::too_many_arguments)]
async fn ask<I: Serialize>(
    gov: &Governance,
    name: &Arc<str>,
    ctx: &CallContext,
    asker: Option<&dyn Asker>,
    input: &I,
    why: &str,
    covering: Option<Rule>,
    agent: Option<&Arc<str>>,
    session: Option<&Arc<str>>,
) -> Result<Arc<str>, CallError> {
    let Some(asker) = asker else {
        let who = agent.map_or("<agent>", |a| &**a);
        return Err(denied(
            name,
            format!(
                "{why} asks for approval, and nobody can be asked on this connection. \
                 To allow it, add to guildhall.toml:\n[[agents.{who}.rules]]\ntool = \"{name}\"\naction = \"allow\""
            ),
        ));
    };
    let request = AskRequest {
        tool: Arc::clone(name),
        agent: agent.cloned(),
        session: session.cloned(),
        arguments: serde_json::to_value(input).unwrap_or(Value::Null),
        reason: why.to_owned(),
    };
    // The call's deadline bounds the wait for an answer.
    let Ok(approval) = tokio::time::timeout_at(ctx.deadline(), asker.ask(request)).await else {
        return Err(denied(
            name,
            format!("{why}; no answer came before the call's deadline"),
        ));
    };
    if approval == Approval::Deny {
        return Err(denied(name, format!("{why}; approval was refused")));
    }
    if let (Some(agent), Some(mut rule)) = (agent, covering)
        && matches!(approval, Approval::Session | Approval::Always)
    {
        rule.action = Action::Allow;
        if let Err(err) = gov.grant(agent, session, rule, approval).await {
            tracing::warn!(%err, "an approval could not be stored; it holds for this call only");
        }
    }
    Ok(Arc::from(format!("approved {}", approval_name(approval))))
}

fn approval_name(approval: Approval) -> &'static str {
    match approval {
        Approval::Once => "once",
        Approval::Session => "for the session",
        Approval::Always => "always",
        Approval::Deny => "never",
    }
}

fn denied(tool: &str, reason: String) -> CallError {
    CallError::Denied {
        tool: tool.to_owned(),
        reason,
    }
}

/// XXH3-64 of the arguments' JSON: equal arguments, equal digests.
fn digest<I: Serialize>(input: &I) -> u64 {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Written whole into a reused buffer and hashed in one go: arguments are mostly small,
    // and the streaming hasher's setup costs more than hashing them.
    SCRATCH.with_borrow_mut(|json| {
        json.clear();
        let _ = serde_json::to_writer(&mut *json, input);
        let digest = xxhash_rust::xxh3::xxh3_64(json);
        if json.capacity() > 64 * 1024 {
            // One huge argument does not pin its buffer for the thread's life.
            *json = Vec::new();
        }
        digest
    })
}

fn is<O: 'static, T: 'static>() -> bool {
    std::any::TypeId::of::<O>() == std::any::TypeId::of::<T>()
}

fn downcast_mut<O: 'static, T: 'static>(out: &mut O) -> Option<&mut T> {
    (out as &mut dyn Any).downcast_mut::<T>()
}

/// `reply` as the stack's output type, which the caller checked is [`ToolReply`].
fn as_output<O: 'static>(reply: ToolReply) -> Result<O, CallError> {
    (Box::new(reply) as Box<dyn Any>)
        .downcast::<O>()
        .map(|o| *o)
        .map_err(|_| CallError::Unavailable {
            tool: String::new(),
            reason: "a cached result reached a typed call".into(),
        })
}

/// The call's audit record in the making. Dropped unfinished (the caller went away), it is
/// recorded as `cancelled`.
struct Trail<'g> {
    gov: &'g Governance,
    ctx: &'g CallContext,
    tool: &'g Arc<str>,
    /// The arguments' digest, once known.
    digest: u64,
    /// What decided the call.
    rule: Option<Arc<str>>,
    finished: bool,
}

impl<'g> Trail<'g> {
    fn new(gov: &'g Governance, tool: &'g Arc<str>, ctx: &'g CallContext) -> Self {
        Self {
            gov,
            ctx,
            tool,
            digest: 0,
            rule: None,
            finished: false,
        }
    }

    /// The audit record, once: later calls get `None`.
    fn close(&mut self, outcome: Outcome) -> Option<Entry> {
        if std::mem::replace(&mut self.finished, true) {
            return None;
        }
        Some(Entry {
            call_id: self.ctx.call_id(),
            agent: self.ctx.agent_shared().cloned(),
            session: self.ctx.session_shared().cloned(),
            tool: Arc::clone(self.tool),
            digest: self.digest,
            decision: if outcome == Outcome::Denied {
                Action::Deny
            } else {
                Action::Allow
            },
            rule: self.rule.take(),
            duration_us: duration_us(self.ctx.started().elapsed()),
            outcome,
        })
    }

    /// Records the call's end and passes its result on.
    fn finish<O>(mut self, result: Result<O, CallError>) -> Result<O, CallError> {
        let outcome = match &result {
            Ok(_) => Outcome::Ok,
            Err(err) => Outcome::of(err),
        };
        let Some(entry) = self.close(outcome) else {
            return result;
        };
        self.gov.emit(|| match &result {
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
        result
    }
}

impl Drop for Trail<'_> {
    fn drop(&mut self) {
        if let Some(entry) = self.close(Outcome::Cancelled)
            && let Some(audit) = self.gov.audit()
        {
            audit.append(entry);
        }
    }
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
