//! The durable actor: one writer per key, loaded on first use, committed before acknowledged,
//! passivated when idle. An agent's mailbox, a context session and the task board are each
//! one; each gives only its [`Behaviour`] (how to load, how to handle a request, what keeps
//! it busy), and this module does the rest of the life around it:
//!
//! - **Start** (`pre_start`, boxed so the actor's task does not carry the larger future of
//!   loading for the rest of its life): a retired slot refuses to start; then a barrier,
//!   after which every commit submitted before this start (by a predecessor that crashed) is
//!   done; then this server's [`Hold`] on the key when servers share the store (another
//!   holding it hands it over first, after its commits, which the load then reads); then the
//!   behaviour loads; then the actor is marked active and published in its slot.
//! - **Requests** are taken out of their bounce-back wrapper, mark the actor active and go
//!   to the behaviour.
//! - **Passivation**: told by its [`Family`]'s sweep, an actor idle for long enough and not
//!   [busy](Behaviour::busy) asks its supervisor to stop it and clears its slot
//!   ([`lazy::passivate`]).
//! - **Stop** (`post_stop`, whatever stopped it): the slot is cleared; the hold goes with the
//!   state, after everything the actor submitted.
//!
//! [`Commits`] is the group commit that context and the task board share: changes applied in
//! memory at once, one commit in flight, answers sent only once what they answer is durable.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use guildhall_supervision::ChildSpec;
use guildhall_supervision::lazy::{self, CoarseClock, Partitions, Slot, SlotVisitor, Sweep};
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::store::cluster::Hold;
use crate::store::{self, Batch, Store, StoreError};

/// What one kind of durable actor does; [`DurableActor`] does the rest.
pub(crate) trait Behaviour: Send + Sync + Sized + 'static {
    /// What callers ask of it.
    type Op: Send + 'static;
    /// What it answers.
    type Reply: Send + 'static;
    /// Its own messages: commit outcomes, timers.
    type Own: Send + 'static;
    /// What it holds in memory.
    type State: Send + 'static;
    /// What one actor serves, for traces and errors: "agent", "session", "board".
    const WHAT: &'static str;

    /// Where it lives.
    fn home(&self) -> Home<'_, Self>;

    /// Its subject among servers sharing the store.
    fn subject(&self) -> String;

    /// Loads its state. Called once every commit submitted before this start is done and
    /// this server holds the key; `held` says whether servers share the store (a hold was
    /// taken). The actor is published when this returns.
    fn load(
        &self,
        myself: &ActorRef<MsgOf<Self>>,
        held: bool,
    ) -> impl Future<Output = Result<Self::State, ActorProcessingErr>> + Send;

    /// Handles a caller's request (its actor is already marked active).
    ///
    /// # Errors
    /// An error stops the actor, and its supervisor restarts it.
    fn request(
        &self,
        myself: &ActorRef<MsgOf<Self>>,
        state: &mut Self::State,
        op: Self::Op,
        reply: Responder<Self>,
    ) -> Result<(), ActorProcessingErr>;

    /// Handles one of its own messages.
    ///
    /// # Errors
    /// As [`request`](Self::request).
    fn own(
        &self,
        myself: &ActorRef<MsgOf<Self>>,
        state: &mut Self::State,
        msg: Self::Own,
    ) -> impl Future<Output = Result<(), ActorProcessingErr>> + Send;

    /// Whether something other than idleness keeps it running: a commit in flight, an answer
    /// held, a waiter, a lease.
    fn busy(&self, state: &mut Self::State) -> bool;

    /// Runs after every message (the task board sets its lease timer here).
    fn after(&self, _myself: &ActorRef<MsgOf<Self>>, _state: &mut Self::State) {}

    /// Runs as the actor stops, whatever stopped it; `held` as in [`load`](Self::load).
    fn stopped(&self, _state: &mut Self::State, _held: bool) {}
}

/// Where a durable actor answers a request.
pub(crate) type Responder<B> = lazy::Responder<<B as Behaviour>::Reply, <B as Behaviour>::Op>;

