//! [`SharedLines`]: the batches of lines an [`Feed`](super::Feed) renders
//! once, kept for its watchers, and [`Follower`], one watcher's place in them.
//!
//! Kept by events and bytes rather than by count: at a few events a second a batch holds
//! one, and a watcher may fall as far behind as the event stream lets one subscriber.

use std::sync::Arc;

use super::line::{KEPT_BYTES, missed_line, push_line};

/// One batch of lines rendered for every watcher of an operator's feed, and where in the
/// event stream it stands, so that a watcher that fell behind can tell what it lost.
#[derive(Debug)]
pub(super) struct Rendered {
    /// The stream's position (events taken or lost from it) before the batch and after it.
    pub(super) from: u64,
    pub(super) to: u64,
    /// Events lost from the stream that the batch's own `missed` lines tell.
    pub(super) missed: u64,
    pub(super) lines: String,
}

/// Events' worth of batches kept for the watchers of an operator's feed: as many as the
/// event stream keeps for one subscriber, so a watcher may fall as far behind as before.
const KEPT_EVENTS: u64 = crate::events::CAPACITY as u64;

/// The most bytes of lines kept for them, whatever the count (long error messages).
const KEPT_LINES_BYTES: usize = 16 << 20;

/// The batches rendered for the watchers of an operator's feed: the latest, bounded by
/// events and bytes rather than by batches (at a few events a second a batch holds one), and
/// a wake-up for watchers waiting on the next.
#[derive(Debug)]
pub(super) struct SharedLines {
    log: std::sync::Mutex<Log>,
    /// Rung at each batch pushed (and at the end); watchers wait on it and then read the
    /// log, so it carries nothing.
    bell: tokio::sync::watch::Sender<()>,
}

#[derive(Debug, Default)]
struct Log {
    batches: std::collections::VecDeque<Arc<Rendered>>,
    /// The number of the first batch kept.
    first: u64,
    events: u64,
    bytes: usize,
    /// Where the next batch starts in the stream: the last one's end.
    at: u64,
    /// The rendering ended (the runtime is gone): no batch will come.
    closed: bool,
}

impl SharedLines {
    pub(super) fn new() -> Self {
        Self {
            log: std::sync::Mutex::default(),
            bell: tokio::sync::watch::Sender::new(()),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A watcher of the batches from the next one on.
    pub(super) fn follow(self: &Arc<Self>) -> Follower {
        let log = self.log();
        Follower {
            shared: Arc::clone(self),
            bell: self.bell.subscribe(),
            next: log.first + log.batches.len() as u64,
            reached: log.at,
            missed: 0,
            current: None,
            joined: String::new(),
        }
    }

    /// Watchers following.
    pub(super) fn followers(&self) -> usize {
        self.bell.receiver_count()
    }

    /// Adds `batch` for the watchers, letting go of the oldest past the bounds; what it let
    /// go of and nobody else holds comes back, for its memory.
    pub(super) fn push(&self, batch: Rendered) -> Option<Rendered> {
        let mut spare = None;
        let mut log = self.log();
        log.at = batch.to;
        log.events += batch.to - batch.from;
        log.bytes += batch.lines.len();
        log.batches.push_back(Arc::new(batch));
        while log.batches.len() > 1
            && (log.events > KEPT_EVENTS || log.bytes > KEPT_LINES_BYTES)
            && let Some(oldest) = log.batches.pop_front()
        {
            log.first += 1;
            log.events -= oldest.to - oldest.from;
            log.bytes -= oldest.lines.len();
            spare = Arc::try_unwrap(oldest).ok();
        }
        drop(log);
        self.bell.send_replace(());
        spare
    }

    /// No batch will come: watchers end once they have taken those kept.
    pub(super) fn close(&self) {
        self.log().closed = true;
        self.bell.send_replace(());
    }
}

/// A watcher of lines rendered once for many ([`SharedLines`]).
#[derive(Debug)]
pub(super) struct Follower {
    shared: Arc<SharedLines>,
    bell: tokio::sync::watch::Receiver<()>,
    /// The number of the next batch to take.
    next: u64,
    /// The stream's position after the last batch taken (at first, where the batch being
    /// rendered when the watcher came starts).
    reached: u64,
    missed: u64,
    /// The batch being shown, held until the next is asked for.
    current: Option<Arc<Rendered>>,
    /// A batch after a gap: its lines behind the `missed` line that tells the gap.
    joined: String,
}

impl Follower {
    /// As [`Watching::next`](super::Watching::next).
    pub(super) async fn next(&mut self) -> Option<&str> {
        // Let go of the last batch, so its memory can go back to the rendering.
        self.current = None;
        let batch = loop {
            // Marked seen before looking, so a batch pushed after the look wakes the wait.
            self.bell.borrow_and_update();
            {
                let log = self.shared.log();
                // Fell behind past what is kept: on from the oldest kept, the gap shown by
                // its position.
                let next = self.next.max(log.first);
                if let Some(batch) = log.batches.get((next - log.first) as usize) {
                    self.next = next + 1;
                    break Arc::clone(batch);
                }
                if log.closed {
                    return None;
                }
            }
            if self.bell.changed().await.is_err() {
                return None;
            }
        };
        let lost = batch.from.saturating_sub(self.reached);
        self.reached = batch.to;
        self.missed += lost + batch.missed;
        if lost == 0 {
            return Some(&self.current.insert(batch).lines);
        }
        let mut joined = std::mem::take(&mut self.joined).into_bytes();
        if joined.capacity() > KEPT_BYTES {
            joined = Vec::new();
        }
        joined.clear();
        missed_line(lost, &mut joined);
        push_line(&mut joined);
        joined.extend_from_slice(batch.lines.as_bytes());
        self.joined = String::from_utf8(joined).unwrap_or_default();
        Some(&self.joined)
    }

    pub(super) fn missed(&self) -> u64 {
        self.missed
    }
}
