//! Rate limits: per tool (every caller together) and per agent (across its tools), answered
//! with a retry-after error. GCRA from the `governor` crate: constant memory per key, no
//! timers, bursts up to the limit.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use guildhall_actors::CallError;
use serde::{Deserialize, Deserializer};

/// A rate: `100/min`, `5/s`, `1000/hour`, `20/10s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Calls allowed per period (also the largest burst).
    pub calls: NonZeroU32,
    /// The period.
    pub per: Duration,
}

impl Rate {
    fn quota(self) -> Quota {
        // `per / calls` is at least a nanosecond because `per` was checked to be ≥ 1 ms and
        // `calls` ≤ 1,000,000.
        Quota::with_period(self.per / self.calls.get())
            .unwrap_or_else(|| Quota::per_second(self.calls))
            .allow_burst(self.calls)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.calls, humantime::format_duration(self.per))
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("invalid rate `{s}`: {why}; write e.g. `100/min`, `5/s` or `20/10s`")
        };
        let (calls, per) = s.split_once('/').ok_or_else(|| bad("no `/`"))?;
        let calls: u32 = calls
            .trim()
            .parse()
            .map_err(|_| bad("the count is not a number"))?;
        let calls = NonZeroU32::new(calls)
            .filter(|n| n.get() <= 1_000_000)
            .ok_or_else(|| bad("the count must be 1 to 1,000,000"))?;
        let per = per.trim();
        let per = match per {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "d" | "day" => Duration::from_secs(86_400),
            other => humantime::parse_duration(other).map_err(|e| bad(&e.to_string()))?,
        };
        if per < Duration::from_millis(1) {
            return Err(bad("the period must be at least 1ms"));
        }
        Ok(Self { calls, per })
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Every configured limit.
#[derive(Default)]
pub struct RateLimits {
    tools: HashMap<String, (Rate, DefaultDirectRateLimiter)>,
    agents: Option<(Rate, DefaultKeyedRateLimiter<Arc<str>>)>,
}

impl RateLimits {
    /// Limits for the tools in `tools` and, if given, for each agent.
    pub fn new(tools: impl IntoIterator<Item = (String, Rate)>, per_agent: Option<Rate>) -> Self {
        Self {
            tools: tools
                .into_iter()
                .map(|(tool, rate)| (tool, (rate, RateLimiter::direct(rate.quota()))))
                .collect(),
            agents: per_agent.map(|rate| (rate, RateLimiter::keyed(rate.quota()))),
        }
    }

    /// Whether no limit is configured.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.agents.is_none()
    }

    /// Admits one call to `tool` by `agent`, or says when to retry.
    ///
    /// # Errors
    /// [`CallError::RateLimited`] naming the limit.
    pub fn check(&self, tool: &str, agent: Option<&Arc<str>>) -> Result<(), CallError> {
        let limited = |limit: String, retry_after: Duration| CallError::RateLimited {
            tool: tool.to_owned(),
            limit,
            retry_after,
        };
        if let Some((rate, limiter)) = self.tools.get(tool)
            && let Err(not_until) = limiter.check()
        {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(limited(format!("{rate} for `{tool}`"), wait));
        }
        if let (Some((rate, limiter)), Some(agent)) = (&self.agents, agent)
            && let Err(not_until) = limiter.check_key(agent)
        {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(limited(format!("{rate} for agent `{agent}`"), wait));
        }
        Ok(())
    }

    /// Forgets agents whose limits have fully recovered, so the keyed state stays small.
    pub fn forget_idle(&self) {
        if let Some((_, limiter)) = &self.agents {
            limiter.retain_recent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_clear_errors() {
        let r: Rate = "100/min".parse().expect("valid");
        assert_eq!((r.calls.get(), r.per), (100, Duration::from_secs(60)));
        let r: Rate = "20/10s".parse().expect("valid");
        assert_eq!((r.calls.get(), r.per), (20, Duration::from_secs(10)));
        for bad in ["100", "x/min", "0/min", "5/fortnight", "5/0s"] {
            let err = bad.parse::<Rate>().expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn limits_admit_the_rate_then_say_when_to_retry() {
        let limits = RateLimits::new(
            [("t".to_owned(), "2/min".parse().expect("rate"))],
            Some("2/hour".parse().expect("rate")),
        );
        let a: Arc<str> = Arc::from("a");
        assert!(limits.check("t", Some(&a)).is_ok());
        assert!(limits.check("t", None).is_ok());
        let err = limits.check("t", Some(&a)).expect_err("tool limit");
        let CallError::RateLimited {
            limit, retry_after, ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert!(limit.contains("for `t`"), "{limit}");
        assert!(
            *retry_after > Duration::from_secs(20) && *retry_after <= Duration::from_secs(30),
            "{retry_after:?}"
        );
        // The agent's own limit spans tools.
        assert!(limits.check("u", Some(&a)).is_ok());
        let err = limits.check("u", Some(&a)).expect_err("agent limit");
        assert!(err.to_string().contains("for agent `a`"), "{err}");
        assert!(limits.check("u", Some(&Arc::from("b"))).is_ok());
        assert!(RateLimits::default().is_empty());
    }
}
