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

/// `ms` (Unix milliseconds) as RFC 3339 in UTC, with milliseconds. Times past the year 9999
/// are shown as its last millisecond rather than failing.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms.min(MAX_RFC3339_MS)))
        .to_string()
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
