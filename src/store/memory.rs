use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rustc_hash::{FxBuildHasher, FxHashMap};
use smallvec::SmallVec;

use crate::sorted::SortedDeque;

use super::{Batch, Done, Durability, Store, StoreError, StoreStats, Table, Write};

/// Enough that two writers rarely meet on a lock.
const SHARDS: usize = 64;

/// A group (an agent or session id), inline when short: hashing and comparing it reads no
/// other memory.
type Short = SmallVec<[u8; 24]>;

/// The rest of a key after its group (a 0 byte and a message id: 17 bytes), ordered as its
/// bytes are. Up to 24 bytes it is kept as three big-endian words, so that an ordered map
/// compares integers rather than calling `memcmp` at every step of its search.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rest {
    /// Zero-padded words and the real length: with the padding, comparing the words and
    /// then the lengths orders keys as comparing their bytes does.
    Inline([u64; 3], u8),
    Long(Box<[u8]>),
}

const INLINE: usize = 24;

impl Rest {
    fn new(bytes: &[u8]) -> Self {
        if bytes.len() > INLINE {
            return Rest::Long(bytes.into());
        }
        let mut padded = [0u8; INLINE];
        padded[..bytes.len()].copy_from_slice(bytes);
        let word =
            |i: usize| u64::from_be_bytes(padded[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        // At most 24, so the length fits.
        Rest::Inline([word(0), word(1), word(2)], bytes.len() as u8)
    }

    /// Calls `f` with the bytes (on the stack when inline).
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Rest::Inline(words, len) => {
                let mut bytes = [0u8; INLINE];
                for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
                    chunk.copy_from_slice(&word.to_be_bytes());
                }
                f(&bytes[..usize::from(*len)])
            }
            Rest::Long(bytes) => f(bytes),
        }
    }
}

impl Ord for Rest {
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (Rest::Inline(a, la), Rest::Inline(b, lb)) => a.cmp(b).then(la.cmp(lb)),
            _ => self.with_bytes(|a| other.with_bytes(|b| a.cmp(b))),
        }
    }
}

