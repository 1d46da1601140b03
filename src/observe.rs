//! What a running server tells the tools people already watch it with: Prometheus metrics
//! (`GET /metrics` on the HTTP listener, OpenMetrics text).
//!
//! [`Metrics`] follows the runtime's event stream ([`crate::events`]) on its own task and
//! aggregates it (calls by tool and outcome, their latency, restarts, breakers, messages,
//! agents connected); a scrape adds what is read at that moment (agents registered, tools).
//! It never slows a call: the stream is a bounded broadcast, and events the aggregator
//! misses are counted (`guildhall_events_missed_total`).

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::events::ToolEvent;
use crate::runtime::Runtime;

/// The dashboard: one page, its script and styles inline, served at `/` by the HTTP
/// listener. It reads `/api/status` and follows `/events`.
pub const DASHBOARD_HTML: &str = include_str!("observe/dashboard.html");

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    /// `ok`, `denied`, or the failure's kind (`tool_error`, `crashed`, `timeout`, …).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
}

fn latency() -> Histogram {
    // 50 µs to about 52 s, doubling.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

/// A runtime's metrics, aggregated from its events while the value lives.
pub struct Metrics {
    registry: Mutex<Registry>,
    runtime: crate::runtime::WeakRuntime,
    agents: Gauge,
    tools: Gauge,
    _aggregating: DropGuard,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Starts following `runtime`'s events. Must be called within a Tokio runtime.
    pub fn start(runtime: &Runtime) -> Arc<Self> {
        let mut registry = Registry::default();
        let calls = Family::<CallLabels, Counter>::default();
        let durations =
            Family::<ToolLabels, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        let restarts = Family::<ToolLabels, Counter>::default();
        let breakers = Family::<ToolLabels, Gauge>::default();
        let messages = Counter::<u64>::default();
        let deliveries = Counter::<u64>::default();
        let connected = Gauge::<i64>::default();
        let missed = Counter::<u64>::default();
        let agents = Gauge::<i64>::default();
        let tools = Gauge::<i64>::default();
        registry.register(
            "guildhall_calls",
            "Tool calls ended, by tool and outcome (ok, denied, or the failure's kind)",
            calls.clone(),
        );
        registry.register(
            "guildhall_call_duration_seconds",
            "Duration of the tool calls that succeeded",
            durations.clone(),
        );
        registry.register(
            "guildhall_tool_restarts",
            "Restarts of a tool's actors by their supervisor",
            restarts.clone(),
        );
        registry.register(
            "guildhall_breaker_open",
            "Whether a tool's circuit breaker is open (1) or closed (0)",
            breakers.clone(),
        );
        registry.register("guildhall_messages", "Messages sent", messages.clone());
        registry.register(
            "guildhall_message_deliveries",
            "Copies of sent messages delivered to recipients",
            deliveries.clone(),
        );
        registry.register(
            "guildhall_agents_connected",
            "Agents with at least one live connection",
            connected.clone(),
        );
        registry.register(
            "guildhall_events_missed",
            "Runtime events the metrics aggregator missed by falling behind",
            missed.clone(),
        );
        registry.register("guildhall_agents", "Agents registered", agents.clone());
        registry.register("guildhall_tools", "Tools registered", tools.clone());

        let stop = CancellationToken::new();
        let mut events = runtime.governance().events();
        let until = stop.clone();
        tokio::spawn(async move {
            let mut seen_missed = 0;
            loop {
                let event = tokio::select! {
                    () = until.cancelled() => return,
                    event = events.next() => event,
                };
                let Some(event) = event else { return };
                if events.missed() > seen_missed {
                    missed.inc_by(events.missed() - seen_missed);
                    seen_missed = events.missed();
                }
                let tool_labels = |tool: &str| ToolLabels {
                    tool: tool.to_owned(),
                };
                let call = |tool: &str, outcome: &str| CallLabels {
                    tool: tool.to_owned(),
                    outcome: outcome.to_owned(),
                };
                match event {
                    ToolEvent::Completed {
                        tool, duration_us, ..
                    } => {
                        calls.get_or_create(&call(&tool, "ok")).inc();
                        durations
                            .get_or_create(&tool_labels(&tool))
                            .observe(duration_us as f64 / 1e6);
                    }
                    ToolEvent::Failed { tool, kind, .. } => {
                        calls.get_or_create(&call(&tool, kind)).inc();
                    }
                    ToolEvent::Denied { tool, .. } => {
                        calls.get_or_create(&call(&tool, "denied")).inc();
                    }
                    ToolEvent::Restarted { tool, .. } => {
                        restarts.get_or_create(&tool_labels(&tool)).inc();
                    }
                    ToolEvent::CircuitOpened { tool } => {
                        breakers.get_or_create(&tool_labels(&tool)).set(1);
                    }
                    ToolEvent::CircuitClosed { tool } => {
                        breakers.get_or_create(&tool_labels(&tool)).set(0);
                    }
                    ToolEvent::Mailed { recipients, .. } => {
                        messages.inc();
                        deliveries.inc_by(recipients as u64);
                    }
                    ToolEvent::AgentConnected { .. } => {
                        connected.inc();
                    }
                    ToolEvent::AgentLeft { .. } => {
                        connected.dec();
                    }
                    _ => {}
                }
            }
        });
        Arc::new(Self {
            registry: Mutex::new(registry),
            runtime: runtime.downgrade(),
            agents,
            tools,
            _aggregating: stop.drop_guard(),
        })
    }

    /// The metrics as OpenMetrics text (Prometheus reads it), with the agents and tools
    /// counted now.
    pub fn render(&self) -> String {
        if let Some(runtime) = self.runtime.upgrade() {
            self.agents
                .set(i64::try_from(runtime.agents().len()).unwrap_or(i64::MAX));
            self.tools
                .set(i64::try_from(runtime.tools().len()).unwrap_or(i64::MAX));
        }
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

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
