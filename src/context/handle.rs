//! The Rust API: [`Sessions`] to manage sessions, [`Context`] to read and change one.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::ContextError;
use super::export::SessionExport;
use super::hub::ContextHub;
use super::log::{History, HistoryQuery};
use super::model::{Applied, Change, Entry, Strategy};
use super::query::{ContextView, Select};
use super::session::{SessionEntry, SessionId, SessionRecord, SessionSpec};
use crate::agents::{Agent, AgentId};

/// The sessions of a runtime. Cheap to clone. Get it from
/// [`Runtime::sessions`](crate::Runtime::sessions).
#[derive(Clone)]
pub struct Sessions {
    hub: Arc<ContextHub>,
}

/// A session's record with its current size.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct SessionInfo {
    /// The record.
    pub record: SessionRecord,
    /// The session version: how many batches were applied.
    pub version: u64,
    /// The oldest version history can be read at.
    pub oldest_version: u64,
    /// Number of entries.
    pub entries: usize,
    /// Bytes of JSON held in entry values.
    pub bytes: usize,
}

impl Sessions {
    pub(crate) fn new(hub: Arc<ContextHub>) -> Self {
        Self { hub }
    }

    /// Creates a session.
    ///
    /// # Errors
    /// [`ContextError::InvalidSessionId`], [`ContextError::SessionExists`],
    /// [`ContextError::UnknownAuthor`] for an unregistered creator, or a store failure.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the session created.
    pub async fn create(&self, spec: SessionSpec) -> Result<SessionRecord, ContextError> {
        self.hub.create(spec).await
    }

    /// Every session, oldest first.
    pub fn list(&self) -> Vec<Arc<SessionRecord>> {
        self.hub.sessions.list()
    }

    /// A session's record and size.
    ///
    /// # Errors
    /// [`ContextError::UnknownSession`], or its context failing to load.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn get(&self, id: &str) -> Result<SessionInfo, ContextError> {
        let entry = self.hub.session(id).await?;
        let stat = self.hub.stat(&entry).await?;
        Ok(SessionInfo {
            record: (*entry.record()).clone(),
            version: stat.version,
            oldest_version: stat.base,
            entries: stat.entries,
            bytes: stat.bytes,
        })
    }

    /// Closes a session: it can still be read and exported, no longer changed.
    ///
    /// # Errors
    /// [`ContextError::UnknownSession`] or a store failure.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the session closed.
    pub async fn close(&self, id: &str) -> Result<SessionRecord, ContextError> {
        Ok((*self.hub.close(id).await?).clone())
    }

    /// Deletes a session and everything stored for it.
    ///
    /// # Errors
    /// [`ContextError::UnknownSession`] or a store failure (the session then stays).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the session deleted.
    pub async fn delete(&self, id: &str) -> Result<(), ContextError> {
        self.hub.delete(id).await
    }

    /// The context of an existing session, changed anonymously.
    ///
    /// # Errors
    /// [`ContextError::UnknownSession`].
    pub fn context(&self, id: &str) -> Result<Context, ContextError> {
        let entry = self.hub.sessions.require(id)?;
        Ok(Context::new(Arc::clone(&self.hub), entry, None))
    }

    /// The context of session `id` (created if missing), changed as `author` when given.
    ///
    /// # Errors
    /// [`ContextError::InvalidSessionId`], [`ContextError::UnknownAuthor`], or a store
    /// failure creating it.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the session created.
    pub async fn open(&self, id: &str, author: Option<&str>) -> Result<Context, ContextError> {
        let author = author.map(|a| self.hub.author(a)).transpose()?;
        let entry = self.hub.open_session(id, author.as_ref()).await?;
        Ok(Context::new(Arc::clone(&self.hub), entry, author))
    }

    /// The context of session `id` (created if missing), changed as `agent`.
    ///
    /// # Errors
    /// [`ContextError::InvalidSessionId`], or a store failure creating it.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the session created.
    pub async fn open_as(&self, id: &str, agent: &Agent) -> Result<Context, ContextError> {
        let entry = self.hub.open_session(id, Some(agent.id())).await?;
        Ok(Context::new(
            Arc::clone(&self.hub),
            entry,
            Some(agent.id().clone()),
        ))
    }

    /// Exports a session to a serialisable form; with `history`, every batch still kept.
    ///
    /// # Errors
    /// [`ContextError::UnknownSession`], or a store failure.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn export(&self, id: &str, history: bool) -> Result<SessionExport, ContextError> {
        let entry = self.hub.session(id).await?;
        self.hub.export(&entry, history).await
    }

    /// Creates a session from an export, under `id` if given (else the exported id). An
    /// export with history must replay to its entries.
    ///
    /// # Errors
    /// [`ContextError::InvalidExport`] naming what is wrong, [`ContextError::SessionExists`],
    /// [`ContextError::TooLarge`], or a store failure. Nothing is stored on error.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the session imported.
    pub async fn import(
        &self,
        export: SessionExport,
        id: Option<&str>,
    ) -> Result<SessionRecord, ContextError> {
        self.hub.import(export, id).await
    }

    /// Number of context actors running now.
    pub fn active(&self) -> usize {
        self.hub.active()
    }
}

