//! What a proxied server logs (`notifications/message`), written to guildhall's log as that
//! server's: each message cut to [`MAX_LOGGED`] bytes, at most [`PER_SECOND`] a second. The
//! rest are counted, said once as they start being dropped and counted with the next one let
//! through, so a server cannot flood the log or slow the connection reading it.
//!
//! MCP's logging is deprecated from the 2026 revision on (SEP-2577), and rmcp marks its
//! types so; servers of the 2025 revisions still send it, and it is read for them.
#![allow(deprecated)]

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use serde_json::Value;

/// Bytes of one message written at most.
pub(crate) const MAX_LOGGED: usize = 2048;
/// Messages of one server written per second at most (and at once).
pub(crate) const PER_SECOND: u32 = 20;

/// One server connection's log messages on their way to guildhall's log.
pub(crate) struct ServerLog {
    server: Arc<str>,
    limiter: DefaultDirectRateLimiter,
    /// Dropped since the last one written.
    dropped: AtomicU64,
}

impl ServerLog {
    pub(crate) fn new(server: Arc<str>) -> Self {
        let rate = NonZeroU32::new(PER_SECOND).unwrap_or(NonZeroU32::MIN);
        Self {
            server,
            limiter: RateLimiter::direct(Quota::per_second(rate)),
            dropped: AtomicU64::new(0),
        }
    }

    /// Writes `message` at its level, or counts it when past the rate.
    pub(crate) fn write(&self, message: &LoggingMessageNotificationParam) {
        if self.limiter.check().is_err() {
            if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(server = %self.server, "the server logs more than {PER_SECOND} messages a second: the rest are dropped and counted");
            }
            return;
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        let text = shown(&message.data);
        let logger = message.logger.as_deref().unwrap_or("-");
        let server = &*self.server;
        match message.level {
            LoggingLevel::Debug => tracing::debug!(server, logger, dropped, "{text}"),
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(server, logger, dropped, "{text}");
            }
            LoggingLevel::Warning => tracing::warn!(server, logger, dropped, "{text}"),
            LoggingLevel::Error
            | LoggingLevel::Critical
            | LoggingLevel::Alert
            | LoggingLevel::Emergency => tracing::error!(server, logger, dropped, "{text}"),
        }
    }
}

/// A message's data as a line: a string as it is, anything else as compact JSON; cut to
/// [`MAX_LOGGED`] bytes at a character boundary, with what was cut said.
fn shown(data: &Value) -> String {
    let text = match data {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    if text.len() <= MAX_LOGGED {
        return text;
    }
    let mut end = MAX_LOGGED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes cut]", &text[..end], text.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_message_is_a_line_cut_to_its_bound() {
        assert_eq!(shown(&json!("disk almost full")), "disk almost full");
        assert_eq!(shown(&json!({"free": 3})), r#"{"free":3}"#);
        let long = shown(&json!("é".repeat(MAX_LOGGED)));
        assert!(long.len() < MAX_LOGGED + 40, "{}", long.len());
        assert!(
            long.ends_with(&format!("… [{MAX_LOGGED} more bytes cut]")),
            "{long}"
        );
    }

    #[test]
    fn past_the_rate_messages_are_counted_not_written() {
        let log = ServerLog::new("chatty".into());
        let message = LoggingMessageNotificationParam::new(LoggingLevel::Info, json!("x"));
        for _ in 0..PER_SECOND + 30 {
            log.write(&message);
        }
        // The burst passes at once; what comes within the same instant is counted.
        let dropped = log.dropped.load(Ordering::Relaxed);
        assert!((25..=30).contains(&dropped), "{dropped}");
    }
}
