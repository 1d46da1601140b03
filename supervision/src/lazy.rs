//! Actors started on first use and stopped when idle (in guildhall: a mailbox per agent, a
//! context actor per session), an actor-lifecycle concern that knows nothing of what the
//! actors do.
//!
//! Each such actor has a [`Slot`] that says where it runs (if it does), and lives as a
//! transient child of one of several dynamic supervisors, its [`Partitions`]. A request
//! ([`Lazy::request`]) finds the actor through its slot, asks the partition to start it when
//! the slot is empty, waits on the slot's notification while it restarts, and is re-sent
//! when the actor died with it queued ([`Request`] bounces itself back when dropped). The
//! owner runs a [`Sweep`] that tells actors idle for long enough to stop ([`passivate`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use std::future::Future;
use std::time::Duration;

use ractor::{ActorId, ActorRef};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::{
    Backoff, ChildSpec, DynamicSpec, ErrorChain, Restart, Shutdown, Strategy, Supervisor,
    SupervisorError, SupervisorMsg, SupervisorSpec,
};

/// Where a lazily started actor runs, when it last did something, and whether it may start.
pub struct Slot<M: ractor::Message> {
    actor: RwLock<Option<ActorRef<M>>>,
    /// Woken whenever the actor changes.
    pub changed: Notify,
    /// Milliseconds (on its owner's coarse clock) of the actor's last activity.
    last_active: AtomicU64,
    /// Set when what the actor serves is being deleted: it must not start again.
    retired: AtomicBool,
}

impl<M: ractor::Message> Default for Slot<M> {
    fn default() -> Self {
        Self {
            actor: RwLock::new(None),
            changed: Notify::new(),
            last_active: AtomicU64::new(0),
            retired: AtomicBool::new(false),
        }
    }
}

impl<M: ractor::Message> Slot<M> {
    /// The running actor, if any.
    pub fn actor(&self) -> Option<ActorRef<M>> {
        self.actor
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `f` on the running actor, if any, without taking a reference to it: a clone
    /// and its drop are two writes to a count that every sender and the actor itself share.
    pub fn with_actor<R>(&self, f: impl FnOnce(&ActorRef<M>) -> R) -> Option<R> {
        self.actor
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(f)
    }

    /// Publishes `actor` as the one running (called by the actor as it starts).
    pub fn publish(&self, actor: ActorRef<M>) {
        *self.actor.write().unwrap_or_else(PoisonError::into_inner) = Some(actor);
        self.changed.notify_waiters();
    }

    /// Clears the slot if it still holds `actor`.
    pub fn unpublish(&self, actor: &ActorRef<M>) {
        let mut slot = self.actor.write().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|a| a.get_id() == actor.get_id()) {
            *slot = None;
        }
        drop(slot);
        self.changed.notify_waiters();
    }

    /// Marks the actor active at `now` (its owner's [`CoarseClock`]).
    pub fn touch(&self, now: u64) {
        // Most touches fall in the same tick: writing only on a change leaves the line shared
        // with the senders reading this slot on other cores.
        if self.last_active.load(Ordering::Relaxed) != now {
            self.last_active.store(now, Ordering::Relaxed);
        }
    }

    /// When the actor was last active, on its owner's [`CoarseClock`].
    pub fn last_active(&self) -> u64 {
        self.last_active.load(Ordering::Relaxed)
    }

    /// Stops the actor from starting again, ahead of a deletion.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Undoes [`retire`](Self::retire) after a deletion failed.
    pub fn unretire(&self) {
        self.retired.store(false, Ordering::Release);
    }

    /// Whether the slot is retired (see [`retire`](Self::retire)).
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }
}

/// Dynamic supervisors that share the children of one kind: a child keyed `k` lives in
/// partition `hash(k) % n`. Children start in parallel across partitions (Elixir's
/// `PartitionSupervisor` idea): one supervisor starting children one at a time would be the
/// bottleneck of activating many.
pub struct Partitions {
    /// Each partition publishes itself here whenever it (re)starts.
    slots: Vec<RwLock<Option<ActorRef<SupervisorMsg>>>>,
}

