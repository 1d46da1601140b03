//! The board actor: the only writer of the task board.
//!
//! **Changes** are applied in memory at once (so the next operation sees them), then
//! committed: each changed task's record and its history entry in one batch. One commit is
//! in flight at a time; operations arriving meanwhile wait together for the next one, so
//! a failed commit is followed by nothing. An operation is answered, by the store's writer
//! thread, only once it is committed; its notices are mailed after that.
//!
//! **Reads** see every change that arrived before them and are answered only once those are
//! committed, so nothing read can be lost by a crash.
//!
//! **Leases** are checked before every operation, and on a timer set for the next one to
//! end while the actor runs. The actor is not passivated while a lease is held.
//!
//! **Crashes.** A restarted actor waits for every commit submitted before it (a barrier),
//! then loads the board. Changes applied in memory but not yet submitted are lost with the
//! actor; their callers get no answer and re-send them, and they apply afresh.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use super::model::{Board, Effects, Notice, Task, TaskEvent};
use super::protocol::{BoardMsg, Op, Reply};
use super::shared::{BOARD, Shared};
use super::status::TaskId;
use super::{TaskError, keys, notify};
use crate::agents::now_ms;
use crate::store::cluster::Hold;
use crate::store::{self, Batch, StoreError, Table, codec};
use guildhall_supervision::lazy;

pub(crate) struct BoardActor {
    pub(crate) shared: Arc<Shared>,
}

/// Changes applied in memory and waiting for the next commit, with whom to answer and what
/// to mail once it is done.
#[derive(Default)]
struct Pending {
    batch: Batch,
    acks: Vec<(oneshot::Sender<Reply>, Reply)>,
    notices: Vec<Notice>,
    /// The tasks it changes, reported to listeners once committed.
    changed: Vec<TaskId>,
}

pub(crate) struct BoardState {
    board: Board,
    /// Changes applied in memory, counted.
    applied: u64,
    /// The count known committed.
    committed: u64,
    /// The count whose commit is in flight.
    inflight: Option<u64>,
    next: Pending,
    /// Answers held until what they saw is committed.
    deferred: Vec<(u64, Reply, oneshot::Sender<Reply>)>,
    /// When the lease timer set last fires (Unix milliseconds), if one is set.
    timer_at: Option<u64>,
    /// No time goes backwards on the board, even if the clock does.
    last_ms: u64,
    /// This server's hold on the board, when servers share the store: kept only to be
    /// dropped with the state, which releases it after every change this actor submitted.
    _hold: Option<Hold>,
}

/// The board's subject among servers sharing the store.
pub(crate) const BOARD_SUBJECT: &str = "board:tasks";

impl Actor for BoardActor {
    type Msg = BoardMsg;
    type State = BoardState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (): (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Box::pin(self.load(myself)).await
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.shared.slot.unpublish(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BoardMsg::Request(request) => {
                let Some((op, reply)) = request.take() else {
                    return Ok(());
                };
                self.shared.slot.touch(self.shared.clock.now());
                let now = state.now();
                self.expire(state, now);
                self.handle_op(state, op, reply, now);
                if state.inflight.is_none() {
                    self.flush(&myself, state)?;
                }
            }
            BoardMsg::Committed(result) => {
                let count = state.inflight.take().unwrap_or(state.committed);
                // A failed commit leaves the memory ahead of the store: start again from the
                // store. Operations waiting behind it were never submitted; their callers
                // re-send them to the restarted actor.
                result?;
                state.committed = count;
                release(state);
                self.flush(&myself, state)?;
            }
            BoardMsg::Expire => {
                state.timer_at = None;
                let now = state.now();
                self.expire(state, now);
                if state.inflight.is_none() {
                    self.flush(&myself, state)?;
                }
            }
            BoardMsg::Passivate => self.passivate_if_idle(&myself, state),
        }
        self.arm_timer(&myself, state);
        Ok(())
    }
}

impl BoardState {
    fn now(&mut self) -> u64 {
        self.last_ms = now_ms().max(self.last_ms);
        self.last_ms
    }
}

impl BoardActor {
    async fn load(&self, myself: ActorRef<BoardMsg>) -> Result<BoardState, ActorProcessingErr> {
        let store = &*self.shared.store;
        // Every commit submitted before this start (by a predecessor that crashed) is done
        // once this barrier is.
        store::commit(store, Batch::new()).await?;
        // Active on one server at a time: another holding it hands it over first, after
        // its changes, which the scan below then reads. Should the scan fail, the hold is
        // dropped here, and released.
        let hold = Hold::take(&self.shared.store, BOARD_SUBJECT.to_owned()).await?;
        let mut tasks = Vec::new();
        store::scan_values(store, Table::Tasks, &[], |_, task: Task| tasks.push(task))?;
        let last_ms = tasks.iter().map(|t| t.updated_ms).max().unwrap_or(0);
        self.shared.slot.touch(self.shared.clock.now());
        self.shared.slot.publish(myself);
        Ok(BoardState {
            board: Board::from_tasks(tasks),
            applied: 0,
            committed: 0,
            inflight: None,
            next: Pending::default(),
            deferred: Vec::new(),
            timer_at: None,
            last_ms,
            _hold: hold,
        })
    }

