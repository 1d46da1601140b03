//! Times as people and JSON read them. A leaf: every layer may use it.
//!
//! Stored times are Unix milliseconds (`u64`). Formatting one must never fail: a value can be
//! anything a store holds, including one written by a careless caller or an older build.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last instant RFC 3339 can write: 9999-12-31T23:59:59.999Z.
pub const MAX_RFC3339_MS: u64 = 253_402_300_799_999;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A number of seconds a caller gave, cut to `max`: why not, when it is negative or not a
/// number. Cut before converting: a huge number of seconds does not fit a `Duration`.
pub(crate) fn seconds_up_to(
    secs: f64,
    max: std::time::Duration,
) -> Result<std::time::Duration, String> {
    if secs.is_finite() && secs >= 0.0 {
        Ok(std::time::Duration::from_secs_f64(
            secs.min(max.as_secs_f64()),
        ))
    } else {
        Err(format!(
            "expected a non-negative number of seconds, got {secs}"
        ))
    }
}

/// `ms` (Unix milliseconds) as RFC 3339 in UTC, with milliseconds. Times past the year 9999
/// are shown as its last millisecond rather than failing.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms.min(MAX_RFC3339_MS)))
        .to_string()
}

/// A duration as people write it in a config file (`500ms`, `30s`, `2min`, `7d`), for
/// `#[serde(with = "crate::time::humane")]`.
pub(crate) mod humane {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Reads `30s` and the like; a bad one is an error that shows how to write one.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    /// Writes it back as `humantime` prints it (`1m 30s`).
    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    /// `text` as a duration, or why it is not one.
    pub(crate) fn parse(text: &str) -> Result<Duration, String> {
        humantime::parse_duration(text).map_err(|err| {
            format!("invalid duration `{text}`: {err}; write e.g. `500ms`, `30s`, `2min` or `7d`")
        })
    }

    /// The same for an optional field (with `#[serde(default)]`).
    pub(crate) mod option {
        use std::time::Duration;

        use serde::Deserializer;

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_stored_time_formats() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(MAX_RFC3339_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
    }
}
