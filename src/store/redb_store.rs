use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use redb::{Database, DatabaseError, ReadableDatabase, StorageError, TableDefinition, TableError};

use super::{
    Batch, CommitCounters, Done, Durability, Store, StoreError, StoreStats, Table, Write, codec,
};

/// The store's file inside the data directory.
pub const FILE_NAME: &str = "guildhall.redb";
/// Where a new store is built before it is renamed to [`FILE_NAME`].
const NEW_FILE_NAME: &str = "guildhall.redb.new";
/// Held while a new store is built, so two processes starting together build only one.
const CREATE_LOCK_NAME: &str = "guildhall.redb.create-lock";
/// The store layout this build reads and writes, kept in `meta` under the `format` key.
pub const STORE_FORMAT: u32 = 1;
const FORMAT_KEY: &[u8] = b"format";
/// The most writes one group commit takes before it commits and starts the next.
const MAX_GROUP_WRITES: usize = 16 * 1024;

pub(super) const fn definition(
    table: Table,
) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
    TableDefinition::new(table.name())
}

/// The durable store: one redb file, written by one thread with group commit.
///
/// Every batch waiting when the writer starts a transaction goes into that transaction, and
/// one fsync (redb's `Durability::Immediate`) acknowledges them all. Under load batches
/// queue while the previous commit syncs, so the batch size follows the load with no added
/// latency when idle.
pub struct RedbStore {
    /// `None` once closed: the file lock goes with the last reference.
    db: RwLock<Option<Arc<Database>>>,
    path: PathBuf,
    /// Read by every submit, written once by `close`.
    jobs: RwLock<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<CommitCounters>,
}

struct Job {
    batch: Batch,
    done: Done,
}

impl RedbStore {
    /// Opens (or creates) the store in directory `dir`.
    ///
    /// # Errors
    /// - [`StoreError::Locked`] when another process has it open;
    /// - [`StoreError::Corrupt`] when the file is damaged or not a redb file;
    /// - [`StoreError::UnknownFormat`] when it holds another layout version, or redb
    ///   tables that are not a guildhall store's;
    /// - [`StoreError::Io`] when the directory or file cannot be created or read.
    ///
    /// An existing file is never reset or overwritten on any of these errors.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// [`open`](Self::open), with a page cache of `cache_bytes` (the most of its memory
    /// the store holds on to; see [`DEFAULT_CACHE_BYTES`]).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with_cache(dir: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        crate::private_fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        let path = dir.join(FILE_NAME);
        create_if_missing(dir, &path)?;
        let db = open_checked(&path, cache_bytes).map_err(|e| match e {
            StoreError::Corrupt { path, .. } if is_empty(&path) => StoreError::Corrupt {
                path,
                reason: "the file is empty, as an interrupted creation by an older \
                             guildhall leaves it; it holds no data, and removing it lets a new \
                             store be made"
                    .into(),
            },
            other => other,
        })?;
        check_format(&db, &path)?;
        let db = Arc::new(db);
        let stats = Arc::new(CommitCounters::default());
        let (tx, rx) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("guildhall-store".into())
            .spawn({
                let db = Arc::clone(&db);
                let stats = Arc::clone(&stats);
                move || write_loop(&db, &rx, &stats)
            })
            .map_err(|e| io_error(&path, e))?;
        tracing::debug!(path = %path.display(), "store opened");
        Ok(Self {
            db: RwLock::new(Some(db)),
            path,
            jobs: RwLock::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            stats,
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn db(&self) -> Result<Arc<Database>, StoreError> {
        self.db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(StoreError::Closed)
    }

    /// Commits everything submitted so far, stops the writer, and closes the file (releasing
    /// its lock once reads in progress finish). Later calls fail with [`StoreError::Closed`].
    pub fn close(&self) {
        self.jobs
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = writer.join();
        }
        self.db
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        self.close();
    }
}

/// Makes a new store appear whole or not at all.
///
/// redb writes a new file's header in place, so a process killed while creating the store
/// would leave a file that is not a database, which [`RedbStore::open`] rightly refuses. A
/// new store is therefore built and stamped under a temporary name, synced, and renamed into
/// place; a temporary file found here was left by a creator that died, and held nothing.
fn create_if_missing(dir: &Path, path: &Path) -> Result<(), StoreError> {
    if path.try_exists().map_err(|e| io_error(path, e))? {
        return Ok(());
    }
    let lock_path = dir.join(CREATE_LOCK_NAME);
    let lock = crate::private_fs::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io_error(&lock_path, e))?;
    lock.lock().map_err(|e| io_error(&lock_path, e))?;
    // Another process may have created it while this one waited for the lock.
    if path.try_exists().map_err(|e| io_error(path, e))? {
        return Ok(());
    }
    let new = dir.join(NEW_FILE_NAME);
    match std::fs::remove_file(&new) {
        Ok(()) => tracing::warn!(path = %new.display(), "removed a store left half-created"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&new, e)),
    }
    let db = Database::create(&new).map_err(|e| open_error(&new, e))?;
    // redb takes no mode: the file is made private before it holds anything or has its name.
    crate::private_fs::restrict(&new).map_err(|e| io_error(&new, e))?;
    check_format(&db, &new)?;
    drop(db);
    std::fs::rename(&new, path).map_err(|e| io_error(path, e))?;
    sync_dir(dir)
}

