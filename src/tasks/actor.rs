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
//! **Ended tasks** leave memory once their last change is committed, and are read from the
//! store when needed (see [`super::model`]): the board holds the work in progress.
//!
//! **Crashes.** A restarted actor waits for every commit submitted before it (a barrier),
//! then loads the board. Changes applied in memory but not yet submitted are lost with the
//! actor; their callers get no answer and re-send them, and they apply afresh.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef};

use super::model::{Board, Effects, Notice, Task, TaskEvent};
use super::protocol::{BoardMsg, BoardOwn, Op, Reply};
use super::shared::{BOARD, Shared, StoredTasks};
use super::status::TaskId;
use super::{keys, notify};
use crate::agents::now_ms;
use crate::durable::{Behaviour, Commits, Home, Msg, Responder};
use crate::store::{self, Table, codec};

pub(crate) struct BoardActor {
    pub(crate) shared: Arc<Shared>,
}

/// What a commit does once durable: the notices it mails and the tasks it changed, reported
/// to listeners.
#[derive(Default)]
pub(crate) struct Staged {
    notices: Vec<Notice>,
    changed: Vec<TaskId>,
}

pub(crate) struct BoardState {
    board: Board,
    commits: Commits<BoardActor, Staged>,
    /// When the lease timer set last fires (Unix milliseconds), if one is set.
    timer_at: Option<u64>,
    /// No time goes backwards on the board, even if the clock does.
    last_ms: u64,
    /// Ended tasks in memory, each with the count of changes that must be committed before it
    /// leaves (its last change's).
    ending: HashMap<TaskId, u64>,
}

/// The board's subject among servers sharing the store.
pub(crate) const BOARD_SUBJECT: &str = "board:tasks";

impl Behaviour for BoardActor {
    type Op = Op;
    type Reply = Reply;
    type Own = BoardOwn;
    type State = BoardState;
    const WHAT: &'static str = "board";

    fn home(&self) -> Home<'_, Self> {
        let shared = &self.shared;
        Home::new(&shared.slot, &shared.family, BOARD, &shared.store)
    }

    fn subject(&self) -> String {
        BOARD_SUBJECT.to_owned()
    }

    async fn load(
        &self,
        _: &ActorRef<BoardMsg>,
        _held: bool,
    ) -> Result<BoardState, ActorProcessingErr> {
        // Ended tasks stay in the store: read only for the next id and the clock.
        let (mut tasks, mut next_id, mut last_ms) = (Vec::new(), 1, 0);
        store::scan_values(&*self.shared.store, Table::Tasks, &[], |_, task: Task| {
            next_id = next_id.max(task.id + 1);
            last_ms = last_ms.max(task.updated_ms);
            if !task.status.is_ended() {
                tasks.push(task);
            }
        })?;
        let mut board = Board::from_tasks(tasks);
        board.archive(
            Arc::new(StoredTasks(Arc::clone(&self.shared.store))),
            next_id,
        );
        Ok(BoardState {
            board,
            commits: Commits::new(0),
            timer_at: None,
            last_ms,
            ending: HashMap::new(),
        })
    }

    fn request(
        &self,
        myself: &ActorRef<BoardMsg>,
        state: &mut BoardState,
        op: Op,
        reply: Responder<Self>,
    ) -> Result<(), ActorProcessingErr> {
        let now = state.now();
        self.expire(state, now);
        self.handle_op(state, op, reply, now);
        self.flush(myself, state)
    }

    async fn own(
        &self,
        myself: &ActorRef<BoardMsg>,
        state: &mut BoardState,
        msg: BoardOwn,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BoardOwn::Committed(committed) => state.commits.committed(committed)?,
            BoardOwn::Expire => {
                state.timer_at = None;
                let now = state.now();
                self.expire(state, now);
            }
        }
        self.flush(myself, state)
    }

    fn busy(&self, state: &mut BoardState) -> bool {
        state.commits.busy() || state.board.has_leases()
    }

    fn after(&self, myself: &ActorRef<BoardMsg>, state: &mut BoardState) {
        state.evict_committed();
        self.arm_timer(myself, state);
    }
}

