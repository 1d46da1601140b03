//! Exponential backoff with jitter between restarts.
//!
//! The first restart in a quiet period is immediate, as in OTP; each further restart while
//! earlier ones are still inside the intensity window waits `initial · 2^(n-1)`, capped at
//! `max`, scaled by a random factor in `[1 - jitter, 1]` so that siblings crashing together do
//! not restart in lockstep.

use std::time::Duration;

/// Delay policy between consecutive restarts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay before the second restart in a window.
    pub initial: Duration,
    /// Upper bound on any delay.
    pub max: Duration,
    /// Fraction of the delay that is randomised away, in `[0, 1]`.
    pub jitter: f64,
}

impl Backoff {
    /// `initial` doubling up to `max`, with 20% jitter.
    pub const fn exponential(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            jitter: 0.2,
        }
    }

    /// Always restart immediately.
    pub const fn none() -> Self {
        Self {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            jitter: 0.0,
        }
    }

    /// The delay before a restart when `recent` restarts already happened in the window.
    /// `unit` is a random number in `[0, 1)` supplying the jitter.
    pub fn delay(&self, recent: u32, unit: f64) -> Duration {
        if recent == 0 || self.initial.is_zero() {
            return Duration::ZERO;
        }
        let exp = (recent - 1).min(32);
        let base = self
            .initial
            .checked_mul(1u32 << exp.min(31))
            .unwrap_or(self.max)
            .min(self.max);
        let jitter = self.jitter.clamp(0.0, 1.0);
        base.mul_f64(1.0 - jitter * unit.clamp(0.0, 1.0))
    }
}

impl Default for Backoff {
    /// 10 ms doubling up to 5 s.
    fn default() -> Self {
        Self::exponential(Duration::from_millis(10), Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn first_restart_is_immediate() {
        assert_eq!(Backoff::default().delay(0, 0.5), Duration::ZERO);
    }

    #[test]
    fn delay_doubles_and_caps() {
        let b = Backoff {
            jitter: 0.0,
            ..Backoff::exponential(10 * MS, 50 * MS)
        };
        assert_eq!(b.delay(1, 0.0), 10 * MS);
        assert_eq!(b.delay(2, 0.0), 20 * MS);
        assert_eq!(b.delay(3, 0.0), 40 * MS);
        assert_eq!(b.delay(4, 0.0), 50 * MS);
        assert_eq!(b.delay(100, 0.0), 50 * MS);
    }

    #[test]
    fn jitter_shortens_within_bounds() {
        let b = Backoff::exponential(100 * MS, Duration::from_secs(1));
        assert_eq!(b.delay(1, 0.0), 100 * MS);
        assert_eq!(b.delay(1, 1.0), 80 * MS);
        let mid = b.delay(1, 0.5);
        assert!(mid > 80 * MS && mid < 100 * MS);
    }

    #[test]
    fn none_never_waits() {
        assert_eq!(Backoff::none().delay(7, 0.3), Duration::ZERO);
    }
}
