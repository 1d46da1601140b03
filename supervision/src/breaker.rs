//! Circuit breaker with Akka semantics.
//!
//! - **Closed**: calls pass; consecutive failures are counted and a success resets the count.
//!   After `max_failures` consecutive failures the breaker opens.
//! - **Open**: calls are rejected at once with [`CircuitOpen`], which says when to retry.
//!   After the reset timeout the next call is let through as a probe (half-open).
//! - **Half-open**: exactly one probe is in flight; other calls are rejected. A successful
//!   probe closes the breaker and restores the base reset timeout; a failed probe re-opens it
//!   with the reset timeout multiplied by `backoff_factor`, up to `max_reset_timeout`.
//!
//! [`CircuitBreaker`] is the pure state machine (it takes `now`); [`SharedBreaker`] wraps it
//! for concurrent callers and reads the clock through tokio, so paused-time tests drive it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Breaker tuning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub max_failures: u32,
    /// How long the breaker stays open before the first probe.
    pub reset_timeout: Duration,
    /// Multiplier applied to the reset timeout after a failed probe.
    pub backoff_factor: f64,
    /// Upper bound on the reset timeout.
    pub max_reset_timeout: Duration,
}

impl Default for BreakerConfig {
    /// Five failures; 1 s doubling up to 60 s.
    fn default() -> Self {
        Self {
            max_failures: 5,
            reset_timeout: Duration::from_secs(1),
            backoff_factor: 2.0,
            max_reset_timeout: Duration::from_secs(60),
        }
    }
}

/// A call was rejected because the breaker is open (or half-open with its probe in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitOpen {
    /// How long until a call may be let through again.
    pub retry_after: Duration,
}

/// What a caller was admitted as; hand it back to [`CircuitBreaker::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// An ordinary call while closed.
    Normal,
    /// The single half-open probe.
    Probe,
}

/// The breaker's state, as shown in snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BreakerStatus {
    /// Calls pass.
    Closed {
        /// Consecutive failures so far.
        failures: u32,
    },
    /// Calls are rejected.
    Open {
        /// Time until a probe is let through.
        #[serde(with = "millis")]
        retry_after: Duration,
        /// The reset timeout currently in force.
        #[serde(with = "millis")]
        reset_timeout: Duration,
    },
    /// One probe call is in flight.
    HalfOpen,
}

/// A state change worth reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The breaker opened (from closed, or re-opened after a failed probe).
    Opened {
        /// The reset timeout now in force.
        reset_timeout: Duration,
    },
    /// A probe succeeded and the breaker closed.
    Closed,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

/// The breaker state machine. Never reads a clock.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: State,
    reset_timeout: Duration,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: State::Closed { failures: 0 },
            reset_timeout: config.reset_timeout,
        }
    }

    /// Asks to let a call through at `now`.
    ///
    /// # Errors
    /// [`CircuitOpen`] while open, or while half-open with the probe still in flight.
    pub fn try_acquire(&mut self, now: Instant) -> Result<Admission, CircuitOpen> {
        match self.state {
            State::Closed { .. } => Ok(Admission::Normal),
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen;
                Ok(Admission::Probe)
            }
            State::Open { until } => Err(CircuitOpen {
                retry_after: until - now,
            }),
            // The probe decides soon; a caller cannot do better than retry after it.
            State::HalfOpen => Err(CircuitOpen {
                retry_after: Duration::ZERO,
            }),
        }
    }

    /// Records the outcome of a call admitted as `admission`. Results of ordinary calls that
    /// finish after the breaker left the closed state are ignored, as in Akka.
    pub fn record(
        &mut self,
        admission: Admission,
        success: bool,
        now: Instant,
    ) -> Option<Transition> {
        match (admission, self.state, success) {
            (Admission::Normal, State::Closed { .. }, true) => {
                self.state = State::Closed { failures: 0 };
                None
            }
            (Admission::Normal, State::Closed { failures }, false) => {
                let failures = failures + 1;
                if failures >= self.config.max_failures {
                    Some(self.open(now))
                } else {
                    self.state = State::Closed { failures };
                    None
                }
            }
            (Admission::Probe, State::HalfOpen, true) => {
                self.reset_timeout = self.config.reset_timeout;
                self.state = State::Closed { failures: 0 };
                Some(Transition::Closed)
            }
            (Admission::Probe, State::HalfOpen, false) => {
                let next = self
                    .reset_timeout
                    .mul_f64(self.config.backoff_factor.max(1.0))
                    .min(self.config.max_reset_timeout);
                self.reset_timeout = next;
                Some(self.open(now))
            }
            _ => None,
        }
    }

    /// The probe was abandoned before it produced an outcome (its caller went away): the
    /// breaker returns to open with the probe slot free at once, so the next call probes.
    pub fn abandon_probe(&mut self, now: Instant) {
        if let State::HalfOpen = self.state {
            self.state = State::Open { until: now };
        }
    }

    /// The state as seen at `now`.
    pub fn status(&self, now: Instant) -> BreakerStatus {
        match self.state {
            State::Closed { failures } => BreakerStatus::Closed { failures },
            State::Open { until } => BreakerStatus::Open {
                retry_after: until.saturating_duration_since(now),
                reset_timeout: self.reset_timeout,
            },
            State::HalfOpen => BreakerStatus::HalfOpen,
        }
    }

    fn open(&mut self, now: Instant) -> Transition {
        self.state = State::Open {
            until: now + self.reset_timeout,
        };
        Transition::Opened {
            reset_timeout: self.reset_timeout,
        }
    }
}

