//! Child specifications: how to start a child and what to do when it exits.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use ractor::{Actor, ActorCell, SpawnErr};

use crate::backoff::Backoff;
use crate::breaker::SharedBreaker;
// What a snapshot shows of a child is its kind; a spec only sets it.
pub use crate::snapshot::ChildKind;

/// Starts a child linked to the given supervisor cell and returns the child's cell.
///
/// Called again for every restart, so it must build fresh state each time.
pub type StartFn =
    Arc<dyn Fn(ActorCell) -> BoxFuture<'static, Result<ActorCell, SpawnErr>> + Send + Sync>;

/// When a child is restarted (OTP restart types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Restart {
    /// Always restarted.
    #[default]
    Permanent,
    /// Restarted only after an abnormal exit (a failure or a kill); a normal stop is final.
    Transient,
    /// Never restarted; removed from the supervisor when it exits.
    Temporary,
}

/// How a child is stopped during shutdown or a group restart (OTP shutdown values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Killed at once: in-flight work is aborted and `post_stop` does not run.
    BrutalKill,
    /// Asked to stop; killed if it has not stopped within the duration.
    Timeout(Duration),
    /// Asked to stop and waited for without limit. The default for supervisors.
    Infinity,
}

/// Everything a supervisor needs to know about one child.
#[derive(Clone)]
pub struct ChildSpec {
    pub(crate) id: Arc<str>,
    pub(crate) start: StartFn,
    pub(crate) restart: Restart,
    pub(crate) shutdown: Shutdown,
    pub(crate) kind: ChildKind,
    pub(crate) breaker: Option<Arc<SharedBreaker>>,
    pub(crate) backoff: Option<Backoff>,
}

impl ChildSpec {
    /// A permanent worker with a five-second shutdown timeout, started by `start`.
    pub fn worker(id: impl Into<Arc<str>>, start: StartFn) -> Self {
        Self {
            id: id.into(),
            start,
            restart: Restart::Permanent,
            shutdown: Shutdown::Timeout(Duration::from_secs(5)),
            kind: ChildKind::Worker,
            breaker: None,
            backoff: None,
        }
    }

    /// A permanent worker running actor `A`; `make` builds the handler and its arguments
    /// afresh for every (re)start.
    pub fn actor<A, F>(id: impl Into<Arc<str>>, make: F) -> Self
    where
        A: Actor,
        F: Fn() -> (A, A::Arguments) + Send + Sync + 'static,
    {
        let make = Arc::new(make);
        Self::worker(
            id,
            Arc::new(move |sup: ActorCell| {
                let (handler, args) = make();
                Box::pin(async move {
                    let (actor, _) = Actor::spawn_linked(None, handler, args, sup).await?;
                    Ok(actor.get_cell())
                })
            }),
        )
    }

    /// Calls `hook` with the child's new cell after every start and restart: how a caller
    /// keeps a reference to a child (a nested supervisor, say) that stays current across
    /// restarts.
    pub fn on_start(mut self, hook: impl Fn(&ActorCell) + Send + Sync + 'static) -> Self {
        let start = self.start;
        let hook = Arc::new(hook);
        self.start = Arc::new(move |parent| {
            let (start, hook) = (Arc::clone(&start), Arc::clone(&hook));
            Box::pin(async move {
                let cell = start(parent).await?;
                hook(&cell);
                Ok(cell)
            })
        });
        self
    }

    /// Marks a child started by a custom [`StartFn`] as a supervisor (one that answers
    /// [`SupervisorMsg`](crate::SupervisorMsg)), so snapshots include its subtree.
    pub fn as_supervisor(mut self) -> Self {
        self.kind = ChildKind::Supervisor;
        self
    }

    /// Sets the restart type.
    pub fn restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// Sets how the child is stopped.
    pub fn shutdown(mut self, shutdown: Shutdown) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Attaches a circuit breaker whose state is shown in snapshots of this child.
    pub fn breaker(mut self, breaker: Arc<SharedBreaker>) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Overrides the supervisor's backoff for restarts of this child.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// The child's id, unique within its supervisor.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildSpec")
            .field("id", &self.id)
            .field("restart", &self.restart)
            .field("shutdown", &self.shutdown)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}
