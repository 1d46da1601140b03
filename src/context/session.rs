//! Sessions: their ids and records, and the directory that holds them all in memory.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use dashmap::DashMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ContextError;
use super::protocol::ContextMsg;
use crate::agents::AgentId;
use crate::store::{self, Batch, Notice, Store, Table, codec};
use guildhall_supervision::lazy::Slot;

/// A session's id: 1 to 64 characters from `A-Z a-z 0-9 _ - . @`. Cheap to clone.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// Checks and wraps an id.
    ///
    /// # Errors
    /// [`ContextError::InvalidSessionId`] naming what is wrong with it.
    pub fn parse(id: &str) -> Result<Self, ContextError> {
        crate::agents::check_name(id).map_err(|reason| ContextError::InvalidSessionId {
            id: id.to_owned(),
            reason,
        })?;
        Ok(Self(Arc::from(id)))
    }

    /// A new unique id (a UUID v7, so ids sort by creation).
    pub fn generate() -> Self {
        Self(Arc::from(uuid::Uuid::now_v7().to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl std::borrow::Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A session as the directory records it. Stored, so its fields are positional: new ones go
/// last (see [`codec`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionRecord {
    /// Its id.
    pub id: SessionId,
    /// A title for people.
    pub title: String,
    /// The agent that created it.
    pub created_by: Option<AgentId>,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When it was closed; a closed session can be read, not changed.
    pub closed_ms: Option<u64>,
    /// Anything else worth knowing about it.
    pub metadata: Value,
}

/// What to create: everything is optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionSpec {
    /// The id; a new UUID v7 when absent.
    pub id: Option<String>,
    /// A title.
    pub title: String,
    /// The agent creating it (must be registered).
    pub created_by: Option<String>,
    /// Free-form metadata.
    pub metadata: Value,
}

impl SessionSpec {
    /// A session with id `id`.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: Some(id.into()),
            ..Self::default()
        }
    }

    /// Sets the title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// Sets the creating agent.
    pub fn created_by(mut self, agent: impl Into<String>) -> Self {
        self.created_by = Some(agent.into());
        self
    }

    /// Sets the metadata.
    pub fn metadata(mut self, metadata: Value) -> Self {
        self.metadata = metadata;
        self
    }
}

/// One session as the runtime holds it: its record and where its context actor runs.
pub(crate) struct SessionEntry {
    pub(crate) id: SessionId,
    record: RwLock<Arc<SessionRecord>>,
    pub(crate) slot: Slot<ContextMsg>,
}

impl SessionEntry {
    fn new(record: SessionRecord) -> Self {
        Self {
            id: record.id.clone(),
            record: RwLock::new(Arc::new(record)),
            slot: Slot::default(),
        }
    }

    pub(crate) fn record(&self) -> Arc<SessionRecord> {
        Arc::clone(&self.record.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.record().closed_ms.is_some()
    }
}

/// Every session, in memory and written through to the store.
pub(crate) struct SessionDirectory {
    sessions: DashMap<SessionId, Arc<SessionEntry>>,
    /// Serialises changes, so the store and the map agree on the last one.
    changes: tokio::sync::Mutex<()>,
}

/// What a [`Notice::Changed`] of the sessions names.
pub(crate) const SESSIONS: &str = "sessions";

fn record_key(id: &SessionId) -> Vec<u8> {
    id.as_str().as_bytes().to_vec()
}

impl SessionDirectory {
    pub(crate) fn load(store: &dyn Store) -> Result<Self, ContextError> {
        let sessions = DashMap::new();
        store::scan_values(store, Table::Sessions, b"", |_, r: SessionRecord| {
            sessions.insert(r.id.clone(), Arc::new(SessionEntry::new(r)));
        })?;
        Ok(Self {
            sessions,
            changes: tokio::sync::Mutex::new(()),
        })
    }

    /// The session `id`, read from the store when this directory does not know it
    /// (another server sharing the store created it, and its notice has not come yet).
    ///
    /// # Errors
    /// [`ContextError::Store`] when the store cannot be read.
    pub(crate) async fn get_or_load(
        &self,
        store: &dyn Store,
        id: &str,
    ) -> Result<Option<Arc<SessionEntry>>, ContextError> {
        if let Some(entry) = self.get(id) {
            return Ok(Some(entry));
        }
        let _serial = self.changes.lock().await;
        if let Some(entry) = self.get(id) {
            return Ok(Some(entry));
        }
        let Some(bytes) = store.get(Table::Sessions, id.as_bytes())? else {
            return Ok(None);
        };
        let record: SessionRecord = codec::decode(Table::Sessions, &bytes)?;
        let entry = Arc::new(SessionEntry::new(record));
        self.sessions.insert(entry.id.clone(), Arc::clone(&entry));
        Ok(Some(entry))
    }

