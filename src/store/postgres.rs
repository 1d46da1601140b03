//! [`PostgresStore`]: the store in a PostgreSQL database, so that several servers can share
//! one (`[store] url = "postgres://…"`, `serve --store URL`).
//!
//! - **Layout.** One table, `guildhall_kv (tbl, key, value)`, keyed by the [`Table`]'s code
//!   and the key's bytes; `bytea` compares bytewise, so a prefix scan is a range scan of
//!   the primary key, in the order redb gives. The schema is made and upgraded by
//!   [`MIGRATIONS`], each applied once, in order, under an advisory lock so that servers
//!   starting together do not race; a database migrated by a newer guildhall is refused.
//! - **Group commit.** One writer connection takes every batch waiting when it starts a
//!   transaction into that transaction: one commit (synchronous, so on disk) acknowledges
//!   them all, as redb's one fsync does. Within the group the last write to a key wins,
//!   so the group is one statement (a multi-row delete and upsert), one round trip,
//!   whatever its size.
//! - **Reads.** [`Store`]'s reads are synchronous. They run on a small pool of connections
//!   driven by this store's own single-threaded runtime, and the caller's thread waits for
//!   the answer: a caller on a single-threaded runtime cannot starve them.
//! - **Failure.** A lost connection is made again on the next use, at most once per
//!   [`RECONNECT`]: meanwhile reads and commits fail at once with
//!   [`StoreError::Unavailable`], and nothing acknowledged is lost (an acknowledged batch
//!   was committed). A commit whose connection broke before PostgreSQL answered is reported
//!   failed, though it may have committed: a sender that tries again may store it twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls, Statement};

mod ownership;

use ownership::Ownership;

use super::{Batch, CommitCounters, Done, Durability, Store, StoreError, StoreStats, Table, Write};

/// The schema, one step per version; never edit a step that shipped, add one.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE guildhall_kv (
             tbl smallint NOT NULL,
             key bytea NOT NULL,
             value bytea NOT NULL,
             PRIMARY KEY (tbl, key)
         )",
    ),
    (
        2,
        "CREATE TABLE guildhall_owner (
             id smallint PRIMARY KEY CHECK (id = 1),
             node text NOT NULL,
             epoch bigint NOT NULL,
             expires_at timestamptz NOT NULL,
             heartbeat_at timestamptz NOT NULL
         );
         -- The row exists from the start, expired: every taker locks it, one at a time.
         INSERT INTO guildhall_owner VALUES (1, '', 0, to_timestamp(0), to_timestamp(0));
         CREATE FUNCTION guildhall_fence(e bigint) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM 1 FROM guildhall_owner WHERE id = 1 AND epoch = e FOR SHARE;
             IF NOT FOUND THEN
                 RAISE EXCEPTION 'fenced: another server owns this database'
                     USING ERRCODE = 'GH001';
             END IF;
             RETURN true;
         END $$",
    ),
];

/// How long a server's hold on the database lasts without a heartbeat, by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);

/// Taken by a server applying migrations (`pg_advisory_xact_lock`): "guildhal" as a number.
const MIGRATION_LOCK: i64 = 0x6775_696c_6468_616c;
/// Connections for reads: reads of different actors go on in parallel.
const READERS: usize = 4;
/// Rows a scan fetches per query: a scan that stops early reads little.
const SCAN_PAGE: i64 = 256;
/// The most writes one group commit takes before it commits and starts the next.
const MAX_GROUP_WRITES: usize = 16 * 1024;
/// The longest a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a broken connection is tried again; until then, uses of it fail at once.
const RECONNECT: Duration = Duration::from_millis(250);

/// The store in a PostgreSQL database. See the [module documentation](self).
pub struct PostgresStore {
    /// The runtime that drives every connection (on the thread `guildhall-postgres`).
    handle: tokio::runtime::Handle,
    readers: Arc<[Connection]>,
    next_reader: AtomicUsize,
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    /// Ends when the writer has committed everything submitted before `close`.
    writer_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    stats: Arc<CommitCounters>,
    owner: Arc<Ownership>,
}

