//! [`Pace`]: how long a feed's rendering (or the ring behind `guildhall://events`) rests
//! after a batch, so that watching does not slow what it watches.
//!
//! Taking an event costs the call that emits it more than the event costs to build: its
//! hand-over through the stream's ring (the ring's locks on the caller's core, the copy and
//! drop on the subscriber's). At full speed a swarm makes a few hundred thousand events a
//! second, far more than a page or a terminal can show, and taking all of them cost a
//! governed call a tenth to a fifth of its time (`bench calls`, watched against unwatched).
//! While every subscriber of the stream rests, a call hands nothing over and builds nothing
//! (see [`crate::events`]). So a rendering takes at most [`SAMPLE_RATE`] events a second on
//! average, in bursts of up to [`BURST`] after a quieter while; past that it rests between
//! batches and shows a sample, each gap told in a `missed` line. Below that rate it never
//! rests and shows every event: 5,000 events a second, the rate watchers are promised, is
//! half of it, and the burst is two seconds of that.
//!
//! A rate rather than a share of the rendering's own time: the rendering's work is small
//! beside what the hand-over costs the calls, so resting nineteen parts in twenty of its
//! own time still took five in six of the events a busy governed runtime made, and watching
//! cost its calls 0.10 to 0.17 of the bench's governed ratio. Taking 10,000 a second of
//! a stream of a million costs them about 0.02 (`docs/benchmarks.md`).
//!
//! A rendering that falls behind on its own work (events that are slow to render, such as
//! long error messages) also rests: after a full batch it works at most one part in
//! [`WORK_SHARE`] of the time. No rest is longer than [`MOST_REST`], within the 100 ms lag
//! watchers are promised.
//!
//! Counts are not sampled: the metrics count every call and event where it happens
//! (`governance::call_stats`, [`crate::events::Tally`]).

use std::time::{Duration, Instant};

use crate::events::COALESCE;

/// Events a second a rendering takes at most, on average, before it samples.
pub(super) const SAMPLE_RATE: u32 = 10_000;

/// Events a rendering may take at once past [`SAMPLE_RATE`] after a quiet while (its credit
/// when it starts, and the most it saves up).
pub(super) const BURST: u32 = 10_000;

/// A rendering that fell behind on its own work works at most one part in this many of the
/// time.
const WORK_SHARE: u32 = 20;

/// The longest a rendering rests after a batch: within the 100 ms lag watchers are promised.
pub(super) const MOST_REST: Duration = Duration::from_millis(50);

/// A rendering's pace: the events it may still take before it samples (a token bucket of
/// [`BURST`] refilled at [`SAMPLE_RATE`]).
#[derive(Debug)]
pub(super) struct Pace {
    /// Events it may take now; below zero, what it took beyond its rate.
    credit: f64,
    /// When the credit was last counted.
    at: Instant,
}

/// One batch a rendering took, as [`Pace::rest_after`] weighs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    /// Events taken from the stream, shown or not.
    pub(super) taken: u64,
    /// How long taking and rendering them took.
    pub(super) busy: Duration,
    /// More events waited than the batch could take.
    pub(super) full: bool,
}

impl Pace {
    /// A rendering starting at `now`, with a full burst's credit.
    pub(super) fn new(now: Instant) -> Self {
        Self {
            credit: f64::from(BURST),
            at: now,
        }
    }

    /// How long to rest after `batch`, done at `now`, if at all: long enough to bring the
    /// rendering back within its rate, or nineteen times its work when it fell behind on
    /// its own, whichever is longer, and at most [`MOST_REST`]. No rest shorter than the
    /// stream's own pause ([`COALESCE`]); what is owed then carries over to the next batch.
    pub(super) fn rest_after(&mut self, batch: Batch, now: Instant) -> Option<Duration> {
        let rate = f64::from(SAMPLE_RATE);
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * rate;
        self.credit = (self.credit + earned).min(f64::from(BURST)) - batch.taken as f64;
        self.at = now;
        let owed = if self.credit < 0.0 {
            Duration::from_secs_f64(-self.credit / rate)
        } else {
            Duration::ZERO
        };
        let work = if batch.full {
            batch.busy.saturating_mul(WORK_SHARE - 1)
        } else {
            Duration::ZERO
        };
        let rest = owed.max(work).min(MOST_REST);
        (rest > COALESCE).then_some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(taken: u64) -> Batch {
        Batch {
            taken,
            busy: Duration::from_micros(10),
            full: false,
        }
    }

    #[test]
    fn below_the_sample_rate_a_rendering_never_rests() {
        let start = Instant::now();
        let mut pace = Pace::new(start);
        // 5,000 events a second for ten seconds, in batches every 2 ms.
        for tick in 1..=5_000u32 {
            let now = start + COALESCE * tick;
            assert_eq!(pace.rest_after(taken(10), now), None, "at batch {tick}");
        }
    }

    #[test]
    fn a_burst_passes_whole_and_then_the_rendering_samples_at_its_rate() {
        let start = Instant::now();
        let mut pace = Pace::new(start);
        // A burst within the credit, all at once: no rest.
        assert_eq!(pace.rest_after(taken(u64::from(BURST)), start), None);
        // Then 500 more at once: rest until they are within the rate.
        let owed = Duration::from_secs_f64(500.0 / f64::from(SAMPLE_RATE));
        let rest = pace.rest_after(taken(500), start).expect("rests");
        assert!(rest.abs_diff(owed) < Duration::from_micros(1), "{rest:?}");
        // Rested that long, it owes nothing: a small batch right then needs no rest.
        assert_eq!(pace.rest_after(taken(1), start + owed), None);
        // Sustained past the rate, it rests in proportion: offered 512 events every 2 ms
        // (256,000 a second) it takes its rate's worth and rests the rest of the time.
        let (mut now, mut resting, mut took) = (start + owed, Duration::ZERO, 0);
        for _ in 0..1_000 {
            now += COALESCE;
            took += 512;
            let rest = pace.rest_after(taken(512), now).unwrap_or_default();
            resting += rest;
            now += rest;
        }
        let elapsed = (now - start - owed).as_secs_f64();
        let expected = 1.0 - 2.0 * f64::from(SAMPLE_RATE) / 1_000.0 / 512.0;
        let share = resting.as_secs_f64() / elapsed;
        assert!(
            (share - expected).abs() < 0.01,
            "{share} resting, {expected} expected"
        );
        let rate = f64::from(took) / elapsed;
        assert!(
            (rate / f64::from(SAMPLE_RATE) - 1.0).abs() < 0.02,
            "{rate} events a second taken"
        );
    }

    #[test]
    fn a_rendering_behind_on_its_own_work_rests_nineteen_times_it_within_the_promised_lag() {
        let start = Instant::now();
        let full = |busy| Batch {
            taken: 1,
            busy,
            full: true,
        };
        let mut pace = Pace::new(start);
        assert_eq!(
            pace.rest_after(full(Duration::from_micros(50)), start),
            None,
            "under the pause"
        );
        assert_eq!(
            pace.rest_after(full(Duration::from_millis(1)), start),
            Some(Duration::from_millis(19))
        );
        assert_eq!(
            pace.rest_after(full(Duration::from_millis(10)), start),
            Some(MOST_REST)
        );
        // However far past its rate: at most the longest rest.
        assert_eq!(pace.rest_after(taken(1_000_000), start), Some(MOST_REST));
    }
}
