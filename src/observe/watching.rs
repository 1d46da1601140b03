//! What one watcher sees of the event stream: [`EventFilter`] (what an agent may see) and
//! [`Watching`] (events as the lines `guildhall watch` and `/events` send).

use std::sync::Arc;

use crate::events::ToolEvent;

use super::line::{self, missed_line, push_line};
use super::shared_lines::Follower;

/// Which events one subscriber may see. The operator (no agent) sees all. An agent sees its
/// own calls (and how they ended), the mail it sent or that was addressed to it by id,
/// agents connecting and leaving (the directory is readable by every agent), context
/// sessions changing (every agent may read every session), and tools' restarts and breakers
/// (the shared services' health); not other agents' calls or mail.
#[derive(Debug, Default)]
pub struct EventFilter {
    agent: Option<Arc<str>>,
    /// The agent's own calls in flight: their ends name only the call.
    own_calls: Callers,
}

impl EventFilter {
    /// The filter of `agent` (`None`: the operator, who sees everything).
    pub fn new(agent: Option<Arc<str>>) -> Self {
        Self {
            agent,
            own_calls: Callers::default(),
        }
    }

    /// Whether the subscriber may see `event`.
    pub fn admits(&mut self, event: &ToolEvent) -> bool {
        let Some(me) = self.agent.as_deref() else {
            return true;
        };
        let caller = self.own_calls.of(event, |agent| agent == me);
        visible_to(me, event, caller.as_deref())
    }
}

/// Calls in flight whose caller is remembered at most. Past that the memory is emptied, and
/// the calls then in flight end unattributed (shown to no agent, only to the operator),
/// rather than the map growing. Not kept full: a call whose end was lost from the stream
/// (its watcher fell behind, or rested) stays here, and a full map would leave every later
/// call of the agent unattributed.
const MAX_CALLS: usize = 65_536;

/// Who made each call in flight, noted from its `invoked` event, so that the events ending
/// it, which name only the call, can be told by caller.
#[derive(Debug, Default)]
pub(crate) struct Callers(std::collections::HashMap<uuid::Uuid, Arc<str>>);

impl Callers {
    /// The caller of `event`'s call when it is a call's event: noted at its start (if `keep`
    /// says so for that caller), forgotten at its end.
    pub(crate) fn of(
        &mut self,
        event: &ToolEvent,
        keep: impl FnOnce(&str) -> bool,
    ) -> Option<Arc<str>> {
        match event {
            ToolEvent::Invoked { call_id, agent, .. } => {
                if let Some(agent) = agent
                    && keep(agent)
                {
                    if self.0.len() >= MAX_CALLS {
                        self.0.clear();
                    }
                    self.0.insert(*call_id, Arc::clone(agent));
                }
                agent.clone()
            }
            ToolEvent::Completed { call_id, .. }
            | ToolEvent::Failed { call_id, .. }
            | ToolEvent::Denied { call_id, .. } => self.0.remove(call_id),
            _ => None,
        }
    }
}

/// Whether agent `me` may see `event`, whose call (for a call's events) was made by `caller`:
/// the one rule of what an agent sees, for watchers and for `guildhall://events`.
pub(crate) fn visible_to(me: &str, event: &ToolEvent, caller: Option<&str>) -> bool {
    match event {
        ToolEvent::Invoked { .. }
        | ToolEvent::Completed { .. }
        | ToolEvent::Failed { .. }
        | ToolEvent::Denied { .. } => caller == Some(me),
        ToolEvent::Mailed { from, to, .. } => &**from == me || &**to == me,
        _ => true,
    }
}

/// Events a watcher takes in one go at most: a batch is one write to its connection.
const BATCH: usize = 512;

/// Events as a watcher shows them (`guildhall watch`, `/events`): each admitted event as a
/// line of JSON with `at_ms`, preceded by `{"event":"missed","count":N}` when the watcher fell
/// behind and lost N. Lines come in batches, everything that arrived since the last one, so a
/// busy stream costs one write per batch rather than one per event.
///
/// A watcher follows the lines of a [`Feed`](super::Feed), rendered once for all the
/// feed's watchers: [`Feed::watch`](super::Feed::watch) makes one.
#[derive(Debug)]
pub struct Watching(Follower);

