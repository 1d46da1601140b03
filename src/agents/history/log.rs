//! Where the mail log is kept: in the store, or beside a store that is memory.
//!
//! On a durable or shared store the log is the `Mail` table, keyed by second and id, and a
//! writer commits what sends handed over every [`LOG_CADENCE`] (a send pays for an `Arc` in
//! a buffer, not for a second write). On a memory store, nothing outlives the process
//! anyway: the log is the messages themselves, each the `Arc` the send made, kept in id
//! order. Encoding each message once more and writing it to a table, as a durable store
//! needs, made in-memory sends half again as slow (see docs/benchmarks.md).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use uuid::Uuid;

use super::super::MailError;
use super::super::ids::{log_key, logged_id};
use super::super::message::Message;
use crate::sorted::SortedDeque;
use crate::store::{self, Batch, Durability, Store, Table, codec};

/// How often the writer commits the messages handed over.
pub(crate) const LOG_CADENCE: Duration = Duration::from_millis(25);
/// Messages written in one batch at most: a store holds its lock for one batch, and a
/// sender waiting on it waits for no more than this many.
const LOG_BATCH: usize = 256;
/// Messages waiting for the writer before it is woken early.
const LOG_QUEUE: usize = 4_096;
/// Messages waiting for the writer at most (a store that stopped committing): past it a
/// message is not handed over, and the next start logs it from its recipients' copies.
const MAX_PENDING: usize = 1_048_576;
/// Messages removed (or read from a held log) per step: a held log's lock, which sends
/// take, is held for no more than this many.
pub(super) const STEP: usize = 1_000;

/// The log: every delivered message once, by id.
pub(super) struct MailLog {
    kept: Kept,
    /// Messages delivered, waiting for the writer, by id (sorted without reading them).
    pending: Mutex<Vec<(u128, Arc<Message>)>>,
    /// Wakes the writer early (a full buffer).
    wake: tokio::sync::Notify,
}

/// Where the log's messages are kept.
enum Kept {
    /// In the store's `Mail` table.
    Stored(Arc<dyn Store>),
    /// In this process's memory, as its store is.
    Held(Mutex<SortedDeque<u128, Arc<Message>>>),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The key a scan of the `Mail` table starts at for ids from `start` (0: the first).
fn start_key(start: u128) -> Vec<u8> {
    if start == 0 {
        Vec::new()
    } else {
        log_key(&Uuid::from_u128(start))
    }
}

impl MailLog {
    /// A log beside `store`: held when the store is this process's memory alone.
    pub(super) fn new(store: Arc<dyn Store>) -> Self {
        let kept = if store.durability() == Durability::Memory && store.cluster().is_none() {
            Kept::Held(Mutex::new(SortedDeque::default()))
        } else {
            Kept::Stored(store)
        };
        Self::with(kept)
    }

