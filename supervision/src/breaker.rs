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
//! **Failures are attributed to their caller.** A caller that can make a tool fail (an input
//! that makes it panic or run past its deadline) must not be able to shut the tool off for
//! everyone else. So the circuit opens for all callers only when the run of consecutive
//! failures holds at least [`BreakerConfig::min_callers`] distinct callers, or a failure of a
//! trusted call (the embedding program's own, made for no caller). A caller whose own calls
//! keep failing gets a circuit of its own, with the same thresholds, which rejects only its
//! calls.
//!
//! [`CircuitBreaker`] is the pure state machine (it takes `now`); [`SharedBreaker`] wraps it
//! for concurrent callers, keeps the per-caller circuits, and reads the clock through tokio,
//! so paused-time tests drive it.

use std::collections::HashMap;
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
    /// Distinct callers whose failures it takes to open the circuit for everyone (a trusted
    /// call's failure counts as enough). Below that, only the failing caller's own circuit
    /// opens.
    pub min_callers: u32,
}

impl Default for BreakerConfig {
    /// Five failures from at least two callers; 1 s doubling up to 60 s.
    fn default() -> Self {
        Self {
            max_failures: 5,
            reset_timeout: Duration::from_secs(1),
            backoff_factor: 2.0,
            max_reset_timeout: Duration::from_secs(60),
            min_callers: 2,
        }
    }
}

/// Who a call was made for, as the breaker tells callers apart: a hash of the caller's
/// identity. `None` where a breaker takes an `Option<Caller>` is a trusted call.
pub type Caller = u64;

