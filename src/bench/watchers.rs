//! Watchers for the benchmarks that measure what watching costs: as `guildhall watch` and
//! the dashboard's `/events` take the event stream.

use std::time::Instant;

use crate::Runtime;
use crate::observe::Feed;

/// A watcher as `guildhall watch` and the dashboard's `/events` are: the operator's lines of
/// `feed`, every event as JSON, taken in batches. Returns when the runtime stops or `stop`
/// fires; what it showed and lost.
pub(super) fn watcher(
    feed: &Feed,
    mut on_invoked: impl FnMut(Instant) + Send + 'static,
) -> (
    tokio::task::JoinHandle<Watched>,
    tokio_util::sync::DropGuard,
) {
    let mut watching = feed.watch();
    let stop = tokio_util::sync::CancellationToken::new();
    let until = stop.clone();
    let task = tokio::spawn(async move {
        let mut taken = 0u64;
        loop {
            let lines = tokio::select! {
                biased;
                () = until.cancelled() => break,
                lines = watching.next() => lines,
            };
            let Some(lines) = lines else { break };
            let at = Instant::now();
            std::hint::black_box(lines.as_bytes());
            for line in lines.split('\n') {
                if line.starts_with(r#"{"event":"invoked""#) {
                    on_invoked(at);
                }
                taken += u64::from(!line.starts_with(r#"{"event":"missed""#));
            }
        }
        Watched {
            taken,
            missed: watching.missed(),
        }
    });
    (task, stop.drop_guard())
}

/// What the issue's "dashboard open and `watch` attached" is on a server: two watchers of
/// every event, sharing one rendering as a server's do, beside the `/metrics` aggregator
/// every server with an HTTP listener runs, until [`Watchers::stop`].
pub(super) fn dashboard_and_watch(runtime: &Runtime) -> Watchers {
    let metrics = crate::observe::Metrics::start(runtime);
    let feed = Feed::operator(runtime);
    let (tasks, stops) = (0..2).map(|_| watcher(&feed, |_| {})).unzip();
    Watchers {
        tasks,
        stops,
        _metrics: metrics,
    }
}

/// Watchers running until stopped (or dropped, uncounted).
pub(super) struct Watchers {
    tasks: Vec<tokio::task::JoinHandle<Watched>>,
    stops: Vec<tokio_util::sync::DropGuard>,
    /// Aggregating while it lives.
    _metrics: std::sync::Arc<crate::observe::Metrics>,
}

/// What watchers took between their start and their stop.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Watched {
    /// Events shown, summed over the watchers.
    pub(super) taken: u64,
    /// Events they lost by falling behind, summed over the watchers.
    pub(super) missed: u64,
}

impl std::ops::AddAssign for Watched {
    fn add_assign(&mut self, other: Self) {
        self.taken += other.taken;
        self.missed += other.missed;
    }
}

impl Watchers {
    /// Stops the watchers and sums what they took and lost. Lines rendered but not yet
    /// taken when they stop count as neither.
    pub(super) async fn stop(self) -> Watched {
        drop(self._metrics);
        drop(self.stops);
        let mut watched = Watched::default();
        for task in self.tasks {
            watched += task.await.unwrap_or_default();
        }
        watched
    }
}
