//! Times as people read them.

/// `ms` (Unix milliseconds) in the local time zone, as people read it:
/// `2026-11-24 17:09:40 +01:00`. (JSON output keeps RFC 3339 in UTC.)
pub(super) fn local_time(ms: u64) -> String {
    let ms = ms.min(guildhall::time::MAX_RFC3339_MS);
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|at| {
            at.to_zoned(jiff::tz::TimeZone::system())
                .strftime("%Y-%m-%d %H:%M:%S %:z")
                .to_string()
        })
        .unwrap_or_else(|| guildhall::time::rfc3339(ms))
}
