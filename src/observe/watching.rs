//! What one watcher sees of the event stream: [`EventFilter`] (what an agent may see) and
//! [`Watching`] (events as the lines `guildhall watch` and `/events` send).

use std::sync::Arc;

use crate::events::ToolEvent;

/// Which events one subscriber may see. The operator (no agent) sees all. An agent sees its
/// own calls (and how they ended), the mail it sent or that was addressed to it by id,
/// agents connecting and leaving (the directory is readable by every agent), context
/// sessions changing (every agent may read every session), and tools' restarts and breakers
/// (the shared services' health); not other agents' calls or mail.
#[derive(Debug, Default)]
pub struct EventFilter {
    agent: Option<Arc<str>>,
    /// The agent's calls in flight: their ends name only the call.
    own_calls: std::collections::HashSet<uuid::Uuid>,
}

impl EventFilter {
    /// The filter of `agent` (`None`: the operator, who sees everything).
    pub fn new(agent: Option<Arc<str>>) -> Self {
        Self {
            agent,
            own_calls: std::collections::HashSet::new(),
        }
    }

    /// Whether the subscriber may see `event`.
    pub fn admits(&mut self, event: &ToolEvent) -> bool {
        let Some(me) = self.agent.as_deref() else {
            return true;
        };
        match event {
            ToolEvent::Invoked { call_id, agent, .. } => {
                let mine = agent.as_deref() == Some(me);
                if mine {
                    self.own_calls.insert(*call_id);
                }
                mine
            }
            ToolEvent::Completed { call_id, .. }
            | ToolEvent::Failed { call_id, .. }
            | ToolEvent::Denied { call_id, .. } => self.own_calls.remove(call_id),
            ToolEvent::Mailed { from, to, .. } => &**from == me || &**to == me,
            _ => true,
        }
    }
}

/// Events as a watcher shows them (`guildhall watch`, `/events`): each admitted event as
/// JSON with `at_ms`, preceded by `{"event": "missed", "count": N}` when the watcher fell
/// behind and lost N.
#[derive(Debug)]
pub struct Watching {
    events: crate::EventStream,
    missed: u64,
    filter: EventFilter,
}

impl Watching {
    /// Watches `events`, showing what `filter` admits.
    pub fn new(events: crate::EventStream, filter: EventFilter) -> Self {
        Self {
            events,
            missed: 0,
            filter,
        }
    }

    /// The next lines to show (one or two); `None` once the runtime is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is taken only when its lines are returned.
    pub async fn next(&mut self) -> Option<Vec<serde_json::Value>> {
        loop {
            let event = self.events.next().await?;
            let mut lines = Vec::with_capacity(2);
            let missed = self.events.missed();
            if missed > self.missed {
                lines.push(serde_json::json!({ "event": "missed", "count": missed - self.missed }));
                self.missed = missed;
            }
            if self.filter.admits(&event) {
                let mut value = serde_json::to_value(&event).unwrap_or_default();
                value["at_ms"] = crate::time::now_ms().into();
                lines.push(value);
            }
            if !lines.is_empty() {
                return Some(lines);
            }
        }
    }
}