impl Partitions {
    /// One partition per core, at least two.
    pub fn new() -> Arc<Self> {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 16));
        Arc::new(Self {
            slots: (0..n).map(|_| RwLock::new(None)).collect(),
        })
    }

    /// The supervisor of the child keyed `key`.
    pub fn supervisor(&self, key: &str) -> Option<ActorRef<SupervisorMsg>> {
        let slot = &self.slots[partition_of(key, self.slots.len())];
        slot.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The child spec of a supervisor named `id`: one-for-one over the partitions, each a
    /// dynamic supervisor that never escalates and publishes itself when it (re)starts.
    pub fn supervisor_spec(self: &Arc<Self>, id: &'static str) -> ChildSpec {
        let partitions = (0..self.slots.len()).map(|i| {
            let this = Arc::clone(self);
            ChildSpec::dynamic_supervisor(i.to_string(), DynamicSpec::never_escalate()).on_start(
                move |cell| {
                    *this.slots[i]
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = Some(cell.clone().into());
                },
            )
        });
        ChildSpec::supervisor(
            id,
            SupervisorSpec {
                strategy: Strategy::OneForOne,
                intensity: DynamicSpec::never_escalate().intensity,
                backoff: Backoff::default(),
                children: partitions.collect(),
            },
        )
    }
}

/// A stable partition for a key (FNV-1a: the same in every process).
fn partition_of(key: &str, partitions: usize) -> usize {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash % partitions as u64) as usize
}

/// How long a request waits for its actor's restart before asking for a start itself.
pub const RESTART_POLL: Duration = Duration::from_millis(50);

/// Why an actor could not be started.
#[non_exhaustive]
#[derive(Debug)]
pub enum StartError {
    /// Its slot is retired: what it serves is being deleted.
    Retired,
    /// Anything else, as a reason.
    Failed(String),
}

/// Asks `key`'s partition to start the actor of `slot` from `spec`. One already there
/// (starting, or waiting out a restart backoff) is fine: the caller looks at the slot again.
///
/// # Errors
/// [`StartError::Retired`] when the slot is being deleted; [`StartError::Failed`] otherwise.
///
/// # Cancel safety
/// Cancel safe: a start the dropped future asked for goes on, and the next request finds
/// its actor in the slot.
pub async fn start<M: ractor::Message>(
    slot: &Slot<M>,
    partitions: &Partitions,
    key: &str,
    spec: ChildSpec,
) -> Result<(), StartError> {
    let supervisor = partitions
        .supervisor(key)
        .ok_or_else(|| StartError::Failed("its supervisor is not running".into()))?;
    match Supervisor::from_ref(supervisor).start_child(spec).await {
        Ok(()) => Ok(()),
        Err(SupervisorError::DuplicateChild { .. }) => {
            let changed = slot.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if slot.actor().is_none() {
                let _ = tokio::time::timeout(RESTART_POLL, changed).await;
            }
            Ok(())
        }
        Err(_) if slot.is_retired() => Err(StartError::Retired),
        Err(err) => Err(StartError::Failed(ErrorChain(&err).to_string())),
    }
}

/// Stops the actor of `slot` when idle: asks its supervisor to stop it, then clears the slot,
/// in that order, so whoever finds the slot empty asks for a new actor only after this stop.
/// Requests caught in between bounce and are re-sent.
pub fn passivate<M: ractor::Message>(
    slot: &Slot<M>,
    partitions: &Partitions,
    key: &str,
    myself: &ActorRef<M>,
) {
    let Some(supervisor) = partitions.supervisor(key) else {
        return;
    };
    let (tx, _) = oneshot::channel();
    let _ = supervisor.cast(SupervisorMsg::TerminateChild(key.to_owned(), tx.into()));
    slot.unpublish(myself);
}

/// Milliseconds since an epoch, as of the last sweep: the clock of idleness. Coarse on
/// purpose: every request marks its actor active, and reading this costs an atomic load
/// where reading the real clock costs a clock read.
pub struct CoarseClock {
    epoch: std::time::Instant,
    now: AtomicU64,
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self {
            epoch: std::time::Instant::now(),
            now: AtomicU64::new(0),
        }
    }
}

impl CoarseClock {
    /// The time of the last [`tick`](Self::tick), in milliseconds since the epoch.
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// Advances the clock to the real time and returns it.
    pub fn tick(&self) -> u64 {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.now.store(now, Ordering::Relaxed);
        now
    }
}

/// How often a sweep for actors idle `idle` runs: an actor is passivated after between
/// `idle` and `idle` plus a quarter of it.
fn sweep_period(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(5), Duration::from_secs(15))
}

/// Runs `sweep` on `owner` every `period` until the owner is dropped (needs a tokio runtime).
fn spawn_sweep<T: Send + Sync + 'static>(
    owner: std::sync::Weak<T>,
    period: Duration,
    sweep: impl Fn(&T) + Send + 'static,
) -> tokio::task::AbortHandle {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(owner) = owner.upgrade() else {
                return;
            };
            sweep(&owner);
        }
    })
    .abort_handle()
}

/// What a request's caller receives: the actor's answer, or the request itself, handed back
/// unhandled. (The request is boxed: a bounce is rare, and a smaller message makes every
/// request's answer channel smaller.)
pub type Answer<O, R> = Result<R, Box<O>>;

