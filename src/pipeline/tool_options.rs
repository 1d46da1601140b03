//! How the runtime runs one tool: its pipeline's settings.

use std::time::Duration;

use guildhall_supervision::{Backoff, BreakerConfig};

/// How the runtime runs one tool.
#[derive(Debug, Clone)]
pub struct ToolOptions {
    /// Default time budget of a call when the caller gives none.
    pub timeout: Duration,
    /// How long a call may run past its deadline (with its token cancelled) before its actor
    /// is restarted; also the shutdown timeout of the tool's actors.
    pub grace: Duration,
    /// Retries of transient failures, for idempotent tools only.
    pub max_retries: u32,
    /// Calls in flight at once (running or queued) before further callers wait.
    pub max_in_flight: usize,
    /// The tool's circuit breaker.
    pub breaker: BreakerConfig,
    /// Delay before restarting a tool actor that already restarted within the last ten
    /// seconds (the first restart is immediate).
    pub backoff: Backoff,
    /// Whether MCP's `tools/list` shows it (default `true`). An unlisted tool is still
    /// called by name, governed and audited like any other: a proxied server's resource
    /// reads and prompt gets are such tools.
    pub listed: bool,
}

impl Default for ToolOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            grace: Duration::from_secs(1),
            max_retries: 2,
            max_in_flight: 1024,
            breaker: BreakerConfig::default(),
            backoff: Backoff::default(),
            listed: true,
        }
    }
}

impl ToolOptions {
    /// Sets the default call timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the cancellation grace period.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Sets the retry count for idempotent tools.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Sets the in-flight bound.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Sets the breaker configuration.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// Sets the restart backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Keeps the tool out of MCP's `tools/list` (see [`listed`](Self::listed)).
    pub fn unlisted(mut self) -> Self {
        self.listed = false;
        self
    }
}
