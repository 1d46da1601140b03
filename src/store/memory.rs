use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use super::{Batch, Done, Durability, Store, StoreError, StoreStats, Table, Write};

/// A store that keeps everything in memory: for tests, benchmarks and throwaway runs.
/// Batches apply atomically under one lock and complete at once.
#[derive(Debug, Default)]
pub struct MemoryStore {
    tables: RwLock<[BTreeMap<Vec<u8>, Vec<u8>>; Table::ALL.len()]>,
    batches: AtomicU64,
    writes: AtomicU64,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn apply(&self, batch: Batch) {
        let n = batch.len() as u64;
        let mut tables = self.tables.write().unwrap_or_else(PoisonError::into_inner);
        for write in batch.writes {
            match write {
                Write::Put { table, key, value } => {
                    tables[table.index()].insert(key, value);
                }
                Write::Delete { table, key } => {
                    tables[table.index()].remove(&key);
                }
            }
        }
        drop(tables);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(n, Ordering::Relaxed);
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
        let tables = self.tables.read().unwrap_or_else(PoisonError::into_inner);
        Ok(tables[table.index()].get(key).cloned())
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let tables = self.tables.read().unwrap_or_else(PoisonError::into_inner);
        for (k, v) in tables[table.index()].range(prefix.to_vec()..) {
            if !k.starts_with(prefix) || !visit(k, v) {
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
