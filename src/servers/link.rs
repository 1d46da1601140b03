//! What a server's proxied tools share with the actor that runs the server: the live
//! connection (or why there is none), the start breaker, the in-flight bound, and where
//! progress reports go.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use guildhall_actors::CallContext;
use guildhall_supervision::{BreakerConfig, BreakerStatus, SharedBreaker};
use rmcp::model::ProgressToken;
use rmcp::service::{Peer, RoleClient};
use tokio::sync::{Semaphore, watch};

/// A server's connection as its tools see it.
#[derive(Clone)]
pub(crate) enum Phase {
    /// Its process is being started and the handshake done; why the last one ended, when
    /// one did.
    Starting { after: Option<Arc<str>> },
    /// Serving: calls go to `peer`. `generation` grows with every start, so a call can tell
    /// that the connection it used is gone.
    Up {
        peer: Peer<RoleClient>,
        generation: u64,
        pid: Option<u32>,
    },
    /// Not serving, and why (the process exited, it failed to start, it hung).
    Down { reason: Arc<str> },
    /// Removed, or stopped for good (a temporary server that ended).
    Stopped { reason: Arc<str> },
}

/// Tells a server's actor that connection `generation` hung.
type HangReport = Box<dyn Fn(u64) + Send + Sync>;

/// Shared by a server's actor and its proxied tools.
pub(crate) struct Link {
    pub(crate) server: Arc<str>,
    phase: watch::Sender<Phase>,
    generation: AtomicU64,
    /// Failed starts open it; while it is open calls fail at once instead of waiting.
    pub(crate) breaker: Arc<SharedBreaker>,
    /// The `concurrency` bound, when there is one.
    permits: Option<Arc<Semaphore>>,
    /// Calls waiting for progress, by the progress token their request carries.
    progress: DashMap<String, CallContext>,
    /// Starts of the process, the first included.
    pub(crate) starts: AtomicU64,
    /// Calls sent to the server and not answered yet.
    in_flight: AtomicUsize,
    /// Calls the server ran as tasks, followed to their end.
    tasks: AtomicU64,
    /// Why its last connection ended, kept while the next one serves.
    last_end: std::sync::Mutex<Option<Arc<str>>>,
    /// Tells the server's actor as it is now (each restart sets it) that a connection
    /// did not answer its probe.
    on_hung: std::sync::Mutex<Option<HangReport>>,
    /// Until when a listing of tools waits for its first start.
    listed_by: tokio::time::Instant,
    /// Whether a listing went on without it (said once in the log).
    listed_late: std::sync::atomic::AtomicBool,
}

/// Failed starts in a row that open a server's breaker; it then lets one start through
/// after a second, doubling up to a minute while they keep failing.
const START_BREAKER: BreakerConfig = BreakerConfig {
    max_failures: 3,
    reset_timeout: Duration::from_secs(1),
    backoff_factor: 2.0,
    max_reset_timeout: Duration::from_secs(60),
    min_callers: 1,
};

impl Link {
    /// A link of `server` (at most `concurrency` calls at once), which a listing of tools
    /// waits for until `listing_wait` from now.
    pub(crate) fn new(
        server: Arc<str>,
        concurrency: Option<usize>,
        listing_wait: Duration,
    ) -> Self {
        Self {
            server,
            phase: watch::Sender::new(Phase::Starting { after: None }),
            generation: AtomicU64::new(0),
            breaker: Arc::new(SharedBreaker::new(START_BREAKER)),
            permits: concurrency.map(|n| Arc::new(Semaphore::new(n.max(1)))),
            progress: DashMap::new(),
            starts: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            tasks: AtomicU64::new(0),
            last_end: std::sync::Mutex::new(None),
            on_hung: std::sync::Mutex::new(None),
            listed_by: tokio::time::Instant::now() + listing_wait,
            listed_late: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Waits until its first start ended: it serves, or failed and says why.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub(crate) async fn started_once(&self) {
        let mut phase = self.phase.subscribe();
        let _ = phase
            .wait_for(|p| !matches!(p, Phase::Starting { after: None }))
            .await;
    }

    /// Waits until its first start ended (serving, or failed and saying why), or its
    /// listing deadline passes; a listing that goes on without it says so once.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub(crate) async fn first_start(&self) {
        if tokio::time::timeout_at(self.listed_by, self.started_once())
            .await
            .is_err()
            && !self.listed_late.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(server = %self.server, "still starting when tools were listed; its tools come with `list_changed` once it serves");
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.phase.borrow().clone()
    }

    pub(crate) fn watch(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// A start begins; returns the starts before it (its restarts, once it is not the
    /// first).
    pub(crate) fn starting(&self) -> u64 {
        let before = self.starts.fetch_add(1, Ordering::Relaxed);
        self.phase.send_modify(|phase| {
            let after = match phase {
                Phase::Down { reason } | Phase::Stopped { reason } => Some(Arc::clone(reason)),
                Phase::Starting { after } => after.take(),
                Phase::Up { .. } => None,
            };
            *phase = Phase::Starting { after };
        });
        before
    }

    /// The generation of the next connection.
    pub(crate) fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Connection `generation` serves on `peer`, its tools registered.
    pub(crate) fn up(&self, peer: Peer<RoleClient>, pid: Option<u32>, generation: u64) {
        self.phase.send_replace(Phase::Up {
            peer,
            generation,
            pid,
        });
    }

    /// The connection is gone. Calls on it end `crashed`; calls after it wait for the next.
    pub(crate) fn down(&self, reason: impl Into<Arc<str>>) {
        let reason = reason.into();
        *self
            .last_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::clone(&reason));
        self.phase.send_if_modified(|phase| {
            if matches!(phase, Phase::Stopped { .. }) {
                return false;
            }
            *phase = Phase::Down { reason };
            true
        });
    }

    /// The connection of `generation` was dropped by its actor (stopped, restarted): unless
    /// something already said why it went, it went because it was stopped.
    pub(crate) fn dropped(&self, generation: u64) {
        self.phase.send_if_modified(|phase| {
            if !matches!(phase, Phase::Up { generation: g, .. } if *g == generation) {
                return false;
            }
            *phase = Phase::Down {
                reason: "the server was stopped".into(),
            };
            true
        });
    }

    /// Stopped for good: waiting calls end at once.
    pub(crate) fn stopped(&self, reason: impl Into<Arc<str>>) {
        self.phase.send_replace(Phase::Stopped {
            reason: reason.into(),
        });
    }

    /// Where [`hung`](Self::hung) reports go: the actor that (re)started just now.
    pub(crate) fn report_hangs_to(&self, report: impl Fn(u64) + Send + Sync + 'static) {
        *self
            .on_hung
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Box::new(report));
    }

