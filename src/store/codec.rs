//! How values are encoded: one format-version byte, then MessagePack (rmp-serde) in its
//! compact form, a struct as an array of its fields in declaration order.
//!
//! Compact is about twice as fast to write as named fields, and smaller. The price is a rule
//! for every stored type: **fields are positional**. A new field goes last, with
//! `#[serde(default)]`, so older values (shorter arrays) still decode; a field is never
//! removed or reordered, and `skip_serializing_if` is never used (a skipped field would shift
//! the ones after it). Anything else takes a new [`VALUE_FORMAT`].

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{StoreError, Table};

/// The version of the value encoding this build writes and reads.
pub const VALUE_FORMAT: u8 = 1;

/// Encodes a value.
///
/// # Panics
/// Never for the runtime's own types: they are plain data that MessagePack can always encode.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Encoded into a reused buffer and copied out at its exact size: one allocation, and
    // no spare capacity kept alive by whatever holds the value.
    SCRATCH.with_borrow_mut(|scratch| {
        scratch.clear();
        scratch.push(VALUE_FORMAT);
        if let Err(err) = rmp_serde::encode::write(scratch, value) {
            // Only non-string map keys or a failing Serialize impl get here; neither is stored.
            unreachable!("stored values always encode: {err}");
        }
        scratch.as_slice().to_vec()
    })
}

/// Decodes a value written by [`encode`].
///
/// # Errors
/// [`StoreError::Decode`] for an unknown format version or bytes that do not decode.
pub fn decode<T: DeserializeOwned>(table: Table, bytes: &[u8]) -> Result<T, StoreError> {
    match bytes.split_first() {
        Some((&VALUE_FORMAT, rest)) => {
            rmp_serde::from_slice(rest).map_err(|e| StoreError::Decode {
                table: table.name(),
                reason: e.to_string(),
            })
        }
        Some((version, _)) => Err(StoreError::Decode {
            table: table.name(),
            reason: format!(
                "value format version {version} is not known (this build reads {VALUE_FORMAT})"
            ),
        }),
        None => Err(StoreError::Decode {
            table: table.name(),
            reason: "empty value".into(),
        }),
    }
}

/// Checks that `bytes` are a value [`decode`] can read as some type: a known format
/// version, then well-formed MessagePack. For tools that see stored bytes without knowing
/// their type (`guildhall doctor`).
///
/// # Errors
/// As [`decode`].
pub fn check(table: Table, bytes: &[u8]) -> Result<(), StoreError> {
    decode::<serde::de::IgnoredAny>(table, bytes)?;
    // Serde reads a string that is not UTF-8 as bytes when it may be anything; every stored
    // string is read as one, so such a value would not decode as what it is.
    let mut rest = &bytes[1..];
    well_formed(&mut rest, 0).map_err(|reason| StoreError::Decode {
        table: table.name(),
        reason,
    })
}

/// Nesting deeper than any stored type.
const MAX_DEPTH: u32 = 128;

