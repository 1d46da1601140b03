//! Idempotent sends: a send that carries a client-chosen `request_id` is made once. A retry
//! with the same id from the same sender within [`WINDOW`] (after a timeout, a reconnect, a
//! bridge restart) is answered with the first send's receipt and delivers nothing again.
//!
//! Each such send is remembered in the store's `sends` table (sender, 0, request id): first
//! as *pending*, with the message id chosen for it, committed before anything is delivered;
//! then *done*, with its receipt. A retry that finds it done answers the receipt. One that
//! finds it pending (the first attempt was cut off: the server died mid-send) sends the same
//! message again under the same id, skipping each recipient that already has it (in its
//! inbox or archive), so nobody gets it twice whichever part of the first attempt landed.
//! Retries of one request are taken one at a time on a server.

use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::AgentId;
use super::message::{Receipt, Rejected};
use crate::store::{self, Batch, Store, StoreError, Table};

/// How long a request id is remembered.
pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// The longest request id taken.
pub const MAX_REQUEST_ID: usize = 128;
/// Locks the retries of one request wait on (by hash; unrelated requests rarely share one).
const STRIPES: usize = 64;
/// Every this many remembered sends, the sender's records past the window are dropped.
const PRUNE_EVERY: u64 = 256;

/// What is remembered of a send with a request id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SendRecord {
    /// The message's id, chosen before the first delivery.
    pub(crate) id: Uuid,
    /// When the request was first seen.
    pub(crate) at_ms: u64,
    /// The receipt, once the send was made; `None` while it is pending.
    pub(crate) receipt: Option<StoredReceipt>,
}

/// A receipt as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StoredReceipt {
    thread: Uuid,
    delivered_to: Vec<String>,
    rejected: Vec<(String, String)>,
    #[serde(default)]
    held: Vec<String>,
}

impl StoredReceipt {
    pub(crate) fn of(receipt: &Receipt) -> Self {
        Self {
            thread: receipt.thread,
            delivered_to: receipt
                .delivered_to
                .iter()
                .map(ToString::to_string)
                .collect(),
            rejected: receipt
                .rejected
                .iter()
                .map(|r| (r.agent.to_string(), r.reason.clone()))
                .collect(),
            held: receipt.held.iter().map(ToString::to_string).collect(),
        }
    }

    pub(crate) fn receipt(&self, id: Uuid) -> Receipt {
        Receipt {
            id,
            thread: self.thread,
            delivered_to: self
                .delivered_to
                .iter()
                .filter_map(|a| AgentId::parse(a).ok())
                .collect(),
            rejected: self
                .rejected
                .iter()
                .filter_map(|(agent, reason)| {
                    Some(Rejected {
                        agent: AgentId::parse(agent).ok()?,
                        reason: reason.clone(),
                    })
                })
                .collect(),
            held: self
                .held
                .iter()
                .filter_map(|a| AgentId::parse(a).ok())
                .collect(),
        }
    }
}

/// Checks a request id: 1 to [`MAX_REQUEST_ID`] bytes, no control characters.
pub(crate) fn check_request_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID {
        return Err(format!(
            "must be 1 to {MAX_REQUEST_ID} bytes (it is {})",
            id.len()
        ));
    }
    if id.chars().any(char::is_control) {
        return Err("must not hold control characters".into());
    }
    Ok(())
}

fn key(sender: &str, request: &str) -> Vec<u8> {
    let mut key = super::ids::mailbox_prefix(sender);
    key.extend_from_slice(request.as_bytes());
    key
}

/// The record of `sender`'s request `request`, when one is within the window at `now_ms`.
pub(crate) fn recall(
    store: &dyn Store,
    sender: &str,
    request: &str,
    now_ms: u64,
) -> Result<Option<SendRecord>, StoreError> {
    let Some(bytes) = store.get(Table::Sends, &key(sender, request))? else {
        return Ok(None);
    };
    let record: SendRecord = store::codec::decode(Table::Sends, &bytes)?;
    let window = u64::try_from(WINDOW.as_millis()).unwrap_or(u64::MAX);
    Ok((now_ms.saturating_sub(record.at_ms) <= window).then_some(record))
}

/// Commits `record` for `sender`'s request `request`, with, now and then, the removal of
/// the sender's records past the window.
pub(crate) async fn remember(
    store: &dyn Store,
    sender: &str,
    request: &str,
    record: &SendRecord,
    count: &std::sync::atomic::AtomicU64,
) -> Result<(), StoreError> {
    let mut batch = Batch::new();
    if count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % PRUNE_EVERY == PRUNE_EVERY - 1 {
        let window = u64::try_from(WINDOW.as_millis()).unwrap_or(u64::MAX);
        let cutoff = record.at_ms.saturating_sub(window);
        let mut stale = Vec::new();
        store::scan_values(
            store,
            Table::Sends,
            &super::ids::mailbox_prefix(sender),
            |key, old: SendRecord| {
                if old.at_ms < cutoff {
                    stale.push(key.to_vec());
                }
            },
        )?;
        for key in stale {
            batch.delete(Table::Sends, key);
        }
    }
    batch.put(
        Table::Sends,
        key(sender, request),
        store::codec::encode(record),
    );
    store::commit(store, batch).await
}

/// One request's turn: its retries on this server wait for each other; and the count of
/// sends remembered, which paces the pruning.
pub(crate) struct Turns {
    stripes: [tokio::sync::Mutex<()>; STRIPES],
    pub(crate) remembered: std::sync::atomic::AtomicU64,
}

impl Default for Turns {
    fn default() -> Self {
        Self {
            stripes: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
            remembered: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Turns {
    pub(crate) async fn take(
        &self,
        sender: &str,
        request: &str,
    ) -> tokio::sync::MutexGuard<'_, ()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (sender, request).hash(&mut hasher);
        let stripe = usize::try_from(hasher.finish() % STRIPES as u64).unwrap_or(0);
        self.stripes[stripe].lock().await
    }
}
