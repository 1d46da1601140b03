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
//!   whatever its size. Keys written as new ([`Write::Insert`]: a delivered message's) are
//!   plainly inserted (an upsert of them would cost a third more); a group refused because
//!   one existed after all is written again as puts, with nothing overtaken.
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
use tokio_postgres::Client;

mod connection;
mod membership;

use connection::{CONNECT_TIMEOUT, Connection, Reads, Writes, connect, failed};
use membership::Membership;

use super::cluster::{Claimed, Cluster, Member, Notice};
use super::{Batch, CommitCounters, Done, Durability, Store, StoreError, StoreStats, Table, Write};
use futures::StreamExt;
use futures::future::BoxFuture;

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
    (
        3,
        "DROP FUNCTION guildhall_fence(bigint);
         DROP TABLE guildhall_owner;
         CREATE TABLE guildhall_nodes (
             node text PRIMARY KEY,
             host text NOT NULL,
             pid bigint NOT NULL,
             address text NOT NULL DEFAULT '',
             started_at timestamptz NOT NULL DEFAULT now(),
             heartbeat_at timestamptz NOT NULL,
             expires_at timestamptz NOT NULL,
             fenced boolean NOT NULL DEFAULT false
         );
         CREATE TABLE guildhall_leases (
             subject text PRIMARY KEY,
             node text NOT NULL,
             epoch bigint NOT NULL
         );
         CREATE INDEX guildhall_leases_node ON guildhall_leases (node);
         -- Every claim's epoch comes from here: a later claim has a larger one, whoever
         -- made it, even after the subject was released and its row deleted.
         CREATE SEQUENCE guildhall_claims;
         CREATE FUNCTION guildhall_node_fence(n text) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM 1 FROM guildhall_nodes WHERE node = n AND NOT fenced FOR SHARE;
             IF NOT FOUND THEN
                 RAISE EXCEPTION 'fenced: another server took over from this one'
                     USING ERRCODE = 'GH001';
             END IF;
             RETURN true;
         END $$;
         -- A group commit that carries notices: the writes and the notices in one call,
         -- one round trip (the notices are sent at the commit, only if it happens).
         CREATE FUNCTION guildhall_commit_notify(
             pt int2[], pk bytea[], pv bytea[], dt int2[], dk bytea[], n text,
             ch text[], pl text[]) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM guildhall_node_fence(n);
             DELETE FROM guildhall_kv k USING unnest(dt, dk) AS d(tbl, key)
                 WHERE k.tbl = d.tbl AND k.key = d.key;
             INSERT INTO guildhall_kv (tbl, key, value)
                 SELECT u.tbl, u.key, u.value FROM unnest(pt, pk, pv) AS u(tbl, key, value)
                 ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value;
             PERFORM pg_notify(c.channel, c.payload) FROM unnest(ch, pl) AS c(channel, payload);
         END $$;
         -- Claims subject s for server n: its holder afterwards, and the claim's epoch.
         CREATE FUNCTION guildhall_claim(s text, n text, OUT o_holder text, OUT o_epoch bigint)
         LANGUAGE plpgsql AS $$
         DECLARE h text;
         BEGIN
             PERFORM guildhall_node_fence(n);
             LOOP
                 SELECT l.node INTO h FROM guildhall_leases l WHERE l.subject = s FOR UPDATE;
                 IF NOT FOUND THEN
                     o_epoch := nextval('guildhall_claims');
                     INSERT INTO guildhall_leases AS l (subject, node, epoch)
                         VALUES (s, n, o_epoch) ON CONFLICT (subject) DO NOTHING;
                     IF FOUND THEN
                         o_holder := n;
                         RETURN;
                     END IF;
                     -- Another claim inserted it meanwhile: lock that one.
                     CONTINUE;
                 END IF;
                 IF h <> n THEN
                     -- Held elsewhere: taken only from a server gone past its lease, which
                     -- is fenced first (its row lock waits for its commit in flight).
                     UPDATE guildhall_nodes SET fenced = true
                         WHERE node = h AND (fenced OR expires_at < now());
                     IF NOT FOUND AND EXISTS (SELECT 1 FROM guildhall_nodes WHERE node = h) THEN
                         o_holder := h;
                         o_epoch := 0;
                         RETURN;
                     END IF;
                 END IF;
                 UPDATE guildhall_leases l SET node = n, epoch = nextval('guildhall_claims')
                     WHERE l.subject = s RETURNING l.epoch INTO o_epoch;
                 o_holder := n;
                 RETURN;
             END LOOP;
         END $$",
    ),
    (
        4,
        "-- Deletes by key, one index probe each, whatever the planner believes of the
         -- table's size: a plan cached while the table was small (or not yet analyzed)
         -- joined by scanning the whole table, in every commit that deleted anything.
         CREATE FUNCTION guildhall_delete(dt int2[], dk bytea[]) RETURNS void
         LANGUAGE sql SET enable_hashjoin = off SET enable_mergejoin = off
             SET enable_seqscan = off AS $$
             DELETE FROM guildhall_kv k USING unnest(dt, dk) AS d(tbl, key)
                 WHERE k.tbl = d.tbl AND k.key = d.key
         $$;
         CREATE OR REPLACE FUNCTION guildhall_commit_notify(
             pt int2[], pk bytea[], pv bytea[], dt int2[], dk bytea[], n text,
             ch text[], pl text[]) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM guildhall_node_fence(n);
             IF cardinality(dt) > 0 THEN
                 PERFORM guildhall_delete(dt, dk);
             END IF;
             INSERT INTO guildhall_kv (tbl, key, value)
                 SELECT u.tbl, u.key, u.value FROM unnest(pt, pk, pv) AS u(tbl, key, value)
                 ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value;
             PERFORM pg_notify(c.channel, c.payload) FROM unnest(ch, pl) AS c(channel, payload);
         END $$",
    ),
    (
        5,
        "-- As before, with the keys written as new (nt, nk, nv) plainly inserted, as the
         -- statement for groups of puts alone inserts them. The eight-argument function
         -- stays for servers of the version before, still running during an upgrade.
         CREATE FUNCTION guildhall_commit_notify(
             pt int2[], pk bytea[], pv bytea[], nt int2[], nk bytea[], nv bytea[],
             dt int2[], dk bytea[], n text, ch text[], pl text[]) RETURNS void
         LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM guildhall_node_fence(n);
             IF cardinality(dt) > 0 THEN
                 PERFORM guildhall_delete(dt, dk);
             END IF;
             INSERT INTO guildhall_kv (tbl, key, value)
                 SELECT u.tbl, u.key, u.value FROM unnest(nt, nk, nv) AS u(tbl, key, value);
             INSERT INTO guildhall_kv (tbl, key, value)
                 SELECT u.tbl, u.key, u.value FROM unnest(pt, pk, pv) AS u(tbl, key, value)
                 ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value;
             PERFORM pg_notify(c.channel, c.payload) FROM unnest(ch, pl) AS c(channel, payload);
         END $$",
    ),
];

