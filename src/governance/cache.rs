//! The result cache: for tools declared deterministic (`cache_ttl` in config), a result is
//! reused for the same tool, session and canonical arguments until its time to live passes
//! or the session's context changes. Only JSON calls are cached (typed Rust calls get the
//! tool's own, uncopyable output).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ToolReply;

/// Entries kept at most; past it, the cache evicts the entries least likely to be asked for
/// again (quick_cache's S3-FIFO), so new results are always kept.
const CAPACITY: usize = 16_384;

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    tool: Arc<str>,
    session: Option<Arc<str>>,
    digest: u64,
}

#[derive(Clone)]
struct Entry {
    reply: Arc<ToolReply>,
    expires: Instant,
    /// The session's context generation when the result was made.
    generation: u64,
}

/// Cached results.
pub struct ResultCache {
    entries: quick_cache::sync::Cache<Key, Entry>,
}

impl Default for ResultCache {
    fn default() -> Self {
        Self {
            entries: quick_cache::sync::Cache::new(CAPACITY),
        }
    }
}

impl ResultCache {
    /// The cached result, if it is still fresh and the context has not changed since.
    pub fn get(
        &self,
        tool: &Arc<str>,
        session: Option<&Arc<str>>,
        digest: u64,
        generation: u64,
    ) -> Option<Arc<ToolReply>> {
        let key = Key {
            tool: Arc::clone(tool),
            session: session.cloned(),
            digest,
        };
        let entry = self.entries.get(&key)?;
        // Time to live is checked here, against tokio's clock (quick_cache has no expiry).
        let fresh = (entry.expires > Instant::now() && entry.generation == generation)
            .then_some(entry.reply);
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
        reply: Arc<ToolReply>,
    ) {
        let now = Instant::now();
        self.entries.insert(
            Key {
                tool: Arc::clone(tool),
                session: session.cloned(),
                digest,
            },
            Entry {
                reply,
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

    fn reply(value: serde_json::Value) -> Arc<ToolReply> {
        Arc::new(ToolReply::new(value))
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_die_with_a_context_change() {
        let cache = ResultCache::default();
        let t: Arc<str> = Arc::from("t");
        let s: Arc<str> = Arc::from("s");
        cache.put(&t, Some(&s), 1, 7, Duration::from_secs(10), reply(json!(1)));
        assert_eq!(
            cache.get(&t, Some(&s), 1, 7).map(|r| r.value.clone()),
            Some(json!(1))
        );
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
        cache.put(&t, Some(&s), 1, 7, Duration::from_secs(10), reply(json!(1)));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(cache.get(&t, Some(&s), 1, 7).is_none(), "expired");
    }

    #[tokio::test]
    async fn a_full_cache_still_keeps_new_results() {
        let cache = ResultCache::default();
        let t: Arc<str> = Arc::from("t");
        let hour = Duration::from_secs(3600);
        for digest in 0..(CAPACITY as u64 * 2) {
            cache.put(&t, None, digest, 0, hour, reply(json!(digest)));
        }
        let newest = CAPACITY as u64 * 2;
        cache.put(&t, None, newest, 0, hour, reply(json!("new")));
        assert_eq!(
            cache.get(&t, None, newest, 0).map(|r| r.value.clone()),
            Some(json!("new"))
        );
    }
}
