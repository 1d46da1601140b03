//! A structured result made to fit a byte budget while keeping its shape: long strings and
//! long lists are cut, nothing is renamed, retyped or added.
//!
//! Truncation cuts a result's text, and a cut text is no longer the JSON its tool's output
//! schema describes; an MCP client that checks the schema (the official Python SDK) then
//! fails the call, whatever the tool. A shortened value is still of that schema (a string
//! stays a string, a list a list of the same items) as long as the schema asks no minimum
//! length of a list or string and no more than [`KEPT_KEYS`] properties of an object:
//! guildhall's own answers never do. Short strings (ids, states, times, up to
//! [`KEPT_STRING`] bytes) are never cut, so an enumerated or formatted value stays whole.
//!
//! One knob `k` cuts every string past `max(k, KEPT_STRING)` bytes, every list past `k`
//! items and every object past `max(k, KEPT_KEYS)` members; the written size only grows
//! with `k`, so a binary search finds the largest `k` that fits, each step measuring the
//! shortened value without building it.

use serde_json::{Map, Value};

use crate::paged::json_len;

/// Strings of at most this many bytes are never cut.
pub(super) const KEPT_STRING: usize = 64;

/// Objects of at most this many members are never cut: more than any answer's own fields.
pub(super) const KEPT_KEYS: usize = 64;

/// Appended to a string that was cut.
const MARK: &str = "…";

/// `value` shortened so that its compact JSON takes at most `budget` bytes, or `None` when
/// even the shortest form it may take (one item per list, short strings, [`KEPT_KEYS`]
/// members per object) is over it. A value within the budget comes back unchanged.
pub(super) fn shorten(value: &Value, budget: usize) -> Option<Value> {
    let whole = widest(value);
    if written(value, whole) <= budget {
        return Some(value.clone());
    }
    if written(value, 1) > budget {
        return None;
    }
    // The largest k in [1, whole) whose shortened value fits: written(lo) fits, written(hi)
    // does not.
    let (mut lo, mut hi) = (1, whole);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if written(value, mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(build(value, lo))
}

/// The largest string length, list length or object size in `value`: the `k` that cuts
/// nothing.
fn widest(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(widest).fold(items.len(), usize::max),
        Value::Object(map) => map
            .iter()
            .map(|(key, v)| widest(v).max(key.len()))
            .fold(map.len(), usize::max),
        _ => 0,
    }
    .max(1)
}

/// `s` cut to at most `k` bytes (never under [`KEPT_STRING`]) at a character boundary, and
/// whether it was cut.
fn cut_str(s: &str, k: usize) -> (&str, bool) {
    let keep = k.max(KEPT_STRING);
    if s.len() <= keep {
        return (s, false);
    }
    let mut end = keep;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], true)
}

fn kept_members(map: &Map<String, Value>, k: usize) -> usize {
    map.len().min(k.max(KEPT_KEYS))
}

/// Bytes of the compact JSON of `build(value, k)`, counted without building it.
fn written(value: &Value, k: usize) -> usize {
    match value {
        Value::String(s) => {
            let (kept, was_cut) = cut_str(s, k);
            string_len(kept) + if was_cut { MARK.len() } else { 0 }
        }
        Value::Array(items) => {
            let kept = items.len().min(k);
            let inner: usize = items[..kept].iter().map(|v| written(v, k)).sum();
            2 + inner + kept.saturating_sub(1)
        }
        Value::Object(map) => {
            let kept = kept_members(map, k);
            let inner: usize = map
                .iter()
                .take(kept)
                .map(|(key, v)| string_len(key) + 1 + written(v, k))
                .sum();
            2 + inner + kept.saturating_sub(1)
        }
        // A number, boolean or null always serializes.
        scalar => json_len(scalar),
    }
}

/// Bytes of `s` as a JSON string, quotes and escapes included.
fn string_len(s: &str) -> usize {
    json_len(s)
}

fn build(value: &Value, k: usize) -> Value {
    match value {
        Value::String(s) => match cut_str(s, k) {
            (kept, true) => Value::String(format!("{kept}{MARK}")),
            (_, false) => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().take(k).map(|v| build(v, k)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .take(kept_members(map, k))
                .map(|(key, v)| (key.clone(), build(v, k)))
                .collect(),
        ),
        scalar => scalar.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn size(value: &Value) -> usize {
        value.to_string().len()
    }

    #[test]
    fn a_long_body_is_cut_and_the_short_fields_stay_whole() {
        let message = json!({
            "id": "018f6b2e-0000-7000-8000-000000000000",
            "status": "in_progress",
            "body": "ü".repeat(40_000),
        });
        let short = shorten(&message, 4_096).unwrap();
        assert!(size(&short) <= 4_096);
        assert_eq!(short["id"], message["id"]);
        assert_eq!(short["status"], "in_progress");
        let body = short["body"].as_str().unwrap();
        assert!(body.ends_with(MARK) && body.len() > 3_000, "{}", body.len());
    }

    #[test]
    fn a_long_list_keeps_its_first_items() {
        let listing = json!({ "tasks": (0..1_000).map(|i| json!({"n": i})).collect::<Vec<_>>() });
        let short = shorten(&listing, 2_000).unwrap();
        let tasks = short["tasks"].as_array().unwrap();
        assert!(
            size(&short) <= 2_000 && tasks.len() > 100,
            "{}",
            tasks.len()
        );
        assert_eq!(tasks[0], json!({"n": 0}));
    }

    #[test]
    fn what_cannot_fit_is_refused_and_what_fits_is_unchanged() {
        let wide: Map<String, Value> = (0..KEPT_KEYS)
            .map(|i| (format!("{i:03}"), json!(i)))
            .collect();
        assert_eq!(shorten(&Value::Object(wide.clone()), 10), None);
        let small = json!({"a": [1, 2, 3], "b": "x"});
        assert_eq!(shorten(&small, 1_000), Some(small));
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,200}".prop_map(Value::from),
            "[a\"\\\\\n\u{1}é]{0,300}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 200, 30, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..30).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,6}", inner, 0..80)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Whether `short` is `whole` with strings, lists and objects cut, and nothing else.
    fn is_cut_from(short: &Value, whole: &Value) -> bool {
        match (short, whole) {
            (Value::String(s), Value::String(w)) => {
                s == w || s.strip_suffix(MARK).is_some_and(|kept| w.starts_with(kept))
            }
            (Value::Array(s), Value::Array(w)) => {
                s.len() <= w.len() && s.iter().zip(w).all(|(s, w)| is_cut_from(s, w))
            }
            (Value::Object(s), Value::Object(w)) => s
                .iter()
                .all(|(key, v)| w.get(key).is_some_and(|w| is_cut_from(v, w))),
            (s, w) => s == w,
        }
    }

    proptest! {
        #[test]
        fn a_shortened_value_fits_and_is_cut_from_the_whole(value in any_json(), budget in 0usize..20_000, k in 1usize..400) {
            prop_assert_eq!(written(&value, widest(&value)), size(&value), "nothing cut");
            prop_assert_eq!(written(&value, k), size(&build(&value, k)), "the count is the written size");
            match shorten(&value, budget) {
                Some(short) => {
                    prop_assert!(size(&short) <= budget, "{} > {}", size(&short), budget);
                    prop_assert!(is_cut_from(&short, &value));
                }
                None => prop_assert!(size(&build(&value, 1)) > budget),
            }
        }
    }
}