impl PartialOrd for Rest {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One table's entries, grouped by the key's part before its first 0 byte (a mailbox's
/// recipient). A write finds its group with one hash lookup, however much the store holds.
/// Within a group, entries are kept in the order of the rest of the key, in one buffer:
/// message ids and log versions grow, so most inserts append and most removals (read
/// messages) pop the front. A hash map scattered entries over cold memory, and a B-tree's
/// search walked whole nodes; either made the store a large part of a delivery. Keys without
/// a 0 byte (agent ids) live in the ordered `flat`.
///
/// A group that empties keeps its buffer for a while: a mailbox drained and filled again
/// would otherwise regrow it from nothing each time. Empty groups are dropped once there are
/// many of them, so deregistered agents' buffers do not pile up.
#[derive(Debug, Default)]
struct TableMap {
    groups: FxHashMap<Short, SortedDeque<Rest, Vec<u8>>>,
    /// How many groups are empty.
    empty: usize,
    flat: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Empty groups kept (per shard), at least; more when the shard has more groups in use.
const EMPTY_GROUPS_KEPT: usize = 32;

/// Slots a group keeps however few entries it holds (its buffer is not given back below
/// this): 14 KiB at most per group.
const GROUP_SLOTS_KEPT: usize = 256;

/// Splits `key` into its group and the rest (from the 0 byte on); `None` for a flat key.
fn split(key: &[u8]) -> Option<(&[u8], &[u8])> {
    key.iter().position(|&b| b == 0).map(|i| key.split_at(i))
}

impl TableMap {
    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) {
        match split(&key) {
            Some((group, rest)) => {
                let rest = Rest::new(rest);
                match self.groups.get_mut(group) {
                    Some(map) => {
                        if map.is_empty() {
                            self.empty -= 1;
                        }
                        map.insert(rest, value);
                    }
                    None => {
                        let mut map = SortedDeque::default();
                        map.insert(rest, value);
                        self.groups.insert(Short::from_slice(group), map);
                    }
                }
            }
            None => {
                self.flat.insert(key, value);
            }
        }
    }

    fn remove(&mut self, key: &[u8]) {
        let Some((group, rest)) = split(key) else {
            self.flat.remove(key);
            return;
        };
        let Some(map) = self.groups.get_mut(group) else {
            return;
        };
        if map.remove(&Rest::new(rest)).is_none() {
            return;
        }
        map.shrink_sparse(GROUP_SLOTS_KEPT);
        if map.is_empty() {
            self.empty += 1;
            if self.empty > EMPTY_GROUPS_KEPT.max(self.groups.len() / 2) {
                self.groups.retain(|_, map| !map.is_empty());
                self.empty = 0;
            }
        }
    }

    fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        match split(key) {
            Some((group, rest)) => self.groups.get(group)?.get(&Rest::new(rest)),
            None => self.flat.get(key),
        }
    }

    /// Entries whose key starts with `prefix` and is at least `start`, unsorted.
    fn collect(&self, prefix: &[u8], start: &[u8], out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
        // A group's entries are in key order: the scan starts at `start` and ends at the first
        // key past the prefix (keys that share a prefix sort together).
        let mut visit_group = |group: &[u8], map: &SortedDeque<Rest, Vec<u8>>| {
            let entries: Box<dyn Iterator<Item = _>> = match start.strip_prefix(group) {
                Some(rest) if start >= prefix => Box::new(map.iter_from(&Rest::new(rest))),
                _ => Box::new(map.iter()),
            };
            for (rest, value) in entries {
                let mut key = Vec::with_capacity(group.len() + INLINE);
                key.extend_from_slice(group);
                rest.with_bytes(|bytes| key.extend_from_slice(bytes));
                if key.as_slice() < start {
                    continue;
                }
                if !key.starts_with(prefix) {
                    if key.as_slice() > prefix {
                        break;
                    }
                    continue;
                }
                out.push((key, value.clone()));
            }
        };
        match split(prefix) {
            Some((group, _)) => {
                if let Some(map) = self.groups.get(group) {
                    visit_group(group, map);
                }
            }
            None => {
                for (group, map) in &self.groups {
                    if group.starts_with(prefix) {
                        visit_group(group, map);
                    }
                }
                let from: &[u8] = start.max(prefix);
                out.extend(
                    self.flat
                        .range::<[u8], _>((
                            std::ops::Bound::Included(from),
                            std::ops::Bound::Unbounded,
                        ))
                        .map_while(|(k, v)| k.starts_with(prefix).then(|| (k.clone(), v.clone()))),
                );
            }
        }
    }
}

/// One shard: its part of every table, and what it has applied (counted here, under the
/// lock, rather than in counters every core writes).
#[derive(Debug, Default)]
struct Shard {
    tables: [TableMap; Table::ALL.len()],
    batches: u64,
    writes: u64,
}

impl Shard {
    fn apply(&mut self, write: Write) {
        self.writes += 1;
        match write {
            Write::Put { table, key, value } | Write::Insert { table, key, value } => {
                self.tables[table.index()].insert(key, value);
            }
            Write::PutShared { table, key, value } => {
                self.tables[table.index()].insert(key, value.to_vec());
            }
            Write::Delete { table, key } => self.tables[table.index()].remove(&key),
        }
    }
}

/// A store that keeps everything in memory: for tests, benchmarks and throwaway runs.
/// Commits complete at once.
///
/// Keys are sharded by their group (the part before the first 0 byte: a mailbox's
/// recipient), so writers to different mailboxes rarely meet on a lock. A batch locks the
/// shards it touches in index order and applies atomically.
#[derive(Debug)]
pub struct MemoryStore {
    shards: [Mutex<Shard>; SHARDS],
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn shard_of(key: &[u8]) -> usize {
        let group = split(key).map_or(key, |(group, _)| group);
        // Keys are the runtime's own (agent ids), not an attacker's: a fast hash will do.
        // The high bits of an Fx hash are its best mixed.
        (FxBuildHasher.hash_one(group) >> (64 - SHARDS.trailing_zeros())) as usize
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn apply(&self, batch: Batch) {
        let shards: SmallVec<[usize; 2]> = batch
            .writes()
            .iter()
            .map(|w| Self::shard_of(w.key()))
            .collect();
        let Some(&first) = shards.first() else {
            self.lock(0).batches += 1;
            return;
        };
        if shards.iter().all(|&s| s == first) {
            // The common case (one mailbox's writes), without multi-shard bookkeeping.
            let mut shard = self.lock(first);
            shard.batches += 1;
            for write in batch.into_writes() {
                shard.apply(write);
            }
            return;
        }
        let mut touched = shards.clone();
        touched.sort_unstable();
        touched.dedup();
        let mut guards: SmallVec<[_; 4]> = touched.iter().map(|&i| self.lock(i)).collect();
        guards[0].batches += 1;
        for (write, shard) in batch.into_writes().zip(shards) {
            let at = touched.binary_search(&shard).unwrap_or(0);
            guards[at].apply(write);
        }
    }
}

impl Store for MemoryStore {
    fn submit(&self, batch: Batch, done: Done) {
        self.apply(batch);
        done(Ok(()));
    }

    fn try_commit(&self, batch: Batch) -> Result<Result<(), StoreError>, Batch> {
        self.apply(batch);
        Ok(Ok(()))
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock(Self::shard_of(key)).tables[table.index()]
            .get(key)
            .cloned())
    }

