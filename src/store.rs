//! Storage: what the runtime persists, behind one small trait.
//!
//! A [`Store`] holds byte keys and values in a fixed set of [`Table`]s. Writes arrive as
//! [`Batch`]es that apply atomically; a batch's completion is reported once it is as durable
//! as the store promises. Reads see the last completed batches.
//!
//! - [`RedbStore`]: the default, an embedded redb file in the data directory. One writer
//!   thread gathers every batch waiting at the moment it starts a transaction into that one
//!   transaction: one fsync acknowledges them all (group commit).
//! - [`PostgresStore`] (feature `postgres`): a PostgreSQL database, which several servers
//!   can share; one writer connection commits with the same group commit.
//! - [`MemoryStore`]: nothing on disk, for tests and benchmarks; commits complete at once.
//!
//! Values are encoded by [`codec`]: rmp-serde, prefixed with a format version.

pub mod cluster;
pub mod codec;
pub mod doctor;
mod error;
mod memory;
mod notice;
#[cfg(feature = "postgres")]
mod postgres;
mod redb_store;
mod table;

use std::path::Path;
use std::sync::Arc;

use smallvec::SmallVec;

pub use cluster::{Cluster, Notice};
pub use error::StoreError;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{DEFAULT_LEASE, MIGRATIONS, PostgresStore, table_code};
pub use redb_store::{DEFAULT_CACHE_BYTES, FILE_NAME, RedbStore, STORE_FORMAT};
pub use table::Table;

/// One write in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Sets `key` to `value`.
    Put {
        /// The table.
        table: Table,
        /// The key.
        key: Vec<u8>,
        /// The encoded value.
        value: Vec<u8>,
    },
    /// Sets `key`, which the writer made new (from a fresh id, as a message's): a store
    /// may add it without looking for an old value first. A key that existed after all is
    /// set as by [`Write::Put`], only slower.
    Insert {
        /// The table.
        table: Table,
        /// The key.
        key: Vec<u8>,
        /// The encoded value.
        value: Vec<u8>,
    },
    /// Sets `key` to a value shared with other writes (one encoding of a message fanned
    /// out to many mailboxes, held once in memory).
    PutShared {
        /// The table.
        table: Table,
        /// The key.
        key: Vec<u8>,
        /// The encoded value.
        value: Arc<[u8]>,
    },
    /// Removes `key` if present.
    Delete {
        /// The table.
        table: Table,
        /// The key.
        key: Vec<u8>,
    },
}

impl Write {
    /// The table written.
    pub fn table(&self) -> Table {
        match self {
            Write::Put { table, .. }
            | Write::Insert { table, .. }
            | Write::PutShared { table, .. }
            | Write::Delete { table, .. } => *table,
        }
    }

    /// The key written.
    pub fn key(&self) -> &[u8] {
        match self {
            Write::Put { key, .. }
            | Write::Insert { key, .. }
            | Write::PutShared { key, .. }
            | Write::Delete { key, .. } => key,
        }
    }
}

/// Writes that apply together or not at all. An empty batch is a barrier: it completes once
/// every batch submitted before it has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Most batches hold one or two writes: those need no allocation.
    writes: SmallVec<[Write; 2]>,
    /// Notices to other servers sharing the store, sent if the batch commits (empty, it
    /// allocates nothing).
    notes: Vec<notice::Note>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put.
    pub fn put(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>) -> &mut Self {
        self.writes.push(Write::Put { table, key, value });
        self
    }

    /// Adds a put of a key the caller made new ([`Write::Insert`]).
    pub fn insert(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>) -> &mut Self {
        self.writes.push(Write::Insert { table, key, value });
        self
    }

    /// Adds a put of a value other writes share.
    pub fn put_shared(&mut self, table: Table, key: Vec<u8>, value: Arc<[u8]>) -> &mut Self {
        self.writes.push(Write::PutShared { table, key, value });
        self
    }

    /// Adds a delete.
    pub fn delete(&mut self, table: Table, key: Vec<u8>) -> &mut Self {
        self.writes.push(Write::Delete { table, key });
        self
    }

    /// Sends `notice` to the server `to` (every other server when `None`) if, and when,
    /// the batch commits. A store no other server shares drops it.
    pub fn notify(&mut self, to: Option<Arc<str>>, notice: Notice) -> &mut Self {
        self.notes.push(notice::Note { to, notice });
        self
    }

    /// The notices to send with the batch.
    pub fn notes(&self) -> &[notice::Note] {
        &self.notes
    }

    /// Number of writes.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether the batch has no writes and no notices.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.notes().is_empty()
    }

    /// The writes, in order.
    pub fn writes(&self) -> &[Write] {
        &self.writes
    }

    /// The writes, in order, owned.
    pub fn into_writes(self) -> impl ExactSizeIterator<Item = Write> {
        self.writes.into_iter()
    }
}