/// How long a server's lease lasts without a heartbeat, by default: the time a killed
/// server's mailboxes and sessions stay unavailable before another server takes them.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);

/// Taken by a server applying migrations (`pg_advisory_xact_lock`): "guildhal" as a number.
const MIGRATION_LOCK: i64 = 0x6775_696c_6468_616c;
/// Connections for reads: reads of different actors go on in parallel.
const READERS: usize = 4;
/// Rows a scan fetches per query: a scan that stops early reads little.
const SCAN_PAGE: i64 = 256;
/// The most writes one group commit takes before it commits and starts the next.
const MAX_GROUP_WRITES: usize = 16 * 1024;
/// Group commits sent to PostgreSQL at once: the next is sent while the one before it is
/// being committed, so the database starts on it as soon as that one is done rather than a
/// round trip and its acknowledgements later.
const IN_FLIGHT: usize = 2;

/// The store in a PostgreSQL database. See the [module documentation](self).
pub struct PostgresStore {
    /// The runtime that drives every connection (on the thread `guildhall-postgres`).
    handle: tokio::runtime::Handle,
    readers: Arc<[Connection<Reads>]>,
    next_reader: AtomicUsize,
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    /// Ends when the writer has committed everything submitted before `close`.
    writer_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    stats: Arc<CommitCounters>,
    me: Arc<Membership>,
}

