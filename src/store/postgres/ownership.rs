//! Which server owns the database: a lease in `guildhall_owner` (node, epoch, expiry),
//! renewed by its owner's heartbeat, and the fence every commit passes.
//!
//! A server opening the store takes the lease when there is none or it has expired, with
//! the epoch one higher than the last; a live lease of another server refuses the open
//! ([`StoreError::InUse`]). Every group commit calls `guildhall_fence(epoch)`, which takes
//! a share lock on the lease row and raises unless the epoch is still the lease's: a
//! server paused past its lease (SIGSTOP, a long GC pause of a VM, a partition) whose
//! lease another server took can no longer write, whatever it still believes, and steps
//! down ([`StoreError::Fenced`]). Fencing, not consensus of our own: PostgreSQL's row lock
//! and transaction order decide.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::Client;

use super::failed;
use crate::store::StoreError;

/// The SQL state `guildhall_fence` raises with.
pub(super) const FENCED_STATE: &str = "GH001";

/// This server's hold on the database.
#[derive(Debug)]
pub(super) struct Ownership {
    /// Who this server is, as the lease names it.
    pub(super) node: String,
    /// The lease's epoch when this server took it.
    pub(super) epoch: i64,
    /// How long a lease lasts without a heartbeat.
    pub(super) lease: Duration,
    /// Set once this server learned it lost the lease: everything fails from then on.
    fenced: AtomicBool,
}

impl Ownership {
    /// Whether this server lost the lease.
    pub(super) fn fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Marks the lease lost (once; logged).
    pub(super) fn lose(&self) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::error!(
                node = %self.node,
                epoch = self.epoch,
                "another server took over the database: this one stops writing"
            );
        }
    }
}

/// A name for this server: host, process and a random part (a restarted process is
/// another owner).
fn node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}/{}/{}", std::process::id(), &random[..8])
}

fn interval_of(lease: Duration) -> String {
    format!("{} milliseconds", lease.as_millis())
}

/// Takes the lease, or says who holds it.
pub(super) async fn take(client: &Client, lease: Duration) -> Result<Arc<Ownership>, StoreError> {
    let node = node_name();
    let fail = |e: tokio_postgres::Error| failed("open", &e);
    client.batch_execute("BEGIN").await.map_err(fail)?;
    let taken = async {
        let row = client
            .query_opt(
                "SELECT node, epoch, expires_at > now() AS live, \
                        (extract(epoch FROM expires_at - now()) * 1000)::bigint AS left_ms \
                 FROM guildhall_owner WHERE id = 1 FOR UPDATE",
                &[],
            )
            .await
            .map_err(fail)?;
        // The row is made by the migration: locking it serializes servers taking it.
        let Some(row) = row else {
            return Err(StoreError::Backend {
                operation: "open",
                reason: "the lease row `guildhall_owner` is missing".into(),
            });
        };
        if row.get::<_, bool>("live") {
            return Err(StoreError::InUse {
                holder: row.get("node"),
                left_ms: u64::try_from(row.get::<_, i64>("left_ms")).unwrap_or(0),
            });
        }
        let epoch = row.get::<_, i64>("epoch") + 1;
        client
            .execute(
                "UPDATE guildhall_owner SET node = $1, epoch = $2, \
                 expires_at = now() + $3::text::interval, heartbeat_at = now() WHERE id = 1",
                &[&node, &epoch, &interval_of(lease)],
            )
            .await
            .map_err(fail)?;
        Ok(epoch)
    }
    .await;
    let end = if taken.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client.batch_execute(end).await.map_err(fail)?;
    let epoch = taken?;
    tracing::info!(%node, epoch, ?lease, "owns the database");
    Ok(Arc::new(Ownership {
        node,
        epoch,
        lease,
        fenced: AtomicBool::new(false),
    }))
}

/// Renews the lease every third of its length until `stop`, or until it is found lost.
/// A renewal that cannot reach the database is tried again at the next beat: the lease
/// may run out meanwhile, and then the fence, not this loop, stops the writes.
pub(super) async fn heartbeat(
    config: Arc<tokio_postgres::Config>,
    owner: Arc<Ownership>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(owner.lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if owner.fenced() {
            return;
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            client = super::connect(&config).await.ok();
        }
        let Some(c) = &client else { continue };
        let renewed = c
            .execute(
                "UPDATE guildhall_owner SET expires_at = now() + $1::text::interval, \
                 heartbeat_at = now() WHERE id = 1 AND epoch = $2",
                &[&interval_of(owner.lease), &owner.epoch],
            )
            .await;
        match renewed {
            Ok(0) => {
                owner.lose();
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not renew the database lease"),
        }
    }
}

/// Gives the lease up (a clean shutdown), so the next server need not wait for it to expire.
/// Through the writer's connection, which is open already.
pub(super) async fn release(writer: &super::Connection, owner: &Ownership) {
    if owner.fenced() {
        return;
    }
    let Ok(live) = writer.live().await else {
        return;
    };
    let _ = live
        .client
        .execute(
            "UPDATE guildhall_owner SET expires_at = now() WHERE id = 1 AND epoch = $1",
            &[&owner.epoch],
        )
        .await;
}

/// Whether `e` is the fence refusing a write.
pub(super) fn is_fenced(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == FENCED_STATE)
}
