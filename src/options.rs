//! Per-call settings, and the per-tool ones the pipeline defines.

use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::{CallContext, CallObserver, TraceParent};

use crate::agents::Agent;
use crate::governance::Asker;
pub use crate::pipeline::ToolOptions;

/// Who is calling and how long they will wait.
#[derive(Clone, Default)]
pub struct CallOptions {
    pub(crate) agent: Option<Arc<str>>,
    pub(crate) session: Option<Arc<str>>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) observer: Option<Arc<dyn CallObserver>>,
    pub(crate) asker: Option<Arc<dyn Asker>>,
    pub(crate) trace: Option<TraceParent>,
}

impl CallOptions {
    /// No agent, no session, the tool's default timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls as `agent`: the call's sender, permissions and mailbox are that agent's. An
    /// agent is named by its handle, never by a free string, so a call can only be made as
    /// an agent the runtime registered ([`Runtime::agent`](crate::Runtime::agent) looks one
    /// up by id).
    pub fn as_agent(mut self, agent: &Agent) -> Self {
        self.agent = Some(agent.id().shared());
        self
    }

    /// Makes the call in the caller's trace: its span (when traces are exported) is a child
    /// of the caller's span `trace` names, so it shows inside the caller's own trace.
    pub fn trace_parent(mut self, trace: TraceParent) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The context of one call made with these options (`timeout` when they name none),
    /// and who is asked when a rule says `ask`.
    pub(crate) fn into_call(self, timeout: Duration) -> (CallContext, Option<Arc<dyn Asker>>) {
        let ctx = CallContext::traced(
            self.agent,
            self.session,
            self.timeout.unwrap_or(timeout),
            self.observer,
            self.trace,
        );
        (ctx, self.asker)
    }

    /// The calling agent by id, for the protocol front ends that authenticated it.
    pub(crate) fn agent_id(mut self, agent: impl Into<Arc<str>>) -> Self {
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