/// What the writer connection does, in the order submitted: a release is never taken
/// before the commits submitted ahead of it, nor a claim before an earlier release.
enum Job {
    Commit {
        batch: Batch,
        done: Done,
    },
    Claim {
        subject: String,
        reply: tokio::sync::oneshot::Sender<Result<(String, i64), StoreError>>,
    },
    Release {
        subject: String,
        epoch: i64,
    },
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:pass@host:port/db` or key=value
    /// form), creating or upgrading its schema, and joins the servers sharing it.
    ///
    /// # Errors
    /// - [`StoreError::Unavailable`] when the database cannot be reached;
    /// - [`StoreError::UnknownFormat`] when a newer guildhall migrated it;
    /// - [`StoreError::Backend`] when a migration fails.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_url(url, DEFAULT_LEASE)
    }

    /// As [`open`](Self::open), with a lease of `lease`.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_url(url: &str, lease: Duration) -> Result<Self, StoreError> {
        Self::open_with(parse(url)?, lease)
    }

    /// As [`open`](Self::open), with the connection's settings made by the caller and the
    /// lease this server is a member by (renewed every third of it; once it ran out,
    /// another server may take what this one holds, and fence it).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(config: tokio_postgres::Config, lease: Duration) -> Result<Self, StoreError> {
        if lease < Duration::from_millis(300) {
            return Err(StoreError::backend(
                "open",
                format!("a lease of {lease:?} is too short (300 ms at least)"),
            ));
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
        let joined = wait(&handle, {
            let config = Arc::clone(&config);
            async move {
                let client = connect(&config).await?;
                migrate(&client).await?;
                membership::join(&client, lease).await
            }
        });
        let me = match joined {
            Ok(me) => me,
            Err(err) => {
                let _ = stop_tx.send(());
                return Err(err);
            }
        };
        let (stop_beat, beat_stopped) = tokio::sync::watch::channel(false);
        let beat = handle.spawn(membership::heartbeat(
            Arc::clone(&config),
            Arc::clone(&me),
            beat_stopped.clone(),
        ));
        // Listening before the open returns: nothing sent to this server from then on is
        // missed.
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let listener = handle.spawn(membership::listen(
            Arc::clone(&config),
            Arc::clone(&me),
            beat_stopped,
            ready_tx,
        ));
        let _ = wait(&handle, async move {
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, ready_rx).await;
            Ok(())
        });
        let readers: Arc<[Connection<Reads>]> = (0..READERS)
            .map(|_| Connection::new(Arc::clone(&config)))
            .collect();
        let stats = Arc::new(CommitCounters::default());
        let (jobs, rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        handle.spawn({
            let writer = Connection::<Writes>::new(Arc::clone(&config));
            let stats = Arc::clone(&stats);
            let me = Arc::clone(&me);
            async move {
                Writer {
                    connection: &writer,
                    stats: &stats,
                    me: &me,
                }
                .run(rx)
                .await;
                // Everything is committed: give up what this server held, for the others.
                let _ = stop_beat.send(true);
                let _ = beat.await;
                let _ = listener.await;
                membership::leave(&writer, &me).await;
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
            me,
        })
    }

    /// The next reader, round robin.
    fn reader(&self) -> usize {
        self.next_reader.fetch_add(1, Ordering::Relaxed) % READERS
    }

    /// This server's id among those sharing the database.
    pub fn node(&self) -> &str {
        &self.me.node
    }

    /// Refuses reads and writes once this server was fenced, or the store is closed.
    fn usable(&self) -> Result<(), StoreError> {
        if self.me.fenced() {
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

    /// Hands `job` to the writer; gives it back when the store is closed.
    fn job(&self, job: Job) -> Result<(), Box<Job>> {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        match jobs.as_ref() {
            Some(jobs) => jobs.send(job).map_err(|e| Box::new(e.0)),
            None => Err(Box::new(job)),
        }
    }

    /// Runs `query` on a reader and waits for its rows.
    fn read_rows(
        &self,
        query: &'static str,
        params: Vec<String>,
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        self.usable()?;
        let (readers, index) = (Arc::clone(&self.readers), self.reader());
        wait(&self.handle, async move {
            let live = readers[index].live().await?;
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
                .iter()
                .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            live.client
                .query(query, &params)
                .await
                .map_err(|e| failed("read", e))
        })
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

/// `url` as connection settings.
fn parse(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    url.parse().map_err(|e| StoreError::backend("open", e))
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

/// Applies the migrations this database lacks, refusing one migrated by a newer build.
async fn migrate(client: &Client) -> Result<(), StoreError> {
    let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    let fail = |e: tokio_postgres::Error| failed("migrate", e);
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
        Table::Cursors => 11,
        Table::Sends => 12,
        Table::Held => 13,
        Table::Mail => 14,
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

/// A group commit sent to the database, and what became of it.
struct Flown {
    result: Result<(), Refused>,
    started: Instant,
    batches: Vec<Batch>,
    writes: usize,
    dones: Vec<Done>,
}

/// Why a group did not commit.
enum Refused {
    /// A key written as new ([`Write::Insert`]) existed: written as puts, the group commits.
    Existed,
    /// Anything else: the group's batches fail with it.
    Failed(StoreError),
}

/// Group commits in flight, oldest first. One connection runs its statements in the order
/// they were sent, and the answers come back in that order.
type Flight<'a> = futures::stream::FuturesOrdered<BoxFuture<'a, Flown>>;

/// The writer connection's loop: gathers the batches waiting into group commits, keeps
/// [`IN_FLIGHT`] of them sent, and runs claims and releases in order with them.
struct Writer<'a> {
    connection: &'a Connection<Writes>,
    stats: &'a CommitCounters,
    me: &'a Membership,
}

impl<'a> Writer<'a> {
    async fn run(&self, mut rx: mpsc::UnboundedReceiver<Job>) {
        let mut flight: Flight<'a> = futures::stream::FuturesOrdered::new();
        let (mut next, mut open) = (None, true);
        loop {
            let job = match next.take() {
                Some(job) => job,
                None if flight.len() >= IN_FLIGHT || (!open && !flight.is_empty()) => {
                    if let Some(flown) = flight.next().await {
                        self.settle(flown, &mut flight).await;
                    }
                    continue;
                }
                None if !open => return,
                None if flight.is_empty() => match rx.recv().await {
                    Some(job) => job,
                    None => {
                        open = false;
                        continue;
                    }
                },
                None => tokio::select! {
                    biased;
                    Some(flown) = flight.next() => {
                        self.settle(flown, &mut flight).await;
                        continue;
                    }
                    job = rx.recv() => match job {
                        Some(job) => job,
                        None => {
                            open = false;
                            continue;
                        }
                    },
                },
            };
            // Claims and releases come after every commit submitted before them.
            let (first, first_done) = match job {
                Job::Commit { batch, done } => (batch, done),
                Job::Claim { subject, reply } => {
                    self.land(&mut flight).await;
                    let _ = reply.send(claim(self.connection, &subject, self.me).await);
                    continue;
                }
                Job::Release { subject, epoch } => {
                    self.land(&mut flight).await;
                    release(self.connection, &subject, epoch, self.me).await;
                    continue;
                }
            };
            let mut writes = first.len();
            let (mut batches, mut dones) = (vec![first], vec![first_done]);
            while writes < MAX_GROUP_WRITES
                && let Ok(job) = rx.try_recv()
            {
                match job {
                    Job::Commit { batch, done } => {
                        writes += batch.len();
                        batches.push(batch);
                        dones.push(done);
                    }
                    other => {
                        next = Some(other);
                        break;
                    }
                }
            }
            let started = Instant::now();
            let (connection, me) = (self.connection, self.me);
            flight.push_back(Box::pin(async move {
                let result = commit_group(connection, &batches, me, None).await;
                Flown {
                    result,
                    started,
                    batches,
                    writes,
                    dones,
                }
            }));
        }
    }

    /// Waits until every group in flight is answered.
    async fn land(&self, flight: &mut Flight<'a>) {
        while let Some(flown) = flight.next().await {
            self.settle(flown, flight).await;
        }
    }

    /// Answers the batches of `flown`, the oldest group in flight. One refused because a
    /// key written as new existed (rare: a message delivered twice to one mailbox) is
    /// written again as puts, once every group sent after it has been answered: a key one
    /// of them wrote is left out (its later write stands), so no write overtakes a newer
    /// one.
    async fn settle(&self, flown: Flown, flight: &mut Flight<'a>) {
        if !matches!(flown.result, Err(Refused::Existed)) {
            return self.answer(flown);
        }
        let mut settled = vec![flown];
        while let Some(flown) = flight.next().await {
            settled.push(flown);
        }
        for i in 0..settled.len() {
            if matches!(settled[i].result, Err(Refused::Existed)) {
                self.stats.rewritten();
                let later: std::collections::HashSet<Key<'_>> = settled[i + 1..]
                    .iter()
                    .filter(|flown| flown.result.is_ok())
                    .flat_map(|flown| flown.batches.iter().flat_map(Batch::writes))
                    .map(key_of)
                    .collect();
                let again =
                    commit_group(self.connection, &settled[i].batches, self.me, Some(&later)).await;
                settled[i].result = again;
            }
        }
        for flown in settled {
            self.answer(flown);
        }
    }

    fn answer(&self, flown: Flown) {
        let result = match flown.result {
            Ok(()) => {
                self.stats
                    .committed(flown.started, flown.batches.len(), flown.writes);
                Ok(())
            }
            Err(refused) => {
                self.stats.failed();
                Err(match refused {
                    Refused::Failed(err) => err,
                    Refused::Existed => {
                        StoreError::backend("commit", "a key written as new existed")
                    }
                })
            }
        };
        for done in flown.dones {
            done(result.clone());
        }
    }
}

/// A key in `guildhall_kv`: its table's code and its bytes.
type Key<'a> = (i16, &'a [u8]);

/// Where `write` writes in `guildhall_kv`.
fn key_of(write: &Write) -> Key<'_> {
    (table_code(write.table()), write.key())
}

/// Claims `subject` for this server: its holder afterwards and the claim's epoch.
async fn claim(
    writer: &Connection<Writes>,
    subject: &str,
    me: &Membership,
) -> Result<(String, i64), StoreError> {
    if me.fenced() {
        return Err(StoreError::Fenced);
    }
    let live = writer.live().await?;
    let row = live
        .client
        .query_one(&live.claim, &[&subject, &me.node])
        .await
        .map_err(|e| fenced_or_failed(me, "claim", e))?;
    Ok((row.get(0), row.get(1)))
}

/// Ends this server's claim `epoch` of `subject` (a newer claim stays).
async fn release(writer: &Connection<Writes>, subject: &str, epoch: i64, me: &Membership) {
    if me.fenced() {
        return;
    }
    let Ok(live) = writer.live().await else {
        // The database is away: the lease runs out with this server's, or is taken over
        // when it is asked for and this server no longer answers.
        return;
    };
    if let Err(e) = live
        .client
        .execute(&live.release, &[&subject, &me.node, &epoch])
        .await
    {
        tracing::warn!(subject, error = %guildhall_actors::ErrorChain(&e), "could not release a subject");
    }
}

fn fenced_or_failed(
    me: &Membership,
    operation: &'static str,
    e: tokio_postgres::Error,
) -> StoreError {
    if membership::is_fenced(&e) {
        me.lose();
        StoreError::Fenced
    } else {
        failed(operation, e)
    }
}

/// Commits every batch of `group` in one transaction, with the notices they carry. `again`
/// writes it once more after it was refused ([`Refused::Existed`]): every put as a put,
/// leaving out the keys given (written since by a later group).
async fn commit_group(
    writer: &Connection<Writes>,
    group: &[Batch],
    me: &Membership,
    again: Option<&std::collections::HashSet<Key<'_>>>,
) -> Result<(), Refused> {
    if me.fenced() {
        return Err(Refused::Failed(StoreError::Fenced));
    }
    // The group's net effect: the last write to each key, and whether it is new (written
    // only by one `Insert`, so absent before).
    let mut last: HashMap<Key<'_>, (Option<&[u8]>, bool)> = HashMap::new();
    for write in group.iter().flat_map(Batch::writes) {
        let key = key_of(write);
        if again.is_some_and(|later| later.contains(&key)) {
            continue;
        }
        let (value, new) = match write {
            Write::Put { value, .. } => (Some(&value[..]), false),
            Write::Insert { value, .. } => (Some(&value[..]), again.is_none()),
            Write::PutShared { value, .. } => (Some(&value[..]), false),
            Write::Delete { .. } => (None, false),
        };
        last.entry(key)
            .and_modify(|was| *was = (value, false))
            .or_insert((value, new));
    }
    let (mut channels, mut payloads) = (Vec::new(), Vec::new());
    for note in group.iter().flat_map(Batch::notes) {
        channels.push(
            note.to
                .as_deref()
                .map_or_else(|| membership::EVERYONE.to_owned(), membership::channel),
        );
        // Signed with the sender: a server skips what it told everyone itself.
        payloads.push(format!("{}\n{}", me.node, note.notice.encode()));
    }
    if last.is_empty() && channels.is_empty() {
        // A barrier: everything before it has been answered already.
        return Ok(());
    }
    let (mut put_tbl, mut put_key, mut put_value) = (Vec::new(), Vec::new(), Vec::new());
    let (mut new_tbl, mut new_key, mut new_value) = (Vec::new(), Vec::new(), Vec::new());
    let (mut del_tbl, mut del_key) = (Vec::new(), Vec::new());
    for ((tbl, key), (value, new)) in last {
        match value {
            Some(value) if new => {
                new_tbl.push(tbl);
                new_key.push(key);
                new_value.push(value);
            }
            Some(value) => {
                put_tbl.push(tbl);
                put_key.push(key);
                put_value.push(value);
            }
            None => {
                del_tbl.push(tbl);
                del_key.push(key);
            }
        }
    }
    let live = writer.live().await.map_err(Refused::Failed)?;
    let fail = |e: tokio_postgres::Error| {
        if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
            Refused::Existed
        } else {
            Refused::Failed(fenced_or_failed(me, "commit", e))
        }
    };
    if channels.is_empty() && del_tbl.is_empty() {
        live.client
            .execute(
                &live.apply,
                &[
                    &put_tbl, &put_key, &put_value, &me.node, &new_tbl, &new_key, &new_value,
                ],
            )
            .await
            .map_err(fail)?;
    } else {
        live.client
            .execute(
                &live.notify,
                &[
                    &put_tbl, &put_key, &put_value, &new_tbl, &new_key, &new_value, &del_tbl,
                    &del_key, &me.node, &channels, &payloads,
                ],
            )
            .await
            .map_err(fail)?;
    }
    Ok(())
}

impl Store for PostgresStore {
    fn submit(&self, batch: Batch, done: Done) {
        if let Err(job) = self.job(Job::Commit { batch, done })
            && let Job::Commit { done, .. } = *job
        {
            done(Err(StoreError::Closed));
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
                .map_err(|e| failed("read", e))?;
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
                    .map_err(|e| failed("read", e))?;
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
        self.me.fenced().then_some(StoreError::Fenced)
    }

    fn describe(&self) -> String {
        format!(
            "PostgreSQL, shared; this server is {} (lease {:?})",
            self.me.node, self.me.lease
        )
    }

    fn cluster(&self) -> Option<&dyn Cluster> {
        Some(self)
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

/// How long a claim waits for a live holder to hand its subject over, beyond the lease
/// (after which a silent holder's subject is taken), at most.
const HANDOVER: Duration = Duration::from_secs(2);
/// The longest a claim waits in all: under the runtime's activation timeout.
const MAX_CLAIM_WAIT: Duration = Duration::from_secs(8);
/// How often a claim asks a live holder again while it waits.
const ASK_AGAIN: Duration = Duration::from_millis(250);

impl Cluster for PostgresStore {
    fn node(&self) -> &str {
        &self.me.node
    }

    fn claim<'a>(&'a self, subject: &'a str) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        Box::pin(async move {
            let deadline = Instant::now() + (self.me.lease + HANDOVER).min(MAX_CLAIM_WAIT);
            let mut asked: Option<Instant> = None;
            let mut pause = Duration::from_millis(2);
            loop {
                self.usable()?;
                let (reply, answer) = tokio::sync::oneshot::channel();
                let job = Job::Claim {
                    subject: subject.to_owned(),
                    reply,
                };
                if self.job(job).is_err() {
                    return Err(StoreError::Closed);
                }
                let (holder, epoch) = answer.await.map_err(|_| StoreError::Closed)??;
                if holder == self.me.node {
                    return Ok(Claimed { epoch });
                }
                if Instant::now() >= deadline {
                    return Err(StoreError::Held {
                        subject: subject.to_owned(),
                        holder,
                    });
                }
                if asked.is_none_or(|at| at.elapsed() >= ASK_AGAIN) {
                    let mut ask = Batch::new();
                    ask.notify(Some(holder.into()), Notice::Release(subject.into()));
                    super::commit(self, ask).await?;
                    asked = Some(Instant::now());
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(25));
            }
        })
    }

    fn release(&self, subject: &str, claimed: Claimed) {
        let _ = self.job(Job::Release {
            subject: subject.to_owned(),
            epoch: claimed.epoch,
        });
    }

    fn holder(&self, subject: &str) -> Result<Option<Arc<str>>, StoreError> {
        let rows = self.read_rows(
            "SELECT l.node FROM guildhall_leases l JOIN guildhall_nodes n USING (node) \
             WHERE l.subject = $1 AND l.node <> $2 AND NOT n.fenced AND n.expires_at > now()",
            vec![subject.to_owned(), self.me.node.clone()],
        )?;
        Ok(rows.first().map(|row| Arc::from(row.get::<_, &str>(0))))
    }

    fn holders(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let rows = self.read_rows(
            "SELECT subject, node FROM guildhall_leases WHERE starts_with(subject, $1) \
             ORDER BY subject",
            vec![prefix.to_owned()],
        )?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.me.notices.subscribe()
    }

    fn announce(&self, address: &str) {
        if self.usable().is_err() {
            return;
        }
        let (readers, index) = (Arc::clone(&self.readers), self.reader());
        let (address, node) = (address.to_owned(), self.me.node.clone());
        self.handle.spawn(async move {
            if let Ok(live) = readers[index].live().await {
                let _ = live
                    .client
                    .execute(
                        "UPDATE guildhall_nodes SET address = $1 WHERE node = $2",
                        &[&address, &node],
                    )
                    .await;
            }
        });
    }

    fn members(&self) -> Result<Vec<Member>, StoreError> {
        let rows = self.read_rows(
            "SELECT n.node, n.host, n.pid, n.address, \
                    (extract(epoch FROM now() - n.heartbeat_at) * 1000)::bigint, \
                    n.expires_at > now() AND NOT n.fenced, \
                    (SELECT count(*) FROM guildhall_leases l WHERE l.node = n.node) \
             FROM guildhall_nodes n WHERE n.node = $1 OR n.expires_at > now() - interval '1 hour' \
             ORDER BY n.started_at, n.node",
            vec![self.me.node.clone()],
        )?;
        Ok(rows
            .iter()
            .map(|row| {
                let node: String = row.get(0);
                Member {
                    this: node == self.me.node,
                    node,
                    host: row.get(1),
                    pid: row.get(2),
                    address: row.get(3),
                    heartbeat_age_ms: row.get(4),
                    live: row.get(5),
                    leases: row.get(6),
                }
            })
            .collect())
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
