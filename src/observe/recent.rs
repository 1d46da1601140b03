//! The latest events, kept for MCP clients to read as the resource `guildhall://events`
//! ([`RecentEvents`]): a stateless reader (the 2026 protocol era has no sessions) asks for
//! what came after the last event it saw, and a subscriber is told when more came.
//!
//! One ring per server, [`KEPT`] events long, fed by one subscriber of the event stream;
//! each reader sees only its share ([`visible_to`]), so the ring remembers who made each
//! call. It runs from the first time a client asks for events until the server stops: a
//! server nobody asks pays nothing for it. It keeps pace as a feed's rendering does
//! ([`Pace`]): past 10,000 events a second it keeps a sample, so that one client's read
//! does not cost every later call the hand-over of its event for the server's life. The
//! events numbered but not kept are told to readers as missed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::pace::{Batch, Pace};
use super::watching::{Callers, visible_to};
use crate::changes::{Changes, Subject};
use crate::events::{EventStream, ToolEvent};

/// Events the ring keeps.
pub const KEPT: usize = 1_000;

/// One kept event.
struct Kept {
    seq: u64,
    at_ms: u64,
    caller: Option<Arc<str>>,
    event: ToolEvent,
}

#[derive(Default)]
struct Ring {
    kept: VecDeque<Kept>,
    /// The number of the last event taken (events are numbered from 1).
    last: u64,
    /// Callers of the calls in flight.
    callers: Callers,
}

impl Ring {
    /// Numbers `lost` events that were not taken from the stream (sampled away, or lost
    /// falling behind): readers are told of the gap.
    fn skip(&mut self, lost: u64) {
        self.last += lost;
    }

    fn push(&mut self, event: ToolEvent, at_ms: u64) {
        let caller = self.callers.of(&event, |_| true);
        self.last += 1;
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(Kept {
            seq: self.last,
            at_ms,
            caller,
            event,
        });
    }
}

/// What one read of `guildhall://events` found.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsPage {
    /// The reader's events, oldest first, each with `seq` and `at_ms`.
    pub events: Vec<Value>,
    /// Where the next read starts (`guildhall://events?after=NEXT`): the last event looked at.
    pub next: u64,
    /// Events after the reader's `after`, up to `next`, that the reader cannot see because
    /// they left the ring before this read or were never kept (sampled away); of anyone's.
    pub missed: u64,
}

/// The latest events of a runtime, kept while the value lives.
pub struct RecentEvents {
    ring: Arc<Mutex<Ring>>,
    _stop: DropGuard,
}

impl std::fmt::Debug for RecentEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentEvents").finish_non_exhaustive()
    }
}

impl RecentEvents {
    /// Keeps the latest of `events`, reporting [`Subject::Events`] to `changes` after each
    /// batch taken. Must be called inside a tokio runtime.
    pub fn start(mut events: EventStream, changes: Arc<Changes>) -> Self {
        let ring = Arc::new(Mutex::new(Ring::default()));
        let stop = CancellationToken::new();
        let (kept, until) = (Arc::clone(&ring), stop.clone());
        tokio::spawn(async move {
            let (mut pace, mut told) = (Pace::new(std::time::Instant::now()), 0);
            loop {
                let batch = tokio::select! {
                    () = until.cancelled() => return,
                    batch = events.next_batch(KEPT) => batch,
                };
                let Some(batch) = batch else { return };
                let started = std::time::Instant::now();
                let at_ms = crate::time::now_ms();
                let taken = batch.len() as u64;
                {
                    let mut ring = kept.lock().unwrap_or_else(PoisonError::into_inner);
                    ring.skip(events.missed() - told);
                    for event in batch {
                        ring.push(event, at_ms);
                    }
                }
                told = events.missed();
                changes.changed(&Subject::Events);
                let now = std::time::Instant::now();
                let done = Batch {
                    taken,
                    busy: now - started,
                    full: taken == KEPT as u64,
                };
                if let Some(rest) = pace.rest_after(done, now) {
                    tokio::select! {
                        () = until.cancelled() => return,
                        () = events.rest(rest) => {}
                    }
                }
            }
        });
        Self {
            ring,
            _stop: stop.drop_guard(),
        }
    }