    fn scan_from(
        &self,
        table: Table,
        prefix: &[u8],
        start: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        // A prefix that names a group lies in one shard; any other may span them all.
        let mut found = Vec::new();
        if split(prefix).is_some() {
            self.lock(Self::shard_of(prefix)).tables[table.index()]
                .collect(prefix, start, &mut found);
        } else {
            for i in 0..SHARDS {
                self.lock(i).tables[table.index()].collect(prefix, start, &mut found);
            }
        }
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (k, v) in &found {
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn durability(&self) -> Durability {
        Durability::Memory
    }

    fn stats(&self) -> StoreStats {
        let (mut batches, mut writes) = (0, 0);
        for i in 0..SHARDS {
            let shard = self.lock(i);
            batches += shard.batches;
            writes += shard.writes;
        }
        StoreStats {
            commits: batches,
            batches,
            writes,
            ..StoreStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// A key: a group of one letter (or none: a flat key), a 0 byte and up to 40 bytes, so
    /// inline and long rests meet, as do rests that are prefixes of each other.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::option::of(prop::sample::select(vec![b'a', b'b'])),
            prop::collection::vec(prop::sample::select(vec![0u8, 1, 0x7f, 0xff]), 0..40),
        )
            .prop_map(|(group, rest)| match group {
                Some(g) => [vec![g, 0], rest].concat(),
                None => [
                    b"f".to_vec(),
                    rest.into_iter().filter(|&b| b != 0).collect(),
                ]
                .concat(),
            })
    }

    fn scan(store: &MemoryStore, prefix: &[u8], start: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut seen = Vec::new();
        store
            .scan_from(Table::Inbox, prefix, start, &mut |k, v| {
                seen.push((k.to_vec(), v.to_vec()));
                true
            })
            .expect("memory scans do not fail");
        seen
    }

    /// Groups that empty keep their buffers only up to a bound, and a purge loses nothing.
    #[test]
    fn empty_groups_are_purged_without_losing_entries() {
        let mut table = TableMap::default();
        let key = |g: usize, k: u8| [format!("g{g}").into_bytes(), vec![0, k]].concat();
        let groups = 5 * EMPTY_GROUPS_KEPT;
        for g in 0..groups {
            table.insert(key(g, 1), vec![1]);
            table.insert(key(g, 2), vec![2]);
        }
        // Every group empties but the multiples of 7, which keep entry 2.
        let live = groups.div_ceil(7);
        for g in 0..groups {
            table.remove(&key(g, 1));
            if g % 7 != 0 {
                table.remove(&key(g, 2));
            }
            let empty = table.groups.values().filter(|m| m.is_empty()).count();
            assert_eq!(table.empty, empty, "the count of empty groups is exact");
            assert!(empty <= EMPTY_GROUPS_KEPT.max(table.groups.len() / 2));
        }
        assert!(
            table.groups.len() < live + EMPTY_GROUPS_KEPT,
            "empty groups were purged"
        );
        for g in 0..groups {
            let expected = (g % 7 == 0).then_some(vec![2]);
            assert_eq!(table.get(&key(g, 2)).cloned(), expected);
        }
        // A purged group comes back on its next write.
        table.insert(key(1, 3), vec![3]);
        assert_eq!(table.get(&key(1, 3)), Some(&vec![3]));
    }

    proptest! {
        /// Whatever the keys, the store reads, and scans in key order, as an ordered map of
        /// whole keys does.
        #[test]
        fn reads_and_scans_as_an_ordered_map(
            writes in prop::collection::vec((key(), any::<bool>()), 1..60),
            probe in key(),
        ) {
            let store = MemoryStore::new();
            let mut model = BTreeMap::new();
            for (i, (key, put)) in writes.into_iter().enumerate() {
                let mut batch = Batch::new();
                if put {
                    let value = i.to_be_bytes().to_vec();
                    batch.put(Table::Inbox, key.clone(), value.clone());
                    model.insert(key, value);
                } else {
                    batch.delete(Table::Inbox, key.clone());
                    model.remove(&key);
                }
                store.try_commit(batch).expect("applies at once").expect("no error");
            }
            for (key, value) in &model {
                prop_assert_eq!(store.get(Table::Inbox, key).expect("get"), Some(value.clone()));
            }
            prop_assert_eq!(store.get(Table::Inbox, &probe).expect("get"), model.get(&probe).cloned());
            for prefix in [&b""[..], b"a", b"a\0", b"a\0\x01", b"b\0", b"f", b"f\x01"] {
                for start in [prefix, &probe[..]] {
                    let expected: Vec<_> = model
                        .range(start.to_vec()..)
                        .filter(|(k, _)| k.starts_with(prefix))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    if start.starts_with(prefix) {
                        prop_assert_eq!(scan(&store, prefix, start), expected);
                    }
                }
            }
        }
    }
}