/// A [`CircuitBreaker`] shared by concurrent callers, on tokio's clock.
///
/// The common case, a closed breaker with no recent failures, takes neither the lock nor the
/// clock: an atomic flag mirrors "closed with zero failures" and is refreshed after every
/// locked operation. A success seen through the flag changes nothing, so it is not recorded.
#[derive(Debug)]
pub struct SharedBreaker {
    inner: Mutex<CircuitBreaker>,
    healthy: AtomicBool,
}

impl SharedBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            inner: Mutex::new(CircuitBreaker::new(config)),
            healthy: AtomicBool::new(true),
        }
    }

    /// See [`CircuitBreaker::try_acquire`].
    ///
    /// # Errors
    /// [`CircuitOpen`] when the call must fail fast.
    pub fn try_acquire(&self) -> Result<Admission, CircuitOpen> {
        if self.healthy.load(Ordering::Acquire) {
            return Ok(Admission::Normal);
        }
        self.locked(|b| b.try_acquire(now()))
    }

    /// See [`CircuitBreaker::record`].
    pub fn record(&self, admission: Admission, success: bool) -> Option<Transition> {
        if success && admission == Admission::Normal && self.healthy.load(Ordering::Acquire) {
            return None;
        }
        self.locked(|b| b.record(admission, success, now()))
    }

    /// See [`CircuitBreaker::abandon_probe`].
    pub fn abandon_probe(&self) {
        self.locked(|b| b.abandon_probe(now()));
    }

    fn locked<R>(&self, op: impl FnOnce(&mut CircuitBreaker) -> R) -> R {
        let mut breaker = self.lock();
        let result = op(&mut breaker);
        let healthy = matches!(breaker.state, State::Closed { failures: 0 });
        self.healthy.store(healthy, Ordering::Release);
        result
    }

    /// The current state.
    pub fn status(&self) -> BreakerStatus {
        self.lock().status(now())
    }

    fn lock(&self) -> MutexGuard<'_, CircuitBreaker> {
        // The state machine has no invariant a panic half-way could break.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

mod millis {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Duration, D::Error> {
        <u64 as serde::Deserialize>::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn breaker() -> CircuitBreaker {
        CircuitBreaker::new(BreakerConfig {
            max_failures: 3,
            reset_timeout: S,
            backoff_factor: 2.0,
            max_reset_timeout: 3 * S,
        })
    }

    fn fail(b: &mut CircuitBreaker, now: Instant) -> Option<Transition> {
        let a = b.try_acquire(now).expect("admitted");
        b.record(a, false, now)
    }