struct Job {
    batch: Batch,
    done: Done,
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:pass@host:port/db` or key=value
    /// form), creating or upgrading its schema.
    ///
    /// # Errors
    /// - [`StoreError::Unavailable`] when the database cannot be reached;
    /// - [`StoreError::InUse`] when another server's lease on it is live;
    /// - [`StoreError::UnknownFormat`] when a newer guildhall migrated it;
    /// - [`StoreError::Backend`] when a migration fails.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_url(url, DEFAULT_LEASE)
    }

    /// As [`open`](Self::open), holding the database by a lease of `lease`.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_url(url: &str, lease: Duration) -> Result<Self, StoreError> {
        Self::open_with(parse(url)?, lease)
    }

    /// As [`open`](Self::open), with the connection's settings made by the caller and the
    /// lease this server holds the database by (renewed every third of it; another server
    /// may take the database once it ran out).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(config: tokio_postgres::Config, lease: Duration) -> Result<Self, StoreError> {
        if lease < Duration::from_millis(300) {
            return Err(StoreError::Backend {
                operation: "open",
                reason: format!("a lease of {lease:?} is too short (300 ms at least)"),
            });
        }
        // A current-thread runtime runs only while someone drives it: one thread does.
        let driver = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Io {
                path: "postgres".into(),
                source: Arc::new(e),
            })?;
        let handle = driver.handle().clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("guildhall-postgres".into())
            .spawn(move || {
                driver.block_on(async {
                    let _ = stop_rx.await;
                });
                driver.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|e| StoreError::Io {
                path: "postgres".into(),
                source: Arc::new(e),
            })?;
        let config = Arc::new(config);
        let owned = wait(&handle, {
            let config = Arc::clone(&config);
            async move {
                let client = connect(&config).await?;
                migrate(&client).await?;
                ownership::take(&client, lease).await
            }
        });
        let owner = match owned {
            Ok(owner) => owner,
            Err(err) => {
                let _ = stop_tx.send(());
                return Err(err);
            }
        };
        let (stop_beat, beat_stopped) = tokio::sync::watch::channel(false);
        let beat = handle.spawn(ownership::heartbeat(
            Arc::clone(&config),
            Arc::clone(&owner),
            beat_stopped,
        ));
        let readers: Arc<[Connection]> = (0..READERS)
            .map(|_| Connection::new(Arc::clone(&config)))
            .collect();
        let stats = Arc::new(CommitCounters::default());
        let (jobs, rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        handle.spawn({
            let writer = Connection::new(Arc::clone(&config));
            let stats = Arc::clone(&stats);
            let owner = Arc::clone(&owner);
            async move {
                write_loop(&writer, rx, &stats, &owner).await;
                // Everything is committed: give the database up for the next server.
                let _ = stop_beat.send(true);
                let _ = beat.await;
                ownership::release(&writer, &owner).await;
                let _ = done_tx.send(());
                // The driver thread ends with the writer: every job was answered.
                let _ = stop_tx.send(());
            }
        });
        tracing::debug!("postgres store opened");
        Ok(Self {
            handle,
            readers,
            next_reader: AtomicUsize::new(0),
            jobs: Mutex::new(Some(jobs)),
            writer_done: Mutex::new(Some(done_rx)),
            stats,
            owner,
        })
    }

    /// The next reader, round robin.
    fn reader(&self) -> usize {
        self.next_reader.fetch_add(1, Ordering::Relaxed) % READERS
    }

    /// This server's name in the database's lease.
    pub fn node(&self) -> &str {
        &self.owner.node
    }

    /// The lease's epoch this server holds the database by.
    pub fn epoch(&self) -> i64 {
        self.owner.epoch
    }

    /// Refuses reads and writes once another server took the database, or it is closed.
    fn usable(&self) -> Result<(), StoreError> {
        if self.owner.fenced() {
            Err(StoreError::Fenced)
        } else if self.closed() {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    fn closed(&self) -> bool {
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

/// `url` as connection settings.
fn parse(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    url.parse().map_err(|e| StoreError::Backend {
        operation: "open",
        reason: format!("not a PostgreSQL connection string: {e}"),
    })
}

/// Runs `work` on the store's runtime and waits for it on this thread.
fn wait<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    work: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(work.await);
    });
    rx.recv().unwrap_or(Err(StoreError::Closed))
}

async fn connect(config: &tokio_postgres::Config) -> Result<Client, StoreError> {
    use tokio_postgres::config::SslMode;
    let timed_out = |_| unavailable("connecting timed out");
    let client = if config.get_ssl_mode() == SslMode::Require {
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(tls()?))
            .await
            .map_err(timed_out)?
            .map_err(|e| unavailable(tls_failure(&e)))?;
        tokio::spawn(log_end(connection));
        client
    } else {
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(NoTls))
            .await
            .map_err(timed_out)?
            .map_err(|e| unavailable(&e))?;
        tokio::spawn(log_end(connection));
        client
    };
    Ok(client)
}

/// Drives a connection until it ends, saying why if it broke.
async fn log_end<F: Future<Output = Result<(), tokio_postgres::Error>>>(connection: F) {
    if let Err(e) = connection.await {
        tracing::warn!(error = %e, "postgres connection ended");
    }
}

/// TLS for `sslmode=require`: rustls with ring, the server's certificate verified against
/// the system's roots (stricter than libpq's `require`, which checks nothing). Made once per
/// process: the system's roots are read then, not at every reconnect.
fn tls() -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    use rustls_platform_verifier::BuilderVerifierExt;
    static TLS: std::sync::OnceLock<Result<tokio_postgres_rustls::MakeRustlsConnect, String>> =
        std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(BuilderVerifierExt::with_platform_verifier)
            .map_err(|e| format!("TLS cannot be set up: {e}"))?
            .with_no_client_auth();
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    })
    .clone()
    .map_err(unavailable)
}

/// A failed TLS connection's message, with the cause a bare "error performing TLS
/// handshake" would hide.
fn tls_failure(e: &tokio_postgres::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        source = cause.source();
    }
    message
}

fn unavailable(reason: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        reason: reason.to_string(),
    }
}

/// A failed statement: the database gone is `Unavailable`, anything else the backend's word,
/// with PostgreSQL's own message (tokio-postgres alone says only "db error").
fn failed(operation: &'static str, e: &tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) if !e.is_closed() => StoreError::Backend {
            operation,
            reason: format!("{} ({})", db.message(), db.code().code()),
        },
        _ => unavailable(e),
    }
}

/// Applies the migrations this database lacks, refusing one migrated by a newer build.
async fn migrate(client: &Client) -> Result<(), StoreError> {
    let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    let fail = |e: tokio_postgres::Error| failed("migrate", &e);
    client.batch_execute("BEGIN").await.map_err(fail)?;
    let result = async {
        // Taken first, so servers starting together create and migrate one at a time (DDL
        // is transactional: the next sees what the first committed).
        client
            .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(fail)?;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS guildhall_migrations (
                     version integer PRIMARY KEY,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 )",
            )
            .await
            .map_err(fail)?;
        let row = client
            .query_one(
                "SELECT coalesce(max(version), 0) FROM guildhall_migrations",
                &[],
            )
            .await
            .map_err(fail)?;
        let found: i32 = row.get(0);
        if found > known {
            return Err(StoreError::UnknownFormat {
                path: "postgres".into(),
                found: u32::try_from(found).unwrap_or(0),
                supported: u32::try_from(known).unwrap_or(0),
            });
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
            client.batch_execute(sql).await.map_err(fail)?;
            client
                .execute(
                    "INSERT INTO guildhall_migrations (version) VALUES ($1)",
                    &[version],
                )
                .await
                .map_err(fail)?;
            tracing::info!(version, "postgres store migrated");
        }
        Ok(())
    }
    .await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client.batch_execute(end).await.map_err(fail)?;
    result
}

/// One connection, made on first use and again after it broke.
struct Connection {
    config: Arc<tokio_postgres::Config>,
    state: tokio::sync::Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    live: Option<Arc<Live>>,
    /// When the last attempt failed: no new attempt before [`RECONNECT`] has passed.
    failed_at: Option<Instant>,
}

/// A live connection and its prepared statements.
struct Live {
    client: Client,
    get: Statement,
    scan: Statement,
    apply: Statement,
}

impl Connection {
    fn new(config: Arc<tokio_postgres::Config>) -> Self {
        Self {
            config,
            state: tokio::sync::Mutex::new(Slot::default()),
        }
    }

    async fn live(&self) -> Result<Arc<Live>, StoreError> {
        let mut slot = self.state.lock().await;
        if let Some(live) = &slot.live
            && !live.client.is_closed()
        {
            return Ok(Arc::clone(live));
        }
        slot.live = None;
        if let Some(at) = slot.failed_at
            && at.elapsed() < RECONNECT
        {
            return Err(unavailable(
                "the database is unreachable; trying again shortly",
            ));
        }
        match self.open().await {
            Ok(live) => {
                slot.failed_at = None;
                Ok(Arc::clone(slot.live.insert(Arc::new(live))))
            }
            Err(e) => {
                slot.failed_at = Some(Instant::now());
                Err(e)
            }
        }
    }

    async fn open(&self) -> Result<Live, StoreError> {
        let client = connect(&self.config).await?;
        let prepare = |sql: &'static str| {
            let client = &client;
            async move { client.prepare(sql).await.map_err(|e| failed("open", &e)) }
        };
        let get = prepare("SELECT value FROM guildhall_kv WHERE tbl = $1 AND key = $2").await?;
        let scan = prepare(
            "SELECT key, value FROM guildhall_kv \
             WHERE tbl = $1 AND key >= $2 AND ($3::bytea IS NULL OR key < $3) \
             ORDER BY key LIMIT $4",
        )
        .await?;
        // One statement is one transaction: the group commits in one round trip. Its
        // puts and deletes touch different keys (each key's last write only).
        // Every write joins the fence: none happens unless this server's epoch is still
        // the lease's, and the lease row stays share-locked until the commit.
        let apply = prepare(
            "WITH fence AS (SELECT guildhall_fence($6) AS ok), \
             gone AS ( \
                 DELETE FROM guildhall_kv k \
                 USING unnest($4::int2[], $5::bytea[]) AS d(tbl, key), fence \
                 WHERE fence.ok AND k.tbl = d.tbl AND k.key = d.key) \
             INSERT INTO guildhall_kv (tbl, key, value) \
             SELECT u.tbl, u.key, u.value \
             FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) AS u(tbl, key, value), fence \
             WHERE fence.ok \
             ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value",
        )
        .await?;
        Ok(Live {
            client,
            get,
            scan,
            apply,
        })
    }
}

/// The code of `table` in the `tbl` column of `guildhall_kv`; fixed once written, whatever
/// the enum's order.
pub fn table_code(table: Table) -> i16 {
    match table {
        Table::Meta => 0,
        Table::Agents => 1,
        Table::Inbox => 2,
        Table::Archive => 3,
        Table::Sessions => 4,
        Table::ContextLog => 5,
        Table::ContextSnapshots => 6,
        Table::Audit => 7,
        Table::Approvals => 8,
        Table::Tasks => 9,
        Table::TaskHistory => 10,
    }
}

/// The first key after every key starting with `prefix`; `None` when there is none.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

async fn write_loop(
    writer: &Connection,
    mut rx: mpsc::UnboundedReceiver<Job>,
    stats: &CommitCounters,
    owner: &Ownership,
) {
    while let Some(first) = rx.recv().await {
        let mut writes = first.batch.len();
        let mut group = vec![first];
        while writes < MAX_GROUP_WRITES
            && let Ok(job) = rx.try_recv()
        {
            writes += job.batch.len();
            group.push(job);
        }
        // The callbacks apart: they are not `Sync`, so the commit must not hold them.
        let (batches, dones): (Vec<Batch>, Vec<Done>) =
            group.into_iter().map(|job| (job.batch, job.done)).unzip();
        let started = Instant::now();
        let result = commit_group(writer, &batches, owner).await;
        if result.is_ok() {
            stats.committed(started, batches.len(), writes);
        } else {
            stats.failed();
        }
        for done in dones {
            done(result.clone());
        }
    }
}

/// Commits every batch of `group` in one transaction.
async fn commit_group(
    writer: &Connection,
    group: &[Batch],
    owner: &Ownership,
) -> Result<(), StoreError> {
    if owner.fenced() {
        return Err(StoreError::Fenced);
    }
    // The group's net effect: the last write to each key.
    let mut last: HashMap<(i16, &[u8]), Option<&[u8]>> = HashMap::new();
    for write in group.iter().flat_map(Batch::writes) {
        match write {
            Write::Put { table, key, value } => {
                last.insert((table_code(*table), key), Some(value));
            }
            Write::PutShared { table, key, value } => {
                last.insert((table_code(*table), key), Some(value));
            }
            Write::Delete { table, key } => {
                last.insert((table_code(*table), key), None);
            }
        }
    }
    if last.is_empty() {
        // A barrier: everything before it has been answered already.
        return Ok(());
    }
    let (mut put_tbl, mut put_key, mut put_value) = (Vec::new(), Vec::new(), Vec::new());
    let (mut del_tbl, mut del_key) = (Vec::new(), Vec::new());
    for ((tbl, key), value) in last {
        if let Some(value) = value {
            put_tbl.push(tbl);
            put_key.push(key);
            put_value.push(value);
        } else {
            del_tbl.push(tbl);
            del_key.push(key);
        }
    }
    let live = writer.live().await?;
    live.client
        .execute(
            &live.apply,
            &[
                &put_tbl,
                &put_key,
                &put_value,
                &del_tbl,
                &del_key,
                &owner.epoch,
            ],
        )
        .await
        .map_err(|e| {
            if ownership::is_fenced(&e) {
                owner.lose();
                StoreError::Fenced
            } else {
                failed("commit", &e)
            }
        })?;
    Ok(())
}

impl Store for PostgresStore {
    fn submit(&self, batch: Batch, done: Done) {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        match jobs.as_ref() {
            Some(jobs) => {
                if let Err(job) = jobs.send(Job { batch, done }) {
                    (job.0.done)(Err(StoreError::Closed));
                }
            }
            None => done(Err(StoreError::Closed)),
        }
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.usable()?;
        let key = key.to_vec();
        let (readers, index) = (Arc::clone(&self.readers), self.reader());
        wait(&self.handle, async move {
            let live = readers[index].live().await?;
            let row = live
                .client
                .query_opt(&live.get, &[&table_code(table), &key])
                .await
                .map_err(|e| failed("read", &e))?;
            Ok(row.map(|row| row.get::<_, Vec<u8>>(0)))
        })
    }

    fn scan_from(
        &self,
        table: Table,
        prefix: &[u8],
        start: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.usable()?;
        let end = prefix_end(prefix);
        let mut from = start.max(prefix).to_vec();
        let index = self.reader();
        loop {
            let readers = Arc::clone(&self.readers);
            let (page_from, page_end) = (from.clone(), end.clone());
            let rows: Vec<(Vec<u8>, Vec<u8>)> = wait(&self.handle, async move {
                let live = readers[index].live().await?;
                let rows = live
                    .client
                    .query(
                        &live.scan,
                        &[&table_code(table), &page_from, &page_end, &SCAN_PAGE],
                    )
                    .await
                    .map_err(|e| failed("read", &e))?;
                Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
            })?;
            let full = rows.len() as i64 == SCAN_PAGE;
            for (key, value) in &rows {
                if !visit(key, value) {
                    return Ok(());
                }
            }
            match rows.into_iter().last() {
                Some((mut key, _)) if full => {
                    // The smallest key after the last one seen.
                    key.push(0);
                    from = key;
                }
                _ => return Ok(()),
            }
        }
    }

    fn durability(&self) -> Durability {
        Durability::Durable
    }

    fn lost(&self) -> Option<StoreError> {
        self.owner.fenced().then_some(StoreError::Fenced)
    }

    fn describe(&self) -> String {
        format!(
            "PostgreSQL, owned by this server as {} (epoch {}, lease {:?})",
            self.owner.node, self.owner.epoch, self.owner.lease
        )
    }

    fn stats(&self) -> StoreStats {
        self.stats.snapshot()
    }

    fn close(&self) {
        // No new jobs; the writer answers those queued, then ends.
        drop(
            self.jobs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(done) = self
            .writer_done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = done.recv_timeout(Duration::from_secs(30));
        }
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        drop(
            self.jobs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_the_next_prefix_of_its_length_or_nowhere() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn every_table_has_its_own_code() {
        let mut codes: Vec<_> = Table::ALL.iter().map(|t| table_code(*t)).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Table::ALL.len());
    }
}
