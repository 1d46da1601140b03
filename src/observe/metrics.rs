//! Prometheus metrics (`GET /metrics` on the HTTP listener, OpenMetrics text).
//!
//! [`Metrics`] reads everything at the scrape: calls by tool and outcome and the latency
//! of those that succeeded (counted by the calls as they end, see
//! [`call_stats`](crate::governance::call_stats)); restarts and breakers by tool, messages,
//! deliveries and context batches (counted as they are emitted, see
//! [`Tally`](crate::events::Tally)); and what is read at that moment: agents registered and
//! connected, tools registered, sessions, mailboxes and sessions active, each agent's unread mail (a passive
//! mailbox is counted in the store, not woken), MCP connections, and the store's commits
//! (each one fsync on a durable store) with the time they took.
//!
//! It does not subscribe to the event stream: a subscriber costs every call the stream's
//! hand-over (about a tenth of a governed call), and loses counts when it falls behind.
//! Counting costs a call two or three relaxed additions to its tool's counters, and nothing
//! is ever missed.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::events::TallyReading;
use crate::governance::call_stats::ToolCalls;
use crate::runtime::{Metric, Runtime, WeakRuntime};
use crate::store::StoreStats;

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: Arc<str>,
    /// `ok`, `denied`, `cancelled`, or the failure's kind (`tool_error`, `crashed`, …).
    outcome: &'static str,
}

