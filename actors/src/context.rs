//! The context handed to every call.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Waker;

use futures::task::AtomicWaker;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::trace::TraceParent;

/// Stands in for "never" where an `Instant` must be given: about 30 years.
const FAR_FUTURE: std::time::Duration = std::time::Duration::from_secs(30 * 365 * 24 * 3600);

/// Progress of a long call, as reported by the tool.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Progress {
    /// Work done so far; should only increase.
    pub progress: f64,
    /// Total work, when known.
    pub total: Option<f64>,
    /// A short human-readable note.
    pub message: Option<String>,
}

/// A custom event a tool emits during a call (for dashboards and embedders).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CallEvent {
    /// The call that emitted it.
    pub call_id: Uuid,
    /// The event's name.
    pub name: String,
    /// Its payload.
    pub data: serde_json::Value,
}

/// Receives progress and events from calls. Implementations must not block: they run on
/// the tool's actor.
///
/// # Examples
/// An observer that counts the events calls emit (every method has a default: implement
/// what you listen to). A caller hands it over with its call's options.
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use guildhall_actors::{CallEvent, CallObserver};
///
/// #[derive(Default)]
/// struct Counter {
///     events: AtomicU64,
/// }
///
/// impl CallObserver for Counter {
///     fn on_event(&self, _: CallEvent) {
///         self.events.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let counter = Counter::default();
/// counter.on_event(CallEvent {
///     call_id: uuid::Uuid::nil(),
///     name: "step".into(),
///     data: serde_json::json!({ "done": 1 }),
/// });
/// assert_eq!(counter.events.load(Ordering::Relaxed), 1);
/// ```
pub trait CallObserver: Send + Sync + 'static {
    /// A call reported progress.
    fn on_progress(&self, call: &CallContext, progress: Progress) {
        let _ = (call, progress);
    }

    /// A call emitted an event.
    fn on_event(&self, event: CallEvent) {
        let _ = event;
    }

    /// Asks the caller's user for input on the call's behalf. `request` is an MCP
    /// `elicitation/create` request's params and the answer its result, both as JSON, or why
    /// there is none. `None` (the default) when the caller cannot be asked.
    fn elicit(&self, call: &CallContext, request: serde_json::Value) -> Option<Elicitation> {
        let _ = (call, request);
        None
    }
}

/// The answer to an [`elicit`](CallObserver::elicit) request, when it comes.
pub type Elicitation = futures::future::BoxFuture<'static, Result<serde_json::Value, String>>;

/// Everything a tool knows about the call it is handling. Cheap to clone.
#[derive(Clone)]
pub struct CallContext {
    inner: Arc<Inner>,
}

struct Inner {
    /// Created on first use: most calls finish without anyone asking for it.
    cancel: OnceLock<CancellationToken>,
    /// Where a deadline watcher keeps this call, so it can be removed in O(1).
    deadline_slot: AtomicU64,
    /// Woken when the deadline passes, so the waiting caller can answer `timeout`.
    deadline_waiter: AtomicWaker,
    call_id: Uuid,
    started: Instant,
    agent: Option<Arc<str>>,
    session: Option<Arc<str>>,
    deadline: Instant,
    observer: Option<Arc<dyn CallObserver>>,
    trace: Option<TraceParent>,
}

impl CallContext {
    /// A context with a fresh call id (UUID v7, so ids sort by time) whose deadline is
    /// `timeout` from now.
    pub fn new(
        agent: Option<Arc<str>>,
        session: Option<Arc<str>>,
        timeout: std::time::Duration,
        observer: Option<Arc<dyn CallObserver>>,
    ) -> Self {
        Self::traced(agent, session, timeout, observer, None)
    }

    /// [`new`](Self::new), in the caller's trace `trace` when it named one.
    pub fn traced(
        agent: Option<Arc<str>>,
        session: Option<Arc<str>>,
        timeout: std::time::Duration,
        observer: Option<Arc<dyn CallObserver>>,
        trace: Option<TraceParent>,
    ) -> Self {
        let started = Instant::now();
        Self {
            inner: Arc::new(Inner {
                cancel: OnceLock::new(),
                deadline_slot: AtomicU64::new(u64::MAX),
                deadline_waiter: AtomicWaker::new(),
                call_id: new_call_id(),
                started,
                agent,
                session,
                // An absurd timeout (e.g. `Duration::MAX`) means "no deadline", not a panic.
                deadline: started
                    .checked_add(timeout)
                    .unwrap_or_else(|| started + FAR_FUTURE),
                observer,
                trace,
            }),
        }
    }

