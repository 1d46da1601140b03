//! Calls counted by tool and outcome, with the latency of those that succeeded: what
//! `/metrics` reports of calls, counted by the calls themselves as they end.
//!
//! Counted here rather than by a subscriber of the event stream: a subscriber that takes
//! every call's events costs every call the stream's hand-over (the ring's locks, the
//! event's strings shared with another core), about a tenth of a governed call, while a
//! server answers `/metrics` whether anyone scrapes it or not. Here a call adds to a few
//! counters of its tool, and only once [`CallStats::start`] was called (by the metrics).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dashmap::DashMap;
use guildhall_actors::ErrorKind;

/// Every kind of failure, in the order of their counters (after `ok`).
const KINDS: [ErrorKind; 10] = ErrorKind::ALL;

/// Counters of outcomes: `ok`, each kind of [`KINDS`], and `cancelled` (the caller went
/// away first).
const OUTCOMES: usize = KINDS.len() + 2;
/// Where a kind not in [`KINDS`] is counted: `unavailable`.
const UNLISTED_KIND: usize = 6;
const _: () = assert!(matches!(KINDS[UNLISTED_KIND], ErrorKind::Unavailable));
const CANCELLED: usize = OUTCOMES - 1;

/// The latency buckets' upper bounds: 50 µs, doubling, 21 of them (to about 52 s), then
/// one for longer calls.
const FINITE_BUCKETS: usize = 21;
const FIRST_BOUND_US: u64 = 50;

/// How a call ended, as counted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ended {
    /// It returned a result, in `duration_us`.
    Ok { duration_us: u64 },
    /// It failed.
    Failed(ErrorKind),
    /// The caller went away before it ended.
    Cancelled,
}

/// A runtime's call counters, one set per tool name (a tool registered again keeps its
/// counts).
#[derive(Debug, Default)]
pub struct CallStats {
    counting: AtomicBool,
    tools: DashMap<Arc<str>, Arc<ToolCallStats>>,
}

impl CallStats {
    /// Calls end uncounted until this is called.
    pub(crate) fn start(&self) {
        self.counting.store(true, Ordering::Release);
    }

    /// Whether calls are counted.
    pub(crate) fn counting(&self) -> bool {
        self.counting.load(Ordering::Relaxed)
    }

    /// The counters of tool `name`, made on first use.
    pub(crate) fn of(&self, name: &Arc<str>) -> Arc<ToolCallStats> {
        Arc::clone(self.tools.entry(Arc::clone(name)).or_default().value())
    }

    /// Counts a call to the tool whose counters are `tool`, if counting started.
    #[inline]
    pub(crate) fn record(&self, tool: &ToolCallStats, ended: Ended) {
        if self.counting() {
            tool.record(ended);
        }
    }

    /// Each tool's counts now, by name.
    pub fn read(&self) -> Vec<ToolCalls> {
        let mut tools: Vec<ToolCalls> = self
            .tools
            .iter()
            .map(|entry| entry.value().read(Arc::clone(entry.key())))
            .collect();
        tools.sort_by(|a, b| a.tool.cmp(&b.tool));
        tools
    }
}

/// One tool's counters. A call that succeeded adds to its bucket and to the total time,
/// two additions: the count of `ok` is the buckets' sum (its counter stays 0).
#[derive(Debug, Default)]
pub struct ToolCallStats {
    outcomes: [AtomicU64; OUTCOMES],
    buckets: [AtomicU64; FINITE_BUCKETS + 1],
    ok_micros: AtomicU64,
}

impl ToolCallStats {
    fn record(&self, ended: Ended) {
        let slot = match ended {
            Ended::Ok { duration_us } => {
                self.buckets[bucket(duration_us)].fetch_add(1, Ordering::Relaxed);
                self.ok_micros.fetch_add(duration_us, Ordering::Relaxed);
                return;
            }
            // A kind added to the actors crate but not to `ErrorKind::ALL` counts as
            // `unavailable` rather than as another kind.
            Ended::Failed(kind) => {
                1 + KINDS
                    .iter()
                    .position(|k| *k == kind)
                    .unwrap_or(UNLISTED_KIND)
            }
            Ended::Cancelled => CANCELLED,
        };
        self.outcomes[slot].fetch_add(1, Ordering::Relaxed);
    }