    /// Reads the sessions from the store again (another server sharing it created, changed
    /// or deleted some). Returns the entries removed, so their actors can be stopped.
    ///
    /// # Errors
    /// [`ContextError::Store`] when the store cannot be read.
    pub(crate) async fn refresh(
        &self,
        store: &dyn Store,
    ) -> Result<Vec<Arc<SessionEntry>>, ContextError> {
        let _serial = self.changes.lock().await;
        let mut stored = std::collections::HashMap::new();
        store::scan_values(store, Table::Sessions, b"", |_, r: SessionRecord| {
            stored.insert(r.id.clone(), r);
        })?;
        let mut removed = Vec::new();
        for entry in self.entries() {
            if !stored.contains_key(&entry.id) {
                entry.slot.retire();
                self.sessions.remove(entry.id.as_str());
                removed.push(entry);
            }
        }
        for (id, record) in stored {
            match self.get(id.as_str()) {
                Some(entry) => {
                    if *entry.record() != record {
                        *entry.record.write().unwrap_or_else(PoisonError::into_inner) =
                            Arc::new(record);
                    }
                }
                None => {
                    self.sessions
                        .insert(id, Arc::new(SessionEntry::new(record)));
                }
            }
        }
        Ok(removed)
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<SessionEntry>> {
        self.sessions.get(id).map(|e| Arc::clone(e.value()))
    }

    pub(crate) fn require(&self, id: &str) -> Result<Arc<SessionEntry>, ContextError> {
        self.get(id)
            .ok_or_else(|| ContextError::UnknownSession { id: id.to_owned() })
    }

    pub(crate) fn entries(&self) -> Vec<Arc<SessionEntry>> {
        self.sessions
            .iter()
            .map(|e| Arc::clone(e.value()))
            .collect()
    }

    /// Every session, oldest first (then by id).
    pub(crate) fn list(&self) -> Vec<Arc<SessionRecord>> {
        let mut all: Vec<_> = self.sessions.iter().map(|e| e.value().record()).collect();
        all.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        all
    }

    /// Adds `record`, committing `extra` (an import's state) with it.
    pub(crate) async fn create(
        &self,
        store: &dyn Store,
        record: SessionRecord,
        mut extra: Batch,
    ) -> Result<Arc<SessionEntry>, ContextError> {
        let _serial = self.changes.lock().await;
        if self.sessions.contains_key(record.id.as_str()) {
            return Err(ContextError::SessionExists {
                id: record.id.to_string(),
            });
        }
        extra.put(
            Table::Sessions,
            record_key(&record.id),
            codec::encode(&record),
        );
        extra.notify(None, Notice::Changed(SESSIONS.into()));
        store::commit(store, extra).await?;
        let entry = Arc::new(SessionEntry::new(record));
        self.sessions.insert(entry.id.clone(), Arc::clone(&entry));
        Ok(entry)
    }

    /// Changes a session's record with `change`, persisting it first.
    pub(crate) async fn update(
        &self,
        store: &dyn Store,
        id: &str,
        change: impl FnOnce(&mut SessionRecord),
    ) -> Result<Arc<SessionRecord>, ContextError> {
        let _serial = self.changes.lock().await;
        let entry = self.require(id)?;
        let mut record = (*entry.record()).clone();
        change(&mut record);
        let mut batch = Batch::new();
        batch.put(
            Table::Sessions,
            record_key(&record.id),
            codec::encode(&record),
        );
        batch.notify(None, Notice::Changed(SESSIONS.into()));
        store::commit(store, batch).await?;
        let record = Arc::new(record);
        *entry.record.write().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&record);
        Ok(record)
    }

    /// Removes a retired session, committing `batch` (the deletion of its state) with it. On
    /// failure the session stays and is no longer retired.
    pub(crate) async fn remove(
        &self,
        store: &dyn Store,
        entry: &SessionEntry,
        mut batch: Batch,
    ) -> Result<(), ContextError> {
        let _serial = self.changes.lock().await;
        batch.delete(Table::Sessions, record_key(&entry.id));
        batch.notify(None, Notice::Changed(SESSIONS.into()));
        if let Err(err) = store::commit(store, batch).await {
            entry.slot.unretire();
            return Err(err.into());
        }
        self.sessions.remove(entry.id.as_str());
        Ok(())
    }
}