impl BoardState {
    fn now(&mut self) -> u64 {
        self.last_ms = now_ms().max(self.last_ms);
        self.last_ms
    }

    /// Sends to the archive the ended tasks whose last change is committed.
    fn evict_committed(&mut self) {
        if self.ending.is_empty() {
            return;
        }
        let committed = self.commits.committed_count();
        let board = &mut self.board;
        self.ending.retain(|id, last| {
            if *last > committed {
                return true;
            }
            board.evict(*id);
            false
        });
    }

    /// Brings task `id` into memory for an operation on it, to leave again once ended and
    /// committed.
    fn fault_in(&mut self, id: TaskId) -> Result<(), super::TaskError> {
        if self.board.fault_in(id)? {
            self.ending
                .entry(id)
                .or_insert(self.commits.committed_count());
        }
        Ok(())
    }
}

impl BoardActor {
    fn handle_op(&self, state: &mut BoardState, op: Op, reply: Responder<Self>, now: u64) {
        let limits = &self.shared.config.limits;
        let mut effects = Effects::default();
        let target = match &op {
            Op::Get(id)
            | Op::Update { id, .. }
            | Op::Heartbeat { id, .. }
            | Op::Release { id, .. } => Some(*id),
            Op::Create { .. } | Op::Claim { .. } | Op::List(_) => None,
        };
        if let Some(id) = target
            && let Err(err) = state.fault_in(id)
        {
            return state.commits.read(reply, Reply::Failed(err));
        }
        let board = &mut state.board;
        let outcome = match op {
            Op::Get(id) => board.get(id).map(|t| Some(t.id)),
            Op::List(query) => {
                let listing = board.list(&query);
                return state.commits.read(reply, Reply::Listing(listing));
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
            state.commits.read(reply, answer);
        } else {
            self.stage(state, effects);
            state.commits.ack(reply, answer);
        }
    }

    /// Adds what `effects` changed to the next commit.
    fn stage(&self, state: &mut BoardState, effects: Effects) {
        // The count this change is committed at.
        let change = state.commits.staged_count() + 1;
        let (batch, staged) = state.commits.stage();
        staged.changed.extend(effects.changed.iter().copied());
        for id in &effects.changed {
            if let Ok(task) = state.board.get(*id) {
                batch.put(Table::Tasks, keys::task(*id), codec::encode(task));
                if task.status.is_ended() {
                    state.ending.insert(*id, change);
                } else {
                    state.ending.remove(id);
                }
            }
        }
        for (id, event) in &effects.events {
            batch.put(
                Table::TaskHistory,
                keys::event(*id, event.version),
                codec::encode::<TaskEvent>(event),
            );
        }
        staged.notices.extend(effects.notices);
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
        drop(myself.send_after(wait, || Msg::Own(BoardOwn::Expire)));
    }

    /// Submits the waiting changes as one commit; once durable, its notices are mailed.
    fn flush(
        &self,
        myself: &ActorRef<BoardMsg>,
        state: &mut BoardState,
    ) -> Result<(), ActorProcessingErr> {
        if !state.commits.ready() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let runtime = tokio::runtime::Handle::current();
        state.commits.flush(
            myself,
            &self.shared.store,
            |_| {},
            move |Staged { notices, changed }| {
                shared.office.shared.changes.tasks_changed(&changed);
                shared.office.events.emit(|| {
                    let mut ids = changed.clone();
                    ids.sort_unstable();
                    ids.dedup();
                    crate::events::ToolEvent::TasksChanged { ids }
                });
                if !notices.is_empty() {
                    runtime.spawn(notify::deliver(Arc::clone(&shared.office), notices));
                }
            },
        )?;
        Ok(())
    }
}
