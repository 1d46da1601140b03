//! Runtime events for dashboards, `guildhall watch` and embedders: calls, tools' restarts and
//! breakers, messages sent, agents connecting and leaving.
//!
//! A bounded broadcast: a subscriber that falls behind loses the oldest events and is told
//! how many ([`EventStream::missed`]); the calls never wait for anyone. With no subscriber,
//! emitting costs one atomic load.
//!
//! Events sit in the channel's ring by value, not each in an `Arc` of its own: an event's
//! strings are shared already (`Arc<str>`), so a subscriber's copy costs a few reference
//! counts, while a box per event had made allocating and freeing half of what a subscriber
//! cost the mail it watched (`perf` over `bench mailbox` round trips with one subscriber
//! that only takes the events: `malloc` and `free` about 2,000 of 4,000 added samples).
//!
//! A busy stream wakes its subscriber about once per [`COALESCE`] rather than once per event:
//! after taking a run of events the subscriber pauses that long before waiting again, and an
//! emit into a channel nobody waits on wakes no one. Waking a task per event would cost each
//! call a cross-thread wake-up, which on a loaded machine is most of what watching costs.
//!
//! A subscriber may also rest ([`EventStream::rest`]): take nothing for a while, and lose
//! what comes meanwhile. While every subscriber rests, an emit builds and sends nothing: it
//! counts the event on a counter of its thread's own (`Unsent`), which the subscribers read
//! as missed when they wake. Sending into the ring costs the emitting call more than
//! building the event: its lock, and the slot's old event dropped, are memory another core
//! wrote last.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::broadcast;

mod tally;
pub use tally::{Tally, TallyReading};

/// Events kept for a slow subscriber before the oldest are dropped.
pub(crate) const CAPACITY: usize = 4096;

/// How long a subscriber that just took events lets more gather before it waits again: the
/// most a busy stream adds to an event's lag (watchers are promised 100 ms).
pub const COALESCE: std::time::Duration = std::time::Duration::from_millis(2);

/// Something that happened in the runtime.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolEvent {
    /// A call arrived.
    Invoked {
        /// The call.
        call_id: uuid::Uuid,
        /// The tool.
        tool: Arc<str>,
        /// The caller, if named.
        #[serde(skip_serializing_if = "Option::is_none")]
        agent: Option<Arc<str>>,
        /// The caller's trace, if it named one (as its `traceparent`).
        #[serde(rename = "traceparent", skip_serializing_if = "Option::is_none")]
        trace: Option<guildhall_actors::TraceParent>,
    },
    /// A call returned a result.
    Completed {
        /// The call.
        call_id: uuid::Uuid,
        /// The tool.
        tool: Arc<str>,
        /// How long it took, in microseconds.
        duration_us: u64,
    },
    /// A call failed (a tool error, crash, timeout, open circuit, rate limit...).
    Failed {
        /// The call.
        call_id: uuid::Uuid,
        /// The tool.
        tool: Arc<str>,
        /// The failure's kind (`tool_error`, `crashed`, ...).
        kind: &'static str,
        /// Its message.
        message: String,
    },
    /// Governance refused a call.
    Denied {
        /// The call.
        call_id: uuid::Uuid,
        /// The tool.
        tool: Arc<str>,
        /// Why.
        reason: String,
    },
    /// A tool's actor was restarted by its supervisor. For a proxied MCP server, `tool` is
    /// the server's name (its node in the supervision tree), and so for its breaker's
    /// events: that breaker counts failed starts of its process.
    Restarted {
        /// The tool.
        tool: Arc<str>,
        /// Its restarts so far.
        restarts: u64,
    },
    /// A tool's circuit opened: calls are rejected for a while.
    CircuitOpened {
        /// The tool.
        tool: Arc<str>,
    },
    /// A message was sent: delivered (and, with a durable store, committed) to at least one
    /// recipient.
    Mailed {
        /// The message.
        id: uuid::Uuid,
        /// Its thread.
        thread: uuid::Uuid,
        /// The sender.
        from: Arc<str>,
        /// The address it was sent to (an agent, `role:…`, `children`, `*`, …).
        to: Arc<str>,
        /// Its subject.
        subject: Arc<str>,
        /// How many recipients took it.
        recipients: usize,
    },
    /// An agent's first live connection opened (it was not connected).
    AgentConnected {
        /// The agent.
        agent: Arc<str>,
    },
    /// An agent's last live connection closed.
    AgentLeft {
        /// The agent.
        agent: Arc<str>,
    },
    /// A tool's circuit closed again after a successful probe.
    CircuitClosed {
        /// The tool.
        tool: Arc<str>,
    },
    /// A batch of changes to a context session was committed.
    ContextChanged {
        /// The session.
        session: Arc<str>,
        /// The session's version the batch made.
        version: u64,
        /// Who applied it, if named.
        #[serde(skip_serializing_if = "Option::is_none")]
        author: Option<Arc<str>>,
        /// The keys it changed, in order.
        keys: Vec<String>,
    },
    /// Changes to tasks of the board were committed (ids ascending, each once per commit).
    TasksChanged {
        /// The tasks changed.
        ids: Vec<u64>,
    },
    /// The egress proxy of a sandbox with `network = "proxy"` let a connection through or
    /// refused it.
    Egress {
        /// Whose sandbox asked.
        #[serde(skip_serializing_if = "Option::is_none")]
        agent: Option<Arc<str>>,
        /// The host asked for, as the program named it.
        host: Arc<str>,
        /// Its port.
        port: u16,
        /// Whether the connection was let through.
        allowed: bool,
        /// The `[sandbox.proxy]` entry that allowed it, or why it was refused.
        rule: Arc<str>,
    },
    /// A sandboxed process met a refusal of its sandbox (a path, a host), and its result
    /// said so.
    SandboxRefused {
        /// Whose process it was.
        #[serde(skip_serializing_if = "Option::is_none")]
        agent: Option<Arc<str>>,
        /// The tool that ran it.
        tool: Arc<str>,
        /// The line its result got.
        hint: Arc<str>,
    },
}