/// Makes a rename in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn is_empty(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() == 0)
}

pub(super) fn io_error(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_owned(),
        source: Arc::new(source),
    }
}

/// The page cache redb keeps unless `[store] cache_mib` says otherwise. Its default, 1 GiB, is a ceiling a long-running server
/// reaches as its store grows: the pages its writes and reads touch stay cached, so its
/// resident memory grew by about as much as the store did (`bench soak`: two thirds of the
/// server's growth, until the cache was full). This holds the interior pages of a store of
/// many GiB, which every lookup reads, and the pages a writer's batches dirty; the rest of
/// the file is in the kernel's page cache, a read away.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// Opens the file with redb's integrity check: every page of the committed trees has its
/// checksum verified, so a file damaged outside redb is refused as corrupt instead of
/// served (a plain open trusts it, and may serve a damaged tree as if it were whole, or
/// panic). A panic inside redb all the same is caught and reported as damage.
///
/// One repair is refused: redb finds the newest commit's root damaged and would fall back to
/// the commit before it (its first repair step, reported at progress 0.3). That commit may
/// have been acknowledged, so serving the older one would lose it silently; the store is
/// refused instead, and `guildhall doctor --repair` makes the choice explicit.
fn open_checked(path: &Path, cache_bytes: usize) -> Result<Database, StoreError> {
    let rolled_back = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let flag = Arc::clone(&rolled_back);
        Database::builder()
            .set_cache_size(cache_bytes)
            .set_check_integrity_on_open(true)
            .set_repair_callback(move |session| {
                if is_rollback(session) {
                    flag.store(true, std::sync::atomic::Ordering::Relaxed);
                    session.abort();
                } else {
                    tracing::debug!(progress = session.progress(), "checking the store's pages");
                }
            })
            .open(path)
    }));
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(_)) if rolled_back.load(std::sync::atomic::Ordering::Relaxed) => {
            Err(StoreError::Corrupt {
                path: path.to_owned(),
                reason: "its newest commit is damaged, and opening it would serve the commit \
                         before it as if nothing were lost; `guildhall doctor` reports what \
                         is readable and `guildhall doctor --repair` keeps the older commit"
                    .into(),
            })
        }
        Ok(Err(err)) => Err(open_error(path, err)),
        Err(panic) => Err(StoreError::Corrupt {
            path: path.to_owned(),
            reason: format!(
                "reading it failed inside redb ({}); `guildhall doctor` reports what can be \
                 read and `guildhall doctor --repair` copies it into a new store",
                guildhall_actors::panic_message(panic.as_ref())
            ),
        }),
    }
}

/// Whether redb's repair is about to give up the newest commit for the one before it: the
/// only repair step it reports at progress 0.3 (redb 4.5's `do_repair`; the others are 0.0,
/// 0.6 and 0.9).
pub(super) fn is_rollback(session: &redb::RepairSession) -> bool {
    (session.progress() - 0.3).abs() < 0.05
}

fn open_error(path: &Path, err: DatabaseError) -> StoreError {
    match err {
        DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch => {
            StoreError::Locked {
                path: path.to_owned(),
            }
        }
        DatabaseError::UpgradeRequired(version) => StoreError::UnknownFormat {
            path: path.to_owned(),
            found: u32::from(version),
            supported: STORE_FORMAT,
        },
        // redb reports a file that is not a redb database as invalid data.
        DatabaseError::Storage(StorageError::Io(source))
            if source.kind() == std::io::ErrorKind::InvalidData =>
        {
            StoreError::Corrupt {
                path: path.to_owned(),
                reason: source.to_string(),
            }
        }
        DatabaseError::Storage(StorageError::Io(source)) => io_error(path, source),
        other => StoreError::Corrupt {
            path: path.to_owned(),
            reason: other.to_string(),
        },
    }
}

