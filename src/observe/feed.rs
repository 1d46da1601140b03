//! [`Feed`]: one view of the events (the operator's, every event, or one agent's share),
//! rendered once for everyone watching it; [`Feeds`], a server's feeds.
//!
//! The dashboard's tabs and each `guildhall watch` of a server all show the operator's
//! view, the same lines; the streams one agent opens all show that agent's share. Rendered
//! by each, every watcher made its own pass over every event (taking it from the stream,
//! reading its strings, writing its line), so ten open tabs cost ten passes, and an agent
//! opening a hundred streams cost the server a hundred. Rendered once and shared, a further
//! watcher costs a look at each batch and the write of it to its connection.
//!
//! The batches are kept for the watchers by events and bytes, not by count: at a few events
//! a second a batch holds one, and a watcher may fall as far behind as the event stream
//! lets one subscriber (see `SharedLines`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use dashmap::DashMap;

use crate::events::Events;

use super::line::KEPT_BYTES;
use super::pace::{Batch, Pace};
use super::shared_lines::{Rendered, SharedLines};
use super::watching::{EventFilter, Render, Watching};

/// A view of a runtime's events, rendered once for all its watchers (see the module's doc):
/// the operator's, or one agent's share as [`EventFilter`] admits it. The rendering runs
/// while someone watches and stops when the last watcher goes. Cheap to clone: clones share
/// the rendering.
#[derive(Debug, Clone)]
pub struct Feed {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    events: Events,
    /// Whose share: `None` for the operator's view, every event.
    agent: Option<Arc<str>>,
    /// Where the running rendering puts its batches; `None` while nobody watches.
    rendering: Mutex<Option<Arc<SharedLines>>>,
}

impl Feed {
    /// The operator's view of `runtime`'s events: every one.
    pub fn operator(runtime: &crate::Runtime) -> Self {
        Self::of(runtime.governance().events_sender(), None)
    }

    pub(crate) fn of(events: Events, agent: Option<Arc<str>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                events,
                agent,
                rendering: Mutex::new(None),
            }),
        }
    }

    /// A watcher of the feed's events from now on, as [`Watching`] shows them.
    ///
    /// # Panics
    /// Outside a tokio runtime, when nobody watched before (the rendering is spawned).
    pub fn watch(&self) -> Watching {
        let mut rendering = self.inner.rendering();
        let lines = match &*rendering {
            Some(lines) => Arc::clone(lines),
            None => {
                let lines = Arc::new(SharedLines::new());
                // Subscribed here, before the watcher is handed out: it sees what happens
                // from now on.
                let render = Render::new(
                    self.inner.events.subscribe(),
                    EventFilter::new(self.inner.agent.clone()),
                );
                tokio::spawn(render_for_all(
                    render,
                    Arc::clone(&lines),
                    Arc::downgrade(&self.inner),
                ));
                *rendering = Some(Arc::clone(&lines));
                lines
            }
        };
        Watching::shared(lines.follow())
    }

    /// Whether anyone watches (its rendering runs).
    fn is_watched(&self) -> bool {
        self.inner.rendering().is_some()
    }
}

impl Inner {
    fn rendering(&self) -> std::sync::MutexGuard<'_, Option<Arc<SharedLines>>> {
        self.rendering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Agents' feeds kept while nobody watches them, about: past it, those are let go when
/// another agent starts watching (each is a few hundred bytes; a feed watched, or held by a
/// caller about to watch it, is never let go).
const IDLE_AGENT_FEEDS: usize = 1024;

/// A server's feeds: the operator's, and each agent's that watches. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Feeds {
    operator: Feed,
    agents: Arc<DashMap<Arc<str>, Feed>>,
    /// How many agents' feeds are kept before the idle ones are let go: raised past twice
    /// those a sweep could not let go, so that with many feeds watched at once a new agent's
    /// stream does not sweep the whole map each time.
    sweep_at: Arc<AtomicUsize>,
}

