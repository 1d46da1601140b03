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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;
use tokio::sync::broadcast;

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
}

/// Where events are published.
#[derive(Debug, Clone)]
pub struct Events {
    tx: broadcast::Sender<ToolEvent>,
    /// Subscribers alive: read on every call, so an atomic rather than the channel's lock.
    listening: Arc<AtomicUsize>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            tx: broadcast::Sender::new(CAPACITY),
            listening: Arc::default(),
        }
    }
}

impl Events {
    /// Publishes the event `make` builds, building it only if someone listens.
    pub fn emit(&self, make: impl FnOnce() -> ToolEvent) {
        if self.has_subscribers() {
            let _ = self.tx.send(make());
        }
    }

    /// Whether anyone listens.
    pub fn has_subscribers(&self) -> bool {
        self.subscribers() > 0
    }

    /// How many listen: one a rendering shared by many watchers.
    pub(crate) fn subscribers(&self) -> usize {
        self.listening.load(Ordering::Acquire)
    }

    /// A new subscriber, seeing events from now on.
    pub fn subscribe(&self) -> EventStream {
        self.listening.fetch_add(1, Ordering::AcqRel);
        EventStream {
            rx: self.tx.subscribe(),
            missed: 0,
            taking: false,
            listening: Arc::clone(&self.listening),
        }
    }
}

/// One subscriber's view of the events.
#[derive(Debug)]
pub struct EventStream {
    rx: broadcast::Receiver<ToolEvent>,
    missed: u64,
    /// The last call returned an event: the stream is busy, so pause before waiting.
    taking: bool,
    listening: Arc<AtomicUsize>,
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.listening.fetch_sub(1, Ordering::AcqRel);
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
        let mut taken = 1;
        while taken < max
            && let Some(event) = self.waiting()
        {
            batch.push(event);
            taken += 1;
        }
        true
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

    /// How many events this subscriber has missed by falling behind.
    pub fn missed(&self) -> u64 {
        self.missed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
