//! The result cache: for tools declared deterministic (`cache_ttl` in config), a result is
//! reused for the same tool, session and canonical arguments until its time to live passes
//! or the session's context changes. Only JSON calls are cached (typed Rust calls get the
//! tool's own, uncopyable output).

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rustc_hash::FxBuildHasher;
use serde_json::Value;
use tokio::time::Instant;

/// Entries kept at most; past it, expired entries are dropped and new ones not kept.
const CAPACITY: usize = 16_384;

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    tool: Arc<str>,
    session: Option<Arc<str>>,
    digest: u64,
}

struct Entry {
    value: Arc<Value>,
    expires: Instant,
    /// The session's context generation when the result was made.
    generation: u64,
}

/// Cached results.
#[derive(Default)]
pub struct ResultCache {
    entries: DashMap<Key, Entry, FxBuildHasher>,
}

impl ResultCache {
    /// The cached result, if it is still fresh and the context has not changed since.
    pub fn get(
        &self,
        tool: &Arc<str>,
        session: Option<&Arc<str>>,
        digest: u64,
        generation: u64,
    ) -> Option<Arc<Value>> {
        let key = Key {
            tool: Arc::clone(tool),
            session: session.cloned(),
            digest,
        };
        let fresh = {
            let entry = self.entries.get(&key)?;
            (entry.expires > Instant::now() && entry.generation == generation)
                .then(|| Arc::clone(&entry.value))
        };
        if fresh.is_none() {
            self.entries.remove(&key);
        }
        fresh
    }

    /// Keeps a result for `ttl`.
    pub fn put(
        &self,
        tool: &Arc<str>,
        session: Option<&Arc<str>>,
        digest: u64,
        generation: u64,
        ttl: Duration,
        value: Arc<Value>,
    ) {
        let now = Instant::now();
        if self.entries.len() >= CAPACITY {
            self.entries.retain(|_, e| e.expires > now);
            if self.entries.len() >= CAPACITY {
                return;
            }
        }
        self.entries.insert(
            Key {
                tool: Arc::clone(tool),
                session: session.cloned(),
                digest,
            },
            Entry {
                value,
                expires: now + ttl,
                generation,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_die_with_a_context_change() {
        let cache = ResultCache::default();
        let t: Arc<str> = Arc::from("t");
        let s: Arc<str> = Arc::from("s");
        cache.put(
            &t,
            Some(&s),
            1,
            7,
            Duration::from_secs(10),
            Arc::new(json!(1)),
        );
        assert_eq!(cache.get(&t, Some(&s), 1, 7).as_deref(), Some(&json!(1)));
        assert!(cache.get(&t, None, 1, 7).is_none(), "another session");
        assert!(cache.get(&t, Some(&s), 2, 7).is_none(), "other arguments");
        assert!(
            cache.get(&t, Some(&s), 1, 8).is_none(),
            "the context changed"
        );
        assert!(
            cache.get(&t, Some(&s), 1, 7).is_none(),
            "a stale entry is gone"
        );
        cache.put(
            &t,
            Some(&s),
            1,
            7,
            Duration::from_secs(10),
            Arc::new(json!(1)),
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(cache.get(&t, Some(&s), 1, 7).is_none(), "expired");
    }
}
