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

use ractor::{ActorProcessingErr, ActorRef};
use serde::Serialize;

use super::ContextError;
use super::log::{self, RestoreError};
use super::model::{Change, Entry, SessionContext};
use super::protocol::{Committed, ContextMsg, Op, Reply, Stat};
use super::query;
use super::session::{SessionEntry, SessionId};
use super::shared::Shared;
use crate::agents::{AgentId, now_ms};
use crate::durable::{Behaviour, Commits, Home, Responder};
use crate::store::{self, Batch, Table, codec};

/// One session's context.
pub(crate) struct ContextActor {
    pub(crate) entry: Arc<SessionEntry>,
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct ContextState {
    ctx: SessionContext,
    /// Counts versions: the version is the count of batches applied.
    commits: Commits<ContextActor>,
    /// The oldest version history can be read at.
    base: u64,
    /// The latest snapshot's version and time (0, 0: none).
    snapshot: (u64, u64),
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

impl Behaviour for ContextActor {
    type Op = Op;
    type Reply = Reply;
    type Own = Committed;
    type State = ContextState;
    const WHAT: &'static str = "session";

    fn home(&self) -> Home<'_, Self> {
        let shared = &self.shared;
        Home::new(
            &self.entry.slot,
            &shared.family,
            self.entry.id.as_str(),
            &shared.store,
        )
    }

    fn subject(&self) -> String {
        subject(self.entry.id.as_str())
    }

    async fn load(
        &self,
        _: &ActorRef<ContextMsg>,
        _held: bool,
    ) -> Result<ContextState, ActorProcessingErr> {
        let id = &self.entry.id;
        let restored = match log::restore(&*self.shared.store, id, u64::MAX) {
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
        Ok(ContextState {
            commits: Commits::new(restored.ctx.version()),
            ctx: restored.ctx,
            base: restored.base,
            snapshot: restored.snapshot,
            last_at_ms: restored.last_at_ms,
        })
    }

    fn request(
        &self,
        myself: &ActorRef<ContextMsg>,
        state: &mut ContextState,
        op: Op,
        reply: Responder<Self>,
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
        state.commits.read(reply, answer);
        Ok(())
    }

    async fn own(
        &self,
        myself: &ActorRef<ContextMsg>,
        state: &mut ContextState,
        committed: Committed,
    ) -> Result<(), ActorProcessingErr> {
        state.commits.committed(committed)?;
        self.flush(myself, state)
    }

    fn busy(&self, state: &mut ContextState) -> bool {
        state.commits.busy()
    }
}

/// A session's subject among servers sharing the store.
pub(crate) fn subject(session: &str) -> String {
    store::cluster::subject("ctx", session)
}

impl ContextActor {
    fn update(
        &self,
        myself: &ActorRef<ContextMsg>,
        state: &mut ContextState,
        changes: &[Change],
        author: Option<AgentId>,
        reply: Responder<Self>,
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
        let (batch, ()) = state.commits.stage();
        batch.put(
            Table::ContextLog,
            log::key(&self.entry.id, applied.version),
            codec::encode(&logged),
        );
        state.commits.ack(reply, Reply::Applied(applied));
        self.flush(myself, state)
    }

    /// Submits the waiting batches as one commit, with a snapshot when one is due.
    fn flush(
        &self,
        myself: &ActorRef<ContextMsg>,
        state: &mut ContextState,
    ) -> Result<(), ActorProcessingErr> {
        let ContextState {
            ctx,
            commits,
            base,
            snapshot,
            last_at_ms,
        } = state;
        let config = &self.shared.config;
        let id = &self.entry.id;
        commits.flush(
            myself,
            &self.shared.store,
            |batch| {
                if ctx.version() - snapshot.0 >= config.snapshot_every {
                    let retention = config.history_retention;
                    snapshot_into(batch, id, ctx, base, snapshot, *last_at_ms, retention);
                }
            },
            |()| {},
        )?;
        Ok(())
    }
}

/// Adds a snapshot at the current version to `batch`, superseding the previous one, or,
/// when the previous one is older than the history retention, making it the new base and
/// pruning the log before it.
fn snapshot_into(
    batch: &mut Batch,
    id: &SessionId,
    ctx: &SessionContext,
    base: &mut u64,
    snapshot: &mut (u64, u64),
    last_at_ms: u64,
    retention: Option<Duration>,
) {
    let (previous, previous_ms) = *snapshot;
    if previous > *base {
        let expired =
            retention.is_some_and(|keep| now_ms().saturating_sub(previous_ms) >= duration_ms(keep));
        if expired {
            for version in *base + 1..=previous {
                batch.delete(Table::ContextLog, log::key(id, version));
            }
            if *base > 0 {
                batch.delete(Table::ContextSnapshots, log::key(id, *base));
            }
            *base = previous;
        } else {
            batch.delete(Table::ContextSnapshots, log::key(id, previous));
        }
    }
    let version = ctx.version();
    let out = SnapshotOut {
        version,
        at_ms: last_at_ms,
        base: *base,
        entries: ctx.entries().collect(),
    };
    batch.put(
        Table::ContextSnapshots,
        log::key(id, version),
        codec::encode(&out),
    );
    *snapshot = (version, last_at_ms);
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