/// Where events are published.
#[derive(Debug, Clone)]
pub struct Events {
    tx: broadcast::Sender<ToolEvent>,
    listeners: Arc<Listeners>,
    tally: Arc<Tally>,
}

/// Who listens, read on every call: atomics rather than the channel's lock.
#[derive(Debug, Default)]
struct Listeners {
    /// Subscribers alive.
    alive: AtomicUsize,
    /// Of those, resting: taking nothing for a while.
    resting: AtomicUsize,
    /// Events not sent because every subscriber rested.
    unsent: Unsent,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            tx: broadcast::Sender::new(CAPACITY),
            listeners: Arc::default(),
            tally: Arc::default(),
        }
    }
}

impl Events {
    /// Publishes the event `make` builds, building it only if someone listens and is awake
    /// (see the module's doc on resting).
    /// Counted by the [`tally`](Self::tally) once it started, listened to or not.
    pub fn emit(&self, make: impl FnOnce() -> ToolEvent) {
        if !self.tally.counting() {
            return self.emit_call(make);
        }
        let event = make();
        self.tally.add(&event);
        self.emit_call(|| event);
    }

    /// The counts of the events that are not a call's own, for the metrics.
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Publishes a call's own event (`invoked`, `completed`, `failed`, `denied`), built only
    /// if someone listens and is awake (what [`emit`](Self::emit) does besides counting).
    /// Never tallied: calls are counted by
    /// governance's call counters, so that a call emits nothing while
    /// nobody watches.
    pub(crate) fn emit_call(&self, make: impl FnOnce() -> ToolEvent) {
        let alive = self.subscribers();
        if alive == 0 {
            return;
        }
        if self.listeners.resting.load(Ordering::Acquire) < alive {
            let _ = self.tx.send(make());
        } else {
            self.listeners.unsent.count_one();
        }
    }

    /// Whether anyone listens.
    pub fn has_subscribers(&self) -> bool {
        self.subscribers() > 0
    }

    /// How many listen: one a rendering shared by many watchers.
    pub(crate) fn subscribers(&self) -> usize {
        self.listeners.alive.load(Ordering::Acquire)
    }

    /// A new subscriber, seeing events from now on.
    pub fn subscribe(&self) -> EventStream {
        self.listeners.alive.fetch_add(1, Ordering::AcqRel);
        EventStream {
            rx: self.tx.subscribe(),
            missed: 0,
            taking: false,
            listeners: Arc::clone(&self.listeners),
        }
    }
}

