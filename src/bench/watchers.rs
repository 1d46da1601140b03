//! Watchers for the benchmarks that measure what watching costs: as `guildhall watch` and
//! the dashboard's `/events` take the event stream.

use std::time::Instant;

use crate::Runtime;
use crate::observe::OperatorFeed;

/// A watcher as `guildhall watch` and the dashboard's `/events` are: the operator's lines of
/// `feed`, every event as JSON, taken in batches. Returns when the runtime stops or `stop`
/// fires; its count of events and of those missed.
pub(super) fn watcher(
    feed: &OperatorFeed,
    mut on_invoked: impl FnMut(Instant) + Send + 'static,
) -> (
    tokio::task::JoinHandle<(u64, u64)>,
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
        (taken, watching.missed())
    });
    (task, stop.drop_guard())
}

/// What the issue's "dashboard open and `watch` attached" is: two watchers of every event,
/// sharing one rendering as a server's do, until the guards drop.
pub(super) fn dashboard_and_watch(runtime: &Runtime) -> Vec<tokio_util::sync::DropGuard> {
    let feed = OperatorFeed::new(runtime);
    (0..2).map(|_| watcher(&feed, |_| {}).1).collect()
}
