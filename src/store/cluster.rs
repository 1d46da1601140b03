//! Servers sharing one store: which server runs which actor, and the notices they send each
//! other through the store.
//!
//! A store one process owns (redb, memory) has no [`Cluster`]: every actor is local. A
//! shared database (PostgreSQL) has one. An actor whose state others may also reach (an
//! agent's mailbox, a context session, the task board) is a *subject*: before it loads,
//! its server [claims](Cluster::claim) the subject, and it is active on that server only
//! until it stops and [releases](Cluster::release) it. A server that needs a subject
//! another live server holds asks that server to hand it over (a [`Notice::Release`]) and
//! waits for it. A server gone silent past its lease is fenced by the first server that
//! takes one of its subjects: none of its writes commit from then on.

use std::sync::Arc;

use futures::future::BoxFuture;

use serde::Serialize;

// The notices are plain data the store's batches carry too: they have their own file.
pub use super::notice::{Note, Notice};
use super::{Store, StoreError};

/// A subject's name: what an actor serves, the same on every server.
pub fn subject(kind: &str, id: &str) -> String {
    format!("{kind}:{id}")
}

/// A claimed subject: held by this server until released with this epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    /// Grows at every claim of the subject, by any server: a release names the claim it
    /// ends, so a late release never ends a newer one.
    pub epoch: i64,
}

/// This server's hold on a subject, kept by the actor that claimed it (in its state) and
/// released when dropped: when the actor stops, crashes or fails to load, after every batch
/// it submitted (the writer takes the release in order with them).
pub struct Hold {
    store: Arc<dyn Store>,
    subject: String,
    claimed: Claimed,
}

impl Hold {
    /// Claims `subject` for this server (see [`Cluster::claim`]); `None` when no other
    /// server shares `store`.
    ///
    /// # Errors
    /// As [`Cluster::claim`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the store recorded the claim, the subject stays this
    /// server's with no `Hold` to release it, and another server asking for it waits out
    /// its claim time in vain. Its callers, actors' starts, run it to its end.
    pub async fn take(store: &Arc<dyn Store>, subject: String) -> Result<Option<Self>, StoreError> {
        let Some(cluster) = store.cluster() else {
            return Ok(None);
        };
        let claimed = cluster.claim(&subject).await?;
        Ok(Some(Self {
            store: Arc::clone(store),
            subject,
            claimed,
        }))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(cluster) = self.store.cluster() {
            cluster.release(&self.subject, self.claimed);
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("subject", &self.subject)
            .field("claimed", &self.claimed)
            .finish_non_exhaustive()
    }
}

/// One server sharing the store, as `guildhall status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Its id.
    pub node: String,
    /// The host it runs on and its process id.
    pub host: String,
    /// Its process id.
    pub pid: i64,
    /// The address it serves on, once it said (empty until then).
    pub address: String,
    /// Milliseconds since its last heartbeat.
    pub heartbeat_age_ms: i64,
    /// Whether its lease is live (it is up and may write).
    pub live: bool,
    /// How many subjects it holds.
    pub leases: i64,
    /// Whether this is the server asking.
    pub this: bool,
}

/// The servers sharing a store. See the [module documentation](self).
pub trait Cluster: Send + Sync {
    /// This server's id.
    fn node(&self) -> &str;

    /// Claims `subject` for this server. A subject held by another live server is asked
    /// for (a [`Notice::Release`] to it) and waited for; one held by a server gone past its
    /// lease is taken at once, and that server fenced.
    ///
    /// # Errors
    /// [`StoreError::Held`] when its holder did not hand it over in time; the store's
    /// errors otherwise.
    fn claim<'a>(&'a self, subject: &'a str) -> BoxFuture<'a, Result<Claimed, StoreError>>;

    /// Ends the claim `claimed` of `subject`, after every batch submitted before.
    fn release(&self, subject: &str, claimed: Claimed);

    /// The live server other than this one that holds `subject`, if any.
    ///
    /// # Errors
    /// The store's.
    fn holder(&self, subject: &str) -> Result<Option<Arc<str>>, StoreError>;

    /// Every subject starting with `prefix` that a server holds, with its holder (live or
    /// not), in subject order.
    ///
    /// # Errors
    /// The store's.
    fn holders(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError>;

    /// Notices for this server, from now on. A subscriber that falls behind gets
    /// [`Notice::Resync`].
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Notice>;

    /// Says where this server can be reached, for the member list.
    fn announce(&self, address: &str);

    /// The servers sharing the store, this one included.
    ///
    /// # Errors
    /// The store's.
    fn members(&self) -> Result<Vec<Member>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_read_back_as_sent_and_unknown_ones_are_none() {
        let id = uuid::Uuid::now_v7();
        for notice in [
            Notice::Release("mail:a b".into()),
            Notice::Mail {
                agent: "dev-1".into(),
                id,
            },
            Notice::Changed("agents".into()),
            Notice::Resync,
        ] {
            assert_eq!(Notice::decode(&notice.encode()), Some(notice));
        }
        assert_eq!(Notice::decode("mail\nx\nnot-a-uuid"), None);
        assert_eq!(Notice::decode("later\nsomething"), None);
    }
}
