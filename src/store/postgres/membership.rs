//! The servers sharing the database: each one's row in `guildhall_nodes` (its lease,
//! renewed by its heartbeat), the fence every commit passes, the subjects each holds in
//! `guildhall_leases`, and the notices they send each other (LISTEN/NOTIFY).
//!
//! A server joins with a row of its own. A subject (an agent's mailbox, a session, the
//! board) is claimed by `guildhall_claim`, which row-locks the subject's lease: a free
//! subject is taken; one held by a server whose lease ran out (or was fenced) is taken too,
//! and that server is fenced in the same transaction; one held by a live server is not.
//! Every group commit calls `guildhall_node_fence(node)`, which share-locks the server's
//! own row and raises unless it is not fenced: a server paused past its lease (SIGSTOP, a
//! frozen VM, a partition) whose subject another server took can no longer write, whatever
//! it still believes, and steps down ([`StoreError::Fenced`]). Fencing, not consensus of
//! our own: PostgreSQL's row locks and transaction order decide.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_postgres::Client;

use super::connection::{Connection, RECONNECT, Writes, connect, connect_listening, failed};
use crate::store::StoreError;
use crate::store::cluster::Notice;

/// The SQL state `guildhall_node_fence` raises with.
pub(super) const FENCED_STATE: &str = "GH001";

/// Notices kept for a subscriber that has not read them yet.
const NOTICE_BACKLOG: usize = 4096;

/// The channel every server listens on.
pub(super) const EVERYONE: &str = "gh_all";

/// This server's place in the database.
#[derive(Debug)]
pub(super) struct Membership {
    /// Who this server is (32 hex digits, new at each start: a restarted process is
    /// another server).
    pub(super) node: String,
    /// How long its lease lasts without a heartbeat.
    pub(super) lease: Duration,
    /// Set once this server learned it was fenced: everything fails from then on.
    fenced: AtomicBool,
    /// Where notices for this server go.
    pub(super) notices: broadcast::Sender<Notice>,
}

impl Membership {
    /// Whether this server was fenced.
    pub(super) fn fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Marks this server fenced (once; logged).
    pub(super) fn lose(&self) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::error!(
                node = %self.node,
                "another server took over from this one: it stops writing"
            );
        }
    }
}

/// The channel a server listens on.
pub(super) fn channel(node: &str) -> String {
    format!("gh_{node}")
}

fn interval_of(lease: Duration) -> String {
    format!("{} milliseconds", lease.as_millis())
}

/// Joins the database as a new server: a row of its own, its lease starting now. Rows of
/// servers gone for a day that hold nothing are cleared on the way.
pub(super) async fn join(client: &Client, lease: Duration) -> Result<Arc<Membership>, StoreError> {
    let node = uuid::Uuid::new_v4().simple().to_string();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    let fail = |e: tokio_postgres::Error| failed("open", e);
    client
        .execute(
            "DELETE FROM guildhall_nodes n WHERE n.expires_at < now() - interval '1 day' \
             AND NOT EXISTS (SELECT 1 FROM guildhall_leases l WHERE l.node = n.node)",
            &[],
        )
        .await
        .map_err(fail)?;
    client
        .execute(
            "INSERT INTO guildhall_nodes (node, host, pid, heartbeat_at, expires_at) \
             VALUES ($1, $2, $3, now(), now() + $4::text::interval)",
            &[
                &node,
                &host,
                &i64::from(std::process::id()),
                &interval_of(lease),
            ],
        )
        .await
        .map_err(fail)?;
    tracing::info!(%node, ?lease, "joined the shared database");
    Ok(Arc::new(Membership {
        node,
        lease,
        fenced: AtomicBool::new(false),
        notices: broadcast::channel(NOTICE_BACKLOG).0,
    }))
}

/// Renews the lease every third of its length until `stop`, or until it is found fenced.
/// A renewal that cannot reach the database is tried again at the next beat: the lease
/// may run out meanwhile, and then the fence, not this loop, stops the writes.
pub(super) async fn heartbeat(
    config: Arc<tokio_postgres::Config>,
    me: Arc<Membership>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(me.lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if me.fenced() {
            return;
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            client = connect(&config).await.ok();
        }
        let Some(c) = &client else { continue };
        let renewed = c
            .execute(
                "UPDATE guildhall_nodes SET expires_at = now() + $1::text::interval, \
                 heartbeat_at = now() WHERE node = $2 AND NOT fenced",
                &[&interval_of(me.lease), &me.node],
            )
            .await;
        match renewed {
            Ok(0) => {
                me.lose();
                return;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&e), "could not renew this server's lease")
            }
        }
    }
}

/// Leaves the database (a clean shutdown): gives up every subject and the server's row, so
/// others need not wait for its lease to run out. Through the writer's connection, after
/// everything it committed.
pub(super) async fn leave(writer: &Connection<Writes>, me: &Membership) {
    if me.fenced() {
        return;
    }
    let Ok(live) = writer.live().await else {
        return;
    };
    let client = &live.client;
    if client
        .execute("DELETE FROM guildhall_leases WHERE node = $1", &[&me.node])
        .await
        .is_ok()
    {
        let _ = client
            .execute(
                "DELETE FROM guildhall_nodes WHERE node = $1 AND NOT fenced",
                &[&me.node],
            )
            .await;
    }
}

/// Whether `e` is the fence refusing a write.
pub(super) fn is_fenced(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == FENCED_STATE)
}

/// Listens for this server's notices until `stop`, and hands them to its subscribers. A
/// broken connection is made again; since notices may have been missed meanwhile, the
/// subscribers are then told to look again ([`Notice::Resync`]).
pub(super) async fn listen(
    config: Arc<tokio_postgres::Config>,
    me: Arc<Membership>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut missed = false;
    loop {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let connected = match connect_listening(&config, Some(tx)).await {
            // LISTEN takes no parameters: the channel is spliced in, made of this server's
            // own random hex id only.
            Ok(client) => client
                .batch_execute(&format!("LISTEN {}; LISTEN {EVERYONE}", channel(&me.node)))
                .await
                .map(|()| client)
                .map_err(|e| failed("listen", e)),
            Err(e) => Err(e),
        };
        match connected {
            Ok(_client) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                if std::mem::take(&mut missed) {
                    let _ = me.notices.send(Notice::Resync);
                }
                loop {
                    tokio::select! {
                        payload = rx.recv() => match payload {
                            Some(payload) => match payload.split_once('\n') {
                                // What this server told everyone: it knows already.
                                Some((from, _)) if from == me.node => {}
                                Some((_, text)) if let Some(notice) = Notice::decode(text) => {
                                    let _ = me.notices.send(notice);
                                }
                                _ => tracing::debug!(%payload, "unknown notice ignored"),
                            },
                            // The connection ended.
                            None => break,
                        },
                        _ = stop.changed() => return,
                    }
                }
                missed = true;
            }
            Err(e) => {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&e), "cannot listen for other servers' notices");
                missed = true;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RECONNECT) => {}
            _ = stop.changed() => return,
        }
    }
}
