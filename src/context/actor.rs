//! The context actor: one per active session, the only writer of that session's state.
//!
//! **Updates.** A batch is applied in memory at once (so the next batch sees it and its
//! expected versions check against it), then logged. One commit per session is in flight at
//! a time: batches arriving meanwhile wait together for the next commit, so the log never has
//! a gap and a failed commit is followed by nothing. A batch is acknowledged, by the store's
//! writer thread, only once it is committed.
//!
//! **Reads** see every batch that arrived before them and are answered only once those are
//! committed, so nothing read can be lost by a crash.
//!
//! **Crashes.** A restarted actor waits for every commit submitted before it (a barrier), then
//! loads its latest snapshot and replays the log after it. Batches applied in memory but not
//! yet submitted are lost with the actor; their callers get no answer and re-send them, and
//! they apply afresh (expected versions checked again). So a crash in the middle of an update
//! leaves nothing of it, and nothing acknowledged is lost.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::Serialize;
use tokio::sync::oneshot;

use super::ContextError;
use super::log::{self, RestoreError};
use super::model::{Applied, Change, Entry, SessionContext};
use super::protocol::{ContextMsg, Op, Reply, Stat};
use super::query;
use super::session::SessionEntry;
use super::shared::Shared;
use crate::agents::{AgentId, now_ms};
use crate::store::cluster::Hold;
use crate::store::{self, Batch, StoreError, Table, codec};
use guildhall_supervision::lazy;

/// One session's context.
pub(crate) struct ContextActor {
    pub(crate) entry: Arc<SessionEntry>,
    pub(crate) shared: Arc<Shared>,
}

/// Batches applied in memory and waiting for the next commit, with whom to answer.
#[derive(Default)]
struct Pending {
    batch: Batch,
    acks: Vec<(oneshot::Sender<Reply>, Applied)>,
}

pub(crate) struct ContextState {
    ctx: SessionContext,
    /// The last version known committed.
    committed: u64,
    /// The version whose commit is in flight.
    inflight: Option<u64>,
    next: Pending,
    /// Answers held until the version they saw is committed.
    deferred: Vec<(u64, Reply, oneshot::Sender<Reply>)>,
    /// The oldest version history can be read at.
    base: u64,
    /// The latest snapshot's version and time (0, 0: none).
    snapshot: (u64, u64),
    /// This server's hold on the session, when servers share the store: kept only to be
    /// dropped with the state, which releases it after every batch this actor submitted.
    _hold: Option<Hold>,
    /// When the last batch was applied.
    last_at_ms: u64,
}

/// A snapshot, written from borrowed entries (same layout as [`log::Snapshot`]).
#[derive(Serialize)]
struct SnapshotOut<'a> {
    version: u64,
    at_ms: u64,
    base: u64,
    entries: Vec<&'a Entry>,
}

impl Actor for ContextActor {
    type Msg = ContextMsg;
    type State = ContextState;
    type Arguments = ();

    /// Loads the session. Boxed, so the actor's task does not carry the larger future of
    /// loading for the rest of its life.
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
        self.entry.slot.unpublish(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ContextMsg::Request(request) => {
                let Some((op, reply)) = request.take() else {
                    return Ok(());
                };
                self.entry.slot.touch(self.shared.clock.now());
                self.handle_op(&myself, state, op, reply)?;
            }
            ContextMsg::Committed(result) => {
                let version = state.inflight.take().unwrap_or(state.committed);
                // A failed commit leaves the memory state ahead of the store: start again
                // from the store. Batches waiting behind it were never submitted; their
                // callers re-send them to the restarted actor.
                result?;
                state.committed = version;
                self.release(state);
                self.flush(&myself, state)?;
            }
            ContextMsg::Passivate => self.passivate_if_idle(&myself, state),
        }
        Ok(())
    }
}

/// A session's subject among servers sharing the store.
pub(crate) fn subject(session: &str) -> String {
    store::cluster::subject("ctx", session)
}