/// Called once when a submitted batch is committed, or failed.
pub type Done = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// What "committed" means for a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// On disk (fsynced) before the batch completes.
    Durable,
    /// In this process's memory only; lost when it exits.
    Memory,
}

/// Counters of what a store has done since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Transactions committed (for a durable store, each is one fsync).
    pub commits: u64,
    /// Time spent committing them, fsyncs included, in microseconds: divided by `commits`,
    /// the mean commit latency.
    pub commit_micros: u64,
    /// Group commits that failed (each failed every batch in it).
    pub failed_commits: u64,
    /// Group commits refused because a key written as new ([`Write::Insert`]) existed,
    /// and then written again as puts (rare: each costs a second commit).
    pub rewritten_commits: u64,
    /// Batches applied.
    pub batches: u64,
    /// Writes applied.
    pub writes: u64,
}

/// What a group-committing store counts, shared by its writer and [`Store::stats`].
#[derive(Debug, Default)]
pub(crate) struct CommitCounters {
    commits: std::sync::atomic::AtomicU64,
    commit_micros: std::sync::atomic::AtomicU64,
    failed_commits: std::sync::atomic::AtomicU64,
    rewritten_commits: std::sync::atomic::AtomicU64,
    batches: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
}

impl CommitCounters {
    /// Counts one group commit of `batches` batches and `writes` writes, begun at `started`.
    pub(crate) fn committed(&self, started: std::time::Instant, batches: usize, writes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.commits.fetch_add(1, Relaxed);
        self.commit_micros.fetch_add(micros, Relaxed);
        self.batches.fetch_add(batches as u64, Relaxed);
        self.writes.fetch_add(writes as u64, Relaxed);
    }

    /// Counts a group commit that failed.
    pub(crate) fn failed(&self) {
        self.failed_commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts a group commit written again as puts (it is counted as committed or failed
    /// too, once, by how that ends). Only PostgreSQL's writer does that.
    #[cfg(feature = "postgres")]
    pub(crate) fn rewritten(&self) {
        self.rewritten_commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> StoreStats {
        use std::sync::atomic::Ordering::Relaxed;
        StoreStats {
            commits: self.commits.load(Relaxed),
            commit_micros: self.commit_micros.load(Relaxed),
            failed_commits: self.failed_commits.load(Relaxed),
            rewritten_commits: self.rewritten_commits.load(Relaxed),
            batches: self.batches.load(Relaxed),
            writes: self.writes.load(Relaxed),
        }
    }
}

/// A transactional key-value store with group commit.
///
/// # Examples
/// A store in a map, for a runtime whose state need not outlive it (what `MemoryStore`
/// does, sharded and faster): a batch applies whole, under one lock.
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::{Arc, Mutex};
///
/// use guildhall::store::{Batch, Done, Durability, Store, StoreError, StoreStats, Table, Write};
///
/// #[derive(Default)]
/// struct InMap(Mutex<BTreeMap<(Table, Vec<u8>), Vec<u8>>>);
///
/// impl Store for InMap {
///     fn submit(&self, batch: Batch, done: Done) {
///         let mut map = self.0.lock().unwrap();
///         for write in batch.into_writes() {
///             match write {
///                 Write::Put { table, key, value } | Write::Insert { table, key, value } => {
///                     map.insert((table, key), value);
///                 }
///                 Write::PutShared { table, key, value } => {
///                     map.insert((table, key), value.to_vec());
///                 }
///                 Write::Delete { table, key } => {
///                     map.remove(&(table, key));
///                 }
///             }
///         }
///         drop(map);
///         done(Ok(()));
///     }
///
///     fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
///         Ok(self.0.lock().unwrap().get(&(table, key.to_vec())).cloned())
///     }
///
///     fn scan_from(
///         &self,
///         table: Table,
///         prefix: &[u8],
///         start: &[u8],
///         visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
///     ) -> Result<(), StoreError> {
///         let map = self.0.lock().unwrap();
///         for ((t, key), value) in map.range((table, start.to_vec())..) {
///             if *t != table || !key.starts_with(prefix) || !visit(key, value) {
///                 break;
///             }
///         }
///         Ok(())
///     }
///
///     fn durability(&self) -> Durability {
///         Durability::Memory
///     }
///
///     fn stats(&self) -> StoreStats {
///         StoreStats::default() // nothing counted
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(InMap::default());
/// let runtime = guildhall::Runtime::builder().store(store.clone()).build().await?;
/// runtime.register_agent(guildhall::AgentSpec::new("dev-1", "dev")).await?;
/// let mut agents = 0;
/// store.scan(Table::Agents, b"", &mut |_, _| {
///     agents += 1;
///     true
/// })?;
/// assert!(agents >= 1, "the agent's record is in the store");
/// runtime.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Applies `batch` atomically and calls `done` once it is committed (or failed). `done`
    /// may run on another thread; it must not block.
    fn submit(&self, batch: Batch, done: Done);

    /// Commits `batch` on this thread if the store can do so without blocking, and returns
    /// the outcome; otherwise hands the batch back for [`submit`](Self::submit).
    ///
    /// # Errors
    /// The batch, unchanged, when the store only commits asynchronously.
    #[allow(
        clippy::result_large_err,
        reason = "the batch comes back as it went in, on the path every commit takes: \
                  boxing it would add an allocation to each"
    )]
    fn try_commit(&self, batch: Batch) -> Result<Result<(), StoreError>, Batch> {
        Err(batch)
    }

