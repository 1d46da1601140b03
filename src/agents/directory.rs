//! The agent directory: who is registered, in which role, under which parent.
//!
//! Kept whole in memory (a few hundred bytes an agent) and written through to the store, so
//! lookups and fan-outs never touch the disk. Registration is rare and serialised; lookups
//! are lock-free reads of concurrent maps.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use dashmap::DashMap;
use ractor::ActorRef;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::MailError;
use super::ids::{AgentId, check_name, now_ms};
use super::protocol::{Arrivals, MailboxMsg, MailboxOwn};
use crate::durable::Msg;
use crate::store::{self, Batch, Notice, Store, Table, codec};

/// What a [`Notice::Changed`] of the directory names.
pub(crate) const AGENTS: &str = "agents";
use guildhall_supervision::lazy::Slot;

/// A registered agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentRecord {
    /// Its id.
    pub id: AgentId,
    /// Its role (`tl`, `pm`, `dev`, ...).
    pub role: String,
    /// The agent it reports to.
    #[serde(default)]
    pub parent: Option<AgentId>,
    /// Anything else worth knowing about it.
    #[serde(default)]
    pub metadata: Value,
    /// When it was first registered, in milliseconds since the Unix epoch.
    pub registered_ms: u64,
}

/// What to register: an id, a role, and optionally a parent and metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    /// The agent's id.
    pub id: String,
    /// Its role.
    pub role: String,
    /// The agent it reports to. It need not be registered yet: agents start in any order,
    /// and the child is linked to it by id when it registers.
    pub parent: Option<String>,
    /// Free-form metadata (a JSON object, or null).
    pub metadata: Value,
}

impl AgentSpec {
    /// An agent `id` in `role`, with no parent and no metadata.
    pub fn new(id: impl Into<String>, role: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            role: role.into(),
            parent: None,
            metadata: Value::Null,
        }
    }

    /// Sets the parent.
    pub fn parent(mut self, parent: impl Into<String>) -> Self {
        self.parent = Some(parent.into());
        self
    }

    /// Sets the metadata.
    pub fn metadata(mut self, metadata: Value) -> Self {
        self.metadata = metadata;
        self
    }
}

/// One agent as the runtime holds it: its record and where its mailbox actor is, if active.
pub(crate) struct AgentEntry {
    pub(crate) id: AgentId,
    record: RwLock<Arc<AgentRecord>>,
    /// The mailbox actor; retired when the agent is deregistered.
    pub(crate) slot: Slot<MailboxMsg>,
    /// When it last made a call through a protocol front end, in milliseconds since the
    /// Unix epoch; 0 when it has not since this server started.
    last_seen_ms: AtomicU64,
    /// How many live connections act as it.
    connections: AtomicU32,
    /// Its process, when a layer above runs one for it (a launched agent).
    process: RwLock<Option<Arc<dyn ProcessReport>>>,
    /// While its mailbox loads or runs here, with servers sharing the store: what other
    /// servers stored into its inbox meanwhile (`None` otherwise: nothing to keep).
    pub(crate) arrivals: std::sync::Mutex<Option<Arrivals>>,
    /// Held by a `check_inbox {"since": "last"}` listing, so two of the agent's connections
    /// never list what came after the same cursor. The agent's own: its waits hold up no one
    /// else's listing, and it goes with the agent.
    pub(crate) reading: tokio::sync::Mutex<()>,
}

/// A process run for an agent, as listings show it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProcessView {
    /// The launch profile it runs.
    pub profile: String,
    /// `running`, `restarting`, `idle` (waits for mail to wake it), `ended` or `gave_up`.
    pub state: String,
    /// Its process, while one runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Seconds its current process has run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uptime_secs: Option<u64>,
    /// Times it was started again.
    pub restarts: u64,
    /// How its last process ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
}

/// Tells how an agent's process is doing, now: implemented by the layer that runs it, so
/// the directory shows it without knowing that layer.
pub trait ProcessReport: Send + Sync + 'static {
    /// The process as it is now.
    fn report(&self) -> ProcessView;
}