/// A request to a lazily started actor. Dropped unhandled (its actor died with it queued, or
/// was gone when it was sent), it sends itself back, and the caller re-sends it.
pub struct Request<O: Send + 'static, R: Send + 'static> {
    op: Option<O>,
    reply: Option<oneshot::Sender<Answer<O, R>>>,
}

impl<O: Send + 'static, R: Send + 'static> Request<O, R> {
    /// A request for `op`, answered (or bounced back) on `reply`.
    pub fn new(op: O, reply: oneshot::Sender<Answer<O, R>>) -> Self {
        Self {
            op: Some(op),
            reply: Some(reply),
        }
    }

    /// The request and where to answer it; the request no longer bounces.
    pub fn take(mut self) -> Option<(O, Responder<R, O>)> {
        let op = self.op.take()?;
        Some((op, Responder(self.reply.take()?)))
    }
}

impl<O: Send + 'static, R: Send + 'static> Drop for Request<O, R> {
    fn drop(&mut self) {
        if let (Some(op), Some(reply)) = (self.op.take(), self.reply.take()) {
            let _ = reply.send(Err(Box::new(op)));
        }
    }
}

/// Where to answer a request taken out of its [`Request`].
pub struct Responder<R, O>(oneshot::Sender<Answer<O, R>>);

impl<R, O> Responder<R, O> {
    /// Answers.
    ///
    /// # Errors
    /// The answer, back, when the caller no longer waits.
    pub fn send(self, answer: R) -> Result<(), R> {
        match self.0.send(Ok(answer)) {
            Ok(()) => Ok(()),
            Err(Ok(answer)) => Err(answer),
            // Only an answer is ever sent here.
            Err(Err(_)) => Ok(()),
        }
    }

