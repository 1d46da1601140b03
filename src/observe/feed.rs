//! [`OperatorFeed`]: the operator's view of the events, every event unfiltered, rendered once
//! for everyone watching it.
//!
//! The dashboard's tabs and each `guildhall watch` of a server all show the operator's
//! view, the same lines. Rendered by each, every watcher paid its own pass over every
//! event (taking it from the stream, reading its strings, writing its line): at a few
//! hundred thousand events a second, each watcher took about a tenth of a two-core
//! machine's mail round trips (`bench mailbox`). Rendered once and shared, a second watcher
//! costs one write per batch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::broadcast;

use crate::events::Events;

use super::watching::{EventFilter, Follower, KEPT_BYTES, Render, Rendered, Watching};

/// Batches a watcher may fall behind by before it loses some: with up to 512 events a
/// batch, more than the event stream itself keeps for a subscriber.
const KEPT_BATCHES: usize = 16;

/// The operator's view of a runtime's events, rendered once for all its watchers (see the
/// module's doc). The rendering runs while someone watches and stops when the last watcher
/// goes. Cheap to clone: clones share the rendering.
#[derive(Debug, Clone)]
pub struct OperatorFeed {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    events: Events,
    /// The rendering running; `None` while nobody watches.
    rendering: Mutex<Option<Rendering>>,
}

#[derive(Debug)]
struct Rendering {
    /// Where it publishes its batches.
    publish: broadcast::Sender<Arc<Rendered>>,
    /// Where in the stream the batch it renders starts: a new watcher's starting point, so
    /// that it can tell a gap in the first batches it gets.
    at: Arc<AtomicU64>,
}

impl OperatorFeed {
    /// The feed of `runtime`'s events.
    pub fn new(runtime: &crate::Runtime) -> Self {
        Self::of(runtime.governance().events_sender())
    }

    pub(crate) fn of(events: Events) -> Self {
        Self {
            inner: Arc::new(Inner {
                events,
                rendering: Mutex::new(None),
            }),
        }
    }

    /// A watcher of every event from now on, as [`Watching`] shows them.
    ///
    /// # Panics
    /// Outside a tokio runtime, when nobody watched before (the rendering is spawned).
    pub fn watch(&self) -> Watching {
        let mut rendering = self
            .inner
            .rendering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let follower = match &*rendering {
            Some(running) => Follower::new(
                running.publish.subscribe(),
                running.at.load(Ordering::Acquire),
            ),
            None => {
                let (publish, batches) = broadcast::channel(KEPT_BATCHES);
                let at = Arc::new(AtomicU64::new(0));
                // Subscribed here, before the watcher is handed out: it sees what happens
                // from now on.
                let render = Render::new(self.inner.events.subscribe(), EventFilter::new(None));
                tokio::spawn(render_for_all(
                    render,
                    publish.clone(),
                    Arc::clone(&at),
                    Arc::downgrade(&self.inner),
                ));
                *rendering = Some(Rendering { publish, at });
                Follower::new(batches, 0)
            }
        };
        Watching::shared(follower)
    }
}

/// Renders the events into batches for every watcher until none is left (or the runtime or
/// the feed is gone).
async fn render_for_all(
    mut render: Render,
    publish: broadcast::Sender<Arc<Rendered>>,
    at: Arc<AtomicU64>,
    feed: Weak<Inner>,
) {
    // Batches sent, oldest first: once every watcher is done with one (the channel's slot
    // too, `KEPT_BATCHES` later), its memory renders a later batch.
    let mut sent: VecDeque<Arc<Rendered>> = VecDeque::with_capacity(KEPT_BATCHES + 2);
    let mut spare = Vec::new();
    loop {
        let (from, told) = (render.seen(), render.missed());
        let mut lines = std::mem::take(&mut spare);
        if !render.next_into(&mut lines).await {
            break;
        }
        let to = render.seen();
        // Moved on before the batch goes out: a watcher that comes in between takes this
        // batch as the start of what it sees, not as a gap.
        at.store(to, Ordering::Release);
        let batch = Arc::new(Rendered {
            from,
            to,
            missed: render.missed() - told,
            // Only UTF-8 went in: `line::write` copies `str`s or has serde_json escape them.
            lines: String::from_utf8(lines).unwrap_or_default(),
        });
        if publish.send(Arc::clone(&batch)).is_err() && nobody_watches(&feed, &publish) {
            return;
        }
        sent.push_back(batch);
        if sent.len() > KEPT_BATCHES + 1
            && let Some(oldest) = sent.pop_front()
            && let Ok(done) = Arc::try_unwrap(oldest)
            && done.lines.capacity() <= KEPT_BYTES
        {
            spare = done.lines.into_bytes();
        }
    }
    nobody_watches(&feed, &publish);
}

