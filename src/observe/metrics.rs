//! Prometheus metrics (`GET /metrics` on the HTTP listener, OpenMetrics text).
//!
//! [`Metrics`] follows the runtime's event stream ([`crate::events`]) on its own task and
//! aggregates it (calls by tool and outcome, their latency, restarts, breakers, messages,
//! context batches, agents connected). A scrape adds what is read at that moment: agents
//! and tools registered, sessions, mailboxes and sessions active, each agent's unread mail
//! (a passive mailbox is counted in the store, not woken), MCP connections, and the store's
//! commits (each one fsync on a durable store) with the time they took.
//! It never slows a call: the stream is a bounded broadcast, and events the aggregator
//! misses are counted (`guildhall_events_missed_total`).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::events::ToolEvent;
use crate::runtime::{Runtime, WeakRuntime};
use crate::store::StoreStats;

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
    runtime: WeakRuntime,
    /// What the last scrape read, encoded by the registry's collector.
    reading: Arc<Mutex<Reading>>,
    /// The server's live MCP connections, when it counts them.
    connections: OnceLock<watch::Receiver<usize>>,
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
        let context_batches = Counter::<u64>::default();
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
        registry.register(
            "guildhall_context_batches",
            "Batches of context changes committed",
            context_batches.clone(),
        );
        let reading = Arc::new(Mutex::new(Reading::default()));
        registry.register_collector(Box::new(Scraped(Arc::clone(&reading))));

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
                match &event {
                    ToolEvent::Completed {
                        tool, duration_us, ..
                    } => {
                        calls.get_or_create(&call(tool, "ok")).inc();
                        durations
                            .get_or_create(&tool_labels(tool))
                            .observe(*duration_us as f64 / 1e6);
                    }
                    ToolEvent::Failed { tool, kind, .. } => {
                        calls.get_or_create(&call(tool, kind)).inc();
                    }
                    ToolEvent::Denied { tool, .. } => {
                        calls.get_or_create(&call(tool, "denied")).inc();
                    }
                    ToolEvent::Restarted { tool, .. } => {
                        restarts.get_or_create(&tool_labels(tool)).inc();
                    }
                    ToolEvent::CircuitOpened { tool } => {
                        breakers.get_or_create(&tool_labels(tool)).set(1);
                    }
                    ToolEvent::CircuitClosed { tool } => {
                        breakers.get_or_create(&tool_labels(tool)).set(0);
                    }
                    ToolEvent::Mailed { recipients, .. } => {
                        messages.inc();
                        deliveries.inc_by(*recipients as u64);
                    }
                    ToolEvent::ContextChanged { .. } => {
                        context_batches.inc();
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
            reading,
            connections: OnceLock::new(),
            _aggregating: stop.drop_guard(),
        })
    }

    /// Counts the server's live MCP connections as `guildhall_mcp_connections` (`live`
    /// holds their number); the first call wins.
    pub fn count_connections(&self, live: watch::Receiver<usize>) {
        let _ = self.connections.set(live);
    }

    /// The metrics as OpenMetrics text (Prometheus reads it), with what is read now.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn render(&self) -> String {
        let now = match self.runtime.upgrade() {
            Some(runtime) => Reading::of(&runtime, self.connections.get()).await,
            None => Reading::default(),
        };
        *self.reading.lock().unwrap_or_else(PoisonError::into_inner) = now;
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// What a scrape reads at that moment.
#[derive(Debug, Default)]
struct Reading {
    agents: usize,
    tools: usize,
    sessions: usize,
    sessions_active: usize,
    mailboxes_active: usize,
    /// Each agent's unread messages (`None`: the store could not be read).
    unread: Vec<(Arc<str>, usize)>,
    connections: Option<usize>,
    store: StoreStats,
}

impl Reading {
    async fn of(runtime: &Runtime, connections: Option<&watch::Receiver<usize>>) -> Self {
        let agents = runtime.agents();
        let mut unread = Vec::with_capacity(agents.len());
        for record in &agents {
            if let Ok(agent) = runtime.agent(record.id.as_str())
                && let Ok(n) = agent.unread().await
            {
                unread.push((Arc::from(record.id.as_str()), n));
            }
        }
        let sessions = runtime.sessions();
        Self {
            agents: agents.len(),
            tools: runtime.tools().len(),
            sessions: sessions.list().len(),
            sessions_active: sessions.active(),
            mailboxes_active: runtime.active_mailboxes(),
            unread,
            connections: connections.map(|live| *live.borrow()),
            store: runtime.store().stats(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabels {
    agent: Arc<str>,
}

/// Encodes the last [`Reading`] on each scrape.
#[derive(Debug)]
struct Scraped(Arc<Mutex<Reading>>);

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: usize,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn counter<N: prometheus_client::encoding::EncodeCounterValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: N,
) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let e = &mut encoder;
        gauge(e, "guildhall_agents", "Agents registered", r.agents)?;
        gauge(e, "guildhall_tools", "Tools registered", r.tools)?;
        gauge(e, "guildhall_sessions", "Context sessions", r.sessions)?;
        gauge(
            e,
            "guildhall_sessions_active",
            "Context sessions whose actor runs (the others are passive, in the store)",
            r.sessions_active,
        )?;
        gauge(
            e,
            "guildhall_mailboxes_active",
            "Mailboxes whose actor runs (the others are passive, in the store)",
            r.mailboxes_active,
        )?;
        if let Some(connections) = r.connections {
            gauge(
                e,
                "guildhall_mcp_connections",
                "Live MCP connections (stdio, local socket and HTTP sessions)",
                connections,
            )?;
        }
        {
            let metric = ConstGauge::new(0i64);
            let mut family = e.encode_descriptor(
                "guildhall_mailbox_unread",
                "Unread messages waiting in each agent's inbox",
                None,
                metric.metric_type(),
            )?;
            for (agent, n) in &r.unread {
                let labels = AgentLabels {
                    agent: Arc::clone(agent),
                };
                ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        counter(
            e,
            "guildhall_store_commits",
            "Store transactions committed (on a durable store, one fsync each)",
            r.store.commits,
        )?;
        counter(
            e,
            "guildhall_store_commit_seconds",
            "Time spent committing store transactions, fsyncs included (divided by the commits, the mean commit latency)",
            r.store.commit_micros as f64 / 1e6,
        )?;
        counter(
            e,
            "guildhall_store_failed_commits",
            "Store group commits that failed",
            r.store.failed_commits,
        )?;
        counter(
            e,
            "guildhall_store_batches",
            "Batches of writes the store applied",
            r.store.batches,
        )?;
        counter(
            e,
            "guildhall_store_writes",
            "Writes the store applied",
            r.store.writes,
        )
    }
}
