//! [`TraceParent`]: a caller's W3C trace context, so the span of a call joins the trace the
//! caller is in (an agent's own, say) instead of starting one of its own.

use std::fmt;

/// A W3C `traceparent` (version 00): the trace a call belongs to and the caller's span in
/// it. See <https://www.w3.org/TR/trace-context/#traceparent-header>.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace, 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The caller's span, 8 bytes, not all zero: the parent of the call's span.
    pub span_id: [u8; 8],
    /// Whether the caller records this trace (the `sampled` flag).
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`). `None` for anything
    /// else, as the W3C spec says an invalid one is ignored: version `ff`, all-zero ids,
    /// upper-case hex, a wrong length. A later version's value is read by its first four
    /// fields, as the spec asks.
    pub fn parse(value: &str) -> Option<Self> {
        let mut fields = value.split('-');
        let version = fields.next()?;
        let (trace, span, flags) = (fields.next()?, fields.next()?, fields.next()?);
        if version.len() != 2 || version == "ff" || !lower_hex(version) {
            return None;
        }
        // Version 00 has exactly four fields; later ones may add more.
        if version == "00" && (fields.next().is_some() || value.len() != 55) {
            return None;
        }
        let trace_id: [u8; 16] = decode(trace)?;
        let span_id: [u8; 8] = decode(span)?;
        let [flags]: [u8; 1] = decode(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }
}

impl TraceParent {
    /// The span of call `call_id` as the parent of what the call causes (a message it
    /// sends, a call it makes): in `parent`'s trace when the caller named one, else in a
    /// trace of its own whose id is the call id. The span id is the call id's last eight
    /// bytes (random in a UUID v7), so the span exported for the call and the context
    /// handed on while it runs are the same span.
    pub fn of_call(call_id: &uuid::Uuid, parent: Option<Self>) -> Self {
        let bytes = call_id.as_bytes();
        let mut span_id = [0u8; 8];
        span_id.copy_from_slice(&bytes[8..]);
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        match parent {
            Some(parent) => Self {
                trace_id: parent.trace_id,
                span_id,
                sampled: parent.sampled,
            },
            None => Self {
                trace_id: *bytes,
                span_id,
                sampled: true,
            },
        }
    }
}

impl<'de> serde::Deserialize<'de> for TraceParent {
    /// A `traceparent` value; an invalid one is an error.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not a traceparent")))
    }
}

impl fmt::Display for TraceParent {
    /// The `traceparent` value (version 00).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for byte in self.trace_id {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("-")?;
        for byte in self.span_id {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "-{:02x}", u8::from(self.sampled))
    }
}

impl serde::Serialize for TraceParent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

fn lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `N` bytes from exactly `2N` lower-case hex digits.
fn decode<const N: usize>(hex: &str) -> Option<[u8; N]> {
    if hex.len() != 2 * N || !lower_hex(hex) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses_and_prints_back() {
        let parent = TraceParent::parse(VALID).expect("valid");
        assert_eq!(parent.trace_id[0], 0x4b);
        assert_eq!(parent.span_id[7], 0xb7);
        assert!(parent.sampled);
        assert_eq!(parent.to_string(), VALID);
        let unsampled = TraceParent::parse(&VALID.replace("-01", "-00")).expect("valid");
        assert!(!unsampled.sampled);
    }

    #[test]
    fn an_invalid_traceparent_is_ignored() {
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é1",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version is read by its first four fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert!(TraceParent::parse(later).is_some());
    }
}
