//! Connections to PostgreSQL: made on first use and again after they broke, each with the
//! statements its use prepares, TLS for `sslmode=require`, and the errors a failed statement
//! becomes. What the store and its membership share (in its own file, so neither imports
//! the other back).

use std::sync::Arc;
use std::time::{Duration, Instant};

use guildhall_actors::ErrorChain;
use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls, Statement};

use crate::store::StoreError;

/// The longest a connection attempt may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a broken connection is tried again; until then, uses of it fail at once.
pub(super) const RECONNECT: Duration = Duration::from_millis(250);

pub(super) async fn connect(config: &tokio_postgres::Config) -> Result<Client, StoreError> {
    connect_listening(config, None).await
}

/// A connection; with `notices`, every notification's payload goes there (and `notices` is
/// dropped when the connection ends).
pub(super) async fn connect_listening(
    config: &tokio_postgres::Config,
    notices: Option<mpsc::UnboundedSender<String>>,
) -> Result<Client, StoreError> {
    use tokio_postgres::config::SslMode;
    let timed_out = |_| unavailable("connecting timed out");
    let client = if config.get_ssl_mode() == SslMode::Require {
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(tls()?))
            .await
            .map_err(timed_out)?
            .map_err(|e| unavailable(ErrorChain(&e)))?;
        tokio::spawn(drive(connection, notices));
        client
    } else {
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(NoTls))
            .await
            .map_err(timed_out)?
            .map_err(|e| unavailable(&e))?;
        tokio::spawn(drive(connection, notices));
        client
    };
    Ok(client)
}

/// Drives a connection until it ends, handing notifications to `notices` and saying why it
/// ended if it broke.
pub(super) async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    notices: Option<mpsc::UnboundedSender<String>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio_postgres::tls::TlsStream + Unpin,
{
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = futures::StreamExt::next(&mut messages).await {
        match message {
            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                if let Some(notices) = &notices {
                    let _ = notices.send(n.payload().to_owned());
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&e), "postgres connection ended");
                return;
            }
        }
    }
}

/// TLS for `sslmode=require`: rustls with ring, the server's certificate verified against
/// the system's roots (stricter than libpq's `require`, which checks nothing). Made once per
/// process: the system's roots are read then, not at every reconnect.
pub(super) fn tls() -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
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

pub(super) fn unavailable(reason: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        reason: reason.to_string(),
    }
}

/// A failed statement: the database gone is `Unavailable`, anything else the backend's word
/// (tokio-postgres's error, with PostgreSQL's own as its source; its `code()` is the
/// SQLSTATE).
pub(super) fn failed(operation: &'static str, e: tokio_postgres::Error) -> StoreError {
    if e.as_db_error().is_some() && !e.is_closed() {
        StoreError::backend(operation, e)
    } else {
        unavailable(ErrorChain(&e))
    }
}

/// One connection, made on first use and again after it broke, with the statements `S` its
/// use needs prepared.
pub(super) struct Connection<S> {
    pub(super) config: Arc<tokio_postgres::Config>,
    pub(super) state: tokio::sync::Mutex<Slot<S>>,
}

pub(super) struct Slot<S> {
    pub(super) live: Option<Arc<Live<S>>>,
    /// When the last attempt failed: no new attempt before [`RECONNECT`] has passed.
    pub(super) failed_at: Option<Instant>,
}

/// A live connection and its prepared statements (reached through it: `live.get`).
pub(super) struct Live<S> {
    pub(super) client: Client,
    pub(super) statements: S,
}

impl<S> std::ops::Deref for Live<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.statements
    }
}

/// The statements a connection prepares as soon as it is made.
pub(super) trait Statements: Sized {
    fn prepare(client: &Client) -> impl Future<Output = Result<Self, StoreError>> + Send;
}

/// `sql` prepared on `client`.
pub(super) async fn prepared(client: &Client, sql: &str) -> Result<Statement, StoreError> {
    client.prepare(sql).await.map_err(|e| failed("open", e))
}

/// A reader's statements.
pub(super) struct Reads {
    pub(super) get: Statement,
    pub(super) scan: Statement,
}

impl Statements for Reads {
    async fn prepare(client: &Client) -> Result<Self, StoreError> {
        Ok(Self {
            get: prepared(
                client,
                "SELECT value FROM guildhall_kv WHERE tbl = $1 AND key = $2",
            )
            .await?,
            scan: prepared(
                client,
                "SELECT key, value FROM guildhall_kv \
                 WHERE tbl = $1 AND key >= $2 AND ($3::bytea IS NULL OR key < $3) \
                 ORDER BY key LIMIT $4",
            )
            .await?,
        })
    }
}

/// The writer's statements.
pub(super) struct Writes {
    pub(super) apply: Statement,
    pub(super) notify: Statement,
    pub(super) claim: Statement,
    pub(super) release: Statement,
}

impl Statements for Writes {
    async fn prepare(client: &Client) -> Result<Self, StoreError> {
        Ok(Self {
            // One statement is one transaction: a group of puts alone (most groups: sends)
            // commits in one round trip, without the function call the other groups make.
            // Every write joins the fence: none happens once this server is fenced, and
            // its row stays share-locked until the commit, so no other server fences it
            // meanwhile.
            //
            // Keys written as new ($5–$7) are plainly inserted: an upsert first looks for
            // the key, then inserts speculatively and confirms, which costs a third more
            // per row (one more index probe, one more WAL record). Such a key that existed
            // after all fails the statement (`unique_violation`), and the group is written
            // again as puts (`settle`).
            apply: prepared(
                client,
                "WITH fence AS (SELECT guildhall_node_fence($4) AS ok), \
                 new AS (INSERT INTO guildhall_kv (tbl, key, value) \
                     SELECT u.tbl, u.key, u.value \
                     FROM unnest($5::int2[], $6::bytea[], $7::bytea[]) AS u(tbl, key, value), \
                         fence \
                     WHERE fence.ok) \
                 INSERT INTO guildhall_kv (tbl, key, value) \
                 SELECT u.tbl, u.key, u.value \
                 FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) AS u(tbl, key, value), fence \
                 WHERE fence.ok \
                 ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value",
            )
            .await?,
            notify: prepared(
                client,
                "SELECT guildhall_commit_notify($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .await?,
            claim: prepared(
                client,
                "SELECT o_holder, o_epoch FROM guildhall_claim($1, $2)",
            )
            .await?,
            release: prepared(
                client,
                "DELETE FROM guildhall_leases WHERE subject = $1 AND node = $2 AND epoch = $3",
            )
            .await?,
        })
    }
}

impl<S: Statements> Connection<S> {
    pub(super) fn new(config: Arc<tokio_postgres::Config>) -> Self {
        Self {
            config,
            state: tokio::sync::Mutex::new(Slot {
                live: None,
                failed_at: None,
            }),
        }
    }

    pub(super) async fn live(&self) -> Result<Arc<Live<S>>, StoreError> {
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

    async fn open(&self) -> Result<Live<S>, StoreError> {
        let client = connect(&self.config).await?;
        let statements = S::prepare(&client).await?;
        Ok(Live { client, statements })
    }
}
