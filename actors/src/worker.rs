//! The generic tool actor and the pool that dispatches calls to it.
//!
//! **Exactly one reply.** The caller owns the reply channel and turns every way a call can end
//! into one result:
//! - the tool returns → `Ok` or [`CallError::Tool`];
//! - the tool panics → the actor replies [`CallError::Crashed`] with the panic message and then
//!   fails, so its supervisor restarts it with fresh state;
//! - the tool ignores cancellation past its deadline plus the grace period → the actor replies
//!   [`CallError::Timeout`] and fails (the stuck future is dropped), and is restarted;
//! - the actor dies with the call still queued → the undelivered [`ToolMsg`] hands its input
//!   back when dropped, and the pool re-sends it to the restarted actor: a call that never
//!   started is never lost and never reported as crashed;
//! - the actor dies any other way mid-call → the reply channel closes → `Crashed`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::FutureExt;
use guildhall_supervision::{ChildSpec, Shutdown};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef};
use tokio::sync::{Notify, oneshot};

use crate::context::CallContext;
use crate::error::CallError;
use crate::tool::{InitState, Tool};
use guildhall_supervision::ErrorChain;

/// The message a [`ToolActor`] handles: one call.
pub struct ToolMsg<T: Tool>(Invocation<T>);

struct Invocation<T: Tool> {
    input: Option<T::Input>,
    ctx: Option<CallContext>,
    reply: Option<oneshot::Sender<Outcome<T>>>,
}

enum Outcome<T: Tool> {
    Done(Result<T::Output, T::Error>),
    /// The call never started; here are its input and context back.
    Bounced(T::Input, CallContext),
    Crashed(String),
    Overran,
}

impl<T: Tool> Drop for Invocation<T> {
    /// An invocation dropped before the actor took its input (the actor died with it queued)
    /// sends the input back so the pool can re-send it.
    fn drop(&mut self) {
        if let (Some(input), Some(ctx), Some(reply)) =
            (self.input.take(), self.ctx.take(), self.reply.take())
        {
            let _ = reply.send(Outcome::Bounced(input, ctx));
        }
    }
}

/// Runs one tool: builds its state at start and handles calls one at a time.
pub struct ToolActor<T: Tool> {
    tool: Arc<T>,
    grace: Duration,
}

impl<T: InitState> Actor for ToolActor<T> {
    type Msg = ToolMsg<T>;
    type State = T::State;
    type Arguments = Arc<Slot<T>>;

    /// Builds the tool's state and publishes this actor in its slot so calls reach it. An
    /// `init` error or panic fails the start; the supervisor counts it as a restart.
    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        slot: Arc<Slot<T>>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let state = self.tool.init().await?;
        slot.publish(Some(myself));
        Ok(state)
    }

    /// A panic in the tool is caught, reported to the caller as `Crashed`, and turned into an
    /// actor failure so the supervisor restarts this actor with fresh state.
    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        ToolMsg(mut inv): Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (Some(input), Some(ctx), Some(reply)) =
            (inv.input.take(), inv.ctx.take(), inv.reply.take())
        else {
            return Ok(());
        };
        if let Some(own) = self.tool.detach(state, &input) {
            tokio::spawn(run_detached(
                Arc::clone(&self.tool),
                own,
                input,
                ctx,
                reply,
                self.grace,
            ));
            return Ok(());
        }
        let watch = ctx.clone();
        let call = AssertUnwindSafe(self.tool.call(state, input, ctx)).catch_unwind();
        let mut call = std::pin::pin!(call);
        // Most calls finish on their first poll. Only the others arm the wait for their
        // cancellation and grace period, boxed so that its space is not carried by every
        // idle actor.
        let finished = match futures::poll!(call.as_mut()) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => Box::pin(finish_or_overrun(call, &watch, self.grace)).await,
        };
        match finished {
            Some(Ok(result)) => {
                let _ = reply.send(Outcome::Done(result));
                Ok(())
            }
            Some(Err(panic)) => {
                let reason = panic_message(panic.as_ref());
                let _ = reply.send(Outcome::Crashed(reason.clone()));
                Err(format!("tool panicked: {reason}").into())
            }
            None => {
                let _ = reply.send(Outcome::Overran);
                Err(format!(
                    "tool ignored cancellation for {:?} past its deadline",
                    self.grace
                )
                .into())
            }
        }
    }
}