impl ContextActor {
    async fn load(&self, myself: ActorRef<ContextMsg>) -> Result<ContextState, ActorProcessingErr> {
        let id = &self.entry.id;
        if self.entry.slot.is_retired() {
            return Err(format!("session `{id}` is being deleted").into());
        }
        // Every commit submitted before this start (by a predecessor that crashed) is done
        // once this barrier is.
        let store = &*self.shared.store;
        store::commit(store, Batch::new()).await?;
        // Active on one server at a time: another holding it hands it over first, after
        // its batches, which the restore below then reads. Should the restore fail, the
        // hold is dropped here, and released.
        let hold = Hold::take(&self.shared.store, subject(id.as_str())).await?;
        let restored = match log::restore(store, id, u64::MAX) {
            Ok(restored) => restored,
            Err(RestoreError::Store(err)) => return Err(err.into()),
            Err(RestoreError::Broken(reason)) => {
                return Err(ContextError::Damaged {
                    session: id.to_string(),
                    reason,
                }
                .into());
            }
        };
        self.entry.slot.touch(self.shared.clock.now());
        self.entry.slot.publish(myself);
        Ok(ContextState {
            committed: restored.ctx.version(),
            ctx: restored.ctx,
            inflight: None,
            next: Pending::default(),
            deferred: Vec::new(),
            base: restored.base,
            snapshot: restored.snapshot,
            last_at_ms: restored.last_at_ms,
            _hold: hold,
        })
    }

    fn handle_op(
        &self,
        myself: &ActorRef<ContextMsg>,
        state: &mut ContextState,
        op: Op,
        reply: oneshot::Sender<Reply>,
    ) -> Result<(), ActorProcessingErr> {
        let answer = match op {
            Op::Update { changes, author } => {
                return self.update(myself, state, &changes, author, reply);
            }
            Op::Read { select, limit } => Reply::View(query::read(&state.ctx, &select, limit)),
            Op::Stat => Reply::Stat(Stat {
                version: state.ctx.version(),
                base: state.base,
                entries: state.ctx.len(),
                bytes: state.ctx.bytes(),
            }),
            Op::Export => Reply::Entries {
                version: state.ctx.version(),
                entries: state.ctx.entries().cloned().collect(),
            },
            #[cfg(feature = "test-util")]
            Op::CrashMidUpdate(changes) => {
                let half = changes.len().div_ceil(2);
                let _ = state.ctx.apply(
                    &changes[..half],
                    None,
                    now_ms(),
                    &super::model::ContextLimits::UNLIMITED,
                );
                panic!(
                    "context of `{}` crashed mid-update on request",
                    self.entry.id
                );
            }
        };
        // Seen only once what it saw is committed.
        let seen = state.ctx.version();
        if seen <= state.committed {
            let _ = reply.send(answer);
        } else {
            state.deferred.push((seen, answer, reply));
        }
        Ok(())
    }

    fn update(
        &self,
        myself: &ActorRef<ContextMsg>,
        state: &mut ContextState,
        changes: &[Change],
        author: Option<AgentId>,
        reply: oneshot::Sender<Reply>,
    ) -> Result<(), ActorProcessingErr> {
        if self.entry.is_closed() {
            let _ = reply.send(Reply::Failed(ContextError::SessionClosed {
                id: self.entry.id.to_string(),
            }));
            return Ok(());
        }
        let at_ms = now_ms().max(state.last_at_ms);
        let applied =
            match state
                .ctx
                .apply(changes, author.as_ref(), at_ms, &self.shared.config.limits)
            {
                Ok(applied) => applied,
                Err(err) => {
                    let _ = reply.send(Reply::Failed(err));
                    return Ok(());
                }
            };
        state.last_at_ms = at_ms;
        let logged = LoggedBatchOut {
            version: applied.version,
            at_ms,
            author: author.as_ref(),
            changes,
            versions: applied
                .changes
                .iter()
                .map(|c| [c.before, c.after])
                .collect(),
        };
        state.next.batch.put(
            Table::ContextLog,
            log::key(&self.entry.id, applied.version),
            codec::encode(&logged),
        );
        state.next.acks.push((reply, applied));
        if state.inflight.is_none() {
            self.flush(myself, state)?;
        }
        Ok(())
    }

    /// Submits the waiting batches as one commit.
    fn flush(
        &self,
        myself: &ActorRef<ContextMsg>,
        state: &mut ContextState,
    ) -> Result<(), ActorProcessingErr> {
        if state.next.acks.is_empty() {
            return Ok(());
        }
        let Pending { mut batch, acks } = std::mem::take(&mut state.next);
        let version = state.ctx.version();
        if version - state.snapshot.0 >= self.shared.config.snapshot_every {
            self.snapshot_into(&mut batch, state);
        }
        match self.shared.store.try_commit(batch) {
            Ok(result) => {
                answer(acks, &result);
                result?;
                state.committed = version;
                self.release(state);
            }
            Err(batch) => {
                state.inflight = Some(version);
                let me = myself.clone();
                self.shared.store.submit(
                    batch,
                    Box::new(move |result| {
                        // Answered here, so an acknowledged batch is never held up by (or
                        // lost with) the actor.
                        answer(acks, &result);
                        let _ = me.cast(ContextMsg::Committed(result));
                    }),
                );
            }
        }
        Ok(())
    }

