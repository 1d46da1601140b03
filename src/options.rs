//! Per-call and per-tool settings.

use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::CallObserver;
use guildhall_supervision::{Backoff, BreakerConfig};

use crate::governance::Asker;

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
}

/// Who is calling and how long they will wait.
#[derive(Clone, Default)]
pub struct CallOptions {
    pub(crate) agent: Option<Arc<str>>,
    pub(crate) session: Option<Arc<str>>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) observer: Option<Arc<dyn CallObserver>>,
    pub(crate) asker: Option<Arc<dyn Asker>>,
}

impl CallOptions {
    /// No agent, no session, the tool's default timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// The calling agent's id.
    pub fn agent(mut self, agent: impl Into<Arc<str>>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// The session the call belongs to.
    pub fn session(mut self, session: impl Into<Arc<str>>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// The call's time budget, overriding the tool's default.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Receives the call's progress reports and events.
    pub fn observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Who to ask when a permission rule says `ask`; without one, such calls are denied
    /// with a message saying how to allow them.
    pub fn asker(mut self, asker: Arc<dyn Asker>) -> Self {
        self.asker = Some(asker);
        self
    }
}

impl std::fmt::Debug for CallOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallOptions")
            .field("agent", &self.agent)
            .field("session", &self.session)
            .field("timeout", &self.timeout)
            .field("observer", &self.observer.is_some())
            .field("asker", &self.asker.is_some())
            .finish()
    }
}
