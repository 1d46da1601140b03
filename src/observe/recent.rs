//! The latest events, kept for MCP clients to read as the resource `guildhall://events`
//! ([`RecentEvents`]): a stateless reader (the 2026 protocol era has no sessions) asks for
//! what came after the last event it saw, and a subscriber is told when more came.
//!
//! One ring per server, [`KEPT`] events long, fed by one subscriber of the event stream;
//! each reader sees only its share ([`visible_to`]), so the ring remembers who made each
//! call. It runs from the first time a client asks for events until the server stops: a
//! server nobody asks pays nothing for it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, DropGuard};

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
    /// Events after the reader's `after` that left the ring before this read (of anyone's).
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
            loop {
                let batch = tokio::select! {
                    () = until.cancelled() => return,
                    batch = events.next_batch(KEPT) => batch,
                };
                let Some(batch) = batch else { return };
                let at_ms = crate::time::now_ms();
                let mut ring = kept.lock().unwrap_or_else(PoisonError::into_inner);
                for event in batch {
                    ring.push(event, at_ms);
                }
                drop(ring);
                changes.changed(&Subject::Events);
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
        let first = ring.kept.front().map_or(ring.last + 1, |k| k.seq);
        let (chosen, missed): (Vec<&Kept>, u64) = match after {
            None => {
                let mut latest: Vec<&Kept> =
                    ring.kept.iter().rev().filter(visible).take(limit).collect();
                latest.reverse();
                (latest, 0)
            }
            Some(after) => (
                ring.kept
                    .iter()
                    .filter(|k| k.seq > after)
                    .filter(visible)
                    .take(limit)
                    .collect(),
                first.saturating_sub(after.saturating_add(1)),
            ),
        };
        // A full page ends at its last event; otherwise every kept event was looked at.
        let next = match chosen.last() {
            Some(last) if chosen.len() == limit => last.seq,
            _ => ring.last.max(after.unwrap_or(0)),
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
}