impl Feeds {
    /// The feeds of `runtime`'s events.
    pub fn new(runtime: &crate::Runtime) -> Self {
        Self::of(runtime.governance().events_sender())
    }

    pub(crate) fn of(events: Events) -> Self {
        Self {
            operator: Feed::of(events, None),
            agents: Arc::default(),
            sweep_at: Arc::new(AtomicUsize::new(IDLE_AGENT_FEEDS)),
        }
    }

    /// The operator's view, shared by the dashboard and every `guildhall watch`.
    pub fn operator(&self) -> &Feed {
        &self.operator
    }

    /// `agent`'s share, shared by every stream it opens. The caller checks that the agent
    /// exists and may watch: an entry is kept for each name asked for.
    pub fn agent(&self, agent: &str) -> Feed {
        if let Some(feed) = self.agents.get(agent) {
            return feed.clone();
        }
        if self.agents.len() >= self.sweep_at.load(Ordering::Relaxed) {
            // A feed is let go only when the map holds the last handle to it: a caller that
            // has just taken it (under the shard's lock the sweep now holds) and not yet
            // watched keeps it, or that agent would get a second rendering.
            self.agents
                .retain(|_, feed| feed.is_watched() || Arc::strong_count(&feed.inner) > 1);
            let kept = self.agents.len();
            self.sweep_at
                .store(IDLE_AGENT_FEEDS.max(2 * kept), Ordering::Relaxed);
        }
        let (events, agent) = (self.operator.inner.events.clone(), Arc::<str>::from(agent));
        self.agents
            .entry(Arc::clone(&agent))
            .or_insert_with(|| Feed::of(events, Some(agent)))
            .clone()
    }
}

/// Renders the events into batches for every watcher until none is left (or the runtime or
/// the feed is gone).
async fn render_for_all(mut render: Render, lines: Arc<SharedLines>, feed: Weak<Inner>) {
    let (mut spare, mut last_len) = (Vec::new(), 0);
    // Where the next batch starts in the stream: events its filter did not admit since the
    // last batch are in its span, not taken for lost.
    let (mut from, mut told) = (render.seen(), render.missed());
    let mut pace = Pace::new(Instant::now());
    loop {
        let mut batch = std::mem::take(&mut spare);
        // No memory came back (a watcher still shows that batch): sized as the last one
        // rather than grown step by step.
        batch.reserve(last_len.min(KEPT_BYTES));
        if !render.next_into(&mut batch).await {
            break;
        }
        if batch.is_empty() {
            // None of these events is the feed's (another agent's calls): nothing to show,
            // but still the time to notice that nobody watches, or a quiet agent's feed
            // would keep taking every event after its last watcher left.
            spare = batch;
            if lines.followers() == 0 && end(&feed, &lines, false) {
                return;
            }
            rest(&mut render, &mut pace).await;
            continue;
        }
        last_len = batch.len();
        let old = lines.push(Rendered {
            from,
            to: render.seen(),
            missed: render.missed() - told,
            // Only UTF-8 went in: `line::write` copies `str`s or has serde_json escape them.
            lines: String::from_utf8(batch).unwrap_or_default(),
        });
        (from, told) = (render.seen(), render.missed());
        if let Some(old) = old
            && old.lines.capacity() <= KEPT_BYTES
        {
            spare = old.lines.into_bytes();
        }
        if lines.followers() == 0 && end(&feed, &lines, false) {
            return;
        }
        rest(&mut render, &mut pace).await;
    }
    end(&feed, &lines, true);
    lines.close();
}

/// Rests after the batch `render` took, as its [`Pace`] says.
async fn rest(render: &mut Render, pace: &mut Pace) {
    let batch = Batch {
        taken: render.last_taken(),
        busy: render.busy(),
        full: render.behind(),
    };
    if let Some(rest) = pace.rest_after(batch, Instant::now()) {
        render.rest(rest).await;
    }
}