    fn handle_op(&self, state: &mut BoardState, op: Op, reply: oneshot::Sender<Reply>, now: u64) {
        let limits = &self.shared.config.limits;
        let mut effects = Effects::default();
        let board = &mut state.board;
        let outcome = match op {
            Op::Get(id) => board.get(id).map(|t| Some(t.id)),
            Op::List(query) => {
                let (tasks, total) = board.list(&query);
                return self.answer_read(state, Reply::Tasks(tasks, total), reply);
            }
            Op::Create { by, spec } => board
                .create(spec, by.as_ref(), now, limits, &mut effects)
                .map(Some),
            Op::Update { by, id, change } => board
                .update(id, change, by.as_ref(), now, limits, &mut effects)
                .map(|()| Some(id)),
            Op::Claim {
                by,
                role,
                filter,
                lease_ms,
            } => board.claim((&by, &role), &filter, lease_ms, now, limits, &mut effects),
            Op::Heartbeat { by, id } => board
                .heartbeat(id, &by, now, &mut effects)
                .map(|()| Some(id)),
            Op::Release { by, id, note } => board
                .release(id, &by, note, now, limits, &mut effects)
                .map(|()| Some(id)),
        };
        let answer = match outcome {
            Ok(Some(id)) => match board.get(id) {
                Ok(task) => Reply::Task(Box::new(board.answer(task))),
                Err(err) => Reply::Failed(err),
            },
            Ok(None) => Reply::Nothing,
            Err(err) => Reply::Failed(err),
        };
        if effects.changed.is_empty() {
            self.answer_read(state, answer, reply);
        } else {
            self.stage(state, effects);
            state.next.acks.push((reply, answer));
        }
    }

    /// Answers now if everything it saw is committed, or once it is.
    fn answer_read(&self, state: &mut BoardState, answer: Reply, reply: oneshot::Sender<Reply>) {
        if state.applied <= state.committed {
            let _ = reply.send(answer);
        } else {
            state.deferred.push((state.applied, answer, reply));
        }
    }

    /// Adds what `effects` changed to the next commit.
    fn stage(&self, state: &mut BoardState, effects: Effects) {
        state.applied += 1;
        state.next.changed.extend(effects.changed.iter().copied());
        for id in &effects.changed {
            if let Ok(task) = state.board.get(*id) {
                state
                    .next
                    .batch
                    .put(Table::Tasks, keys::task(*id), codec::encode(task));
            }
        }
        for (id, event) in &effects.events {
            state.next.batch.put(
                Table::TaskHistory,
                keys::event(*id, event.version),
                codec::encode::<TaskEvent>(event),
            );
        }
        state.next.notices.extend(effects.notices);
    }

    fn expire(&self, state: &mut BoardState, now: u64) {
        if state.board.next_expiry().is_some_and(|at| at <= now) {
            let mut effects = Effects::default();
            state.board.expire(now, &mut effects);
            self.stage(state, effects);
        }
    }

    /// Sets a timer for the next lease to end, unless one is set for no later.
    fn arm_timer(&self, myself: &ActorRef<BoardMsg>, state: &mut BoardState) {
        let Some(at) = state.board.next_expiry() else {
            return;
        };
        if state.timer_at.is_some_and(|set| set <= at) {
            return;
        }
        state.timer_at = Some(at);
        let wait = Duration::from_millis(at.saturating_sub(now_ms()) + 1);
        // The timer's task is not kept: an Expire that finds nothing due does nothing.
        drop(myself.send_after(wait, || BoardMsg::Expire));
    }

    /// Submits the waiting changes as one commit.
    fn flush(
        &self,
        myself: &ActorRef<BoardMsg>,
        state: &mut BoardState,
    ) -> Result<(), ActorProcessingErr> {
        if state.next.batch.is_empty() {
            return Ok(());
        }
        let Pending {
            batch,
            acks,
            notices,
            changed,
        } = std::mem::take(&mut state.next);
        let count = state.applied;
        let shared = Arc::clone(&self.shared);
        let runtime = tokio::runtime::Handle::current();
        let finish = move |result: &Result<(), StoreError>| {
            answer(acks, result);
            if result.is_ok() {
                shared.office.shared.changes.tasks_changed(&changed);
                if !notices.is_empty() {
                    runtime.spawn(notify::deliver(Arc::clone(&shared.office), notices));
                }
            }
        };
        match self.shared.store.try_commit(batch) {
            Ok(result) => {
                finish(&result);
                result?;
                state.committed = count;
                release(state);
            }
            Err(batch) => {
                state.inflight = Some(count);
                let me = myself.clone();
                self.shared.store.submit(
                    batch,
                    Box::new(move |result| {
                        // Answered here, so an acknowledged change is never held up by (or
                        // lost with) the actor.
                        finish(&result);
                        let _ = me.cast(BoardMsg::Committed(result));
                    }),
                );
            }
        }
        Ok(())
    }

    fn passivate_if_idle(&self, myself: &ActorRef<BoardMsg>, state: &mut BoardState) {
        let idle_for = self
            .shared
            .clock
            .now()
            .saturating_sub(self.shared.slot.last_active());
        if state.inflight.is_some()
            || !state.next.batch.is_empty()
            || !state.deferred.is_empty()
            || state.board.has_leases()
            || Duration::from_millis(idle_for) < self.shared.config.idle
        {
            return;
        }
        lazy::passivate(&self.shared.slot, &self.shared.partitions, BOARD, myself);
        tracing::trace!("task board passivated");
    }
}

/// Answers the reads whose changes are now committed.
fn release(state: &mut BoardState) {
    if state.deferred.is_empty() {
        return;
    }
    let committed = state.committed;
    let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.deferred)
        .into_iter()
        .partition(|(seen, _, _)| *seen <= committed);
    state.deferred = waiting;
    for (_, answer, reply) in ready {
        let _ = reply.send(answer);
    }
}

fn answer(acks: Vec<(oneshot::Sender<Reply>, Reply)>, result: &Result<(), StoreError>) {
    for (reply, answer) in acks {
        let _ = reply.send(match result {
            Ok(()) => answer,
            Err(err) => Reply::Failed(TaskError::Store(err.clone())),
        });
    }
}