    /// What `reader` may see of the kept events: after event number `after` (the `next` of
    /// its last read), or the latest when `None`; at most `limit`.
    pub fn read(&self, reader: &str, after: Option<u64>, limit: usize) -> EventsPage {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let visible = |k: &&Kept| visible_to(reader, &k.event, k.caller.as_deref());
        let (chosen, next, missed): (Vec<&Kept>, u64, u64) = match after {
            None => {
                let mut latest: Vec<&Kept> =
                    ring.kept.iter().rev().filter(visible).take(limit).collect();
                latest.reverse();
                (latest, ring.last, 0)
            }
            Some(after) => {
                let (mut chosen, mut kept) = (Vec::new(), 0);
                for k in ring.kept.iter().filter(|k| k.seq > after) {
                    kept += 1;
                    if visible(&k) {
                        chosen.push(k);
                        if chosen.len() == limit {
                            break;
                        }
                    }
                }
                // A full page ends at its last event; otherwise every kept event was
                // looked at. Between `after` and there, numbered events not kept are
                // missed.
                let next = match chosen.last() {
                    Some(last) if chosen.len() == limit => last.seq,
                    _ => ring.last.max(after),
                };
                (chosen, next, (next - after) - kept)
            }
        };
        let events = chosen
            .into_iter()
            .map(|k| {
                let mut value = serde_json::to_value(&k.event).unwrap_or_default();
                value["seq"] = json!(k.seq);
                value["at_ms"] = json!(k.at_ms);
                value
            })
            .collect();
        EventsPage {
            events,
            next,
            missed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Events;

    fn mailed(from: &str, to: &str) -> ToolEvent {
        ToolEvent::Mailed {
            id: uuid::Uuid::nil(),
            thread: uuid::Uuid::nil(),
            from: Arc::from(from),
            to: Arc::from(to),
            subject: Arc::from(""),
            recipients: 1,
        }
    }

    /// Waits (bounded) until the ring has taken event number `last`.
    async fn taken(recent: &RecentEvents, last: u64) {
        for _ in 0..500 {
            if recent.ring.lock().unwrap().last >= last {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("the ring never took event {last}");
    }

    #[tokio::test]
    async fn a_reader_pages_through_its_share_and_is_told_what_left_the_ring() {
        let events = Events::default();
        let recent = RecentEvents::start(events.subscribe(), Arc::default());
        // 1,500 events, every third one to `a`: the first 500 leave the ring.
        for i in 0..1_500 {
            events.emit(|| mailed("x", if i % 3 == 0 { "a" } else { "b" }));
        }
        taken(&recent, 1_500).await;

        let page = recent.read("a", Some(0), 100);
        assert_eq!(page.missed, 500, "events 1..=500 left the ring");
        assert_eq!(page.events.len(), 100);
        assert_eq!(page.events[0]["seq"], 502, "the first of a's still kept");
        assert_eq!(page.next, 799, "a full page ends at its last event");
        let rest = recent.read("a", Some(page.next), 1_000);
        assert_eq!(rest.missed, 0);
        assert_eq!(rest.events.len(), 233);
        assert_eq!(rest.next, 1_500, "every kept event was looked at");

        let latest = recent.read("a", None, 2);
        let seqs: Vec<_> = latest.events.iter().map(|e| e["seq"].clone()).collect();
        assert_eq!(seqs, [1_495, 1_498]);
        assert!(recent.read("nobody", Some(0), 10).events.is_empty());
    }

    #[test]
    fn a_reader_is_told_of_the_events_numbered_but_not_kept() {
        let mut ring = Ring::default();
        for _ in 0..3 {
            ring.push(mailed("x", "a"), 0);
        }
        ring.skip(5);
        ring.push(mailed("x", "b"), 0);
        ring.push(mailed("x", "a"), 0);
        let recent = RecentEvents {
            ring: Arc::new(Mutex::new(ring)),
            _stop: CancellationToken::new().drop_guard(),
        };
        let page = recent.read("a", Some(1), 10);
        let seqs: Vec<_> = page.events.iter().map(|e| e["seq"].clone()).collect();
        assert_eq!(seqs, [2, 3, 10], "b's event 9 is not a's to see");
        assert_eq!((page.missed, page.next), (5, 10), "4..=8 were skipped");
        let page = recent.read("a", Some(1), 2);
        assert_eq!(
            (page.missed, page.next),
            (0, 3),
            "the page ends before the gap"
        );
    }

    #[tokio::test]
    async fn past_its_rate_the_ring_keeps_a_sample_and_numbers_every_event() {
        let events = Events::default();
        let recent = RecentEvents::start(events.subscribe(), Arc::default());
        // 100 events a millisecond for a while, ten times the rate kept, then one at a
        // time until the ring has numbered them all (the last is taken after its rest).
        let (mut emitted, mut built) = (0, 0);
        for _ in 0..300 {
            for _ in 0..100 {
                events.emit(|| {
                    built += 1;
                    mailed("x", "a")
                });
            }
            emitted += 100;
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let last = loop {
            events.emit(|| mailed("x", "a"));
            emitted += 1;
            tokio::time::sleep(super::super::pace::MOST_REST).await;
            let last = recent.ring.lock().unwrap().last;
            if last == emitted {
                break last;
            }
            assert!(
                emitted < 30_100,
                "the ring never caught up: {last} of {emitted}"
            );
        };
        let page = recent.read("a", Some(0), usize::MAX);
        assert_eq!(page.next, last);
        assert_eq!(
            page.events.len() as u64 + page.missed,
            last,
            "each shown or told"
        );
        assert!(
            built < 30_000,
            "the ring rested, and calls built nothing meanwhile: {built} built"
        );
    }
}
