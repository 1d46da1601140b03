//! Restart intensity: at most `max_restarts` restarts within `period`.
//!
//! OTP semantics: every restart is recorded; when recording one would put more than
//! `max_restarts` restarts within the last `period`, the supervisor gives up, stops its
//! children and exits, escalating to its own supervisor.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How many restarts a supervisor tolerates within a sliding period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartIntensity {
    /// Restarts allowed within `period`.
    pub max_restarts: u32,
    /// The sliding window.
    pub period: Duration,
}

impl RestartIntensity {
    /// `max_restarts` within `period`.
    pub const fn new(max_restarts: u32, period: Duration) -> Self {
        Self {
            max_restarts,
            period,
        }
    }

    /// OTP's default: one restart within five seconds.
    pub const fn otp_default() -> Self {
        Self::new(1, Duration::from_secs(5))
    }
}

impl Default for RestartIntensity {
    fn default() -> Self {
        Self::otp_default()
    }
}

/// Returned when a restart would exceed the intensity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntensityExceeded {
    /// Restarts within the period, counting the refused one.
    pub restarts: u32,
    /// The period they fell in.
    pub period: Duration,
}

/// The timestamps of recent restarts, oldest first.
#[derive(Debug, Clone)]
pub struct RestartWindow {
    intensity: RestartIntensity,
    restarts: VecDeque<Instant>,
}

impl RestartWindow {
    /// An empty window for `intensity`.
    pub fn new(intensity: RestartIntensity) -> Self {
        Self {
            intensity,
            restarts: VecDeque::new(),
        }
    }

    /// Records a restart at `now`.
    ///
    /// # Errors
    /// [`IntensityExceeded`] when this restart makes more than `max_restarts` within
    /// `period`; the restart is still recorded.
    pub fn record(&mut self, now: Instant) -> Result<(), IntensityExceeded> {
        self.expire(now);
        self.restarts.push_back(now);
        let restarts = u32::try_from(self.restarts.len()).unwrap_or(u32::MAX);
        if restarts > self.intensity.max_restarts {
            Err(IntensityExceeded {
                restarts,
                period: self.intensity.period,
            })
        } else {
            Ok(())
        }
    }

    /// Restarts recorded within the period ending at `now`.
    pub fn recent(&mut self, now: Instant) -> u32 {
        self.expire(now);
        u32::try_from(self.restarts.len()).unwrap_or(u32::MAX)
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&oldest) = self.restarts.front() {
            if now.saturating_duration_since(oldest) >= self.intensity.period {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_within_limit_are_allowed() {
        let t0 = Instant::now();
        let mut w = RestartWindow::new(RestartIntensity::new(2, Duration::from_secs(5)));
        assert!(w.record(t0).is_ok());
        assert!(w.record(t0 + Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn one_more_than_max_within_period_is_exceeded() {
        let t0 = Instant::now();
        let mut w = RestartWindow::new(RestartIntensity::otp_default());
        assert!(w.record(t0).is_ok());
        let err = w.record(t0 + Duration::from_secs(4)).unwrap_err();
        assert_eq!(err.restarts, 2);
    }

    #[test]
    fn restarts_older_than_period_expire() {
        let t0 = Instant::now();
        let mut w = RestartWindow::new(RestartIntensity::otp_default());
        assert!(w.record(t0).is_ok());
        assert!(w.record(t0 + Duration::from_secs(5)).is_ok());
        assert_eq!(w.recent(t0 + Duration::from_secs(5)), 1);
        assert_eq!(w.recent(t0 + Duration::from_secs(11)), 0);
    }

    #[test]
    fn zero_intensity_refuses_the_first_restart() {
        let mut w = RestartWindow::new(RestartIntensity::new(0, Duration::from_secs(1)));
        assert!(w.record(Instant::now()).is_err());
    }
}