impl Watching {
    /// Follows the lines of a feed.
    pub(super) fn shared(follower: Follower) -> Self {
        Self(follower)
    }

    /// The next lines to show, newline-separated (no trailing newline); `None` once the
    /// runtime is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: a batch is taken whole, synchronously, once it is here.
    pub async fn next(&mut self) -> Option<&str> {
        self.0.next().await
    }

    /// Events this watcher lost by falling behind (each told in a `missed` line).
    pub fn missed(&self) -> u64 {
        self.0.missed()
    }
}

/// Events made into a watcher's lines: those its filter admits, each a line of JSON.
#[derive(Debug)]
pub(super) struct Render {
    events: crate::EventStream,
    filter: EventFilter,
    /// Events lost from the stream that a `missed` line told so far.
    missed: u64,
    /// Events taken from the stream so far, shown or not.
    taken: u64,
    /// Of those, in the last batch.
    last_taken: u64,
    /// The batch being rendered: kept from one batch to the next for its memory.
    batch: Vec<ToolEvent>,
    /// How long taking and rendering the last batch took, its wait for events left out.
    busy: std::time::Duration,
    /// The last batch was as large as one can be: more events waited than it took.
    behind: bool,
}

impl Render {
    pub(super) fn new(events: crate::EventStream, filter: EventFilter) -> Self {
        Self {
            events,
            filter,
            missed: 0,
            taken: 0,
            last_taken: 0,
            batch: Vec::new(),
            busy: std::time::Duration::ZERO,
            behind: false,
        }
    }

    /// Clears `lines` and writes into it the lines of the next events the stream has,
    /// waiting for some; `lines` stays empty when the filter admitted none of them. `false`
    /// once the runtime is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: events are taken only once the first is here, and then without waiting.
    pub(super) async fn next_into(&mut self, lines: &mut Vec<u8>) -> bool {
        lines.clear();
        let Some(first) = self.events.next().await else {
            return false;
        };
        let started = std::time::Instant::now();
        let mut batch = std::mem::take(&mut self.batch);
        batch.push(first);
        self.events.take_waiting(BATCH - 1, &mut batch);
        let at_ms = crate::time::now_ms();
        self.last_taken = batch.len() as u64;
        self.taken += self.last_taken;
        self.behind = batch.len() == BATCH;
        for event in batch.drain(..) {
            self.show(&event, at_ms, lines);
        }
        self.batch = batch;
        self.busy = started.elapsed();
        true
    }

    /// How long taking and rendering the last batch took, its wait for events left out.
    pub(super) fn busy(&self) -> std::time::Duration {
        self.busy
    }

    /// How many events the last batch took from the stream, shown or not.
    pub(super) fn last_taken(&self) -> u64 {
        self.last_taken
    }

    /// Whether the last batch was as large as one can be: the stream comes faster than one
    /// batch per pause takes.
    pub(super) fn behind(&self) -> bool {
        self.behind
    }

    /// Takes no events for `how_long`: those that come meanwhile are lost, and told in a
    /// `missed` line with the next batch.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`EventStream::rest`](crate::EventStream::rest).
    pub(super) async fn rest(&mut self, how_long: std::time::Duration) {
        self.events.rest(how_long).await;
    }

    /// Events lost from the stream so far, each told in a `missed` line.
    pub(super) fn missed(&self) -> u64 {
        self.missed
    }

    /// Events taken from the stream or lost from it so far: a position in the stream.
    pub(super) fn seen(&self) -> u64 {
        self.taken + self.events.missed()
    }

    /// Adds `event`'s lines to `lines`, if the filter admits it.
    fn show(&mut self, event: &ToolEvent, at_ms: u64, lines: &mut Vec<u8>) {
        let missed = self.events.missed();
        if missed > self.missed {
            push_line(lines);
            missed_line(missed - self.missed, lines);
            self.missed = missed;
        }
        if self.filter.admits(event) {
            push_line(lines);
            line::write(event, at_ms, lines);
        }
    }
}

