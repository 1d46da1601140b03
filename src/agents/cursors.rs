//! Where an agent's reading has got to: named cursors, each the newest message id a reader
//! was given, kept in the store's `cursors` table (agent id, 0, name → the id) so they
//! outlast restarts and reconnects. A cursor only moves forward.

use uuid::Uuid;

use crate::store::{self, Batch, Store, StoreError, Table};

/// The cursor `check_inbox {"since": "last"}` reads and moves.
pub const INBOX: &str = "inbox";
/// What `check_inbox`'s `since` takes to mean the agent's [`INBOX`] cursor.
pub const LAST: &str = "last";

fn key(agent: &str, name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(agent.len() + 1 + name.len());
    key.extend_from_slice(agent.as_bytes());
    key.push(0);
    key.extend_from_slice(name.as_bytes());
    key
}

/// `agent`'s cursor `name`, if it was ever moved.
///
/// # Errors
/// The store failed.
pub fn cursor(store: &dyn Store, agent: &str, name: &str) -> Result<Option<Uuid>, StoreError> {
    store
        .get(Table::Cursors, &key(agent, name))?
        .map(|bytes| store::codec::decode(Table::Cursors, &bytes))
        .transpose()
}

/// Moves `agent`'s cursor `name` to `to`, unless it is there or beyond already.
///
/// # Errors
/// The store failed.
///
/// # Cancel safety
/// Not cancel safe: dropped after the commit was submitted, the cursor may or may not have
/// moved.
pub async fn advance_cursor(
    store: &dyn Store,
    agent: &str,
    name: &str,
    to: Uuid,
) -> Result<(), StoreError> {
    if cursor(store, agent, name)?.is_some_and(|at| at >= to) {
        return Ok(());
    }
    let mut batch = Batch::new();
    // Encoded as every stored value is, so `guildhall doctor` reads it as intact.
    batch.put(Table::Cursors, key(agent, name), store::codec::encode(&to));
    store::commit(store, batch).await
}