    /// The value at `key`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails to read.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Visits the entries whose key starts with `prefix`, in key order, until `visit`
    /// returns `false`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails to read.
    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.scan_from(table, prefix, prefix, visit)
    }

    /// As [`scan`](Self::scan), starting at the first key at or after `start` (which should
    /// itself start with `prefix`).
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails to read.
    fn scan_from(
        &self,
        table: Table,
        prefix: &[u8],
        start: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;

    /// Whether commits survive the process.
    fn durability(&self) -> Durability;

    /// What and where the store is, for people (`guildhall status`).
    fn describe(&self) -> String {
        match self.durability() {
            Durability::Durable => "durable".into(),
            Durability::Memory => "in memory (nothing survives the process)".into(),
        }
    }

    /// Why this store can no longer be used at all, when that happened while it was open
    /// (a shared database another server took over): the server must stop.
    fn lost(&self) -> Option<StoreError> {
        None
    }

    /// The servers sharing this store, when others may (a shared database); `None` when
    /// this process owns it alone and every actor is local.
    fn cluster(&self) -> Option<&dyn Cluster> {
        None
    }

    /// What the store has done since it opened.
    fn stats(&self) -> StoreStats;

    /// Finishes pending commits and releases the backend (a file's lock, say). Later
    /// operations fail with [`StoreError::Closed`].
    fn close(&self) {}
}

/// Submits `batch` and waits for it to commit.
///
/// # Errors
/// The commit's [`StoreError`], or [`StoreError::Closed`] if the store stopped first.
///
/// # Cancel safety
/// Dropping the future does not withdraw the batch: it may still commit.
pub async fn commit(store: &dyn Store, batch: Batch) -> Result<(), StoreError> {
    let batch = match store.try_commit(batch) {
        Ok(result) => return result,
        Err(batch) => batch,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    store.submit(
        batch,
        Box::new(move |result| {
            let _ = tx.send(result);
        }),
    );
    rx.await.unwrap_or(Err(StoreError::Closed))
}

/// Visits the entries whose key starts with `prefix`, in key order, each value decoded with
/// [`codec::decode`].
///
/// # Errors
/// The first read or decode error; entries after it are not visited.
pub fn scan_values<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    table: Table,
    prefix: &[u8],
    mut visit: impl FnMut(&[u8], T),
) -> Result<(), StoreError> {
    scan_values_from(store, table, prefix, prefix, |key, value| {
        visit(key, value);
        true
    })
}

/// As [`scan_values`], from the first key at or after `start`, until `visit` returns `false`.
///
/// # Errors
/// The first read or decode error; entries after it are not visited.
pub fn scan_values_from<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    table: Table,
    prefix: &[u8],
    start: &[u8],
    mut visit: impl FnMut(&[u8], T) -> bool,
) -> Result<(), StoreError> {
    let mut failed = None;
    store.scan_from(
        table,
        prefix,
        start,
        &mut |key, value| match codec::decode(table, value) {
            Ok(v) => visit(key, v),
            Err(e) => {
                failed = Some(e);
                false
            }
        },
    )?;
    failed.map_or(Ok(()), Err)
}

/// Adds to `batch` the deletion of every key of `table` that starts with `prefix`.
///
/// # Errors
/// [`StoreError`] when the backend fails to read.
pub fn delete_prefix(
    store: &dyn Store,
    table: Table,
    prefix: &[u8],
    batch: &mut Batch,
) -> Result<(), StoreError> {
    store.scan(table, prefix, &mut |key, _| {
        batch.delete(table, key.to_vec());
        true
    })
}

/// Opens the durable store in `dir`, creating the directory if needed.
///
/// # Errors
/// See [`RedbStore::open`].
pub fn open(dir: &Path) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(RedbStore::open(dir)?))
}