/// Reads one MessagePack value off `rd`, every string checked to be UTF-8.
fn well_formed(rd: &mut &[u8], depth: u32) -> Result<(), String> {
    use rmp::Marker;
    fn take<'a>(rd: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if rd.len() < n {
            return Err("the value ends early".into());
        }
        let (head, tail) = rd.split_at(n);
        *rd = tail;
        Ok(head)
    }
    fn length(rd: &mut &[u8], bytes: usize) -> Result<usize, String> {
        let head = take(rd, bytes)?;
        Ok(head.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b)))
    }
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH}"));
    }
    let marker = rmp::decode::read_marker(rd).map_err(|_| "the value ends early".to_owned())?;
    let (strings, items) = match marker {
        Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
            return Ok(());
        }
        Marker::U8 | Marker::I8 => return take(rd, 1).map(drop),
        Marker::U16 | Marker::I16 => return take(rd, 2).map(drop),
        Marker::U32 | Marker::I32 | Marker::F32 => return take(rd, 4).map(drop),
        Marker::U64 | Marker::I64 | Marker::F64 => return take(rd, 8).map(drop),
        Marker::FixStr(n) => (Some(usize::from(n)), 0),
        Marker::Str8 => (Some(length(rd, 1)?), 0),
        Marker::Str16 => (Some(length(rd, 2)?), 0),
        Marker::Str32 => (Some(length(rd, 4)?), 0),
        Marker::Bin8 => return length(rd, 1).and_then(|n| take(rd, n)).map(drop),
        Marker::Bin16 => return length(rd, 2).and_then(|n| take(rd, n)).map(drop),
        Marker::Bin32 => return length(rd, 4).and_then(|n| take(rd, n)).map(drop),
        Marker::FixArray(n) => (None, usize::from(n)),
        Marker::Array16 => (None, length(rd, 2)?),
        Marker::Array32 => (None, length(rd, 4)?),
        Marker::FixMap(n) => (None, 2 * usize::from(n)),
        Marker::Map16 => (None, 2 * length(rd, 2)?),
        Marker::Map32 => (None, 2 * length(rd, 4)?),
        Marker::FixExt1 => return take(rd, 2).map(drop),
        Marker::FixExt2 => return take(rd, 3).map(drop),
        Marker::FixExt4 => return take(rd, 5).map(drop),
        Marker::FixExt8 => return take(rd, 9).map(drop),
        Marker::FixExt16 => return take(rd, 17).map(drop),
        Marker::Ext8 => return length(rd, 1).and_then(|n| take(rd, n + 1)).map(drop),
        Marker::Ext16 => return length(rd, 2).and_then(|n| take(rd, n + 1)).map(drop),
        Marker::Ext32 => return length(rd, 4).and_then(|n| take(rd, n + 1)).map(drop),
        Marker::Reserved => return Err("a reserved MessagePack marker".into()),
    };
    if let Some(n) = strings {
        return std::str::from_utf8(take(rd, n)?)
            .map(drop)
            .map_err(|err| format!("a string is not UTF-8: {err}"));
    }
    // Each item takes at least a byte: a length past what is left ends early, not slowly.
    for _ in 0..items {
        well_formed(rd, depth + 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct V {
        a: u32,
        b: Option<String>,
        c: serde_json::Value,
    }

    #[test]
    fn a_string_that_is_not_utf8_fails_the_check() {
        let good = encode(&("name", vec![1u8, 2], serde_json::json!({"k": ["v", 1.5]})));
        assert!(check(Table::Inbox, &good).is_ok());
        let mut bad = good.clone();
        let at = bad.windows(4).position(|w| w == b"name").unwrap();
        bad[at] = 0xff;
        let err = check(Table::Inbox, &bad).unwrap_err().to_string();
        assert!(err.contains("not UTF-8"), "{err}");
        assert!(check(Table::Inbox, &good[..good.len() - 1]).is_err());
    }

    #[test]
    fn round_trips_with_a_version_byte() {
        let v = V {
            a: 7,
            b: None,
            c: serde_json::json!({"k": [1, "two", null, 2.5]}),
        };
        let bytes = encode(&v);
        assert_eq!(bytes[0], VALUE_FORMAT);
        assert_eq!(decode::<V>(Table::Meta, &bytes).unwrap(), v);
    }

    /// A value written before a field was added (a shorter array) still decodes.
    #[test]
    fn fields_added_last_with_defaults_decode_from_older_values() {
        #[derive(serde::Serialize)]
        struct Old {
            a: u32,
        }
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct New {
            a: u32,
            #[serde(default)]
            b: Option<String>,
        }
        let bytes = encode(&Old { a: 3 });
        assert_eq!(
            decode::<New>(Table::Meta, &bytes).unwrap(),
            New { a: 3, b: None }
        );
    }

    #[test]
    fn unknown_versions_and_garbage_are_named_errors() {
        let mut bytes = encode(&1u32);
        bytes[0] = 9;
        let err = decode::<u32>(Table::Agents, &bytes)
            .unwrap_err()
            .to_string();
        assert!(err.contains("version 9") && err.contains("agents"), "{err}");
        assert!(decode::<V>(Table::Inbox, &[VALUE_FORMAT, 0xc1]).is_err());
        assert!(decode::<u32>(Table::Inbox, &[]).is_err());
    }
}