    fn read(&self, tool: Arc<str>) -> ToolCalls {
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let ok_buckets: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, c)| (bound_seconds(i), count(c)))
            .collect();
        let ok = ok_buckets.iter().map(|(_, n)| n).sum();
        let name = |slot: usize| match slot {
            0 => "ok",
            CANCELLED => "cancelled",
            kind => KINDS[kind - 1].as_str(),
        };
        ToolCalls {
            tool,
            outcomes: (0..OUTCOMES)
                .map(|slot| {
                    let n = if slot == 0 {
                        ok
                    } else {
                        count(&self.outcomes[slot])
                    };
                    (name(slot), n)
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
            ok_buckets,
            ok_seconds: count(&self.ok_micros) as f64 / 1e6,
        }
    }
}

/// The bucket of a call that took `us` microseconds: the first whose bound it does not
/// pass.
fn bucket(us: u64) -> usize {
    let over = us.div_ceil(FIRST_BOUND_US);
    let i = if over <= 1 {
        0
    } else {
        (over - 1).ilog2() as usize + 1
    };
    i.min(FINITE_BUCKETS)
}

/// Bucket `i`'s upper bound in seconds (the last is unbounded).
fn bound_seconds(i: usize) -> f64 {
    if i >= FINITE_BUCKETS {
        f64::INFINITY
    } else {
        (FIRST_BOUND_US << i) as f64 / 1e6
    }
}

/// One tool's calls as counted when read.
#[derive(Debug, Clone)]
pub struct ToolCalls {
    /// The tool.
    pub tool: Arc<str>,
    /// Calls ended, by outcome (`ok`, `cancelled`, or the failure's kind); outcomes never
    /// seen are left out.
    pub outcomes: Vec<(&'static str, u64)>,
    /// The calls that succeeded, by latency bucket: each bucket's upper bound in seconds
    /// and its own count (not cumulative); the last bound is infinite.
    pub ok_buckets: Vec<(f64, u64)>,
    /// Their total duration, in seconds.
    pub ok_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_falls_in_the_first_bucket_whose_bound_it_does_not_pass() {
        for (us, expected) in [
            (0, 0),
            (50, 0),
            (51, 1),
            (100, 1),
            (101, 2),
            (200, 2),
            (201, 3),
            (50 << 20, 20),
            ((50 << 20) + 1, 21),
            (u64::MAX, 21),
        ] {
            assert_eq!(bucket(us), expected, "{us} µs");
            let bound = bound_seconds(bucket(us));
            assert!(us as f64 / 1e6 <= bound, "{us} µs over its bound {bound}");
        }
    }

    #[test]
    fn calls_are_counted_by_outcome_only_once_counting_started() {
        let stats = CallStats::default();
        let tool = stats.of(&Arc::from("t"));
        stats.record(&tool, Ended::Ok { duration_us: 10 });
        assert!(stats.read()[0].outcomes.is_empty(), "not counting yet");
        stats.start();
        stats.record(&tool, Ended::Ok { duration_us: 10 });
        stats.record(&tool, Ended::Ok { duration_us: 120 });
        stats.record(&tool, Ended::Failed(ErrorKind::Crashed));
        stats.record(&tool, Ended::Cancelled);
        let read = &stats.read()[0];
        assert_eq!(read.outcomes, [("ok", 2), ("crashed", 1), ("cancelled", 1)]);
        assert_eq!(read.ok_buckets[0], (0.00005, 1));
        assert_eq!(read.ok_buckets[2], (0.0002, 1));
        assert!((read.ok_seconds - 0.00013).abs() < 1e-12);
        assert!(
            Arc::ptr_eq(&tool, &stats.of(&Arc::from("t"))),
            "same tool, same counters"
        );
    }
}