/// One session's context, as seen by one author (or anonymously). Cheap to clone.
#[derive(Clone)]
pub struct Context {
    hub: Arc<ContextHub>,
    entry: Arc<SessionEntry>,
    author: Option<AgentId>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("session", &self.entry.id)
            .field("author", &self.author)
            .finish()
    }
}

impl Context {
    pub(crate) fn new(
        hub: Arc<ContextHub>,
        entry: Arc<SessionEntry>,
        author: Option<AgentId>,
    ) -> Self {
        Self { hub, entry, author }
    }

    /// The session's id.
    pub fn session(&self) -> &SessionId {
        &self.entry.id
    }

    /// Who changes are recorded as made by.
    pub fn author(&self) -> Option<&AgentId> {
        self.author.as_ref()
    }

    /// Applies `changes` as one batch, atomically. Returns once it is committed.
    ///
    /// # Errors
    /// [`ContextError::Conflict`] (naming the key and versions), [`ContextError::WrongType`],
    /// [`ContextError::InvalidKey`], [`ContextError::TooLarge`], [`ContextError::Empty`],
    /// [`ContextError::SessionClosed`], or a store failure. Nothing of a refused batch is
    /// applied.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the batch: it may still be applied.
    pub async fn update(&self, changes: Vec<Change>) -> Result<Applied, ContextError> {
        self.hub
            .update(&self.entry, Arc::from(changes), self.author.clone())
            .await
    }

    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    ///
    /// # Cancel safety
    /// As [`update`](Self::update): dropping the future does not withdraw the change.
    pub async fn replace(&self, key: &str, value: Value) -> Result<Applied, ContextError> {
        self.update(vec![Change::new(key, Strategy::Replace, value)])
            .await
    }

    /// Merges `patch` into `key` (RFC 7396).
    ///
    /// # Errors
    /// As [`update`](Self::update).
    ///
    /// # Cancel safety
    /// As [`update`](Self::update): dropping the future does not withdraw the change.
    pub async fn merge(&self, key: &str, patch: Value) -> Result<Applied, ContextError> {
        self.update(vec![Change::new(key, Strategy::Merge, patch)])
            .await
    }

    /// Appends `items` to `key` (text to text, items to an array).
    ///
    /// # Errors
    /// As [`update`](Self::update).
    ///
    /// # Cancel safety
    /// As [`update`](Self::update): dropping the future does not withdraw the change.
    pub async fn append(&self, key: &str, items: Value) -> Result<Applied, ContextError> {
        self.update(vec![Change::new(key, Strategy::Append, items)])
            .await
    }

    /// The entry at `key`.
    ///
    /// # Errors
    /// [`ContextError::Unavailable`] or a store failure loading the session.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn get(&self, key: &str) -> Result<Option<Entry>, ContextError> {
        let view = self.read(Select::Keys(vec![key.to_owned()]), 1).await?;
        Ok(view.entries.into_iter().next())
    }

    /// Reads `select`, at most `limit` entries.
    ///
    /// # Errors
    /// [`ContextError::Unavailable`] or a store failure loading the session.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn read(&self, select: Select, limit: usize) -> Result<ContextView, ContextError> {
        self.hub.read(&self.entry, select, limit).await
    }

    /// Reads `select` as the session was at `version`.
    ///
    /// # Errors
    /// [`ContextError::HistoryPruned`], [`ContextError::FutureVersion`], or a store failure.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn read_as_of(
        &self,
        version: u64,
        select: Select,
        limit: usize,
    ) -> Result<ContextView, ContextError> {
        self.hub
            .read_as_of(&self.entry, version, select, limit)
            .await
    }

    /// Part of the session's history.
    ///
    /// # Errors
    /// A store failure.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn history(&self, query: &HistoryQuery) -> Result<History, ContextError> {
        self.hub.history(&self.entry, query).await
    }

    /// The session's version.
    ///
    /// # Errors
    /// [`ContextError::Unavailable`] or a store failure loading the session.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn version(&self) -> Result<u64, ContextError> {
        Ok(self.hub.stat(&self.entry).await?.version)
    }

    /// Applies the first half of `changes` in the actor's memory, then crashes it: the
    /// restarted actor must hold none of them. Fault injection for tests.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the actor crashed or not; either way nothing of the batch
    /// is kept.
    #[cfg(feature = "test-util")]
    pub async fn crash_mid_update(&self, changes: Vec<Change>) {
        self.hub
            .crash_mid_update(&self.entry, Arc::from(changes))
            .await;
    }
}