/// Where a durable actor lives.
pub(crate) struct Home<'a, B: Behaviour> {
    /// Its slot: where it runs, when it was last active.
    pub(crate) slot: &'a Slot<MsgOf<B>>,
    /// The others of its kind.
    pub(crate) family: &'a Family,
    /// Its key: its child id and what picks its partition.
    pub(crate) key: &'a str,
    pub(crate) store: &'a Arc<dyn Store>,
    /// Held (shared) from the barrier until the actor is published, when given: the
    /// mailboxes' fan-out gate.
    pub(crate) gate: Option<&'a tokio::sync::RwLock<()>>,
}

impl<'a, B: Behaviour> Home<'a, B> {
    /// A home with no gate.
    pub(crate) fn new(
        slot: &'a Slot<MsgOf<B>>,
        family: &'a Family,
        key: &'a str,
        store: &'a Arc<dyn Store>,
    ) -> Self {
        Self {
            slot,
            family,
            key,
            store,
            gate: None,
        }
    }
}

/// Messages every durable actor handles: a caller's request `O` answered `R`, and the
/// behaviour's own messages `Own`. (Generic over these, not over the behaviour, so that
/// whoever sends to the actor depends on its messages, not on the actor.)
pub(crate) enum Msg<O: Send + 'static, R: Send + 'static, Own> {
    /// A caller's request.
    Request(lazy::Request<O, R>),
    /// Stop if idle (sent by the passivation sweep).
    Passivate,
    /// One of the behaviour's own messages.
    Own(Own),
}

/// The messages of `B`'s actor.
pub(crate) type MsgOf<B> =
    Msg<<B as Behaviour>::Op, <B as Behaviour>::Reply, <B as Behaviour>::Own>;

/// The ractor actor around a [`Behaviour`].
pub(crate) struct DurableActor<B>(pub(crate) B);

/// A running durable actor's state.
pub(crate) struct Held<B: Behaviour> {
    state: B::State,
    /// This server's hold on the key, when servers share the store: kept only to be dropped
    /// after the state, which releases it after everything the actor submitted.
    hold: Option<Hold>,
}

impl<B: Behaviour> Actor for DurableActor<B> {
    type Msg = MsgOf<B>;
    type State = Held<B>;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (): (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Box::pin(self.start(myself)).await
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        held: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.0.home().slot.unpublish(&myself);
        self.0.stopped(&mut held.state, held.hold.is_some());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        held: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let state = &mut held.state;
        match msg {
            Msg::Request(request) => {
                let Some((op, reply)) = request.take() else {
                    return Ok(());
                };
                let home = self.0.home();
                home.slot.touch(home.family.clock.now());
                self.0.request(&myself, state, op, reply)?;
            }
            Msg::Own(own) => self.0.own(&myself, state, own).await?,
            Msg::Passivate => self.passivate_if_idle(&myself, state),
        }
        self.0.after(&myself, state);
        Ok(())
    }
}

impl<B: Behaviour> DurableActor<B> {
    async fn start(&self, myself: ActorRef<MsgOf<B>>) -> Result<Held<B>, ActorProcessingErr> {
        let home = self.0.home();
        if home.slot.is_retired() {
            return Err(format!("{} `{}` is being deleted", B::WHAT, home.key).into());
        }
        let _gate = match home.gate {
            Some(gate) => Some(gate.read().await),
            None => None,
        };
        store::commit(&**home.store, Batch::new()).await?;
        // Should the load fail, the hold is dropped here, and released.
        let hold = Hold::take(home.store, self.0.subject()).await?;
        let state = self.0.load(&myself, hold.is_some()).await?;
        home.slot.touch(home.family.clock.now());
        home.slot.publish(myself);
        Ok(Held { state, hold })
    }

    fn passivate_if_idle(&self, myself: &ActorRef<MsgOf<B>>, state: &mut B::State) {
        if self.0.busy(state) {
            return;
        }
        let home = self.0.home();
        let idle_for = home
            .family
            .clock
            .now()
            .saturating_sub(home.slot.last_active());
        if Duration::from_millis(idle_for) < home.family.idle {
            return;
        }
        lazy::passivate(home.slot, &home.family.partitions, home.key, myself);
        tracing::trace!(key = home.key, "{} passivated", B::WHAT);
    }
}

