//! [`Ledger`]: what each agent has read, so a write proves its writer saw the file as it is.
//! A read records the content's hash; a write to an existing file goes ahead only if the
//! file still has the hash this agent recorded. Bounded: an entry evicted (the oldest
//! first, past [`CAPACITY`]) only means the agent must read again before it writes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use quick_cache::sync::Cache;

/// Reads remembered at most, across all agents.
const CAPACITY: usize = 100_000;

/// One agent's read of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// XXH3-128 of the whole content.
    pub(crate) hash: u128,
    /// When it was read, in ms since the Unix epoch.
    pub(crate) at_ms: u64,
}

/// What every agent has read.
pub(crate) struct Ledger {
    seen: Cache<(Arc<str>, PathBuf), Seen>,
}

impl Ledger {
    pub(crate) fn new() -> Self {
        Self {
            seen: Cache::new(CAPACITY),
        }
    }

    /// Notes that `agent` has seen `path` with `content`.
    pub(crate) fn record(&self, agent: &Arc<str>, path: PathBuf, content: &[u8]) {
        let seen = Seen {
            hash: hash(content),
            at_ms: crate::time::now_ms(),
        };
        self.seen.insert((Arc::clone(agent), path), seen);
    }

    /// What `agent` last saw of `path`, if it is remembered.
    pub(crate) fn get(&self, agent: &Arc<str>, path: &Path) -> Option<Seen> {
        self.seen.get(&(Arc::clone(agent), path.to_path_buf()))
    }
}

/// The hash a read records and a write compares.
pub(crate) fn hash(content: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(content)
}