    #[test]
    fn opens_after_consecutive_failures() {
        let t = Instant::now();
        let mut b = breaker();
        assert_eq!(fail(&mut b, t), None);
        assert_eq!(fail(&mut b, t), None);
        assert_eq!(
            fail(&mut b, t),
            Some(Transition::Opened { reset_timeout: S })
        );
        let err = b.try_acquire(t).unwrap_err();
        assert_eq!(err.retry_after, S);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let t = Instant::now();
        let mut b = breaker();
        fail(&mut b, t);
        fail(&mut b, t);
        let a = b.try_acquire(t).unwrap();
        b.record(a, true, t);
        assert_eq!(fail(&mut b, t), None);
        assert_eq!(b.status(t), BreakerStatus::Closed { failures: 1 });
    }

    #[test]
    fn retry_after_counts_down_while_open() {
        let t = Instant::now();
        let mut b = breaker();
        (0..3).for_each(|_| {
            fail(&mut b, t);
        });
        let err = b.try_acquire(t + Duration::from_millis(400)).unwrap_err();
        assert_eq!(err.retry_after, Duration::from_millis(600));
    }

    #[test]
    fn one_probe_after_reset_timeout_and_others_fail_fast() {
        let t = Instant::now();
        let mut b = breaker();
        (0..3).for_each(|_| {
            fail(&mut b, t);
        });
        assert_eq!(b.try_acquire(t + S), Ok(Admission::Probe));
        assert!(b.try_acquire(t + S).is_err());
        assert_eq!(b.status(t + S), BreakerStatus::HalfOpen);
    }

    #[test]
    fn successful_probe_closes() {
        let t = Instant::now();
        let mut b = breaker();
        (0..3).for_each(|_| {
            fail(&mut b, t);
        });
        let a = b.try_acquire(t + S).unwrap();
        assert_eq!(b.record(a, true, t + S), Some(Transition::Closed));
        assert_eq!(b.try_acquire(t + S), Ok(Admission::Normal));
    }

    #[test]
    fn failed_probe_reopens_with_doubled_timeout_up_to_max() {
        let t = Instant::now();
        let mut b = breaker();
        (0..3).for_each(|_| {
            fail(&mut b, t);
        });
        let t1 = t + S;
        assert_eq!(
            fail(&mut b, t1),
            Some(Transition::Opened {
                reset_timeout: 2 * S
            })
        );
        assert!(b.try_acquire(t1 + S).is_err());
        let t2 = t1 + 2 * S;
        assert_eq!(
            fail(&mut b, t2),
            Some(Transition::Opened {
                reset_timeout: 3 * S
            })
        );
        let t3 = t2 + 3 * S;
        assert_eq!(
            fail(&mut b, t3),
            Some(Transition::Opened {
                reset_timeout: 3 * S
            })
        );
    }

    #[test]
    fn success_after_reopen_restores_base_timeout() {
        let t = Instant::now();
        let mut b = breaker();
        (0..3).for_each(|_| {
            fail(&mut b, t);
        });
        fail(&mut b, t + S);
        let t2 = t + 3 * S;
        let a = b.try_acquire(t2).unwrap();
        b.record(a, true, t2);
        (0..3).for_each(|_| {
            fail(&mut b, t2);
        });
        assert_eq!(b.try_acquire(t2).unwrap_err().retry_after, S);
    }

    #[test]
    fn late_results_of_normal_calls_are_ignored_when_open() {
        let t = Instant::now();
        let mut b = breaker();
        let late = b.try_acquire(t).unwrap();
        (0..3).for_each(|_| {
            fail(&mut b, t);
        });
        assert_eq!(b.record(late, true, t), None);
        assert!(b.try_acquire(t).is_err());
    }

    #[test]
    fn abandoned_probe_lets_the_next_call_probe() {
        let t = Instant::now();
        let mut b = breaker();
        (0..3).for_each(|_| {
            fail(&mut b, t);
        });
        assert_eq!(b.try_acquire(t + S), Ok(Admission::Probe));
        b.abandon_probe(t + S);
        assert_eq!(b.try_acquire(t + S), Ok(Admission::Probe));
    }
}