/// An event for the watchers' tests: tool `t` restarted, `restarts` counting them.
#[cfg(test)]
pub(super) fn restarted(restarts: u64) -> ToolEvent {
    ToolEvent::Restarted {
        tool: Arc::from("t"),
        restarts,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Feed;
    use super::*;
    use crate::events::Events;

    fn parse(lines: &str) -> Vec<serde_json::Value> {
        lines
            .split('\n')
            .map(|line| serde_json::from_str(line).expect("each line is JSON"))
            .collect()
    }

    #[tokio::test]
    async fn a_run_of_events_comes_as_one_batch_of_lines_each_with_its_time() {
        let events = Events::default();
        let mut watching = Feed::of(events.clone(), None).watch();
        for i in 0..3 {
            events.emit(|| restarted(i));
        }
        let lines = parse(watching.next().await.expect("lines"));
        assert_eq!(lines.len(), 3, "{lines:?}");
        for (i, line) in lines.iter().enumerate() {
            assert_eq!(line["event"], "restarted");
            assert_eq!(line["restarts"], i as u64);
            assert!(line["at_ms"].as_u64().is_some_and(|ms| ms > 0), "{line}");
        }
    }

    #[tokio::test]
    async fn a_watcher_that_fell_behind_is_told_how_many_it_lost_then_gets_the_rest() {
        let events = Events::default();
        let mut watching = Feed::of(events.clone(), None).watch();
        let total = 5_000u64; // more than the stream keeps
        for i in 0..total {
            events.emit(|| restarted(i));
        }
        let mut lines: Vec<serde_json::Value> = Vec::new();
        while lines.len() < 2 || lines.last().expect("a line")["restarts"] != total - 1 {
            lines.extend(parse(watching.next().await.expect("lines")));
        }
        assert_eq!(lines[0]["event"], "missed");
        let lost = lines[0]["count"].as_u64().expect("a count");
        assert_eq!(
            lines[1]["restarts"], lost,
            "the first kept event follows the lost ones"
        );
        assert_eq!(lines.len() as u64, 1 + total - lost);
        assert_eq!(watching.missed(), lost);
    }

    #[test]
    fn a_memory_of_callers_full_of_lost_ends_is_emptied_rather_than_kept_full() {
        let mut callers = Callers::default();
        let invoked = |n: u64| ToolEvent::Invoked {
            call_id: uuid::Uuid::from_u64_pair(0, n),
            tool: Arc::from("t"),
            agent: Some(Arc::from("a")),
            trace: None,
        };
        // Calls whose ends were lost: never completed.
        for n in 0..=MAX_CALLS as u64 {
            callers.of(&invoked(n), |_| true);
        }
        let last = MAX_CALLS as u64 + 1;
        callers.of(&invoked(last), |_| true);
        let completed = ToolEvent::Completed {
            call_id: uuid::Uuid::from_u64_pair(0, last),
            tool: Arc::from("t"),
            duration_us: 1,
        };
        assert_eq!(callers.of(&completed, |_| true).as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn an_agent_sees_its_own_calls_and_not_another_agents() {
        let events = Events::default();
        let mut watching = Feed::of(events.clone(), Some("a".into())).watch();
        let call = |agent: &str| {
            let call_id = uuid::Uuid::new_v4();
            events.emit(|| ToolEvent::Invoked {
                call_id,
                tool: Arc::from("t"),
                agent: Some(Arc::from(agent)),
                trace: None,
            });
            events.emit(|| ToolEvent::Completed {
                call_id,
                tool: Arc::from("t"),
                duration_us: 1,
            });
        };
        call("b");
        call("a");
        let lines = parse(watching.next().await.expect("lines"));
        let kinds: Vec<_> = lines.iter().map(|l| l["event"].clone()).collect();
        assert_eq!(kinds, ["invoked", "completed"]);
        assert_eq!(lines[0]["agent"], "a");
    }
}