/// Accepts an empty database (and stamps it) or one of this build's format; refuses anything else
/// without writing to it.
fn check_format(db: &Database, path: &Path) -> Result<(), StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let read = db.begin_read().map_err(|e| corrupt(&e))?;
    let found = match read.open_table(definition(Table::Meta)) {
        Ok(meta) => match meta.get(FORMAT_KEY).map_err(|e| corrupt(&e))? {
            Some(v) => Some(codec::decode::<u32>(Table::Meta, v.value()).map_err(|e| corrupt(&e))?),
            None => None,
        },
        Err(TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(corrupt(&e)),
    };
    let has_tables = read
        .list_tables()
        .map_err(|e| corrupt(&e))?
        .next()
        .is_some();
    drop(read);
    match found {
        Some(STORE_FORMAT) => {}
        Some(found) => {
            return Err(StoreError::UnknownFormat {
                path: path.to_owned(),
                found,
                supported: STORE_FORMAT,
            });
        }
        None if has_tables => {
            return Err(StoreError::UnknownFormat {
                path: path.to_owned(),
                found: 0,
                supported: STORE_FORMAT,
            });
        }
        None => {}
    }
    // Create every table (and stamp a new store) so readers never meet a missing table.
    let mut write = db.begin_write().map_err(|e| corrupt(&e))?;
    write.set_two_phase_commit(true);
    for table in Table::ALL {
        let mut t = write
            .open_table(definition(table))
            .map_err(|e| corrupt(&e))?;
        if table == Table::Meta && found.is_none() {
            t.insert(FORMAT_KEY, codec::encode(&STORE_FORMAT).as_slice())
                .map_err(|e| corrupt(&e))?;
        }
    }
    write.commit().map_err(|e| corrupt(&e))
}

fn write_loop(db: &Database, jobs: &mpsc::Receiver<Job>, stats: &CommitCounters) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        let mut writes = group[0].batch.len();
        while writes < MAX_GROUP_WRITES {
            match jobs.try_recv() {
                Ok(job) => {
                    writes += job.batch.len();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        // Barriers only need the commits before them, which are done: no transaction.
        let result = if writes == 0 {
            Ok(())
        } else {
            let started = std::time::Instant::now();
            let committed = std::panic::catch_unwind(AssertUnwindSafe(|| commit_group(db, &group)))
                .unwrap_or_else(|_| {
                    Err(StoreError::backend("commit", "the storage engine panicked"))
                });
            if committed.is_ok() {
                stats.committed(started, group.len(), writes);
            } else if let Err(err) = &committed {
                stats.failed();
                tracing::error!(error = %guildhall_actors::ErrorChain(err), batches = group.len(), "group commit failed");
            }
            committed
        };
        for job in group {
            (job.done)(result.clone());
        }
    }
}

fn commit_group(db: &Database, group: &[Job]) -> Result<(), StoreError> {
    let fail = |e: redb::Error| StoreError::backend("commit", e);
    let mut txn = db.begin_write().map_err(|e| fail(e.into()))?;
    // Two fsyncs per commit (data, then the header that points at it), shared by the whole
    // group: a crash mid-commit then never leaves the newest header damaged, so a damaged
    // one at open is damage, never a crash, and is refused (see `open_checked`).
    txn.set_two_phase_commit(true);
    {
        let mut tables = Vec::with_capacity(Table::ALL.len());
        for table in Table::ALL {
            tables.push(
                txn.open_table(definition(table))
                    .map_err(|e| fail(e.into()))?,
            );
        }
        for job in group {
            for write in job.batch.writes() {
                match write {
                    Write::Put { table, key, value } | Write::Insert { table, key, value } => {
                        tables[table.index()]
                            .insert(key.as_slice(), value.as_slice())
                            .map_err(|e| fail(e.into()))?;
                    }
                    Write::PutShared { table, key, value } => {
                        tables[table.index()]
                            .insert(key.as_slice(), &value[..])
                            .map_err(|e| fail(e.into()))?;
                    }
                    Write::Delete { table, key } => {
                        tables[table.index()]
                            .remove(key.as_slice())
                            .map_err(|e| fail(e.into()))?;
                    }
                }
            }
        }
    }
    txn.commit().map_err(|e| fail(e.into()))
}

impl Store for RedbStore {
    fn submit(&self, batch: Batch, done: Done) {
        let jobs = self.jobs.read().unwrap_or_else(PoisonError::into_inner);
        match jobs.as_ref() {
            Some(tx) => {
                if let Err(mpsc::SendError(job)) = tx.send(Job { batch, done }) {
                    (job.done)(Err(StoreError::Closed));
                }
            }
            None => done(Err(StoreError::Closed)),
        }
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let read = self.db()?.begin_read().map_err(read_error)?;
        let t = read.open_table(definition(table)).map_err(read_error)?;
        Ok(t.get(key).map_err(read_error)?.map(|v| v.value().to_vec()))
    }

    fn scan_from(
        &self,
        table: Table,
        prefix: &[u8],
        start: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let read = self.db()?.begin_read().map_err(read_error)?;
        let t = read.open_table(definition(table)).map_err(read_error)?;
        for entry in t.range(start.max(prefix)..).map_err(read_error)? {
            let (k, v) = entry.map_err(read_error)?;
            if !k.value().starts_with(prefix) || !visit(k.value(), v.value()) {
                break;
            }
        }
        Ok(())
    }

    fn durability(&self) -> Durability {
        Durability::Durable
    }

    fn close(&self) {
        RedbStore::close(self);
    }

    fn describe(&self) -> String {
        format!("redb file {}", self.path.display())
    }

    fn stats(&self) -> StoreStats {
        self.stats.snapshot()
    }
}

fn read_error(e: impl Into<redb::Error>) -> StoreError {
    StoreError::backend("read", e.into())
}