/// Runs a call the tool chose to detach: the same outcomes as inline, but the actor lives on.
async fn run_detached<T: Tool>(
    tool: Arc<T>,
    state: T::State,
    input: T::Input,
    ctx: CallContext,
    reply: oneshot::Sender<Outcome<T>>,
    grace: Duration,
) {
    let _ = reply.send(run_apart(tool, state, input, ctx, grace).await);
}

/// Runs a call away from the tool's actor (detached, or in the caller's task): a panic is
/// caught and a call ignoring cancellation past `grace` abandoned, as the actor would.
async fn run_apart<T: Tool>(
    tool: Arc<T>,
    mut state: T::State,
    input: T::Input,
    ctx: CallContext,
    grace: Duration,
) -> Outcome<T> {
    let watch = ctx.clone();
    let call = AssertUnwindSafe(tool.call(&mut state, input, ctx)).catch_unwind();
    match finish_or_overrun(std::pin::pin!(call), &watch, grace).await {
        Some(Ok(result)) => Outcome::Done(result),
        Some(Err(panic)) => Outcome::Crashed(panic_message(panic.as_ref())),
        None => Outcome::Overran,
    }
}

/// Waits for the call; once it is cancelled, gives it `grace` more. `None`: it overran.
async fn finish_or_overrun<F: Future>(
    mut call: Pin<&mut F>,
    ctx: &CallContext,
    grace: Duration,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        result = call.as_mut() => return Some(result),
        () = ctx.cancellation().cancelled() => {}
    }
    tokio::select! {
        biased;
        result = call => Some(result),
        () = tokio::time::sleep(grace) => None,
    }
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

/// Where callers find the current actor of one worker; republished on every restart.
pub struct Slot<T: Tool> {
    current: RwLock<Option<ActorRef<ToolMsg<T>>>>,
    /// Woken when `current` changes.
    changed: Notify,
    busy: AtomicUsize,
}

impl<T: Tool> Slot<T> {
    fn new() -> Self {
        Self {
            current: RwLock::new(None),
            changed: Notify::new(),
            busy: AtomicUsize::new(0),
        }
    }

    fn current(&self) -> Option<ActorRef<ToolMsg<T>>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn publish(&self, actor: Option<ActorRef<ToolMsg<T>>>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = actor;
        self.changed.notify_waiters();
    }
}

/// A tool's actors and the dispatch of calls to them. Cheap to clone.
pub struct WorkerPool<T: Tool> {
    inner: Arc<PoolInner<T>>,
}

struct PoolInner<T: Tool> {
    tool: Arc<T>,
    name: String,
    grace: Duration,
    slots: Vec<Arc<Slot<T>>>,
    next: AtomicUsize,
    closed: AtomicBool,
}

impl<T: Tool> Clone for WorkerPool<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T: InitState> WorkerPool<T> {
    /// One child spec per actor of the tool: id `<name>` for a sequential tool, `<name>/<i>`
    /// for a concurrent one. Actors are permanent and get `grace` to finish their current call
    /// when shut down.
    pub fn child_specs(&self) -> Vec<ChildSpec> {
        let single = self.inner.slots.len() == 1;
        self.inner
            .slots
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let id = if single {
                    self.inner.name.clone()
                } else {
                    format!("{}/{i}", self.inner.name)
                };
                let tool = Arc::clone(&self.inner.tool);
                let grace = self.inner.grace;
                let slot = Arc::clone(slot);
                ChildSpec::actor(id, move || {
                    (
                        ToolActor {
                            tool: Arc::clone(&tool),
                            grace,
                        },
                        Arc::clone(&slot),
                    )
                })
                .shutdown(Shutdown::Timeout(grace))
            })
            .collect()
    }
}