    /// The caller's trace, if it named one: the call's span belongs to it.
    pub fn trace(&self) -> Option<TraceParent> {
        self.inner.trace
    }

    /// This call's own span, as the parent of what it causes: a message it sends carries
    /// it, so what the recipient does next can join the sender's trace.
    pub fn span(&self) -> TraceParent {
        TraceParent::of_call(&self.inner.call_id, self.inner.trace)
    }

    /// The call's unique id.
    pub fn call_id(&self) -> Uuid {
        self.inner.call_id
    }

    /// The calling agent, if the caller named one.
    pub fn agent(&self) -> Option<&str> {
        self.inner.agent.as_deref()
    }

    /// The session the call belongs to, if any.
    pub fn session(&self) -> Option<&str> {
        self.inner.session.as_deref()
    }

    /// The calling agent's shared id, to keep without copying it.
    pub fn agent_shared(&self) -> Option<&Arc<str>> {
        self.inner.agent.as_ref()
    }

    /// The session's shared id, to keep without copying it.
    pub fn session_shared(&self) -> Option<&Arc<str>> {
        self.inner.session.as_ref()
    }

    /// When the call was made.
    pub fn started(&self) -> Instant {
        self.inner.started
    }

    /// The time budget the call was given.
    pub fn budget(&self) -> std::time::Duration {
        self.inner
            .deadline
            .saturating_duration_since(self.inner.started)
    }

    /// When the call times out.
    pub fn deadline(&self) -> Instant {
        self.inner.deadline
    }

    /// Fires when the deadline passes or the caller goes away. Tools doing long work should
    /// watch it (`token.cancelled().await` in a `select!`, or `is_cancelled()` between steps).
    pub fn cancellation(&self) -> &CancellationToken {
        self.inner.cancel.get_or_init(CancellationToken::new)
    }

    /// Cancels the call (idempotent).
    pub fn cancel(&self) {
        self.cancellation().cancel();
    }

    /// Where the [`Sweeper`](crate::deadline::Sweeper) keeps this call (`u64::MAX`: not watched).
    pub(crate) fn deadline_slot(&self) -> u64 {
        self.inner.deadline_slot.load(Ordering::Acquire)
    }

    /// Records where the runtime's deadline watcher keeps this call.
    pub(crate) fn set_deadline_slot(&self, slot: u64) {
        self.inner.deadline_slot.store(slot, Ordering::Release);
    }

    /// Registers the task waiting for the reply, to be woken at the deadline.
    pub(crate) fn register_deadline_waiter(&self, waker: &Waker) {
        self.inner.deadline_waiter.register(waker);
    }

    /// Fires the deadline: cancels the call and wakes its waiting caller.
    pub(crate) fn expire(&self) {
        self.cancel();
        self.inner.deadline_waiter.wake();
    }

    /// Whether the call has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner
            .cancel
            .get()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Reports progress to whoever is watching the call (e.g. an MCP client that sent a
    /// progress token). A no-op when nobody is.
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        if let Some(observer) = &self.inner.observer {
            observer.on_progress(
                self,
                Progress {
                    progress,
                    total,
                    message: message.map(str::to_owned),
                },
            );
        }
    }

    /// Asks the caller's user for input (an MCP `elicitation/create` request's params, as
    /// JSON); `None` when the caller cannot be asked.
    pub fn elicit(&self, request: serde_json::Value) -> Option<Elicitation> {
        self.inner.observer.as_ref()?.elicit(self, request)
    }

    /// Emits a named event with a JSON payload. A no-op when nobody is watching.
    pub fn emit(&self, name: &str, data: serde_json::Value) {
        if let Some(observer) = &self.inner.observer {
            observer.on_event(CallEvent {
                call_id: self.inner.call_id,
                name: name.to_owned(),
                data,
            });
        }
    }
}

/// A UUID v7: 48 bits of Unix milliseconds, then random bits. Built directly rather than with
/// `Uuid::now_v7`, whose shared counter and OS randomness cost more than the rest of a call.
fn new_call_id() -> Uuid {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let random = fastrand::u128(..).to_le_bytes();
    let mut bytes = [0u8; 10];
    bytes.copy_from_slice(&random[..10]);
    uuid::Builder::from_unix_timestamp_millis(millis, &bytes).into_uuid()
}

impl fmt::Debug for CallContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallContext")
            .field("call_id", &self.inner.call_id)
            .field("agent", &self.inner.agent)
            .field("session", &self.inner.session)
            .field("deadline", &self.inner.deadline)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