impl AgentEntry {
    fn new(record: AgentRecord) -> Self {
        Self {
            id: record.id.clone(),
            record: RwLock::new(Arc::new(record)),
            slot: Slot::default(),
            last_seen_ms: AtomicU64::new(0),
            connections: AtomicU32::new(0),
            process: RwLock::new(None),
            arrivals: std::sync::Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    /// Keeps what `change` says arrived for the mailbox, if it loads or runs here, and
    /// tells it.
    pub(crate) fn arrived(&self, change: impl FnOnce(&mut Arrivals)) {
        let mut arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(arrivals) = arrivals.as_mut() {
            change(arrivals);
            // Told under the lock: a mailbox that publishes itself after this looks at the
            // arrivals itself once it has.
            self.slot
                .with_actor(|a| a.cast(Msg::Own(MailboxOwn::Arrived)));
        }
    }

    /// Shows `process` as this agent's process from now on.
    pub(crate) fn set_process(&self, process: Arc<dyn ProcessReport>) {
        *self.process.write().unwrap_or_else(PoisonError::into_inner) = Some(process);
    }

    /// Its process as it is now, if one is run for it.
    pub(crate) fn process(&self) -> Option<ProcessView> {
        let process = self
            .process
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        process.map(|p| p.report())
    }

    /// Notes that the agent made a call now.
    pub(crate) fn seen(&self) {
        self.last_seen_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// When the agent last made a call, if it has since this server started.
    pub(crate) fn last_seen_ms(&self) -> Option<u64> {
        Some(self.last_seen_ms.load(Ordering::Relaxed)).filter(|&ms| ms > 0)
    }

    /// How many live connections act as this agent.
    pub(crate) fn connections(&self) -> u32 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Counts one more live connection acting as this agent until the guard is dropped;
    /// also returns how many there are now.
    pub(crate) fn connect(self: &Arc<Self>) -> (Connection, u32) {
        let now = self.connections.fetch_add(1, Ordering::Relaxed) + 1;
        self.seen();
        (Connection(Some(Arc::clone(self))), now)
    }

    pub(crate) fn record(&self) -> Arc<AgentRecord> {
        Arc::clone(&self.record.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn mailbox(&self) -> Option<ActorRef<MailboxMsg>> {
        self.slot.actor()
    }
}

/// A live connection acting as an agent; counted while held.
pub(crate) struct Connection(Option<Arc<AgentEntry>>);

impl Connection {
    /// Stops counting this connection; returns how many are left.
    pub(crate) fn release(mut self) -> u32 {
        self.0.take().map_or(0, |entry| {
            entry.connections.fetch_sub(1, Ordering::AcqRel) - 1
        })
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(entry) = self.0.take() {
            entry.connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Shards of the agent map (a power of two).
const AGENT_SHARDS: usize = 64;

/// Every registered agent, with indexes by role and by parent.
pub(crate) struct Directory {
    /// Read on every send: a fast seeded hash, and enough shards that the cores rarely share
    /// a shard's lock.
    agents: DashMap<AgentId, Arc<AgentEntry>, foldhash::fast::RandomState>,
    roles: DashMap<Arc<str>, BTreeSet<AgentId>>,
    children: DashMap<AgentId, BTreeSet<AgentId>>,
    /// Serialises changes, so the store and the maps agree on the last one.
    changes: tokio::sync::Mutex<()>,
    /// Bumped by every registration and removal, so what is derived from roles (the
    /// permission rules that apply to an agent) knows to look again.
    generation: AtomicU64,
}

impl Directory {
    /// Loads every agent from the store.
    pub(crate) fn load(store: &dyn Store) -> Result<Self, MailError> {
        let directory = Self {
            agents: DashMap::with_hasher_and_shard_amount(
                foldhash::fast::RandomState::default(),
                AGENT_SHARDS,
            ),
            roles: DashMap::new(),
            children: DashMap::new(),
            changes: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        };
        let mut records = Vec::new();
        store::scan_values(store, Table::Agents, b"", |_, r: AgentRecord| {
            records.push(r)
        })?;
        for record in records {
            directory.index(&record);
            directory
                .agents
                .insert(record.id.clone(), Arc::new(AgentEntry::new(record)));
        }
        Ok(directory)
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<AgentEntry>> {
        self.agents.get(id).map(|e| Arc::clone(e.value()))
    }

    pub(crate) fn require(&self, id: &str) -> Result<Arc<AgentEntry>, MailError> {
        self.get(id).ok_or_else(|| MailError::UnknownAgent {
            id: id.to_owned(),
            near: String::new(),
        })
    }

    /// Every agent, sorted by id.
    pub(crate) fn list(&self) -> Vec<Arc<AgentRecord>> {
        let mut all: Vec<_> = self.agents.iter().map(|e| e.value().record()).collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    pub(crate) fn entries(&self) -> Vec<Arc<AgentEntry>> {
        self.agents.iter().map(|e| Arc::clone(e.value())).collect()
    }

    /// The agents in `role`, sorted by id.
    pub(crate) fn in_role(&self, role: &str) -> Vec<AgentId> {
        self.roles
            .get(role)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The agents whose parent is `id`, sorted by id.
    pub(crate) fn children_of(&self, id: &str) -> Vec<AgentId> {
        self.children
            .get(id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// At most `limit` agent ids, in no order (no sort of every id for a hint).
    pub(crate) fn some_ids(&self, limit: usize) -> Vec<AgentId> {
        self.agents
            .iter()
            .take(limit)
            .map(|e| e.key().clone())
            .collect()
    }

    /// Every agent id, sorted.
    pub(crate) fn ids(&self) -> Vec<AgentId> {
        let mut ids: Vec<AgentId> = self.agents.iter().map(|e| e.key().clone()).collect();
        ids.sort();
        ids
    }

    /// Registers an agent, or updates the role, parent and metadata of a registered one, and
    /// persists it before returning.
    pub(crate) async fn register(
        &self,
        store: &dyn Store,
        spec: AgentSpec,
    ) -> Result<Arc<AgentEntry>, MailError> {
        let id = AgentId::parse(&spec.id)?;
        check_name(&spec.role).map_err(|reason| MailError::InvalidRole {
            role: spec.role.clone(),
            reason,
        })?;
        let _serial = self.changes.lock().await;
        let parent = match spec.parent.as_deref() {
            None => None,
            Some(p) => {
                // The parent need not be registered yet: agents start in any order, and a
                // child is linked to its parent by id the moment the parent registers.
                let parent = AgentId::parse(p)?;
                self.check_no_cycle(&id, &parent)?;
                Some(parent)
            }
        };
        let existing = self.get(&spec.id);
        let record = AgentRecord {
            id: id.clone(),
            role: spec.role,
            parent,
            metadata: spec.metadata,
            registered_ms: existing
                .as_ref()
                .map_or_else(now_ms, |e| e.record().registered_ms),
        };
        let mut batch = Batch::new();
        batch.put(
            Table::Agents,
            id.as_str().as_bytes().to_vec(),
            codec::encode(&record),
        );
        batch.notify(None, Notice::Changed(AGENTS.into()));
        store::commit(store, batch).await?;
        let entry = match existing {
            Some(entry) => {
                self.unindex(&entry.record());
                *entry.record.write().unwrap_or_else(PoisonError::into_inner) =
                    Arc::new(record.clone());
                entry
            }
            None => {
                let entry = Arc::new(AgentEntry::new(record.clone()));
                self.agents.insert(id, Arc::clone(&entry));
                entry
            }
        };
        self.index(&record);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(entry)
    }

    /// The agent `id`, read from the store when this directory does not know it (another
    /// server sharing the store registered it, and its notice has not come yet).
    ///
    /// # Errors
    /// [`MailError::Store`] when the store cannot be read.
    pub(crate) async fn get_or_load(
        &self,
        store: &dyn Store,
        id: &str,
    ) -> Result<Option<Arc<AgentEntry>>, MailError> {
        if let Some(entry) = self.get(id) {
            return Ok(Some(entry));
        }
        let _serial = self.changes.lock().await;
        if let Some(entry) = self.get(id) {
            return Ok(Some(entry));
        }
        let Some(bytes) = store.get(Table::Agents, id.as_bytes())? else {
            return Ok(None);
        };
        let record: AgentRecord = codec::decode(Table::Agents, &bytes)?;
        self.index(&record);
        let entry = Arc::new(AgentEntry::new(record));
        self.agents.insert(entry.id.clone(), Arc::clone(&entry));
        self.generation.fetch_add(1, Ordering::Release);
        Ok(Some(entry))
    }

    /// Reads the directory from the store again (another server sharing it registered or
    /// removed agents): adds, updates and removes entries to match. Returns whether
    /// anything changed, and the entries removed, so their mailboxes can be stopped.
    ///
    /// # Errors
    /// [`MailError::Store`] when the store cannot be read.
    pub(crate) async fn refresh(
        &self,
        store: &dyn Store,
    ) -> Result<(bool, Vec<Arc<AgentEntry>>), MailError> {
        let _serial = self.changes.lock().await;
        let mut stored = std::collections::HashMap::new();
        store::scan_values(store, Table::Agents, b"", |_, r: AgentRecord| {
            stored.insert(r.id.clone(), r);
        })?;
        let mut changed = false;
        let mut removed = Vec::new();
        for entry in self.entries() {
            if !stored.contains_key(&entry.id) {
                entry.slot.retire();
                self.unindex(&entry.record());
                self.agents.remove(entry.id.as_str());
                removed.push(entry);
                changed = true;
            }
        }
        for (id, record) in stored {
            match self.get(id.as_str()) {
                Some(entry) if *entry.record() == record => {}
                Some(entry) => {
                    self.unindex(&entry.record());
                    *entry.record.write().unwrap_or_else(PoisonError::into_inner) =
                        Arc::new(record.clone());
                    self.index(&record);
                    changed = true;
                }
                None => {
                    self.index(&record);
                    self.agents.insert(id, Arc::new(AgentEntry::new(record)));
                    changed = true;
                }
            }
        }
        if changed {
            self.generation.fetch_add(1, Ordering::Release);
        }
        Ok((changed, removed))
    }

    /// Grows with every registration and removal.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Removes a retired agent, committing `batch` (the deletion of its messages) with it. On
    /// failure the agent stays registered and is no longer retired.
    pub(crate) async fn deregister(
        &self,
        store: &dyn Store,
        id: &str,
        mut batch: Batch,
    ) -> Result<Arc<AgentEntry>, MailError> {
        let _serial = self.changes.lock().await;
        let entry = self.require(id)?;
        batch.delete(Table::Agents, id.as_bytes().to_vec());
        batch.notify(None, Notice::Changed(AGENTS.into()));
        if let Err(err) = store::commit(store, batch).await {
            entry.slot.unretire();
            return Err(err.into());
        }
        self.unindex(&entry.record());
        self.agents.remove(id);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(entry)
    }

    fn check_no_cycle(&self, id: &AgentId, parent: &AgentId) -> Result<(), MailError> {
        let mut at = Some(parent.clone());
        // The hierarchy is acyclic, so this walk ends; the bound guards against a bad store.
        for _ in 0..=self.agents.len() {
            let Some(current) = at else { return Ok(()) };
            if &current == id {
                return Err(MailError::ParentCycle {
                    agent: id.to_string(),
                    parent: parent.to_string(),
                });
            }
            at = self
                .get(current.as_str())
                .and_then(|e| e.record().parent.clone());
        }
        Ok(())
    }

    fn index(&self, record: &AgentRecord) {
        self.roles
            .entry(Arc::from(record.role.as_str()))
            .or_default()
            .insert(record.id.clone());
        if let Some(parent) = &record.parent {
            self.children
                .entry(parent.clone())
                .or_default()
                .insert(record.id.clone());
        }
    }

    fn unindex(&self, record: &AgentRecord) {
        self.roles.remove_if_mut(record.role.as_str(), |_, set| {
            set.remove(&record.id);
            set.is_empty()
        });
        if let Some(parent) = &record.parent {
            self.children.remove_if_mut(parent, |_, set| {
                set.remove(&record.id);
                set.is_empty()
            });
        }
    }
}