    /// Connection `generation` did not answer a probe after a cancelled call.
    pub(crate) fn hung(&self, generation: u64) {
        if let Some(report) = &*self
            .on_hung
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            report(generation);
        }
    }

    /// Why the server's last connection ended, if one did.
    pub(crate) fn last_end(&self) -> Option<Arc<str>> {
        self.last_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether failed starts have opened the breaker (calls fail fast), and until when.
    pub(crate) fn start_breaker(&self) -> BreakerStatus {
        self.breaker.status()
    }

    /// A turn under the `concurrency` bound (none when unbounded), waited for.
    pub(crate) async fn permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.permits {
            // The semaphore is never closed.
            Some(permits) => Arc::clone(permits).acquire_owned().await.ok(),
            None => None,
        }
    }

    /// A turn now, if one is free: `Some(None)` when there is no bound, `None` when every
    /// turn is taken.
    pub(crate) fn try_permit(&self) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
        match &self.permits {
            Some(permits) => Arc::clone(permits).try_acquire_owned().ok().map(Some),
            None => Some(None),
        }
    }

    /// Counts a call as sent until the returned guard is dropped.
    pub(crate) fn sent(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// Whether a tool of this server may refuse a plain call for want of task augmentation:
    /// the connection negotiated 2025-11-25, the one revision that has it (or it is not up
    /// yet, and may).
    pub(crate) fn may_require_tasks(&self) -> bool {
        match &*self.phase.borrow() {
            Phase::Up { peer, .. } => peer.peer_info().is_none_or(|info| {
                info.protocol_version == rmcp::model::ProtocolVersion::V_2025_11_25
            }),
            _ => true,
        }
    }

    /// Counts a call the server runs as a task.
    pub(crate) fn task_followed(&self) {
        self.tasks.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls the server ran as tasks so far.
    pub(crate) fn tasks(&self) -> u64 {
        self.tasks.load(Ordering::Relaxed)
    }

    /// Calls sent to the server and not answered yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Sends progress reports carrying `token` to `call` until the route is dropped.
    pub(crate) fn route_progress(&self, token: &ProgressToken, call: CallContext) -> Route<'_> {
        let key = token_key(token);
        self.progress.insert(key.clone(), call);
        Route { link: self, key }
    }

    /// The one call in flight on this connection, which a request from the server (an
    /// elicitation) must be about; why not, when there are none or several.
    pub(crate) fn sole_call(&self) -> Result<CallContext, String> {
        let mut calls = self.progress.iter();
        match (calls.next(), calls.next()) {
            (Some(call), None) => Ok(call.value().clone()),
            (None, _) => Err("no call of guildhall's is in flight to it".into()),
            (Some(_), Some(_)) => Err(
                "several calls are in flight to it, and stdio does not say which one asks; \
                 `instances` or `concurrency = 1` makes the caller certain"
                    .into(),
            ),
        }
    }

    /// A progress report from the server.
    pub(crate) fn progress(
        &self,
        token: &ProgressToken,
        progress: f64,
        total: Option<f64>,
        message: Option<&str>,
    ) {
        if let Some(call) = self.progress.get(&token_key(token)) {
            call.progress(progress, total, message);
        }
    }
}

/// A call counted in flight until dropped.
pub(crate) struct InFlight<'a>(&'a Link);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A call's progress route, removed when dropped.
pub(crate) struct Route<'a> {
    link: &'a Link,
    key: String,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.link.progress.remove(&self.key);
    }
}

fn token_key(token: &ProgressToken) -> String {
    serde_json::to_string(&token.0).unwrap_or_default()
}