/// A runtime's metrics, read at each scrape.
pub struct Metrics {
    registry: Mutex<Registry>,
    runtime: WeakRuntime,
    /// What the last scrape read, encoded by the registry's collector.
    reading: Arc<Mutex<Reading>>,
    /// The server's live MCP connections, when it counts them.
    connections: OnceLock<watch::Receiver<usize>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Starts counting `runtime`'s calls and events ([`Governance::start_counting`]); they
    /// are counted from then on, even after this value is dropped.
    ///
    /// [`Governance::start_counting`]: crate::governance::Governance::start_counting
    pub fn start(runtime: &Runtime) -> Arc<Self> {
        runtime.governance().start_counting();
        let reading = Arc::new(Mutex::new(Reading::default()));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scraped(Arc::clone(&reading))));
        Arc::new(Self {
            registry: Mutex::new(registry),
            runtime: runtime.downgrade(),
            reading,
            connections: OnceLock::new(),
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
    /// Agents with at least one live connection.
    connected: usize,
    tools: usize,
    sessions: usize,
    sessions_active: usize,
    mailboxes_active: usize,
    /// Each agent's unread messages (`None`: the store could not be read).
    unread: Vec<(Arc<str>, usize)>,
    /// Each tool's calls.
    calls: Vec<ToolCalls>,
    /// The other events counted.
    tally: TallyReading,
    connections: Option<usize>,
    store: StoreStats,
    /// What the subsystems report, by subsystem.
    subsystems: Vec<(&'static str, Metric)>,
}

impl Reading {
    async fn of(runtime: &Runtime, connections: Option<&watch::Receiver<usize>>) -> Self {
        let agents = runtime.agents();
        let mut unread = Vec::with_capacity(agents.len());
        let connected = agents
            .iter()
            .filter(|record| runtime.connections_of(record.id.as_str()) > 0)
            .count();
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
            connected,
            tools: runtime.tools().len(),
            sessions: sessions.list().len(),
            sessions_active: sessions.active(),
            mailboxes_active: runtime.active_mailboxes(),
            unread,
            calls: runtime.governance().call_stats().read(),
            tally: runtime.governance().event_tally().read(),
            connections: connections.map(|live| *live.borrow()),
            store: runtime.store().stats(),
            subsystems: runtime.subsystem_metrics(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: Arc<str>,
}

/// Each tool's calls by outcome, and the latency of those that succeeded.
fn encode_calls(
    encoder: &mut DescriptorEncoder<'_>,
    calls: &[ToolCalls],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "guildhall_calls",
        "Tool calls ended, by tool and outcome (ok, denied, cancelled, or the failure's kind)",
        None,
        MetricType::Counter,
    )?;
    for tool in calls {
        for &(outcome, n) in &tool.outcomes {
            let labels = CallLabels {
                tool: Arc::clone(&tool.tool),
                outcome,
            };
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut family = encoder.encode_descriptor(
        "guildhall_call_duration_seconds",
        "Duration of the tool calls that succeeded",
        None,
        MetricType::Histogram,
    )?;
    for tool in calls {
        let count = tool.ok_buckets.iter().map(|(_, n)| n).sum::<u64>();
        if count == 0 {
            continue;
        }
        let labels = ToolLabels {
            tool: Arc::clone(&tool.tool),
        };
        family
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(tool.ok_seconds, count, &tool.ok_buckets, None)?;
    }
    Ok(())
}

/// Restarts and breakers by tool, messages, deliveries, context batches.
fn encode_tally(
    encoder: &mut DescriptorEncoder<'_>,
    tally: &TallyReading,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "guildhall_tool_restarts",
        "Restarts of a tool's actors (or a proxied server's process) by their supervisor",
        None,
        MetricType::Counter,
    )?;
    for (tool, n) in &tally.restarts {
        let labels = ToolLabels {
            tool: Arc::clone(tool),
        };
        ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "guildhall_breaker_open",
        "Whether a tool's circuit breaker is open (1) or closed (0)",
        None,
        MetricType::Gauge,
    )?;
    for (tool, open) in &tally.breakers {
        let labels = ToolLabels {
            tool: Arc::clone(tool),
        };
        ConstGauge::new(i64::from(*open)).encode(family.encode_family(&labels)?)?;
    }
    counter(
        encoder,
        "guildhall_messages",
        "Messages sent",
        tally.messages,
    )?;
    counter(
        encoder,
        "guildhall_message_deliveries",
        "Copies of sent messages delivered to recipients",
        tally.deliveries,
    )?;
    counter(
        encoder,
        "guildhall_context_batches",
        "Batches of context changes committed",
        tally.context_batches,
    )?;
    counter(
        encoder,
        "guildhall_sandbox_egress_allowed",
        "Connections the sandboxes' egress proxies let through",
        tally.egress_allowed,
    )?;
    counter(
        encoder,
        "guildhall_sandbox_egress_refused",
        "Connections the sandboxes' egress proxies refused",
        tally.egress_refused,
    )?;
    counter(
        encoder,
        "guildhall_sandbox_refusals",
        "Refusals of a sandbox that a command's result named",
        tally.sandbox_refusals,
    )
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
        encode_calls(e, &r.calls)?;
        encode_tally(e, &r.tally)?;
        gauge(e, "guildhall_agents", "Agents registered", r.agents)?;
        gauge(
            e,
            "guildhall_agents_connected",
            "Agents with at least one live connection",
            r.connected,
        )?;
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
        )?;
        encode_subsystems(e, &r.subsystems)
    }
}

/// What the subsystems report, each as `guildhall_<subsystem>_<name>`. A name with
/// anything but lowercase letters, digits and `_` is left out (with a warning), as it
/// would make the whole scrape unreadable.
fn encode_subsystems(
    encoder: &mut DescriptorEncoder<'_>,
    metrics: &[(&'static str, Metric)],
) -> Result<(), std::fmt::Error> {
    let fits = |name: &str| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    for (subsystem, metric) in metrics {
        if !fits(subsystem) || !fits(metric.name) {
            tracing::warn!(
                subsystem,
                metric = metric.name,
                "a metric's name does not fit OpenMetrics; left out"
            );
            continue;
        }
        let name = format!("guildhall_{subsystem}_{}", metric.name);
        let kind = if metric.counter {
            MetricType::Counter
        } else {
            MetricType::Gauge
        };
        let mut family = encoder.encode_descriptor(&name, metric.help, None, kind)?;
        for (labels, value) in &metric.samples {
            let sample = family.encode_family(labels)?;
            if metric.counter {
                ConstCounter::new(*value).encode(sample)?;
            } else {
                ConstGauge::new(*value).encode(sample)?;
            }
        }
    }
    Ok(())
}