/// Whether the rendering into `lines` ends: nobody follows it (checked under the feed's
/// lock, so a watcher either follows already or starts a rendering anew), the feed is gone,
/// or `anyway` (the runtime is gone). When so, the feed forgets it.
fn end(feed: &Weak<Inner>, lines: &Arc<SharedLines>, anyway: bool) -> bool {
    let Some(feed) = feed.upgrade() else {
        return true;
    };
    let mut rendering = feed.rendering();
    if !anyway && lines.followers() > 0 {
        return false;
    }
    if rendering
        .as_ref()
        .is_some_and(|current| Arc::ptr_eq(current, lines))
    {
        *rendering = None;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::watching::restarted;
    use super::*;

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
        let feed = Feed::of(events.clone(), None);
        let (mut one, mut two) = (feed.watch(), feed.watch());
        assert_eq!(events.subscribers(), 1, "one rendering for both watchers");
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
        let feed = Feed::of(events.clone(), None);
        let (mut keeping_up, mut behind) = (feed.watch(), feed.watch());
        // Emitted in runs the rendering takes one by one, each waited for by the watcher
        // keeping up, until the one behind has more events waiting than are kept.
        const RUN: u64 = 500;
        let runs = crate::events::CAPACITY as u64 / RUN + 3;
        for run in 0..runs {
            for i in 0..RUN {
                events.emit(|| restarted(run * RUN + i));
            }
            until(&mut keeping_up, run * RUN + RUN - 1).await;
        }
        let last = runs * RUN - 1;
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
        assert_eq!(lines.len() as u64, 1 + runs * RUN - lost);
        assert_eq!(behind.missed(), lost);
        assert_eq!(keeping_up.missed(), 0);
    }

    #[tokio::test]
    async fn a_rendering_that_falls_behind_rests_and_accounts_for_every_event() {
        let events = Events::default();
        let feed = Feed::of(events.clone(), None);
        let mut watching = feed.watch();
        let (total, mut built) = (50_000u64, 0u64);
        // Emitted in runs larger than a batch, the rendering's turn between them.
        for run in 0..total / 1_000 {
            for i in 0..1_000 {
                events.emit(|| {
                    built += 1;
                    restarted(run * 1_000 + i)
                });
            }
            tokio::task::yield_now().await;
        }
        // A last event to wait for, again until one comes while the rendering is awake.
        let (mut lines, mut last) = (Vec::new(), total);
        'shown: loop {
            assert!(last < total + 100, "the rendering never woke");
            events.emit(|| restarted(last));
            while let Ok(batch) =
                tokio::time::timeout(super::super::pace::MOST_REST * 2, watching.next()).await
            {
                lines.extend(restarts(batch.expect("the runtime is here")));
                if lines.last() == Some(&serde_json::json!(last)) {
                    break 'shown;
                }
            }
            last += 1;
        }
        let missed: u64 = lines
            .iter()
            .filter_map(|line| line.get("count").and_then(serde_json::Value::as_u64))
            .sum();
        let shown = lines.iter().filter(|line| line.is_u64()).count() as u64;
        assert!(
            built < total,
            "resting, it spared the calls building events"
        );
        assert_eq!(shown + missed, last + 1, "each event shown or told lost");
        assert_eq!(watching.missed(), missed);
    }

    #[tokio::test]
    async fn a_watcher_behind_by_many_small_batches_loses_none_of_them() {
        let events = Events::default();
        let feed = Feed::of(events.clone(), None);
        let (mut keeping_up, mut behind) = (feed.watch(), feed.watch());
        // One event a batch, as a quiet swarm makes them: what is kept is bounded by events,
        // not by batches.
        let batches = 300;
        for i in 0..batches {
            events.emit(|| restarted(i));
            until(&mut keeping_up, i).await;
        }
        let lines: Vec<_> = until(&mut behind, batches - 1)
            .await
            .iter()
            .flat_map(|lines| restarts(lines))
            .collect();
        let expected: Vec<_> = (0..batches).map(serde_json::Value::from).collect();
        assert_eq!(lines, expected);
        assert_eq!(behind.missed(), 0);
    }

    fn call(events: &Events, agent: &str, n: u64) {
        let call_id = uuid::Uuid::from_u64_pair(0, n);
        events.emit(|| crate::events::ToolEvent::Invoked {
            call_id,
            tool: Arc::from("t"),
            agent: Some(Arc::from(agent)),
            trace: None,
        });
    }

    #[tokio::test]
    async fn every_stream_of_one_agent_follows_one_rendering_of_its_share() {
        let events = Events::default();
        let feeds = Feeds::of(events.clone());
        let (mut one, mut two) = (feeds.agent("a").watch(), feeds.agent("a").watch());
        assert_eq!(events.subscribers(), 1, "one rendering for both streams");
        call(&events, "b", 1);
        call(&events, "a", 2);
        for watching in [&mut one, &mut two] {
            let lines = watching.next().await.expect("lines");
            let line: serde_json::Value = serde_json::from_str(lines).expect("one line");
            assert_eq!(line["agent"], "a", "{lines}");
        }
        let _other = feeds.agent("b").watch();
        assert_eq!(events.subscribers(), 2, "another agent, another rendering");
    }

    #[tokio::test]
    async fn an_agents_feed_stops_after_its_last_watcher_though_none_of_the_events_is_its() {
        let events = Events::default();
        let feeds = Feeds::of(events.clone());
        drop(feeds.agent("quiet").watch());
        // Only another agent's calls flow: the rendering shows none of them, and still
        // notices that nobody watches.
        let mut emitted = 0;
        while events.has_subscribers() {
            assert!(emitted < 1_000, "the quiet agent's rendering still runs");
            call(&events, "busy", emitted);
            emitted += 1;
            tokio::task::yield_now().await;
            tokio::time::sleep(crate::events::COALESCE).await;
        }
    }

    #[tokio::test]
    async fn a_share_with_gaps_between_its_events_is_not_told_it_lost_them() {
        let events = Events::default();
        let feeds = Feeds::of(events.clone());
        let mut watching = feeds.agent("a").watch();
        for n in 0..3 {
            call(&events, "b", n);
            tokio::task::yield_now().await;
            tokio::time::sleep(crate::events::COALESCE).await;
        }
        call(&events, "a", 9);
        let lines = watching.next().await.expect("lines");
        let line: serde_json::Value = serde_json::from_str(lines).expect("one line, no missed");
        assert_eq!(line["agent"], "a");
        assert_eq!(watching.missed(), 0);
    }

    #[tokio::test]
    async fn agents_feeds_nobody_watches_are_let_go_past_a_bound() {
        let feeds = Feeds::of(Events::default());
        let _watched = feeds.agent("watched").watch();
        let held = feeds.agent("held");
        for i in 0..IDLE_AGENT_FEEDS + 10 {
            let _ = feeds.agent(&format!("idle-{i}"));
        }
        assert!(
            feeds.agents.len() <= IDLE_AGENT_FEEDS,
            "{}",
            feeds.agents.len()
        );
        assert!(feeds.agents.contains_key("watched"), "a watched feed stays");
        let _watching = held.watch();
        assert!(
            Arc::ptr_eq(&feeds.agent("held").inner, &held.inner),
            "a feed taken and not yet watched stays: one rendering per agent"
        );
    }

    #[tokio::test]
    async fn with_many_feeds_watched_a_new_agent_does_not_sweep_them_all_again() {
        let feeds = Feeds::of(Events::default());
        let watching: Vec<_> = (0..IDLE_AGENT_FEEDS + 1)
            .map(|i| feeds.agent(&format!("w-{i}")).watch())
            .collect();
        let sweep_at = feeds.sweep_at.load(Ordering::Relaxed);
        assert!(sweep_at > watching.len(), "{sweep_at}");
        let _ = feeds.agent("new");
        assert_eq!(feeds.sweep_at.load(Ordering::Relaxed), sweep_at, "no sweep");
    }

    #[tokio::test]
    async fn the_rendering_stops_when_the_last_watcher_goes_and_starts_again_for_the_next() {
        let events = Events::default();
        let feed = Feed::of(events.clone(), None);
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
