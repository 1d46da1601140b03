//! Watches each call's deadline and fires its cancellation token when it passes.
//!
//! Deadlines are watched by one [`Sweeper`] per runtime rather than a tokio timer per call.
//! A call adds itself to its thread's shard when it starts and removes itself (O(1), by the
//! index it keeps in its context) when it finishes, so the common case touches one
//! uncontended lock on a thread-local shard. The sweeper ticks every `resolution` while calls
//! are in flight, times out overdue ones by cancelling their token and waking their caller,
//! and parks when nothing is in flight. Registering and removing a tokio timer per call cost
//! more than the rest of the pipeline; the price is that a timeout fires up to one tick late.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::Waker;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::CallContext;

const SHARDS: usize = 16;
const UNWATCHED: u64 = u64::MAX;

/// Watches the deadlines of calls in flight.
#[derive(Debug)]
pub struct Sweeper {
    shards: [Mutex<Vec<CallContext>>; SHARDS],
    idle: AtomicBool,
    wake: Notify,
    resolution: Duration,
}

impl Sweeper {
    /// A sweeper that will tick every `resolution` while calls are in flight, once started.
    pub fn new(resolution: Duration) -> Arc<Self> {
        Arc::new(Self {
            shards: Default::default(),
            idle: AtomicBool::new(false),
            wake: Notify::new(),
            resolution,
        })
    }

    /// Starts the sweeping task on the current tokio runtime. It stops when the last handle
    /// to the sweeper is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(self: &Arc<Self>) {
        tokio::spawn(sweep(Arc::downgrade(self)));
    }

    /// Starts watching `ctx`'s deadline: at it, the call is cancelled and whoever
    /// [waits](Self::wake_at_deadline) for it is woken. Every watched call must be
    /// [unwatched](Self::unwatch) when it ends.
    pub fn watch(&self, ctx: &CallContext) {
        let shard = local_shard();
        let mut entries = self.lock(shard);
        ctx.set_deadline_slot(encode(shard, entries.len()));
        entries.push(ctx.clone());
        drop(entries);
        if self.idle.swap(false, Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Stops watching `ctx` (O(1)); a no-op for a call not watched, or already timed out.
    pub fn unwatch(&self, ctx: &CallContext) {
        let slot = ctx.deadline_slot();
        if slot == UNWATCHED {
            return;
        }
        let (shard, _) = decode(slot);
        let mut entries = self.lock(shard);
        // Re-read under the lock: another removal may have moved this entry.
        let slot = ctx.deadline_slot();
        if slot != UNWATCHED {
            remove(&mut entries, shard, decode(slot).1);
        }
    }

    /// Has `waker` woken when `ctx`'s deadline fires. Only the last waker registered for a
    /// call is kept, as with [`AtomicWaker`](futures::task::AtomicWaker).
    #[inline]
    pub fn wake_at_deadline(&self, ctx: &CallContext, waker: &Waker) {
        ctx.register_deadline_waiter(waker);
    }

    /// Times out overdue calls; returns how many remain in flight.
    fn sweep_once(&self, now: Instant) -> usize {
        let mut pending = 0;
        for shard in 0..SHARDS {
            let mut entries = self.lock(shard);
            let mut i = 0;
            while i < entries.len() {
                if now >= entries[i].deadline() {
                    let expired = remove(&mut entries, shard, i);
                    expired.expire();
                } else {
                    i += 1;
                }
            }
            pending += entries.len();
        }
        pending
    }

    fn is_empty(&self) -> bool {
        (0..SHARDS).all(|shard| self.lock(shard).is_empty())
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Vec<CallContext>> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Swap-removes entry `i`, fixing the index of the entry moved into its place.
fn remove(entries: &mut Vec<CallContext>, shard: usize, i: usize) -> CallContext {
    let removed = entries.swap_remove(i);
    removed.set_deadline_slot(UNWATCHED);
    if let Some(moved) = entries.get(i) {
        moved.set_deadline_slot(encode(shard, i));
    }
    removed
}

fn encode(shard: usize, index: usize) -> u64 {
    ((shard as u64) << 48) | index as u64
}

fn decode(slot: u64) -> (usize, usize) {
    ((slot >> 48) as usize, (slot & ((1 << 48) - 1)) as usize)
}

/// Each thread adds calls to its own shard, so the lock stays uncontended and in cache.
fn local_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        s.get()
    })
}

async fn sweep(weak: Weak<Sweeper>) {
    loop {
        let Some(sweeper) = weak.upgrade() else {
            return;
        };
        if sweeper.sweep_once(Instant::now()) > 0 {
            let tick = sweeper.resolution;
            drop(sweeper);
            tokio::time::sleep(tick).await;
            continue;
        }
        // Park until a call is watched. Publishing `idle` before re-checking the shards means
        // a concurrent `watch` either sees `idle` and notifies, or is seen here.
        sweeper.idle.store(true, Ordering::SeqCst);
        if !sweeper.is_empty() {
            sweeper.idle.store(false, Ordering::SeqCst);
            continue;
        }
        let notified = sweeper.wake.notified();
        // Hold only a weak reference while parked, so the runtime can drop the sweeper.
        let sweeper = Arc::downgrade(&sweeper);
        notified.await;
        drop(sweeper);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn overdue_calls_are_cancelled_and_finished_ones_dropped() {
        let sweeper = Sweeper::new(Duration::from_millis(1));
        sweeper.start();
        let short = CallContext::new(None, None, Duration::from_millis(10), None);
        let long = CallContext::new(None, None, Duration::from_secs(10), None);
        let done = CallContext::new(None, None, Duration::from_millis(10), None);
        sweeper.watch(&short);
        sweeper.watch(&done);
        sweeper.watch(&long);
        // Removing the middle entry moves the last one; its index must follow.
        sweeper.unwatch(&done);
        assert_eq!(decode(long.deadline_slot()).1, 1);

        tokio::time::sleep(Duration::from_millis(12)).await;
        assert!(short.is_cancelled());
        assert!(!long.is_cancelled());
        assert!(!done.is_cancelled(), "finished calls are never cancelled");
        assert_eq!(sweeper.sweep_once(Instant::now()), 1);
        sweeper.unwatch(&long);
        sweeper.unwatch(&short);
        assert!(sweeper.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_sweeper_wakes_for_a_new_call() {
        let sweeper = Sweeper::new(Duration::from_millis(1));
        sweeper.start();
        // Let it find nothing and park.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let ctx = CallContext::new(None, None, Duration::from_millis(3), None);
        sweeper.watch(&ctx);
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(ctx.is_cancelled());
    }
}
