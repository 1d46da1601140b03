//! The context hub: the sessions, their context actors (started on demand, passivated when
//! idle), and the operations that read the store directly (history, reads as of a version,
//! export and import).

use std::sync::Arc;

use guildhall_supervision::ChildSpec;

use super::actor::ContextActor;
use super::export::{EXPORT_FORMAT, SessionExport};
use super::log::{self, History, HistoryQuery, RestoreError};
use super::model::{Applied, Change, ContextLimits, SessionContext};
use super::protocol::{ContextMsg, Op, Reply, Stat};
use super::query::{self, ContextView, Select};
use super::session::{
    SESSIONS, SessionDirectory, SessionEntry, SessionId, SessionRecord, SessionSpec,
};
use super::shared::Shared;
use super::{ContextConfig, ContextError};
use crate::agents::{AgentId, PostOffice, now_ms};
use crate::durable::{self, Family, Owner};
use crate::events::ToolEvent;
use crate::store::{self, Batch, Notice, Store, Table, codec};
use guildhall_supervision::lazy::{self, Lazy, RequestError, SlotVisitor};

/// The id of the supervisor of all context actors, under root.
pub(crate) const CONTEXTS: &str = "contexts";

/// The sessions and their context actors.
pub(crate) struct ContextHub {
    pub(crate) shared: Arc<Shared>,
    pub(crate) sessions: SessionDirectory,
    /// Authors must be registered agents.
    office: Arc<PostOffice>,
    /// Counts context changes, for caches of results that depend on them.
    generations: Generations,
}

/// How many times each session's context (and any context at all) has changed.
#[derive(Default)]
struct Generations {
    any: std::sync::atomic::AtomicU64,
    sessions: dashmap::DashMap<String, u64>,
}

impl ContextHub {
    pub(crate) fn open(
        store: Arc<dyn Store>,
        config: ContextConfig,
        office: Arc<PostOffice>,
    ) -> Result<Arc<Self>, ContextError> {
        let sessions = SessionDirectory::load(&*store)?;
        Ok(Arc::new(Self {
            shared: Arc::new(Shared {
                family: Family::new(config.idle),
                store,
                config,
                changes: Arc::clone(&office.shared.changes),
            }),
            sessions,
            office,
            generations: Generations::default(),
        }))
    }

    /// The session `id`. With servers sharing the store, one created on another server a
    /// moment ago and not yet noticed here is looked for in the store.
    ///
    /// # Errors
    /// [`ContextError::UnknownSession`] when there is none.
    pub(crate) async fn session(&self, id: &str) -> Result<Arc<SessionEntry>, ContextError> {
        let found = if self.shared.store.cluster().is_some() {
            self.sessions.get_or_load(&*self.shared.store, id).await?
        } else {
            self.sessions.get(id)
        };
        found.ok_or_else(|| ContextError::UnknownSession { id: id.to_owned() })
    }

    /// What another server sharing the store says: a session to hand over, sessions it
    /// created, changed or deleted.
    pub(crate) async fn on_notice(&self, notice: &Notice) {
        match notice {
            Notice::Release(subject) => {
                if let Some(id) = subject.strip_prefix("ctx:") {
                    // Its state goes with it, and its hold is released after its batches.
                    lazy::stop(&self.shared.family.partitions, id).await;
                }
            }
            Notice::Changed(what) if &**what == SESSIONS => self.refresh().await,
            Notice::Resync => self.refresh().await,
            _ => {}
        }
    }