/// Counters of a few shards, each on its own cache line, that threads add to each its own:
/// an emit while everyone rests then writes only memory its core holds already, where one
/// shared counter would move between the cores on every call.
#[derive(Debug, Default)]
struct Unsent([Padded; UNSENT_SHARDS]);

const UNSENT_SHARDS: usize = 8;

#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Unsent {
    fn count_one(&self) {
        thread_local! {
            static SHARD: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) % UNSENT_SHARDS
            };
        }
        let shard = SHARD.with(|shard| *shard);
        self.0[shard].0.fetch_add(1, Ordering::Relaxed);
    }

    fn total(&self) -> u64 {
        self.0
            .iter()
            .map(|shard| shard.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// One subscriber's view of the events.
#[derive(Debug)]
pub struct EventStream {
    rx: broadcast::Receiver<ToolEvent>,
    missed: u64,
    /// The last call returned an event: the stream is busy, so pause before waiting.
    taking: bool,
    listeners: Arc<Listeners>,
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.listeners.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A subscriber's rest under way: ends it, counting what went unsent meanwhile as missed,
/// however the rest ends (a dropped rest included).
struct Resting<'a> {
    listeners: &'a Listeners,
    unsent_before: u64,
    missed: &'a mut u64,
}

impl Drop for Resting<'_> {
    fn drop(&mut self) {
        self.listeners.resting.fetch_sub(1, Ordering::AcqRel);
        // An emit that saw everyone resting just before this may count its event only
        // after this read: that one goes untold. Rests are taken under load, where the
        // count is of thousands.
        *self.missed += self.listeners.unsent.total() - self.unsent_before;
    }
}

impl EventStream {
    /// The next event; `None` once the runtime is gone. Events dropped because this
    /// subscriber fell behind are skipped and counted.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call loses no event.
    pub async fn next(&mut self) -> Option<ToolEvent> {
        loop {
            if let Some(event) = self.waiting() {
                return Some(event);
            }
            if std::mem::take(&mut self.taking) {
                // Busy: let the next events gather rather than be woken for each.
                tokio::time::sleep(COALESCE).await;
                continue;
            }
            match self.rx.recv().await {
                Ok(event) => {
                    self.taking = true;
                    return Some(event);
                }
                Err(broadcast::error::RecvError::Lagged(n)) => self.missed += n,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The next events: waits for the first, then takes what else is already here,
    /// `max` in all at most; `None` once the runtime is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: events are taken only once the first is here, and then without waiting.
    pub async fn next_batch(&mut self, max: usize) -> Option<Vec<ToolEvent>> {
        let mut batch = Vec::new();
        self.next_batch_into(max, &mut batch).await.then_some(batch)
    }

    /// [`next_batch`](Self::next_batch) into `batch` (appended to), so that a subscriber can
    /// reuse one; `false` once the runtime is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: events are taken only once the first is here, and then without waiting.
    pub async fn next_batch_into(&mut self, max: usize, batch: &mut Vec<ToolEvent>) -> bool {
        let Some(first) = self.next().await else {
            return false;
        };
        batch.push(first);
        self.take_waiting(max.saturating_sub(1), batch);
        true
    }

    /// Takes into `batch` (appended to) the events already here, `max` at most, without
    /// waiting.
    pub(crate) fn take_waiting(&mut self, max: usize, batch: &mut Vec<ToolEvent>) {
        let mut taken = 0;
        while taken < max
            && let Some(event) = self.waiting()
        {
            batch.push(event);
            taken += 1;
        }
    }

    /// An event already here, without waiting (`None` also once the runtime is gone, which
    /// the next wait then tells).
    fn waiting(&mut self) -> Option<ToolEvent> {
        loop {
            match self.rx.try_recv() {
                Ok(event) => {
                    self.taking = true;
                    return Some(event);
                }
                Err(broadcast::error::TryRecvError::Lagged(n)) => self.missed += n,
                Err(_) => return None,
            }
        }
    }

    /// How many events this subscriber has missed by falling behind or resting.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Takes nothing for `how_long`, losing what comes meanwhile (counted in
    /// [`missed`](Self::missed)). While every subscriber rests, emitting costs the calls
    /// next to nothing; events already in the stream's ring stay there to be taken.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped rest ends there, its losses counted.
    pub(crate) async fn rest(&mut self, how_long: Duration) {
        let unsent_before = self.listeners.unsent.total();
        self.listeners.resting.fetch_add(1, Ordering::AcqRel);
        let _resting = Resting {
            listeners: &self.listeners,
            unsent_before,
            missed: &mut self.missed,
        };
        tokio::time::sleep(how_long).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restarted(restarts: u64) -> ToolEvent {
        ToolEvent::Restarted {
            tool: Arc::from("t"),
            restarts,
        }
    }

    #[tokio::test]
    async fn while_every_subscriber_rests_events_are_not_built_and_count_as_missed() {
        let events = Events::default();
        let mut resting = events.subscribe();
        events.emit(|| restarted(0));
        let mut built = 0;
        tokio::join!(resting.rest(Duration::from_millis(20)), async {
            tokio::task::yield_now().await;
            for i in 1..=5 {
                events.emit(|| {
                    built += 1;
                    restarted(i)
                });
            }
        });
        events.emit(|| restarted(6));
        assert_eq!(built, 0, "nobody awake: nothing built");
        assert_eq!(resting.next().await, Some(restarted(0)), "the ring kept it");
        assert_eq!(resting.next().await, Some(restarted(6)));
        assert_eq!(resting.missed(), 5);
    }

    #[tokio::test]
    async fn beside_an_awake_subscriber_a_resting_one_loses_nothing_the_ring_keeps() {
        let events = Events::default();
        let (mut resting, mut awake) = (events.subscribe(), events.subscribe());
        tokio::join!(resting.rest(Duration::from_millis(20)), async {
            tokio::task::yield_now().await;
            events.emit(|| restarted(1));
        });
        assert_eq!(awake.next().await, Some(restarted(1)));
        assert_eq!(resting.next().await, Some(restarted(1)));
        assert_eq!(resting.missed(), 0);
    }

    #[tokio::test]
    async fn a_rest_cut_short_ends_there() {
        let events = Events::default();
        let mut stream = events.subscribe();
        tokio::select! {
            biased;
            () = stream.rest(Duration::from_secs(3_600)) => unreachable!("an hour passed"),
            () = tokio::task::yield_now() => {}
        }
        events.emit(|| restarted(1));
        let next = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
        assert_eq!(next, Ok(Some(restarted(1))), "awake again");
        assert_eq!(stream.missed(), 0);
    }

    fn invoked() -> ToolEvent {
        ToolEvent::Invoked {
            call_id: uuid::Uuid::nil(),
            tool: Arc::from("t"),
            agent: None,
            trace: None,
        }
    }

    #[test]
    fn the_tally_counts_what_is_emitted_once_started_with_or_without_subscribers() {
        let events = Events::default();
        let mailed = |recipients| ToolEvent::Mailed {
            id: uuid::Uuid::nil(),
            thread: uuid::Uuid::nil(),
            from: Arc::from("a"),
            to: Arc::from("b"),
            subject: Arc::from("s"),
            recipients,
        };
        events.emit(|| mailed(1));
        assert_eq!(events.tally().read().messages, 0, "not counting yet");
        events.tally().start();
        events.emit(|| mailed(3));
        let _subscriber = events.subscribe();
        events.emit(|| restarted(1));
        events.emit(|| restarted(2));
        events.emit(|| ToolEvent::CircuitOpened {
            tool: Arc::from("t"),
        });
        events.emit_call(invoked);
        let read = events.tally().read();
        assert_eq!((read.messages, read.deliveries), (1, 3));
        assert_eq!(read.restarts, [(Arc::from("t"), 2)]);
        assert_eq!(read.breakers, [(Arc::from("t"), true)]);
    }

    #[tokio::test]
    async fn a_slow_subscriber_loses_old_events_and_counts_them() {
        let events = Events::default();
        let mut built = 0;
        events.emit(|| {
            built += 1;
            ToolEvent::CircuitOpened {
                tool: Arc::from("t"),
            }
        });
        assert_eq!(built, 0, "nobody listens: nothing is built");
        let mut slow = events.subscribe();
        let total = CAPACITY as u64 + 10;
        for i in 0..total {
            events.emit(|| ToolEvent::Restarted {
                tool: Arc::from("t"),
                restarts: i,
            });
        }
        let first = slow.next().await.expect("event");
        assert_eq!(
            first,
            ToolEvent::Restarted {
                tool: Arc::from("t"),
                restarts: 10
            }
        );
        assert_eq!(slow.missed(), 10);
    }
}
