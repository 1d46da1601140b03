//! What a running server tells the people and tools watching it: the dashboard page,
//! Prometheus metrics ([`Metrics`]), tool calls as OpenTelemetry spans over OTLP
//! (`Traces`, feature `otlp`), the event stream as one watcher may see it
//! ([`Watching`]) and the operator's view rendered once for all its watchers
//! ([`Feed`], and each agent's share likewise), and the latest events kept for MCP clients ([`RecentEvents`]). Served by the HTTP listener and the local socket (`guildhall watch`); the
//! routes live with them in `mcp`.

mod feed;
mod line;
mod metrics;
mod pace;
mod recent;
mod shared_lines;
mod traces;
mod watching;

pub use feed::{Feed, Feeds};
pub use metrics::{CONTENT_TYPE, Metrics};
pub use recent::{EventsPage, KEPT, RecentEvents};
#[cfg(feature = "otlp")]
pub use traces::Traces;
pub use traces::{TelemetryConfig, TelemetryError};
pub use watching::{EventFilter, Watching};

/// The dashboard: one page, its script and styles inline, served at `/` by the HTTP
/// listener. It reads `/api/status` and `/api/sessions`, and follows `/events`.
pub const DASHBOARD_HTML: &str = include_str!("observe/dashboard.html");
