//! The loop guard: stops an agent calling the same tool with the same arguments over and
//! over (a model stuck in a "doom loop").
//!
//! Each agent's latest streak is kept: the tool, a digest of its canonical arguments, and
//! how many calls in a row matched. The call that makes the streak reach the threshold
//! (and every identical call after it) trips the guard. Calls a tool declares as waiting or
//! polling ([`Tool::polls`](guildhall_actors::Tool::polls)) neither count nor break a
//! streak. Calls without an agent (the embedding program's own) are not guarded.
//!
//! A read-only tool is judged by its results too: repeating a read is a loop only while it
//! keeps answering the same thing. Such a call runs, and counts as a repeat only if its
//! result equals the last one ([`LoopGuard::count_read`]); an agent polling `check_inbox`
//! while new mail arrives is not looping. Other tools change something, so the guard cannot
//! run them to see: they are judged by their arguments, before they run
//! ([`LoopGuard::count`]).

use std::sync::Arc;

use dashmap::DashMap;
use rustc_hash::FxBuildHasher;
use serde::Deserialize;

use super::rules::Action;

/// The guard's settings (`[doom_loop]` in config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoopConfig {
    /// Identical calls in a row that trip the guard; 0 turns it off.
    pub threshold: u32,
    /// What a tripped guard does: `deny` (the default), `ask`, or `allow` (only logs).
    pub action: Action,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            threshold: 3,
            action: Action::Deny,
        }
    }
}

#[derive(Clone, Copy)]
struct Streak {
    /// The tool's [`id`](super::ToolMeta::id).
    tool: u64,
    digest: u64,
    /// The digest of the last result, for tools judged by their results.
    result: Option<u64>,
    count: u32,
}

/// Every agent's current streak.
#[derive(Default)]
pub struct LoopGuard {
    config: LoopConfig,
    streaks: DashMap<Arc<str>, Streak, FxBuildHasher>,
}

impl LoopGuard {
    /// A guard with `config`.
    pub fn new(config: LoopConfig) -> Self {
        Self {
            config,
            streaks: DashMap::default(),
        }
    }

    /// Counts a call by `agent` to the tool `tool_id` ([`ToolMeta::id`](super::ToolMeta::id)) with arguments of
    /// `digest`; returns how many identical calls in a row that makes when it trips the
    /// guard.
    pub fn count(&self, agent: &Arc<str>, tool_id: u64, digest: u64) -> Option<u32> {
        if self.config.threshold == 0 {
            return None;
        }
        let count = match self.streaks.get_mut(&**agent) {
            Some(mut streak) => {
                if streak.tool == tool_id && streak.digest == digest {
                    streak.count = streak.count.saturating_add(1);
                } else {
                    *streak = Streak {
                        tool: tool_id,
                        digest,
                        result: None,
                        count: 1,
                    };
                }
                streak.count
            }
            None => {
                self.streaks.insert(
                    Arc::clone(agent),
                    Streak {
                        tool: tool_id,
                        digest,
                        result: None,
                        count: 1,
                    },
                );
                1
            }
        };
        (count >= self.config.threshold).then_some(count)
    }

    /// Counts a finished call by `agent` to the read-only tool `tool_id` with arguments of `digest`
    /// whose result has digest `result`: a repeat only when both the arguments and the result
    /// match the agent's last call. Returns the count when it trips the guard.
    pub fn count_read(
        &self,
        agent: &Arc<str>,
        tool_id: u64,
        digest: u64,
        result: u64,
    ) -> Option<u32> {
        if self.config.threshold == 0 {
            return None;
        }
        let fresh = Streak {
            tool: tool_id,
            digest,
            result: Some(result),
            count: 1,
        };
        let count = match self.streaks.get_mut(&**agent) {
            Some(mut streak) => {
                if streak.tool == tool_id
                    && streak.digest == digest
                    && streak.result == Some(result)
                {
                    streak.count = streak.count.saturating_add(1);
                } else {
                    *streak = fresh;
                }
                streak.count
            }
            None => {
                self.streaks.insert(Arc::clone(agent), fresh);
                1
            }
        };
        (count >= self.config.threshold).then_some(count)
    }

    /// Whether the guard counts anything.
    pub fn is_on(&self) -> bool {
        self.config.threshold > 0
    }

    /// What a tripped guard does.
    pub fn action(&self) -> Action {
        self.config.action
    }

    /// Keeps the streaks of the agents `keep` says yes to.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.streaks.retain(|agent, _| keep(agent));
    }

    /// Forgets `agent`'s streak (an approval given after the guard asked).
    pub fn reset(&self, agent: &str) {
        self.streaks.remove(agent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_on_the_third_identical_call_only() {
        let guard = LoopGuard::new(LoopConfig::default());
        let (a, b) = (Arc::<str>::from("a"), Arc::<str>::from("b"));
        let (t, u) = (1, 2);
        assert_eq!(guard.count(&a, t, 1), None);
        assert_eq!(guard.count(&a, t, 1), None);
        // Another agent's calls are its own streak.
        assert_eq!(guard.count(&b, t, 1), None);
        assert_eq!(guard.count(&a, t, 1), Some(3));
        assert_eq!(guard.count(&a, t, 1), Some(4));
        // Different arguments, or another tool, start over.
        assert_eq!(guard.count(&a, t, 2), None);
        assert_eq!(guard.count(&a, u, 2), None);
        assert_eq!(guard.count(&a, t, 2), None);
        guard.reset("a");
        assert_eq!(guard.count(&a, t, 2), None);

        // Reads count only while their result stays the same.
        assert_eq!(guard.count_read(&a, t, 9, 100), None);
        assert_eq!(guard.count_read(&a, t, 9, 100), None);
        assert_eq!(
            guard.count_read(&a, t, 9, 101),
            None,
            "new result: a new streak"
        );
        assert_eq!(guard.count_read(&a, t, 9, 101), None);
        assert_eq!(guard.count_read(&a, t, 9, 101), Some(3));

        let off = LoopGuard::new(LoopConfig {
            threshold: 0,
            ..LoopConfig::default()
        });
        for _ in 0..5 {
            assert_eq!(off.count(&a, t, 1), None);
        }
    }
}