    /// Adds a snapshot at the current version to `batch`, superseding the previous one, or,
    /// when the previous one is older than the history retention, making it the new base and
    /// pruning the log before it.
    fn snapshot_into(&self, batch: &mut Batch, state: &mut ContextState) {
        let id = &self.entry.id;
        let (previous, previous_ms) = state.snapshot;
        if previous > state.base {
            let expired = self
                .shared
                .config
                .history_retention
                .is_some_and(|keep| now_ms().saturating_sub(previous_ms) >= duration_ms(keep));
            if expired {
                for version in state.base + 1..=previous {
                    batch.delete(Table::ContextLog, log::key(id, version));
                }
                if state.base > 0 {
                    batch.delete(Table::ContextSnapshots, log::key(id, state.base));
                }
                state.base = previous;
            } else {
                batch.delete(Table::ContextSnapshots, log::key(id, previous));
            }
        }
        let version = state.ctx.version();
        let snapshot = SnapshotOut {
            version,
            at_ms: state.last_at_ms,
            base: state.base,
            entries: state.ctx.entries().collect(),
        };
        batch.put(
            Table::ContextSnapshots,
            log::key(id, version),
            codec::encode(&snapshot),
        );
        state.snapshot = (version, state.last_at_ms);
    }

    /// Answers the reads whose versions are now committed.
    fn release(&self, state: &mut ContextState) {
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

    fn passivate_if_idle(&self, myself: &ActorRef<ContextMsg>, state: &mut ContextState) {
        let idle_for = self
            .shared
            .clock
            .now()
            .saturating_sub(self.entry.slot.last_active());
        if state.inflight.is_some()
            || !state.next.acks.is_empty()
            || !state.deferred.is_empty()
            || Duration::from_millis(idle_for) < self.shared.config.idle
        {
            return;
        }
        lazy::passivate(
            &self.entry.slot,
            &self.shared.partitions,
            self.entry.id.as_str(),
            myself,
        );
        tracing::trace!(session = %self.entry.id, "context passivated");
    }
}

/// A logged batch, written from borrowed parts (same layout as [`log::LoggedBatch`]).
#[derive(Serialize)]
struct LoggedBatchOut<'a> {
    version: u64,
    at_ms: u64,
    author: Option<&'a AgentId>,
    changes: &'a [Change],
    versions: Vec<[u64; 2]>,
}

fn answer(acks: Vec<(oneshot::Sender<Reply>, Applied)>, result: &Result<(), StoreError>) {
    for (reply, applied) in acks {
        let _ = reply.send(match result {
            Ok(()) => Reply::Applied(applied),
            Err(err) => Reply::Failed(err.clone().into()),
        });
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::context::log::{LoggedBatch, Snapshot};
    use crate::context::{EntryKind, Strategy};

    /// The borrowed forms written by the actor decode as the stored forms read back.
    #[test]
    fn borrowed_forms_encode_as_the_stored_forms() {
        let author = AgentId::parse("pm-1").unwrap();
        let changes = vec![Change {
            key: "plan".into(),
            strategy: Strategy::Merge,
            value: json!({"step": 1}),
            kind: Some(EntryKind::Json),
            expected_version: Some(0),
        }];
        let out = LoggedBatchOut {
            version: 3,
            at_ms: 9,
            author: Some(&author),
            changes: &changes,
            versions: vec![[0, 1]],
        };
        let back: LoggedBatch = codec::decode(Table::ContextLog, &codec::encode(&out)).unwrap();
        assert_eq!(
            back,
            LoggedBatch {
                version: 3,
                at_ms: 9,
                author: Some(author.clone()),
                changes: changes.clone(),
                versions: vec![[0, 1]],
            }
        );
        let mut ctx = SessionContext::new();
        ctx.apply(
            &changes,
            Some(&author),
            9,
            &super::super::model::ContextLimits::UNLIMITED,
        )
        .unwrap();
        let out = SnapshotOut {
            version: 1,
            at_ms: 9,
            base: 0,
            entries: ctx.entries().collect(),
        };
        let back: Snapshot = codec::decode(Table::ContextSnapshots, &codec::encode(&out)).unwrap();
        assert_eq!(back.entries, ctx.entries().cloned().collect::<Vec<_>>());
        assert_eq!((back.version, back.at_ms, back.base), (1, 9, 0));
    }
}