    fn with(kept: Kept) -> Self {
        Self {
            kept,
            pending: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Hands `message`, delivered, to the writer. A send takes one lock briefly, whatever
    /// the log holds: ordering and writing are the writer's work, done in batches.
    pub(super) fn append(&self, message: Arc<Message>) {
        let waiting = {
            let mut pending = lock(&self.pending);
            if pending.len() >= MAX_PENDING {
                return;
            }
            pending.push((message.id.as_u128(), message));
            pending.len()
        };
        if waiting == LOG_QUEUE {
            self.wake.notify_one();
        }
    }

    /// What wakes the writer early.
    pub(super) fn writer_wake(&self) -> &tokio::sync::Notify {
        &self.wake
    }

    /// Adds the messages handed over so far, in id order (so each lands after the last in
    /// the log's order, not amid it), [`LOG_BATCH`] at a time.
    pub(super) async fn flush(&self) -> Result<(), MailError> {
        let mut pending = std::mem::take(&mut *lock(&self.pending));
        pending.sort_unstable_by_key(|(id, _)| *id);
        for chunk in pending.chunks(LOG_BATCH) {
            match &self.kept {
                Kept::Held(held) => {
                    let mut held = lock(held);
                    for (id, message) in chunk {
                        held.insert(*id, Arc::clone(message));
                    }
                }
                Kept::Stored(store) => {
                    let mut batch = Batch::new();
                    for (_, message) in chunk {
                        // The message as composed: a recipient that reads its copy changes
                        // its own.
                        batch.put(Table::Mail, log_key(&message.id), codec::encode(&**message));
                    }
                    store::commit(&**store, batch).await?;
                }
            }
        }
        Ok(())
    }

    /// Message `id`, if the log holds it.
    pub(super) fn get(&self, id: u128) -> Result<Option<Arc<Message>>, MailError> {
        match &self.kept {
            Kept::Held(held) => Ok(lock(held).get(&id).cloned()),
            Kept::Stored(store) => match store.get(Table::Mail, &log_key(&Uuid::from_u128(id)))? {
                Some(bytes) => Ok(Some(Arc::new(codec::decode(Table::Mail, &bytes)?))),
                None => Ok(None),
            },
        }
    }

    /// Visits the messages from id `start` on, in id order, until `visit` says stop. A held
    /// log is read [`STEP`] messages at a time, so sends do not wait for the visits.
    pub(super) fn scan_from(
        &self,
        start: u128,
        visit: &mut dyn FnMut(u128, Arc<Message>) -> bool,
    ) -> Result<(), MailError> {
        match &self.kept {
            Kept::Held(held) => {
                let mut from = start;
                loop {
                    let step: Vec<(u128, Arc<Message>)> = lock(held)
                        .iter_from(&from)
                        .take(STEP)
                        .map(|(id, message)| (*id, Arc::clone(message)))
                        .collect();
                    let Some(&(last, _)) = step.last() else {
                        return Ok(());
                    };
                    let full = step.len() == STEP;
                    for (id, message) in step {
                        if !visit(id, message) {
                            return Ok(());
                        }
                    }
                    match last.checked_add(1) {
                        Some(next) if full => from = next,
                        _ => return Ok(()),
                    }
                }
            }
            Kept::Stored(store) => {
                let mut failed = None;
                store.scan_from(Table::Mail, &[], &start_key(start), &mut |key, value| {
                    let Some(id) = logged_id(key) else {
                        return true;
                    };
                    match codec::decode::<Message>(Table::Mail, value) {
                        Ok(message) => visit(id, Arc::new(message)),
                        Err(err) => {
                            failed = Some(err);
                            false
                        }
                    }
                })?;
                match failed {
                    Some(err) => Err(err.into()),
                    None => Ok(()),
                }
            }
        }
    }

    /// Removes the messages with ids below `end`; how many.
    pub(super) async fn remove_before(&self, end: u128) -> Result<usize, MailError> {
        let mut removed = 0;
        match &self.kept {
            Kept::Held(held) => loop {
                let gone = {
                    let mut held = lock(held);
                    let gone = held.pop_front_before(&end, STEP);
                    held.shrink_sparse(0);
                    gone
                };
                removed += gone.len();
                if gone.len() < STEP {
                    return Ok(removed);
                }
            },
            Kept::Stored(store) => {
                let end = start_key(end);
                loop {
                    let mut batch = Batch::new();
                    store.scan(Table::Mail, &[], &mut |key, _| {
                        let old = key < end.as_slice() && batch.len() < STEP;
                        if old {
                            batch.delete(Table::Mail, key.to_vec());
                        }
                        old
                    })?;
                    if batch.is_empty() {
                        return Ok(removed);
                    }
                    removed += batch.len();
                    store::commit(&**store, batch).await?;
                }
            }
        }
    }

    /// Whether the log holds message `id`.
    pub(super) fn contains(&self, id: u128) -> Result<bool, MailError> {
        match &self.kept {
            Kept::Held(held) => Ok(lock(held).get(&id).is_some()),
            Kept::Stored(store) => Ok(store
                .get(Table::Mail, &log_key(&Uuid::from_u128(id)))?
                .is_some()),
        }
    }

    /// Adds `messages` at once (not through the writer).
    pub(super) async fn add_all(&self, messages: Vec<Message>) -> Result<(), MailError> {
        match &self.kept {
            Kept::Held(held) => {
                let mut held = lock(held);
                for message in messages {
                    held.insert(message.id.as_u128(), Arc::new(message));
                }
                Ok(())
            }
            Kept::Stored(store) => {
                let mut batch = Batch::new();
                for message in &messages {
                    batch.put(Table::Mail, log_key(&message.id), codec::encode(message));
                }
                Ok(store::commit(&**store, batch).await?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::ids::first_id_at;
    use super::super::super::{AgentId, DeliveryState, Priority};
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn log_keys_sort_as_their_ids_and_give_them_back() {
        // Made by hand: `new_message_id` at a future time would move the process's id
        // clock for every other test.
        let mut ids: Vec<Uuid> = [0u64, 1, 1023, 1024, 5_000_000, 1_800_000_000_000]
            .iter()
            .flat_map(|&ms| {
                let first = first_id_at(ms);
                [first, Uuid::from_u128(first.as_u128() | 0xffff_ffff)]
            })
            .collect();
        ids.sort();
        let keys: Vec<Vec<u8>> = ids.iter().map(log_key).collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
        for (id, key) in ids.iter().zip(&keys) {
            assert_eq!(logged_id(key), Some(id.as_u128()));
        }
        assert_eq!(logged_id(b"short"), None);
    }

    fn message(id: u128) -> Arc<Message> {
        let id = Uuid::from_u128(id);
        Arc::new(Message {
            id,
            from: AgentId::parse("pm").unwrap(),
            to: "dev".into(),
            subject: format!("s{}", id.as_u128() & 0xffff).into(),
            body: "b".into(),
            payload: None,
            thread: id,
            reply_to: None,
            priority: Priority::Normal,
            created_ms: 7,
            expires_ms: None,
            state: DeliveryState::Delivered,
            read_ms: None,
            acked_ms: None,
            trace: None,
        })
    }

    /// Both kinds of log give back what was added, in id order, across steps of a scan,
    /// and remove what is older than a given id.
    #[tokio::test]
    async fn held_and_stored_logs_agree() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let held = MailLog::new(Arc::clone(&store));
        assert!(matches!(held.kept, Kept::Held(_)));
        let stored = MailLog::with(Kept::Stored(store));
        let base = first_id_at(1_000_000).as_u128();
        // A little out of order, as concurrent sends log, and more than a step.
        let mut ids: Vec<u128> = (0..(STEP as u128 * 2 + 10))
            .map(|i| base + (i << 64))
            .collect();
        ids.swap(3, 4);
        ids.swap(1500, 1499);
        for log in [&held, &stored] {
            for &id in &ids {
                log.append(message(id));
            }
            log.flush().await.unwrap();
            let mut seen = Vec::new();
            log.scan_from(ids[5], &mut |id, m| {
                assert_eq!(m.id.as_u128(), id);
                seen.push(id);
                true
            })
            .unwrap();
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            assert_eq!(
                seen,
                sorted[5..],
                "every message from the start on, in order"
            );
            let mut first_two = Vec::new();
            log.scan_from(0, &mut |id, _| {
                first_two.push(id);
                first_two.len() < 2
            })
            .unwrap();
            assert_eq!(first_two, sorted[..2]);
            assert_eq!(log.get(ids[7]).unwrap().unwrap().id.as_u128(), ids[7]);
            assert!(log.contains(ids[9]).unwrap());
            assert!(!log.contains(base + 1).unwrap());
            let removed = log.remove_before(sorted[STEP + 3]).await.unwrap();
            assert_eq!(removed, STEP + 3);
            assert!(!log.contains(sorted[STEP + 2]).unwrap());
            assert!(log.get(sorted[STEP + 3]).unwrap().is_some());
            log.add_all(vec![Arc::unwrap_or_clone(message(base + 5))])
                .await
                .unwrap();
            assert!(log.contains(base + 5).unwrap());
        }
    }
}