    /// Reads the sessions again, stopping the actors of sessions deleted elsewhere.
    async fn refresh(&self) {
        match self.sessions.refresh(&*self.shared.store).await {
            Ok(removed) => {
                for entry in removed {
                    lazy::stop(&self.shared.family.partitions, entry.id.as_str()).await;
                }
            }
            Err(err) => {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "could not read the sessions again")
            }
        }
    }

    /// The child spec of the `contexts` supervisor.
    pub(crate) fn supervisor_spec(&self) -> ChildSpec {
        self.shared.family.supervisor_spec(CONTEXTS)
    }

    pub(crate) fn stop_sweep(&self) {
        self.shared.family.stop_sweep();
    }

    /// A registered agent's id, for an author or creator.
    pub(crate) fn author(&self, id: &str) -> Result<AgentId, ContextError> {
        match self.office.directory.get(id) {
            Some(entry) => Ok(entry.id.clone()),
            None => Err(ContextError::UnknownAuthor { id: id.to_owned() }),
        }
    }

    pub(crate) async fn create(&self, spec: SessionSpec) -> Result<SessionRecord, ContextError> {
        let id = match &spec.id {
            Some(id) => SessionId::parse(id)?,
            None => SessionId::generate(),
        };
        let record = SessionRecord {
            id,
            title: spec.title,
            created_by: spec
                .created_by
                .as_deref()
                .map(|a| self.author(a))
                .transpose()?,
            created_ms: now_ms(),
            closed_ms: None,
            metadata: spec.metadata,
        };
        let entry = self
            .sessions
            .create(&*self.shared.store, record, Batch::new())
            .await?;
        Ok((*entry.record()).clone())
    }

    /// The session `id`, created (by `author`) if it does not exist.
    pub(crate) async fn open_session(
        &self,
        id: &str,
        author: Option<&AgentId>,
    ) -> Result<Arc<SessionEntry>, ContextError> {
        if let Some(entry) = self.sessions.get(id) {
            return Ok(entry);
        }
        let mut spec = SessionSpec::new(id);
        spec.created_by = author.map(ToString::to_string);
        match self.create(spec).await {
            Ok(_) | Err(ContextError::SessionExists { .. }) => self.sessions.require(id),
            Err(err) => Err(err),
        }
    }

    pub(crate) async fn close(&self, id: &str) -> Result<Arc<SessionRecord>, ContextError> {
        self.sessions
            .update(&*self.shared.store, id, |r| {
                r.closed_ms.get_or_insert_with(now_ms);
            })
            .await
    }

    /// Deletes a session: stops its actor, then removes its record, log and snapshots.
    pub(crate) async fn delete(&self, id: &str) -> Result<(), ContextError> {
        let entry = self.session(id).await?;
        self.changed(id);
        entry.slot.retire();
        lazy::stop(&self.shared.family.partitions, id).await;
        let mut batch = Batch::new();
        let prefix = log::prefix(&entry.id);
        for table in [Table::ContextLog, Table::ContextSnapshots] {
            store::delete_prefix(&*self.shared.store, table, &prefix, &mut batch)?;
        }
        self.sessions
            .remove(&*self.shared.store, &entry, batch)
            .await
    }

    pub(crate) async fn update(
        &self,
        entry: &Arc<SessionEntry>,
        changes: Arc<[Change]>,
        author: Option<AgentId>,
    ) -> Result<Applied, ContextError> {
        let events = &self.office.events;
        let keys: Vec<String> = if self.shared.changes.is_watched() || events.has_subscribers() {
            changes.iter().map(|c| c.key.clone()).collect()
        } else {
            Vec::new()
        };
        let by = events.has_subscribers().then(|| author.clone()).flatten();
        let reply = self.request(entry, Op::Update { changes, author }).await;
        // Counted even on failure: a crash mid-update may have applied it.
        self.changed(entry.id.as_str());
        match reply? {
            Reply::Applied(applied) => {
                self.shared
                    .changes
                    .session_changed(entry.id.as_str(), keys.iter().map(String::as_str));
                events.emit(|| ToolEvent::ContextChanged {
                    session: Arc::from(entry.id.as_str()),
                    version: applied.version,
                    author: by.map(|a| a.shared()),
                    keys,
                });
                Ok(applied)
            }
            other => Err(failed(entry, other)),
        }
    }

    fn changed(&self, session: &str) {
        self.generations
            .any
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        *self
            .generations
            .sessions
            .entry(session.to_owned())
            .or_default() += 1;
    }

    /// How many times `session`'s context has changed (any session's, for `None`) since the
    /// runtime started: a cached result made at another count is stale.
    pub(crate) fn generation(&self, session: Option<&str>) -> u64 {
        match session {
            Some(id) => self.generations.sessions.get(id).map_or(0, |g| *g),
            None => self
                .generations
                .any
                .load(std::sync::atomic::Ordering::Acquire),
        }
    }

    pub(crate) async fn read(
        &self,
        entry: &Arc<SessionEntry>,
        select: Select,
        limit: usize,
    ) -> Result<ContextView, ContextError> {
        match self.request(entry, Op::Read { select, limit }).await? {
            Reply::View(view) => Ok(view),
            other => Err(failed(entry, other)),
        }
    }

    pub(crate) async fn stat(&self, entry: &Arc<SessionEntry>) -> Result<Stat, ContextError> {
        match self.request(entry, Op::Stat).await? {
            Reply::Stat(stat) => Ok(stat),
            other => Err(failed(entry, other)),
        }
    }

    /// Reads `select` as the session was at `version`: from the snapshot at or before it,
    /// with the log replayed up to it.
    pub(crate) async fn read_as_of(
        &self,
        entry: &Arc<SessionEntry>,
        version: u64,
        select: Select,
        limit: usize,
    ) -> Result<ContextView, ContextError> {
        let stat = self.stat(entry).await?;
        if version >= stat.version {
            if version > stat.version {
                return Err(ContextError::FutureVersion {
                    session: entry.id.to_string(),
                    requested: version,
                    current: stat.version,
                });
            }
            return self.read(entry, select, limit).await;
        }
        let ctx = self.rebuild(entry, version, stat.base)?;
        Ok(query::read(&ctx, &select, limit))
    }

    /// The context at `version` (at least `base`), rebuilt from the store.
    fn rebuild(
        &self,
        entry: &SessionEntry,
        version: u64,
        base: u64,
    ) -> Result<SessionContext, ContextError> {
        let pruned = |oldest: u64| ContextError::HistoryPruned {
            session: entry.id.to_string(),
            requested: version,
            oldest,
        };
        if version < base {
            return Err(pruned(base));
        }
        match log::restore(&*self.shared.store, &entry.id, version) {
            Ok(restored) if restored.ctx.version() == version => Ok(restored.ctx),
            // Pruned while this read ran (or damaged): the log does not reach back to it.
            Ok(_) | Err(RestoreError::Broken(_)) => Err(pruned(base)),
            Err(RestoreError::Store(err)) => Err(err.into()),
        }
    }

    pub(crate) async fn history(
        &self,
        entry: &Arc<SessionEntry>,
        query: &HistoryQuery,
    ) -> Result<History, ContextError> {
        let stat = self.stat(entry).await?;
        let limit = query.limit.max(1);
        let from = match (query.after, &query.key) {
            (Some(after), _) => after + 1,
            (None, None) => stat.version.saturating_sub(limit as u64 - 1),
            (None, Some(_)) => stat.base + 1,
        }
        .max(stat.base + 1);
        let mut batches = std::collections::VecDeque::new();
        log::replay(&*self.shared.store, &entry.id, from, |batch| {
            if batch.version > stat.version {
                return false;
            }
            if query
                .key
                .as_ref()
                .is_none_or(|k| batch.changes.iter().any(|c| &c.key == k))
            {
                batches.push_back(batch);
                if batches.len() > limit {
                    if query.after.is_some() {
                        batches.pop_back();
                        return false;
                    }
                    batches.pop_front();
                }
            }
            true
        })?;
        Ok(History {
            version: stat.version,
            oldest: stat.base,
            batches: batches.into(),
        })
    }

    pub(crate) async fn export(
        &self,
        entry: &Arc<SessionEntry>,
        with_history: bool,
    ) -> Result<SessionExport, ContextError> {
        let (version, entries) = match self.request(entry, Op::Export).await? {
            Reply::Entries { version, entries } => (version, entries),
            other => return Err(failed(entry, other)),
        };
        let mut export = SessionExport {
            format: EXPORT_FORMAT.to_owned(),
            session: (*entry.record()).clone(),
            version,
            entries,
            base: version,
            base_entries: Vec::new(),
            history: Vec::new(),
        };
        if with_history {
            let stat = self.stat(entry).await?;
            let base = self.rebuild(entry, stat.base, stat.base)?;
            export.base = stat.base;
            export.base_entries = base.entries().cloned().collect();
            log::replay(&*self.shared.store, &entry.id, stat.base + 1, |batch| {
                let more = batch.version <= version;
                if more {
                    export.history.push(batch);
                }
                more
            })?;
        }
        Ok(export)
    }

    /// Creates a session from an export, as `id` if given. The export is checked first: its
    /// history must replay from its base to exactly its entries.
    pub(crate) async fn import(
        &self,
        export: SessionExport,
        id: Option<&str>,
    ) -> Result<SessionRecord, ContextError> {
        let invalid = |reason: String| ContextError::InvalidExport { reason };
        if export.format != EXPORT_FORMAT {
            return Err(invalid(format!(
                "format {:?} is not {EXPORT_FORMAT:?}",
                export.format
            )));
        }
        let mut record = export.session;
        if let Some(id) = id {
            record.id = SessionId::parse(id)?;
        } else {
            record.id = SessionId::parse(record.id.as_str())?;
        }
        let limits = self.shared.config.limits;
        let listed = export.entries.len();
        let current = SessionContext::from_entries(export.version, export.entries);
        if current.len() != listed {
            return Err(invalid("two entries share a key".into()));
        }
        if current.bytes() > limits.max_session_bytes {
            return Err(ContextError::TooLarge {
                what: "the imported session".into(),
                size: current.bytes(),
                limit: limits.max_session_bytes,
            });
        }
        let mut replayed = SessionContext::from_entries(export.base, export.base_entries);
        let base_snapshot = (export.base > 0 && !export.history.is_empty())
            .then(|| replayed.entries().cloned().collect::<Vec<_>>());
        for batch in &export.history {
            if batch.version != replayed.version() + 1 {
                return Err(invalid(format!(
                    "history jumps from version {} to {}",
                    replayed.version(),
                    batch.version
                )));
            }
            replayed
                .apply(
                    &batch.changes,
                    batch.author.as_ref(),
                    batch.at_ms,
                    &ContextLimits::UNLIMITED,
                )
                .map_err(|e| invalid(format!("batch {} does not replay: {e}", batch.version)))?;
        }
        if !export.history.is_empty() && replayed != current {
            return Err(invalid(
                "its history does not replay to its entries (edited by hand?)".into(),
            ));
        }
        let base = if export.history.is_empty() {
            export.version
        } else {
            export.base
        };
        let mut batch = Batch::new();
        let at_ms = export.history.last().map_or(record.created_ms, |b| b.at_ms);
        if let Some(entries) = base_snapshot {
            let snapshot = log::Snapshot {
                version: base,
                at_ms: 0,
                base,
                entries,
            };
            batch.put(
                Table::ContextSnapshots,
                log::key(&record.id, base),
                codec::encode(&snapshot),
            );
        }
        for logged in &export.history {
            batch.put(
                Table::ContextLog,
                log::key(&record.id, logged.version),
                codec::encode(logged),
            );
        }
        let latest = log::Snapshot {
            version: export.version,
            at_ms,
            base,
            entries: current.entries().cloned().collect(),
        };
        batch.put(
            Table::ContextSnapshots,
            log::key(&record.id, export.version),
            codec::encode(&latest),
        );
        let entry = self
            .sessions
            .create(&*self.shared.store, record, batch)
            .await?;
        Ok((*entry.record()).clone())
    }

    /// Applies half of `changes` in the session's memory and crashes its actor (tests).
    #[cfg(feature = "test-util")]
    pub(crate) async fn crash_mid_update(&self, entry: &Arc<SessionEntry>, changes: Arc<[Change]>) {
        if let Some(actor) = entry.slot.actor() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = actor.cast(ContextMsg::Request(lazy::Request::new(
                Op::CrashMidUpdate(changes),
                tx,
            )));
            let _ = rx.await;
        }
    }

    /// Runs `op` in `entry`'s context actor, starting or waiting for the actor as needed,
    /// and re-sending the request if the actor died before answering.
    async fn request(&self, entry: &Arc<SessionEntry>, op: Op) -> Result<Reply, ContextError> {
        let lazy = Lazy {
            slot: &entry.slot,
            partitions: &self.shared.family.partitions,
            key: entry.id.as_str(),
            spec: || self.child_spec(entry),
        };
        lazy.request(op, ContextMsg::Request, |rx, _| rx, |_| {})
            .await
            .map_err(|err| match err {
                RequestError::Unavailable(reason) => ContextError::Unavailable {
                    session: entry.id.to_string(),
                    reason: format!("its context: {reason}"),
                },
                // A deleted session, or a future kind of failure: it is not there to answer.
                _ => ContextError::UnknownSession {
                    id: entry.id.to_string(),
                },
            })
    }

    fn child_spec(&self, entry: &Arc<SessionEntry>) -> ChildSpec {
        let entry = Arc::clone(entry);
        let shared = Arc::clone(&self.shared);
        durable::child_spec(Arc::from(entry.id.as_str()), move || ContextActor {
            entry: Arc::clone(&entry),
            shared: Arc::clone(&shared),
        })
    }

    /// Number of context actors running now.
    pub(crate) fn active(&self) -> usize {
        self.sessions
            .entries()
            .iter()
            .filter(|e| e.slot.actor().is_some())
            .count()
    }
}

fn failed(entry: &SessionEntry, reply: Reply) -> ContextError {
    match reply {
        Reply::Failed(err) => err,
        other => ContextError::Unavailable {
            session: entry.id.to_string(),
            reason: format!("unexpected answer from the context: {other:?}"),
        },
    }
}

impl Owner for ContextHub {
    type Behaviour = ContextActor;

    fn family(&self) -> &Family {
        &self.shared.family
    }

    fn each_slot(&self, visit: &mut SlotVisitor<'_, ContextMsg>) {
        for entry in self.sessions.entries() {
            visit(&entry.slot);
        }
    }
}
