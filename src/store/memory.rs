use std::collections::BTreeMap;
use std::hash::BuildHasher;

use rustc_hash::{FxBuildHasher, FxHashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Batch, Done, Durability, Store, StoreError, StoreStats, Table, Write};

const SHARDS: usize = 16;

/// One table's entries, grouped by the key's part before its first 0 byte (a mailbox's
/// recipient). Each group is a hash map keyed by the whole key, so a write is two hash
/// lookups however much the store holds; a scan of a group sorts what it finds (scans are
/// rare: a mailbox starting, a listing of read messages). Keys without a 0 byte (agent ids)
/// live in the ordered `flat`.
#[derive(Debug, Default)]
struct TableMap {
    groups: FxHashMap<Vec<u8>, FxHashMap<Vec<u8>, Vec<u8>>>,
    flat: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Splits `key` into its group and the rest (from the 0 byte on); `None` for a flat key.
fn split(key: &[u8]) -> Option<(&[u8], &[u8])> {
    key.iter().position(|&b| b == 0).map(|i| key.split_at(i))
}

impl TableMap {
    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) {
        match split(&key) {
            Some((group, _)) => match self.groups.get_mut(group) {
                Some(map) => {
                    map.insert(key, value);
                }
                None => {
                    let group = group.to_vec();
                    let mut map = FxHashMap::default();
                    map.insert(key, value);
                    self.groups.insert(group, map);
                }
            },
            None => {
                self.flat.insert(key, value);
            }
        }
    }

    fn remove(&mut self, key: &[u8]) {
        match split(key) {
            Some((group, _)) => {
                if let Some(map) = self.groups.get_mut(group) {
                    map.remove(key);
                    if map.is_empty() {
                        self.groups.remove(group);
                    }
                }
            }
            None => {
                self.flat.remove(key);
            }
        }
    }

    fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        match split(key) {
            Some((group, _)) => self.groups.get(group)?.get(key),
            None => self.flat.get(key),
        }
    }

    /// Entries whose key starts with `prefix` and is at least `start`, unsorted.
    fn collect(&self, prefix: &[u8], start: &[u8], out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
        let matching = |(k, v): (&Vec<u8>, &Vec<u8>)| {
            (k.starts_with(prefix) && k.as_slice() >= start).then(|| (k.clone(), v.clone()))
        };
        match split(prefix) {
            Some((group, _)) => {
                if let Some(map) = self.groups.get(group) {
                    out.extend(map.iter().filter_map(matching));
                }
            }
            None => {
                let from: &[u8] = start.max(prefix);
                out.extend(
                    self.flat
                        .range::<[u8], _>((
                            std::ops::Bound::Included(from),
                            std::ops::Bound::Unbounded,
                        ))
                        .map_while(matching),
                );
                for (group, map) in &self.groups {
                    if group.starts_with(prefix) {
                        out.extend(map.iter().filter_map(matching));
                    }
                }
            }
        }
    }
}

type Tables = [TableMap; Table::ALL.len()];

/// A store that keeps everything in memory: for tests, benchmarks and throwaway runs.
/// Commits complete at once.
///
/// Keys are sharded by their group (the part before the first 0 byte: a mailbox's
/// recipient), so writers to different mailboxes rarely meet on a lock. A batch locks the
/// shards it touches in index order and applies atomically.
#[derive(Debug)]
pub struct MemoryStore {
    shards: [Mutex<Tables>; SHARDS],
    batches: AtomicU64,
    writes: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
            batches: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }
}

fn key_of(write: &Write) -> &[u8] {
    match write {
        Write::Put { key, .. } | Write::Delete { key, .. } => key,
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn shard_of(&self, key: &[u8]) -> usize {
        let group = split(key).map_or(key, |(group, _)| group);
        // Keys are the runtime's own (agent ids), not an attacker's: a fast hash will do.
        // The high bits of an Fx hash are its best mixed.
        (FxBuildHasher.hash_one(group) >> (64 - SHARDS.trailing_zeros())) as usize
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Tables> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn apply(&self, batch: Batch) {
        let n = batch.len() as u64;
        let first = batch.writes.first().map(|w| self.shard_of(key_of(w)));
        if let Some(shard) = first
            && batch.writes[1..]
                .iter()
                .all(|w| self.shard_of(key_of(w)) == shard)
        {
            // The common case (one mailbox's writes), without multi-shard bookkeeping.
            let mut tables = self.lock(shard);
            for write in batch.writes {
                apply_one(&mut tables, write);
            }
        } else if n > 0 {
            let shard_per_write: Vec<usize> = batch
                .writes
                .iter()
                .map(|w| self.shard_of(key_of(w)))
                .collect();
            let mut touched = shard_per_write.clone();
            touched.sort_unstable();
            touched.dedup();
            let mut guards: Vec<_> = touched.iter().map(|&i| self.lock(i)).collect();
            for (write, shard) in batch.writes.into_iter().zip(shard_per_write) {
                let at = touched.binary_search(&shard).unwrap_or(0);
                apply_one(&mut guards[at], write);
            }
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(n, Ordering::Relaxed);
    }
}

fn apply_one(tables: &mut Tables, write: Write) {
    match write {
        Write::Put { table, key, value } => tables[table.index()].insert(key, value),
        Write::Delete { table, key } => tables[table.index()].remove(&key),
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
        Ok(self.lock(self.shard_of(key))[table.index()]
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
            self.lock(self.shard_of(prefix))[table.index()].collect(prefix, start, &mut found);
        } else {
            for i in 0..SHARDS {
                self.lock(i)[table.index()].collect(prefix, start, &mut found);
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
        let batches = self.batches.load(Ordering::Relaxed);
        StoreStats {
            commits: batches,
            batches,
            writes: self.writes.load(Ordering::Relaxed),
        }
    }
}