/// The child spec of the durable actor keyed `key`, made by `make` at each (re)start.
pub(crate) fn child_spec<B: Behaviour>(
    key: Arc<str>,
    make: impl Fn() -> B + Send + Sync + 'static,
) -> ChildSpec {
    lazy::child_spec(key, move || DurableActor(make()))
}

/// The durable actors of one kind: the supervisors they live under, the clock of their
/// idleness and the sweep that passivates them.
pub(crate) struct Family {
    pub(crate) partitions: Arc<Partitions>,
    pub(crate) clock: CoarseClock,
    /// How long an actor is idle before it is passivated.
    pub(crate) idle: Duration,
    sweep: Sweep,
}

impl Family {
    pub(crate) fn new(idle: Duration) -> Self {
        Self {
            partitions: Partitions::new(),
            clock: CoarseClock::default(),
            idle,
            sweep: Sweep::default(),
        }
    }

    /// The child spec of the supervisor named `id` that the family's actors live under.
    pub(crate) fn supervisor_spec(&self, id: &'static str) -> ChildSpec {
        self.partitions.supervisor_spec(id)
    }

    /// Stops the passivation sweep (idempotent).
    pub(crate) fn stop_sweep(&self) {
        self.sweep.stop();
    }
}

/// Whoever keeps a [`Family`] and knows its slots: the post office, the context hub, the
/// task board.
pub(crate) trait Owner: Send + Sync + Sized + 'static {
    /// Its actors' behaviour.
    type Behaviour: Behaviour;

    fn family(&self) -> &Family;

    /// Visits the slot of every actor of the family that may be running.
    fn each_slot(&self, visit: &mut SlotVisitor<'_, MsgOf<Self::Behaviour>>);

    /// Starts the passivation sweep, which ends when the owner is dropped (needs a tokio
    /// runtime).
    fn start_sweep(self: &Arc<Self>) {
        self.family().sweep.start(
            self,
            self.family().idle,
            |owner| &owner.family().clock,
            |owner, visit| owner.each_slot(visit),
            || Msg::Passivate,
        );
    }
}

/// A commit outcome, on its way back to the actor that submitted it (its answers are
/// already sent).
pub(crate) struct Committed(pub(crate) Result<(), StoreError>);

/// The group commit of an actor that applies changes in memory at once (so the next request
/// sees them) and makes them durable after: one commit in flight at a time, changes arriving
/// meanwhile wait together for the next, so a failed commit is followed by nothing. An
/// answer is sent, by the store's writer thread, only once what it answers is committed, and
/// a read that saw changes not yet committed waits for them, so nothing answered can be lost
/// by a crash. `E` is what a commit does once durable (the task board's notices).
pub(crate) struct Commits<B: Behaviour, E = ()> {
    /// Changes applied in memory, counted.
    applied: u64,
    /// The count known committed.
    committed: u64,
    /// The count whose commit is in flight.
    inflight: Option<u64>,
    next: Pending<B, E>,
    /// Answers held until what they saw is committed.
    deferred: Vec<(u64, B::Reply, Responder<B>)>,
}

/// Changes waiting for the next commit, with whom to answer and what to do once it is done.
struct Pending<B: Behaviour, E> {
    batch: Batch,
    acks: Vec<(Responder<B>, B::Reply)>,
    then: E,
}

impl<B: Behaviour, E: Default> Default for Pending<B, E> {
    fn default() -> Self {
        Self {
            batch: Batch::new(),
            acks: Vec::new(),
            then: E::default(),
        }
    }
}