/// A call was rejected because the breaker is open (or half-open with its probe in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitOpen {
    /// How long until a call may be let through again.
    pub retry_after: Duration,
    /// Whether only this caller's own circuit is open (its calls kept failing), the tool
    /// serving everyone else.
    pub own: bool,
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
    /// The distinct callers in the current run of failures (at most `min_callers`).
    blamed: Vec<Caller>,
    /// Whether a trusted call failed in the current run.
    trusted_failed: bool,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: State::Closed { failures: 0 },
            reset_timeout: config.reset_timeout,
            blamed: Vec::new(),
            trusted_failed: false,
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
                own: false,
            }),
            // The probe decides soon; a caller cannot do better than retry after it.
            State::HalfOpen => Err(CircuitOpen {
                retry_after: Duration::ZERO,
                own: false,
            }),
        }
    }

    /// Records the outcome of a trusted call admitted as `admission`; see [`Self::record_by`].
    pub fn record(
        &mut self,
        admission: Admission,
        success: bool,
        now: Instant,
    ) -> Option<Transition> {
        self.record_by(admission, success, None, now)
    }

    /// Records the outcome of a call made for `caller` (`None`: a trusted call) admitted as
    /// `admission`. Consecutive failures open the breaker once they number `max_failures`
    /// and come from `min_callers` distinct callers or include a trusted call. Results of
    /// ordinary calls that finish after the breaker left the closed state are ignored, as in
    /// Akka.
    pub fn record_by(
        &mut self,
        admission: Admission,
        success: bool,
        caller: Option<Caller>,
        now: Instant,
    ) -> Option<Transition> {
        match (admission, self.state, success) {
            (Admission::Normal, State::Closed { .. }, true) => {
                self.state = State::Closed { failures: 0 };
                self.forget_blame();
                None
            }
            (Admission::Normal, State::Closed { failures }, false) => {
                let failures = failures.saturating_add(1);
                self.blame(caller);
                if failures >= self.config.max_failures && self.blame_is_shared() {
                    Some(self.open(now))
                } else {
                    self.state = State::Closed { failures };
                    None
                }
            }
            (Admission::Probe, State::HalfOpen, true) => {
                self.reset_timeout = self.config.reset_timeout;
                self.state = State::Closed { failures: 0 };
                self.forget_blame();
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

    /// Whether this breaker is closed with no failure counted.
    pub fn is_clear(&self) -> bool {
        matches!(self.state, State::Closed { failures: 0 })
    }

    fn blame(&mut self, caller: Option<Caller>) {
        match caller {
            None => self.trusted_failed = true,
            Some(caller) => {
                if !self.blamed.contains(&caller)
                    && self.blamed.len() < self.config.min_callers as usize
                {
                    self.blamed.push(caller);
                }
            }
        }
    }

    fn blame_is_shared(&self) -> bool {
        self.trusted_failed || self.blamed.len() >= self.config.min_callers.max(1) as usize
    }

    fn forget_blame(&mut self) {
        self.blamed.clear();
        self.trusted_failed = false;
    }

    fn open(&mut self, now: Instant) -> Transition {
        self.forget_blame();
        self.state = State::Open {
            until: now + self.reset_timeout,
        };
        Transition::Opened {
            reset_timeout: self.reset_timeout,
        }
    }
}

/// A [`CircuitBreaker`] shared by concurrent callers, on tokio's clock, with a circuit of
/// its own for each caller whose calls keep failing.
///
/// The common case, a closed breaker with no recent failures, takes neither the lock nor the
/// clock: an atomic flag mirrors "closed with zero failures, no caller's circuit kept" and
/// is refreshed after every locked operation. A success seen through the flag changes
/// nothing, so it is not recorded.
#[derive(Debug)]
pub struct SharedBreaker {
    inner: Mutex<Circuits>,
    healthy: AtomicBool,
}

/// The most callers with a circuit of their own kept at once. Past it, closed ones are
/// dropped first; a caller not kept is judged by the shared circuit alone.
const MAX_CALLER_CIRCUITS: usize = 4096;

#[derive(Debug)]
struct Circuits {
    shared: CircuitBreaker,
    /// Only callers with at least one failure since their last success.
    callers: HashMap<Caller, CircuitBreaker>,
}

/// What a call was admitted as; hand it back to [`SharedBreaker::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    admission: Admission,
    caller: Option<Caller>,
    /// Whether the call probes its caller's own half-open circuit.
    caller_probe: bool,
}

impl Ticket {
    /// Whether the call holds a probe slot, of the shared circuit or its caller's.
    pub fn is_probe(&self) -> bool {
        self.admission == Admission::Probe || self.caller_probe
    }
}

impl SharedBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            inner: Mutex::new(Circuits {
                shared: CircuitBreaker::new(config),
                callers: HashMap::new(),
            }),
            healthy: AtomicBool::new(true),
        }
    }

    /// Asks to let a call for `caller` (`None`: a trusted call) through.
    ///
    /// # Errors
    /// [`CircuitOpen`] when the call must fail fast: the caller's own circuit is open, or the
    /// shared one is.
    pub fn try_acquire(&self, caller: Option<Caller>) -> Result<Ticket, CircuitOpen> {
        if self.healthy.load(Ordering::Acquire) {
            return Ok(Ticket {
                admission: Admission::Normal,
                caller,
                caller_probe: false,
            });
        }
        self.locked(|c| {
            let now = now();
            let mut caller_probe = false;
            if let Some(own) = caller.and_then(|k| c.callers.get_mut(&k)) {
                match own.try_acquire(now) {
                    Ok(admission) => caller_probe = admission == Admission::Probe,
                    Err(open) => return Err(CircuitOpen { own: true, ..open }),
                }
            }
            match c.shared.try_acquire(now) {
                Ok(admission) => Ok(Ticket {
                    admission,
                    caller,
                    caller_probe,
                }),
                Err(open) => {
                    if caller_probe && let Some(own) = caller.and_then(|k| c.callers.get_mut(&k)) {
                        own.abandon_probe(now);
                    }
                    Err(open)
                }
            }
        })
    }

    /// Records the outcome of a call admitted with `ticket`. Returns the shared circuit's
    /// change, if any (a caller's own circuit changes silently: its calls say so).
    pub fn record(&self, ticket: Ticket, success: bool) -> Option<Transition> {
        if success && !ticket.is_probe() && self.healthy.load(Ordering::Acquire) {
            return None;
        }
        self.locked(|c| {
            let now = now();
            if let Some(key) = ticket.caller {
                if success {
                    c.callers.remove(&key);
                } else {
                    let own = if ticket.caller_probe {
                        Admission::Probe
                    } else {
                        Admission::Normal
                    };
                    if let Some(breaker) = c.caller_circuit(key) {
                        breaker.record(own, false, now);
                    }
                }
            }
            c.shared
                .record_by(ticket.admission, success, ticket.caller, now)
        })
    }

    /// The call admitted with `ticket` was abandoned before it produced an outcome (its
    /// caller went away): a probe slot it held is freed at once, so the next call probes.
    pub fn abandon(&self, ticket: Ticket) {
        if !ticket.is_probe() {
            return;
        }
        self.locked(|c| {
            let now = now();
            if ticket.admission == Admission::Probe {
                c.shared.abandon_probe(now);
            }
            if ticket.caller_probe
                && let Some(own) = ticket.caller.and_then(|k| c.callers.get_mut(&k))
            {
                own.abandon_probe(now);
            }
        });
    }

    fn locked<R>(&self, op: impl FnOnce(&mut Circuits) -> R) -> R {
        let mut circuits = self.lock();
        let result = op(&mut circuits);
        let healthy = circuits.shared.is_clear() && circuits.callers.is_empty();
        self.healthy.store(healthy, Ordering::Release);
        result
    }

    /// The shared circuit's state.
    pub fn status(&self) -> BreakerStatus {
        self.lock().shared.status(now())
    }

    /// How many callers have a circuit of their own open now.
    pub fn callers_open(&self) -> usize {
        let now = now();
        self.lock()
            .callers
            .values()
            .filter(|b| !matches!(b.status(now), BreakerStatus::Closed { .. }))
            .count()
    }

    fn lock(&self) -> MutexGuard<'_, Circuits> {
        // The state machines have no invariant a panic half-way could break.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Circuits {
    /// `caller`'s own circuit, made on its first failure; `None` when too many are kept.
    fn caller_circuit(&mut self, caller: Caller) -> Option<&mut CircuitBreaker> {
        if !self.callers.contains_key(&caller) && self.callers.len() >= MAX_CALLER_CIRCUITS {
            self.callers
                .retain(|_, b| !matches!(b.state, State::Closed { .. }));
            if self.callers.len() >= MAX_CALLER_CIRCUITS {
                return None;
            }
        }
        let config = BreakerConfig {
            // A caller's own circuit is judged by that caller alone.
            min_callers: 1,
            ..self.shared.config
        };
        Some(
            self.callers
                .entry(caller)
                .or_insert_with(|| CircuitBreaker::new(config)),
        )
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
            min_callers: 2,
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

    #[test]
    fn one_callers_failures_do_not_open_the_shared_circuit() {
        let mut b = breaker();
        let t0 = Instant::now();
        for _ in 0..10 {
            assert_eq!(b.record_by(Admission::Normal, false, Some(1), t0), None);
        }
        assert!(b.try_acquire(t0).is_ok());
        // A second caller's failure makes the blame shared: the circuit opens.
        assert!(matches!(
            b.record_by(Admission::Normal, false, Some(2), t0),
            Some(Transition::Opened { .. })
        ));
    }

    #[test]
    fn a_trusted_failure_counts_as_shared_blame() {
        let mut b = breaker();
        let t0 = Instant::now();
        b.record_by(Admission::Normal, false, Some(1), t0);
        b.record_by(Admission::Normal, false, Some(1), t0);
        assert!(matches!(
            b.record_by(Admission::Normal, false, None, t0),
            Some(Transition::Opened { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_caller_gets_its_own_circuit_and_others_are_served() {
        let shared = SharedBreaker::new(BreakerConfig {
            max_failures: 3,
            ..BreakerConfig::default()
        });
        for _ in 0..3 {
            let ticket = shared.try_acquire(Some(7)).expect("admitted");
            assert_eq!(shared.record(ticket, false), None);
        }
        let open = shared.try_acquire(Some(7)).expect_err("own circuit open");
        assert!(open.own);
        // Another caller, and the trusted caller, still get through.
        let other = shared.try_acquire(Some(8)).expect("served");
        shared.record(other, true);
        assert!(shared.try_acquire(None).is_ok());
        assert_eq!(shared.callers_open(), 1);
        assert_eq!(shared.status(), BreakerStatus::Closed { failures: 0 });
        // After the reset timeout the failing caller probes its own circuit; a success
        // clears it.
        tokio::time::advance(Duration::from_secs(2)).await;
        let probe = shared.try_acquire(Some(7)).expect("probe");
        assert!(probe.is_probe());
        shared.record(probe, true);
        assert_eq!(shared.callers_open(), 0);
    }
}