/// Whether the rendering publishing to `publish` should end: nobody watches, or the feed is
/// gone. When so, the feed forgets it (a later watcher starts another).
fn nobody_watches(feed: &Weak<Inner>, publish: &broadcast::Sender<Arc<Rendered>>) -> bool {
    let Some(feed) = feed.upgrade() else {
        return true;
    };
    let mut rendering = feed
        .rendering
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Under the lock: a watcher either subscribed before (and is counted) or starts anew.
    if publish.receiver_count() > 0 {
        return false;
    }
    if rendering
        .as_ref()
        .is_some_and(|current| current.publish.same_channel(publish))
    {
        *rendering = None;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::ToolEvent;

    fn restarted(restarts: u64) -> ToolEvent {
        ToolEvent::Restarted {
            tool: Arc::from("t"),
            restarts,
        }
    }

    fn restarts(lines: &str) -> Vec<serde_json::Value> {
        lines
            .split('\n')
            .map(|line| {
                let line: serde_json::Value = serde_json::from_str(line).expect("JSON");
                if line["event"] == "missed" {
                    line
                } else {
                    line["restarts"].clone()
                }
            })
            .collect()
    }

    /// Takes lines from `watching` until the event `last` is among them.
    async fn until(watching: &mut Watching, last: u64) -> Vec<String> {
        let mut batches = Vec::new();
        loop {
            let lines = tokio::time::timeout(std::time::Duration::from_secs(10), watching.next())
                .await
                .expect("lines come")
                .expect("the runtime is here")
                .to_owned();
            let done = restarts(&lines).last() == Some(&serde_json::json!(last));
            batches.push(lines);
            if done {
                return batches;
            }
        }
    }

    #[tokio::test]
    async fn every_watcher_of_the_feed_gets_the_same_lines_rendered_once() {
        let events = Events::default();
        let feed = OperatorFeed::of(events.clone());
        let (mut one, mut two) = (feed.watch(), feed.watch());
        for i in 0..100 {
            events.emit(|| restarted(i));
        }
        let (seen_one, seen_two) = (until(&mut one, 99).await, until(&mut two, 99).await);
        assert_eq!(seen_one, seen_two, "the same batches, at the same time");
        let all: Vec<_> = seen_one.iter().flat_map(|lines| restarts(lines)).collect();
        let expected: Vec<_> = (0..100u64).map(serde_json::Value::from).collect();
        assert_eq!(all, expected);
        assert_eq!((one.missed(), two.missed()), (0, 0));
    }

    #[tokio::test]
    async fn a_watcher_that_fell_behind_the_others_is_told_how_many_it_lost() {
        let events = Events::default();
        let feed = OperatorFeed::of(events.clone());
        let (mut keeping_up, mut behind) = (feed.watch(), feed.watch());
        // Emitted in runs the rendering takes one by one, each waited for by the watcher
        // keeping up, until the one behind has more batches waiting than are kept.
        let runs = (KEPT_BATCHES + 4) as u64;
        for run in 0..runs {
            for i in 0..10 {
                events.emit(|| restarted(run * 10 + i));
            }
            until(&mut keeping_up, run * 10 + 9).await;
        }
        let last = runs * 10 - 1;
        let lines: Vec<_> = until(&mut behind, last)
            .await
            .iter()
            .flat_map(|lines| restarts(lines))
            .collect();
        assert_eq!(lines[0]["event"], "missed", "{lines:?}");
        let lost = lines[0]["count"].as_u64().expect("a count");
        assert!(lost > 0);
        assert_eq!(
            lines[1],
            serde_json::json!(lost),
            "the first kept follows the lost"
        );
        assert_eq!(lines.len() as u64, 1 + runs * 10 - lost);
        assert_eq!(behind.missed(), lost);
        assert_eq!(keeping_up.missed(), 0);
    }

    #[tokio::test]
    async fn the_rendering_stops_when_the_last_watcher_goes_and_starts_again_for_the_next() {
        let events = Events::default();
        let feed = OperatorFeed::of(events.clone());
        let watching = feed.watch();
        assert!(events.has_subscribers());
        drop(watching);
        // The rendering notices at its next batch that nobody watches.
        let mut emitted = 0;
        while events.has_subscribers() {
            assert!(
                emitted < 1_000,
                "the rendering still runs with nobody watching"
            );
            events.emit(|| restarted(emitted));
            emitted += 1;
            tokio::task::yield_now().await;
            tokio::time::sleep(crate::events::COALESCE).await;
        }
        let mut again = feed.watch();
        events.emit(|| restarted(7));
        assert_eq!(restarts(&until(&mut again, 7).await[0]), [7]);
    }
}
