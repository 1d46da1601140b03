//! [`Tally`]: the events that are not a call's own, counted as they are emitted, for the
//! metrics (restarts and breakers by tool, messages, deliveries, context batches, the
//! sandboxes' egress connections and refusals).
//!
//! Counted where they are emitted rather than by a subscriber of the stream: a subscriber
//! receives every event, the calls' too, and so costs every call the stream's hand-over
//! while a server answers `/metrics` whether anyone scrapes it or not; and a subscriber that
//! falls behind loses counts. Here an event is counted when emitted, always, and calls are
//! counted by governance's call counters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::ToolEvent;

/// Counts of the events that are not a call's own, once [`start`](Self::start)ed.
#[derive(Debug, Default)]
pub struct Tally {
    counting: AtomicBool,
    messages: AtomicU64,
    deliveries: AtomicU64,
    context_batches: AtomicU64,
    egress_allowed: AtomicU64,
    egress_refused: AtomicU64,
    sandbox_refusals: AtomicU64,
    /// By tool (or proxied server): rare events, so one lock.
    tools: Mutex<BTreeMap<Arc<str>, ToolTally>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct ToolTally {
    restarts: u64,
    breaker_open: bool,
}

impl Tally {
    /// Events are counted from now on.
    pub(crate) fn start(&self) {
        self.counting.store(true, Ordering::Release);
    }

    /// Whether events are counted (read on every emit).
    #[inline]
    pub(crate) fn counting(&self) -> bool {
        self.counting.load(Ordering::Relaxed)
    }

    /// Counts `event`.
    pub(crate) fn add(&self, event: &ToolEvent) {
        let tool = |tool: &Arc<str>, change: &dyn Fn(&mut ToolTally)| {
            let mut tools = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
            change(tools.entry(Arc::clone(tool)).or_default());
        };
        match event {
            ToolEvent::Mailed { recipients, .. } => {
                self.messages.fetch_add(1, Ordering::Relaxed);
                self.deliveries
                    .fetch_add(*recipients as u64, Ordering::Relaxed);
            }
            ToolEvent::ContextChanged { .. } => {
                self.context_batches.fetch_add(1, Ordering::Relaxed);
            }
            ToolEvent::Egress { allowed, .. } => {
                let counter = if *allowed {
                    &self.egress_allowed
                } else {
                    &self.egress_refused
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            ToolEvent::SandboxRefused { .. } => {
                self.sandbox_refusals.fetch_add(1, Ordering::Relaxed);
            }
            ToolEvent::Restarted { tool: name, .. } => tool(name, &|t| t.restarts += 1),
            ToolEvent::CircuitOpened { tool: name } => tool(name, &|t| t.breaker_open = true),
            ToolEvent::CircuitClosed { tool: name } => tool(name, &|t| t.breaker_open = false),
            ToolEvent::Invoked { .. }
            | ToolEvent::Completed { .. }
            | ToolEvent::Failed { .. }
            | ToolEvent::Denied { .. }
            | ToolEvent::TasksChanged { .. }
            // Read at the scrape instead, whenever counting started.
            | ToolEvent::AgentConnected { .. }
            | ToolEvent::AgentLeft { .. } => {}
        }
    }

    /// The counts now.
    pub fn read(&self) -> TallyReading {
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let tools = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        TallyReading {
            messages: count(&self.messages),
            deliveries: count(&self.deliveries),
            context_batches: count(&self.context_batches),
            egress_allowed: count(&self.egress_allowed),
            egress_refused: count(&self.egress_refused),
            sandbox_refusals: count(&self.sandbox_refusals),
            restarts: tools
                .iter()
                .filter(|(_, t)| t.restarts > 0)
                .map(|(name, t)| (Arc::clone(name), t.restarts))
                .collect(),
            breakers: tools
                .iter()
                .map(|(name, t)| (Arc::clone(name), t.breaker_open))
                .collect(),
        }
    }
}

/// What [`Tally::read`] found.
#[derive(Debug, Clone, Default)]
pub struct TallyReading {
    /// Messages sent.
    pub messages: u64,
    /// Copies of them delivered.
    pub deliveries: u64,
    /// Context batches committed.
    pub context_batches: u64,
    /// Connections the sandboxes' egress proxies let through.
    pub egress_allowed: u64,
    /// Connections they refused.
    pub egress_refused: u64,
    /// Refusals of a sandbox that a command's result named.
    pub sandbox_refusals: u64,
    /// Restarts by tool (or proxied server), those with any.
    pub restarts: Vec<(Arc<str>, u64)>,
    /// Whether each tool's breaker is open, for the tools whose breaker ever changed.
    pub breakers: Vec<(Arc<str>, bool)>,
}