    /// Whether the caller stopped waiting.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// The child spec of a lazily started actor keyed `key`: transient (restarted after a
/// crash, not after a normal stop such as passivation), made by `make` at each (re)start.
pub fn child_spec<A>(key: Arc<str>, make: impl Fn() -> A + Send + Sync + 'static) -> ChildSpec
where
    A: ractor::Actor<Arguments = ()>,
{
    ChildSpec::worker(
        key,
        Arc::new(move |parent| {
            let actor = make();
            Box::pin(async move {
                let (actor, _) = ractor::Actor::spawn_linked(None, actor, (), parent).await?;
                Ok(actor.get_cell())
            })
        }),
    )
    .restart(Restart::Transient)
    .shutdown(Shutdown::Timeout(Duration::from_secs(5)))
}

/// Stops the actor keyed `key` for good (ahead of deleting what it serves); one not running
/// is fine.
///
/// # Cancel safety
/// A stop the dropped future asked for goes on; calling again is harmless.
pub async fn stop(partitions: &Partitions, key: &str) {
    if let Some(supervisor) = partitions.supervisor(key) {
        match Supervisor::from_ref(supervisor).terminate_child(key).await {
            Ok(()) | Err(SupervisorError::UnknownChild { .. }) => {}
            Err(err) => {
                tracing::warn!(key, error = %ErrorChain(&err), "stopping a lazily started actor failed")
            }
        }
    }
}

/// What a sweep does with each slot.
pub type SlotVisitor<'a, M> = dyn FnMut(&Slot<M>) + 'a;

/// The passivation sweep of one kind of lazily started actor, stopped when dropped.
#[derive(Default)]
pub struct Sweep(std::sync::Mutex<Option<tokio::task::AbortHandle>>);

impl Sweep {
    /// Every [`sweep_period`] of `idle`: ticks the owner's clock, then sends `passivate()` to
    /// every actor (of the slots `each_slot` visits) idle for at least `idle`. Needs a tokio
    /// runtime; ends when the owner is dropped.
    pub fn start<T, M>(
        &self,
        owner: &Arc<T>,
        idle: Duration,
        clock: fn(&T) -> &CoarseClock,
        each_slot: fn(&T, &mut SlotVisitor<'_, M>),
        passivate: fn() -> M,
    ) where
        T: Send + Sync + 'static,
        M: ractor::Message,
    {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let task = spawn_sweep(
            Arc::downgrade(owner),
            sweep_period(idle),
            move |owner: &T| {
                let now = clock(owner).tick();
                each_slot(owner, &mut |slot| {
                    if now.saturating_sub(slot.last_active()) >= idle_ms
                        && let Some(actor) = slot.actor()
                    {
                        let _ = actor.cast(passivate());
                    }
                });
            },
        );
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    /// Stops the sweep (idempotent).
    pub fn stop(&self) {
        if let Some(task) = self.0.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long a request waits, in all, for its actor to start or restart before giving up.
pub const ACTIVATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request to a lazily started actor got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The slot is retired: what the actor serves is being deleted.
    Retired,
    /// The actor could not be started, or did not start within [`ACTIVATION_TIMEOUT`].
    Unavailable(String),
}

impl From<StartError> for RequestError {
    fn from(err: StartError) -> Self {
        match err {
            StartError::Retired => Self::Retired,
            StartError::Failed(reason) => Self::Unavailable(reason),
        }
    }
}

/// One lazily started actor: its slot, the partitions it lives under, its key, and how to
/// make its child spec.
pub struct Lazy<'a, M: ractor::Message, S> {
    /// Where it runs.
    pub slot: &'a Slot<M>,
    /// The supervisors of its kind.
    pub partitions: &'a Partitions,
    /// Its child id, also what picks its partition.
    pub key: &'a str,
    /// Makes its child spec, at each start (see [`child_spec`]).
    pub spec: S,
}

impl<M: ractor::Message, S: Fn() -> ChildSpec> Lazy<'_, M, S> {
    /// Sends `op` to the actor (wrapped by `wrap`), starting it first when it is not
    /// running, and answers with its reply. A request the actor never handled (it died with
    /// the request queued, or was gone when it was sent) comes back and is sent again, to the
    /// restarted actor; so does one dropped mid-handling by a crash, which the actor must
    /// make safe to repeat (in guildhall, nothing of a request is stored before it is
    /// answered or handed to the store). `receive` waits for the reply of a request sent to
    /// the actor with the given id (a plain `rx.await`, or one that also tells that actor
    /// when the caller stops waiting); `again` adjusts a request before it is re-sent.
    ///
    /// # Errors
    /// [`RequestError::Retired`] when the slot is (or becomes) retired;
    /// [`RequestError::Unavailable`] when the actor cannot be started, or has not answered
    /// from a live actor within [`ACTIVATION_TIMEOUT`] of the first trouble.
    ///
    /// # Cancel safety
    /// Dropping the future stops waiting; a request already sent may still be handled.
    pub async fn request<O, R, W, F>(
        &self,
        mut op: O,
        wrap: fn(Request<O, R>) -> M,
        mut receive: W,
        mut again: impl FnMut(&mut O),
    ) -> Result<R, RequestError>
    where
        O: Clone + Send + 'static,
        R: Send + 'static,
        W: FnMut(oneshot::Receiver<Answer<O, R>>, ActorId) -> F,
        F: Future<Output = Result<Answer<O, R>, oneshot::error::RecvError>>,
    {
        // The clock is read only when something goes wrong: the common path needs no deadline.
        let mut deadline = None;
        let mut deadline =
            move || *deadline.get_or_insert_with(|| Instant::now() + ACTIVATION_TIMEOUT);
        loop {
            if self.slot.is_retired() {
                return Err(RequestError::Retired);
            }
            let (tx, rx) = oneshot::channel();
            let retry = op.clone();
            // A failed cast drops the request, which bounces into `rx`.
            let request = wrap(Request::new(op, tx));
            let Some(actor) = self.slot.with_actor(|a| {
                let _ = a.cast(request);
                a.get_id()
            }) else {
                op = retry;
                self.activate(deadline()).await?;
                continue;
            };
            op = match receive(rx, actor).await {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(back)) => *back,
                // Dropped mid-handling by a crash.
                Err(_) => retry,
            };
            again(&mut op);
            let changed = self.slot.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.slot.with_actor(|a| a.get_id()) == Some(actor) {
                // Dead but still published: its supervisor is restarting it, or it was
                // stopped without a chance to clear its slot.
                let wait = RESTART_POLL.min(deadline().saturating_duration_since(Instant::now()));
                if tokio::time::timeout(wait, changed).await.is_err() {
                    self.activate(deadline()).await?;
                }
            }
            if Instant::now() >= deadline() {
                return Err(not_started());
            }
        }
    }

    /// Asks the partition to start the actor unless `deadline` has passed. One already
    /// there (starting, or waiting out a restart backoff) is fine: look at the slot again.
    ///
    /// # Errors
    /// As [`request`](Self::request).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the actor starting.
    pub async fn activate(&self, deadline: Instant) -> Result<(), RequestError> {
        if Instant::now() >= deadline {
            return Err(not_started());
        }
        start(self.slot, self.partitions, self.key, (self.spec)()).await?;
        Ok(())
    }
}

fn not_started() -> RequestError {
    RequestError::Unavailable(format!("it did not start within {ACTIVATION_TIMEOUT:?}"))
}