impl<B, E> Commits<B, E>
where
    B: Behaviour<Own: From<Committed>, Reply: From<StoreError>>,
    E: Default + Send + 'static,
{
    /// Counting from `applied`, all of it committed.
    pub(crate) fn new(applied: u64) -> Self {
        Self {
            applied,
            committed: applied,
            inflight: None,
            next: Pending::default(),
            deferred: Vec::new(),
        }
    }

    /// Counts one change applied in memory, and gives what the next commit writes and does.
    pub(crate) fn stage(&mut self) -> (&mut Batch, &mut E) {
        self.applied += 1;
        (&mut self.next.batch, &mut self.next.then)
    }

    /// How many changes were staged (counting from [`new`](Self::new)'s): the count a change
    /// just staged is committed at.
    pub(crate) fn staged_count(&self) -> u64 {
        self.applied
    }

    /// How many staged changes are committed.
    pub(crate) fn committed_count(&self) -> u64 {
        self.committed
    }

    /// Answers `answer` once the change staged last is committed.
    pub(crate) fn ack(&mut self, reply: Responder<B>, answer: B::Reply) {
        self.next.acks.push((reply, answer));
    }

    /// Answers `answer` at once if everything staged is committed, or once it is.
    pub(crate) fn read(&mut self, reply: Responder<B>, answer: B::Reply) {
        if self.applied <= self.committed {
            let _ = reply.send(answer);
        } else {
            self.deferred.push((self.applied, answer, reply));
        }
    }

    /// Whether [`flush`](Self::flush) would submit a commit: changes are staged and none is
    /// in flight.
    pub(crate) fn ready(&self) -> bool {
        self.inflight.is_none() && !self.next.batch.is_empty()
    }

    /// Whether anything waits: a commit in flight, changes staged, answers held.
    pub(crate) fn busy(&self) -> bool {
        self.inflight.is_some() || !self.next.batch.is_empty() || !self.deferred.is_empty()
    }

    /// Submits the staged changes as one commit unless one is in flight: `prepare` adds to
    /// its batch (a snapshot), `then` runs once it is durable (on the writer's thread, or
    /// here when the store commits at once) with what was staged for it.
    ///
    /// # Errors
    /// A commit that failed at once: the memory is ahead of the store, and the actor must
    /// start again from the store.
    pub(crate) fn flush(
        &mut self,
        myself: &ActorRef<MsgOf<B>>,
        store: &Arc<dyn Store>,
        prepare: impl FnOnce(&mut Batch),
        then: impl FnOnce(E) + Send + 'static,
    ) -> Result<(), StoreError> {
        if !self.ready() {
            return Ok(());
        }
        let Pending {
            mut batch,
            acks,
            then: staged,
        } = std::mem::take(&mut self.next);
        prepare(&mut batch);
        let count = self.applied;
        let finish = move |result: &Result<(), StoreError>| {
            answer::<B>(acks, result);
            if result.is_ok() {
                then(staged);
            }
        };
        match store.try_commit(batch) {
            Ok(result) => {
                finish(&result);
                result?;
                self.committed = count;
                self.release();
            }
            Err(batch) => {
                self.inflight = Some(count);
                let me = myself.clone();
                store.submit(
                    batch,
                    Box::new(move |result| {
                        // Answered here, so an acknowledged change is never held up by (or
                        // lost with) the actor.
                        finish(&result);
                        let _ = me.cast(Msg::Own(Committed(result).into()));
                    }),
                );
            }
        }
        Ok(())
    }

    /// Takes in the outcome of the commit in flight; the caller then flushes what waited.
    ///
    /// # Errors
    /// A failed commit: the memory is ahead of the store, and the actor must start again
    /// from the store. Changes waiting behind it were never submitted; their callers re-send
    /// them to the restarted actor.
    pub(crate) fn committed(&mut self, Committed(result): Committed) -> Result<(), StoreError> {
        let count = self.inflight.take().unwrap_or(self.committed);
        result?;
        self.committed = count;
        self.release();
        Ok(())
    }

    /// Answers the reads whose changes are now committed.
    fn release(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let committed = self.committed;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(seen, _, _)| *seen <= committed);
        self.deferred = waiting;
        for (_, answer, reply) in ready {
            let _ = reply.send(answer);
        }
    }
}

fn answer<B: Behaviour<Reply: From<StoreError>>>(
    acks: Vec<(Responder<B>, B::Reply)>,
    result: &Result<(), StoreError>,
) {
    for (reply, answer) in acks {
        let _ = reply.send(match result {
            Ok(()) => answer,
            Err(err) => B::Reply::from(err.clone()),
        });
    }
}