impl<T: Tool> WorkerPool<T> {
    /// A pool of `tool.concurrency().actors()` workers, none started yet. `grace` is how long
    /// a call may run past its deadline before its actor is restarted.
    pub fn new(tool: Arc<T>, grace: Duration) -> Self {
        let slots = (0..tool.concurrency().actors())
            .map(|_| Arc::new(Slot::new()))
            .collect();
        Self {
            inner: Arc::new(PoolInner {
                name: tool.name().to_owned(),
                tool,
                grace,
                slots,
                next: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Refuses further calls and wakes callers waiting for a restart.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        for slot in &self.inner.slots {
            slot.publish(None);
        }
    }

    /// Sends a call to the least busy actor and returns the future of its single outcome.
    /// The common case, a live actor that answers, allocates nothing beyond the message; only
    /// a call that must wait for a restart boxes a future.
    ///
    /// The future resolves to the tool's output, or to [`CallError::Tool`],
    /// [`CallError::Crashed`], [`CallError::Timeout`] (the tool overran its deadline plus
    /// grace) or [`CallError::Unavailable`] (the pool was closed).
    ///
    /// # Cancel safety
    /// Dropping the future abandons the reply; the call's cancellation token should be
    /// fired by whoever owns it, so the tool stops (or is restarted after the grace period).
    pub fn dispatch(&self, input: T::Input, ctx: CallContext) -> Dispatched<T> {
        if let Some(own) = self.inner.tool.apart(&input) {
            let budget = ctx.budget();
            let state = if self.inner.closed.load(Ordering::Acquire) {
                State::Failed(Some(Box::new(self.unavailable())))
            } else {
                let (tool, grace) = (Arc::clone(&self.inner.tool), self.inner.grace);
                State::Apart(Box::pin(run_apart(tool, own, input, ctx, grace)))
            };
            return Dispatched {
                pool: self.clone(),
                slot: 0,
                tracked: false,
                budget,
                state,
            };
        }
        let slot = self.pick();
        let tracked = self.inner.slots.len() > 1;
        if tracked {
            self.inner.slots[slot].busy.fetch_add(1, Ordering::Relaxed);
        }
        let budget = ctx.budget();
        let state = match self.send(slot, input, ctx) {
            Sent::Waiting { outcome, actor } => State::Waiting { outcome, actor },
            Sent::Closed => State::Failed(Some(Box::new(self.unavailable()))),
            Sent::NoActor(input, ctx) => self.slow(slot, input, ctx, None),
        };
        Dispatched {
            pool: self.clone(),
            slot,
            tracked,
            budget,
            state,
        }
    }

    /// Sends to the slot's current actor, if there is one and the pool is open.
    fn send(&self, slot: usize, input: T::Input, ctx: CallContext) -> Sent<T> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Sent::Closed;
        }
        let Some(actor) = self.inner.slots[slot].current() else {
            return Sent::NoActor(input, ctx);
        };
        let (reply, outcome) = oneshot::channel();
        let inv = Invocation {
            input: Some(input),
            ctx: Some(ctx),
            reply: Some(reply),
        };
        // A failed send drops the message, which bounces the input back through `outcome`.
        let _ = actor.send_message(ToolMsg(inv));
        Sent::Waiting {
            outcome,
            actor: actor.get_id(),
        }
    }

    /// The path for calls that must wait for an actor: boxed, since it is rare.
    fn slow(
        &self,
        slot: usize,
        input: T::Input,
        ctx: CallContext,
        old: Option<ActorId>,
    ) -> State<T> {
        let pool = self.clone();
        let budget = ctx.budget();
        State::Slow(Box::pin(async move {
            let (mut input, mut ctx, mut old) = (input, ctx, old);
            loop {
                pool.wait_replaced(&pool.inner.slots[slot], old).await;
                let (outcome, actor) = match pool.send(slot, input, ctx) {
                    Sent::Waiting { outcome, actor } => (outcome, actor),
                    Sent::Closed => return Err(pool.unavailable()),
                    Sent::NoActor(back, back_ctx) => {
                        (input, ctx, old) = (back, back_ctx, None);
                        continue;
                    }
                };
                match outcome.await {
                    Ok(Outcome::Bounced(back, back_ctx)) => {
                        (input, ctx, old) = (back, back_ctx, Some(actor));
                    }
                    other => return pool.settle(other, budget),
                }
            }
        }))
    }

    /// Turns an actor's reply (or its absence) into the call's result.
    fn settle(
        &self,
        outcome: Result<Outcome<T>, oneshot::error::RecvError>,
        budget: Duration,
    ) -> Result<T::Output, CallError> {
        match outcome {
            Ok(Outcome::Done(Ok(output))) => Ok(output),
            Ok(Outcome::Done(Err(err))) if T::is_crash(&err) => {
                Err(self.crashed(ErrorChain(&err).to_string()))
            }
            Ok(Outcome::Done(Err(err))) => Err(CallError::Tool {
                tool: self.inner.name.clone(),
                message: ErrorChain(&err).to_string(),
                transient: T::is_transient(&err),
                error: Arc::new(err),
            }),
            Ok(Outcome::Crashed(reason)) => Err(self.crashed(reason)),
            Ok(Outcome::Overran) => Err(CallError::Timeout {
                tool: self.inner.name.clone(),
                after: budget,
            }),
            Ok(Outcome::Bounced(..)) => {
                Err(self.crashed("the call was returned undelivered".into()))
            }
            Err(_) => Err(self.crashed("the tool's actor stopped mid-call".into())),
        }
    }

    fn pick(&self) -> usize {
        let slots = &self.inner.slots;
        if slots.len() == 1 {
            return 0;
        }
        // Least busy, scanning from a rotating start so ties spread out.
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        (0..slots.len())
            .map(|k| (start + k) % slots.len())
            .min_by_key(|&i| slots[i].busy.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Waits until the slot holds an actor other than `old` (or the pool closes).
    async fn wait_replaced(&self, slot: &Slot<T>, old: Option<ActorId>) {
        loop {
            // Register interest before checking, so a publish in between is not missed.
            let changed = slot.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if self.inner.closed.load(Ordering::Acquire) {
                return;
            }
            let current = slot.current().map(|a| a.get_id());
            if current.is_some() && current != old {
                return;
            }
            changed.await;
        }
    }

    fn crashed(&self, reason: String) -> CallError {
        CallError::Crashed {
            tool: self.inner.name.clone(),
            reason,
        }
    }

    fn unavailable(&self) -> CallError {
        CallError::Unavailable {
            tool: self.inner.name.clone(),
            reason: "the runtime is shutting down".into(),
        }
    }
}

/// The future of one dispatched call.
pub struct Dispatched<T: Tool> {
    pool: WorkerPool<T>,
    slot: usize,
    tracked: bool,
    budget: Duration,
    state: State<T>,
}

/// What became of an attempt to send a call.
enum Sent<T: Tool> {
    /// Sent; the reply will come through `outcome`.
    Waiting {
        outcome: oneshot::Receiver<Outcome<T>>,
        actor: ActorId,
    },
    /// The pool is closed.
    Closed,
    /// No actor is running in the slot; here is the call back.
    NoActor(T::Input, CallContext),
}

type SlowPath<T> = Pin<Box<dyn Future<Output = Result<<T as Tool>::Output, CallError>> + Send>>;
type ApartCall<T> = Pin<Box<dyn Future<Output = Outcome<T>> + Send>>;

enum State<T: Tool> {
    /// Sent; waiting for the actor's reply.
    Waiting {
        outcome: oneshot::Receiver<Outcome<T>>,
        actor: ActorId,
    },
    /// Waiting for an actor to (re)start, then sending.
    Slow(SlowPath<T>),
    /// Running in the caller's task ([`Tool::apart`]).
    Apart(ApartCall<T>),
    /// Failed before sending (boxed: rare, and it keeps every call's future small).
    Failed(Option<Box<CallError>>),
}

impl<T: Tool> Future for Dispatched<T> {
    type Output = Result<T::Output, CallError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Waiting { outcome, actor } => {
                    let reply = ready!(Pin::new(outcome).poll(cx));
                    if let Ok(Outcome::Bounced(input, ctx)) = reply {
                        // The actor died with the call still queued: wait for its successor.
                        let old = Some(*actor);
                        this.state = this.pool.slow(this.slot, input, ctx, old);
                        continue;
                    }
                    return Poll::Ready(this.pool.settle(reply, this.budget));
                }
                State::Slow(fut) => return fut.as_mut().poll(cx),
                State::Apart(call) => {
                    let outcome = ready!(call.as_mut().poll(cx));
                    return Poll::Ready(this.pool.settle(Ok(outcome), this.budget));
                }
                State::Failed(err) => {
                    let err = err.take().map_or_else(|| this.pool.unavailable(), |e| *e);
                    return Poll::Ready(Err(err));
                }
            }
        }
    }
}

impl<T: Tool> Drop for Dispatched<T> {
    fn drop(&mut self) {
        if self.tracked {
            self.pool.inner.slots[self.slot]
                .busy
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}
