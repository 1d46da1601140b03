//! Where an agent's reading has got to: named cursors, each the newest message id a reader
//! was given, kept in the store's `cursors` table (agent id, 0, name → the id) so they
//! outlast restarts and reconnects. A cursor only moves forward. The [`INBOX`] cursor holds
//! more: an [`InboxReading`], which the agent's mailbox actor keeps and moves.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
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

/// Late messages an agent's [`InboxReading`] keeps at most. Past it, the oldest is dropped
/// (and no longer listed by `since: "last"`; it stays in the inbox): a bound on what a
/// reading costs, which only an agent that stops reading with `since: "last"` while its
/// senders' messages keep arriving late could reach.
pub(crate) const MAX_LATE: usize = 4096;

/// An agent's `check_inbox {"since": "last"}` reading, kept in the [`INBOX`] cursor: the
/// newest message id it was given, and the messages that arrived after a listing had gone
/// past their id, which the next listing gives as well. A message's id is chosen when it
/// is sent, so under load one can arrive after a newer one (its commit came later; it
/// was sent again after a crash; another server stored it): an id alone would skip it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct InboxReading {
    /// The newest message id listed.
    pub(crate) at: Option<Uuid>,
    /// Messages arrived after a listing went past their id, not listed since.
    pub(crate) late: BTreeSet<Uuid>,
}

impl InboxReading {
    /// Whether the next listing gives `id` (the filters aside).
    pub(crate) fn unread_by_it(&self, id: Uuid) -> bool {
        self.at.is_none_or(|at| id > at) || self.late.contains(&id)
    }

    /// Notes a message arriving now, when a listing already gave out `handed` (the newest
    /// id any listing gave, shown yet or not): at or before it, the message is late, and the
    /// next listing gives it. Whether it was noted (the reading changed).
    pub(crate) fn arrived_late(&mut self, id: Uuid, handed: Option<Uuid>) -> bool {
        if handed.is_none_or(|handed| id > handed) || !self.late.insert(id) {
            return false;
        }
        if self.late.len() > MAX_LATE {
            self.late.pop_first();
        }
        true
    }

    /// What a listing showed: the reading moves past them.
    pub(crate) fn shown(&mut self, ids: &[Uuid]) {
        for id in ids {
            self.late.remove(id);
        }
        self.at = self.at.max(ids.iter().copied().max());
    }
}

/// `agent`'s inbox reading (empty when it never listed with `since: "last"`). Cursors
/// written before late messages were kept hold a bare id, read as such.
///
/// # Errors
/// The store failed.
pub(crate) fn inbox_reading(store: &dyn Store, agent: &str) -> Result<InboxReading, StoreError> {
    let Some(bytes) = store.get(Table::Cursors, &key(agent, INBOX))? else {
        return Ok(InboxReading::default());
    };
    if let Ok(reading) = store::codec::decode::<InboxReading>(Table::Cursors, &bytes) {
        return Ok(reading);
    }
    let at: Uuid = store::codec::decode(Table::Cursors, &bytes)?;
    Ok(InboxReading {
        at: Some(at),
        late: BTreeSet::new(),
    })
}

/// Writes `agent`'s inbox reading into `batch`.
pub(crate) fn put_inbox_reading(batch: &mut Batch, agent: &str, reading: &InboxReading) {
    batch.put(
        Table::Cursors,
        key(agent, INBOX),
        store::codec::encode(reading),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn a_reading_gives_what_arrived_late_once_and_keeps_its_bound() {
        let mut reading = InboxReading::default();
        assert!(reading.unread_by_it(id(1)));
        reading.shown(&[id(5), id(7)]);
        assert_eq!(reading.at, Some(id(7)));
        assert!(!reading.unread_by_it(id(6)) && reading.unread_by_it(id(8)));
        // 6 arrives after 7 was listed: late, given next time, once.
        let handed = Some(id(7));
        assert!(reading.arrived_late(id(6), handed));
        assert!(!reading.arrived_late(id(6), handed));
        assert!(
            !reading.arrived_late(id(9), handed),
            "past the reading: not late"
        );
        assert!(
            !reading.arrived_late(id(3), None),
            "nothing listed yet: not late"
        );
        assert!(reading.unread_by_it(id(6)));
        reading.shown(&[id(6)]);
        assert!(!reading.unread_by_it(id(6)));
        assert_eq!(reading.at, Some(id(7)), "a late one does not move it back");
        for n in 0..(MAX_LATE as u128 + 10) {
            reading.arrived_late(id(n), Some(id(u128::MAX)));
        }
        assert_eq!(reading.late.len(), MAX_LATE);
        assert!(!reading.late.contains(&id(0)), "the oldest went first");
    }

    #[test]
    fn a_cursor_written_as_a_bare_id_reads_as_a_reading() {
        let store = crate::store::MemoryStore::new();
        let mut batch = Batch::new();
        batch.put(
            Table::Cursors,
            key("dev", INBOX),
            store::codec::encode(&id(42)),
        );
        futures::executor::block_on(store::commit(&store, batch)).unwrap();
        let reading = inbox_reading(&store, "dev").unwrap();
        assert_eq!(reading.at, Some(id(42)));
        assert!(reading.late.is_empty());
        let mut batch = Batch::new();
        let mut later = reading.clone();
        assert!(later.arrived_late(id(41), later.at));
        put_inbox_reading(&mut batch, "dev", &later);
        futures::executor::block_on(store::commit(&store, batch)).unwrap();
        assert_eq!(inbox_reading(&store, "dev").unwrap(), later);
    }
}
