//! The context of one session, as plain data: no actor, no store, no clock.
//!
//! Applying a batch is deterministic given the batch, its author and its time, so a session
//! is rebuilt exactly by replaying its batches in order.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ContextError;
use crate::agents::AgentId;

/// How a change combines with the current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The value becomes the new value.
    Replace,
    /// JSON merge patch (RFC 7396): objects merge key by key, `null` deletes a key; a patch
    /// that is not an object replaces the value. A result of `null` deletes the entry.
    Merge,
    /// Arrays get the items appended (an array's items, or one value); text gets the text
    /// appended; a missing entry is created.
    Append,
}

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// Plain text (a JSON string).
    Text,
    /// Any JSON value.
    Json,
    /// Markdown text.
    Markdown,
    /// Source code.
    Code,
}

impl EntryKind {
    /// The kind a value gets when a change does not say.
    fn of(value: &Value) -> Self {
        if value.is_string() {
            Self::Text
        } else {
            Self::Json
        }
    }
}

/// One entry of a session's context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Entry {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: Value,
    /// What it holds.
    pub kind: EntryKind,
    /// The agent that last changed it.
    pub author: Option<AgentId>,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When it last changed.
    pub updated_ms: u64,
    /// 1 when created, one more at every change.
    pub version: u64,
}

/// One change in a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// The entry's key.
    pub key: String,
    /// How the value combines with the current one.
    pub strategy: Strategy,
    /// The value, patch or items.
    pub value: Value,
    /// The entry's kind; kept (or inferred for a new entry) when absent.
    #[serde(default)]
    pub kind: Option<EntryKind>,
    /// Apply only if the entry is at this version now (0: it must not exist).
    #[serde(default)]
    pub expected_version: Option<u64>,
}

impl Change {
    /// A change of `key` by `strategy` with `value`, of any version and kind.
    pub fn new(key: impl Into<String>, strategy: Strategy, value: Value) -> Self {
        Self {
            key: key.into(),
            strategy,
            value,
            kind: None,
            expected_version: None,
        }
    }

    /// Applies only if the entry is at `version` (0: absent).
    #[must_use]
    pub fn expect(mut self, version: u64) -> Self {
        self.expected_version = Some(version);
        self
    }

    /// Sets the entry's kind.
    #[must_use]
    pub fn kind(mut self, kind: EntryKind) -> Self {
        self.kind = Some(kind);
        self
    }
}

/// Limits on what a session may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextLimits {
    /// Longest key, in bytes.
    pub max_key_bytes: usize,
    /// Largest entry value, in bytes of JSON.
    pub max_entry_bytes: usize,
    /// Largest session, in bytes of JSON values.
    pub max_session_bytes: usize,
    /// Most changes in one batch.
    pub max_batch: usize,
}

impl ContextLimits {
    /// No limits: for replaying what was accepted under earlier limits.
    pub const UNLIMITED: Self = Self {
        max_key_bytes: usize::MAX,
        max_entry_bytes: usize::MAX,
        max_session_bytes: usize::MAX,
        max_batch: usize::MAX,
    };
}

impl Default for ContextLimits {
    fn default() -> Self {
        Self {
            max_key_bytes: 256,
            max_entry_bytes: 256 * 1024,
            max_session_bytes: 16 * 1024 * 1024,
            max_batch: 1_000,
        }
    }
}

/// What a batch did to one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EntryChange {
    /// The entry.
    pub key: String,
    /// How it was changed.
    pub strategy: Strategy,
    /// Its version before (0: absent).
    pub before: u64,
    /// Its version after (0: deleted).
    pub after: u64,
}

/// What an applied batch did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Applied {
    /// The session's version after the batch (one more per batch).
    pub version: u64,
    /// Each change, in order.
    pub changes: Vec<EntryChange>,
}

/// A session's entries and version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionContext {
    version: u64,
    entries: BTreeMap<String, Held>,
    /// Bytes of JSON held in entry values.
    bytes: usize,
}

/// An entry and the size of its value, kept so a change measures only the new value.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    entry: Entry,
    size: usize,
}

impl Held {
    fn new(entry: Entry) -> Self {
        Self {
            size: json_size(&entry.value),
            entry,
        }
    }
}

/// The length of `value` as compact JSON (what `serde_json::to_vec` writes), without
/// writing it.
pub(crate) fn json_size(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => number_size(n),
        Value::String(s) => string_size(s),
        Value::Array(items) => {
            2 + items.len().saturating_sub(1) + items.iter().map(json_size).sum::<usize>()
        }
        Value::Object(map) => {
            2 + map.len().saturating_sub(1)
                + map
                    .iter()
                    .map(|(k, v)| string_size(k) + 1 + json_size(v))
                    .sum::<usize>()
        }
    }
}

fn number_size(n: &serde_json::Number) -> usize {
    /// Counts what is written instead of keeping it.
    struct Count(usize);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = std::fmt::write(&mut count, format_args!("{n}"));
    count.0
}

/// A string's JSON length: quotes, and escapes as serde_json writes them.
fn string_size(s: &str) -> usize {
    2 + s.len()
        + s.bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Appends `items` to `current` (absent: `None`).
fn append(key: &str, current: Option<&Value>, items: &Value) -> Result<Value, ContextError> {
    match (current, items) {
        (None, Value::Array(_) | Value::String(_)) => Ok(items.clone()),
        (None, item) => Ok(Value::Array(vec![item.clone()])),
        (Some(Value::String(text)), Value::String(more)) => {
            Ok(Value::String(format!("{text}{more}")))
        }
        (Some(Value::Array(list)), Value::Array(more)) => {
            Ok(Value::Array(list.iter().chain(more).cloned().collect()))
        }
        (Some(Value::Array(list)), item) => {
            let mut list = list.clone();
            list.push(item.clone());
            Ok(Value::Array(list))
        }
        (Some(holds), given) => Err(ContextError::WrongType {
            key: key.to_owned(),
            holds: type_name(holds),
            given: type_name(given),
        }),
    }
}

fn check_key(key: &str, limits: &ContextLimits) -> Result<(), ContextError> {
    let invalid = |reason: String| ContextError::InvalidKey {
        key: key.chars().take(80).collect(),
        reason,
    };
    if key.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    if key.len() > limits.max_key_bytes {
        return Err(invalid(format!(
            "it is {} bytes; the limit is {}",
            key.len(),
            limits.max_key_bytes
        )));
    }
    Ok(())
}

impl SessionContext {
    /// An empty context at version 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session's version: how many batches were applied.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// A context at `version` holding `entries` (a snapshot's).
    pub fn from_entries(version: u64, entries: impl IntoIterator<Item = Entry>) -> Self {
        let entries: BTreeMap<String, Held> = entries
            .into_iter()
            .map(|e| (e.key.clone(), Held::new(e)))
            .collect();
        Self {
            version,
            bytes: entries.values().map(|h| h.size).sum(),
            entries,
        }
    }

    /// The entry at `key`.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key).map(|h| &h.entry)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, by key.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values().map(|h| &h.entry)
    }

    /// The entries whose key starts with `prefix`, by key.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.entries
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, h)| &h.entry)
    }

    /// Bytes of JSON held in entry values.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Applies `changes` as one batch by `author` at `now_ms`: all of them, or none.
    ///
    /// Expected versions are checked against the versions before the batch. A key changed
    /// twice in one batch sees its first change in the second.
    ///
    /// # Errors
    /// [`ContextError`] naming the change that was refused; the context is unchanged.
    pub fn apply(
        &mut self,
        changes: &[Change],
        author: Option<&AgentId>,
        now_ms: u64,
        limits: &ContextLimits,
    ) -> Result<Applied, ContextError> {
        if changes.is_empty() {
            return Err(ContextError::Empty);
        }
        if changes.len() > limits.max_batch {
            return Err(ContextError::TooLarge {
                what: "the batch (in changes)".into(),
                size: changes.len(),
                limit: limits.max_batch,
            });
        }
        // Work on copies of the touched entries; commit only if every change passes.
        let mut staged: BTreeMap<&str, Option<Held>> = BTreeMap::new();
        let mut record = Vec::with_capacity(changes.len());
        for change in changes {
            check_key(&change.key, limits)?;
            let key = change.key.as_str();
            if let Some(expected) = change.expected_version {
                let actual = self.get(key).map_or(0, |e| e.version);
                if expected != actual {
                    return Err(ContextError::Conflict {
                        key: key.to_owned(),
                        expected,
                        actual,
                    });
                }
            }
            // The entry as the batch has left it so far; borrowed, so a replace copies no
            // old value.
            let current: Option<&Entry> = match staged.get(key) {
                Some(staged) => staged.as_ref().map(|h| &h.entry),
                None => self.get(key),
            };
            let before = current.map_or(0, |e| e.version);
            let next = changed(current, change, author, now_ms, limits)?;
            record.push(EntryChange {
                key: key.to_owned(),
                strategy: change.strategy,
                before,
                after: next.as_ref().map_or(0, |h| h.entry.version),
            });
            staged.insert(key, next);
        }
        let mut bytes = self.bytes;
        for (key, next) in &staged {
            bytes -= self.entries.get(*key).map_or(0, |h| h.size);
            bytes += next.as_ref().map_or(0, |h| h.size);
        }
        if bytes > limits.max_session_bytes {
            return Err(ContextError::TooLarge {
                what: "the session".into(),
                size: bytes,
                limit: limits.max_session_bytes,
            });
        }
        for (key, next) in staged {
            match next {
                Some(held) => match self.entries.get_mut(key) {
                    Some(slot) => *slot = held,
                    None => {
                        self.entries.insert(key.to_owned(), held);
                    }
                },
                None => {
                    self.entries.remove(key);
                }
            }
        }
        self.bytes = bytes;
        self.version += 1;
        Ok(Applied {
            version: self.version,
            changes: record,
        })
    }
}

/// What `change` by `author` at `now_ms` makes of entry `current`: the new entry, or
/// `None` when a merge leaves nothing (a merge with `null` deletes).
///
/// # Errors
/// An append to something that is not a list, or an entry past its size limit.
fn changed(
    current: Option<&Entry>,
    change: &Change,
    author: Option<&AgentId>,
    now_ms: u64,
    limits: &ContextLimits,
) -> Result<Option<Held>, ContextError> {
    let key = change.key.as_str();
    let value = match change.strategy {
        Strategy::Replace => change.value.clone(),
        Strategy::Merge => {
            let mut value = current.map_or(Value::Null, |e| e.value.clone());
            json_patch::merge(&mut value, &change.value);
            value
        }
        Strategy::Append => append(key, current.map(|e| &e.value), &change.value)?,
    };
    if value.is_null() && change.strategy == Strategy::Merge {
        return Ok(None);
    }
    let size = json_size(&value);
    if size > limits.max_entry_bytes {
        return Err(ContextError::TooLarge {
            what: format!("entry `{key}`"),
            size,
            limit: limits.max_entry_bytes,
        });
    }
    let entry = match current {
        Some(entry) => Entry {
            key: entry.key.clone(),
            kind: change.kind.unwrap_or(entry.kind),
            value,
            author: author.cloned(),
            created_ms: entry.created_ms,
            updated_ms: now_ms,
            version: entry.version + 1,
        },
        None => Entry {
            key: key.to_owned(),
            kind: change.kind.unwrap_or_else(|| EntryKind::of(&value)),
            value,
            author: author.cloned(),
            created_ms: now_ms,
            updated_ms: now_ms,
            version: 1,
        },
    };
    Ok(Some(Held { size, entry }))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::{Just, any, prop, prop_assert_eq, prop_oneof, proptest};
    use proptest::strategy::Strategy as PropStrategy;
    use serde_json::json;

    use super::*;

    fn change(key: &str, strategy: Strategy, value: Value) -> Change {
        Change {
            key: key.into(),
            strategy,
            value,
            kind: None,
            expected_version: None,
        }
    }

    fn apply(ctx: &mut SessionContext, changes: &[Change]) -> Result<Applied, ContextError> {
        ctx.apply(changes, None, 1_000, &ContextLimits::default())
    }

    fn value(ctx: &SessionContext, key: &str) -> Option<Value> {
        ctx.get(key).map(|e| e.value.clone())
    }

    #[test]
    fn replace_sets_and_versions_count_changes() {
        let mut ctx = SessionContext::new();
        let a = apply(&mut ctx, &[change("plan", Strategy::Replace, json!("v1"))]).unwrap();
        assert_eq!(
            (a.version, a.changes[0].before, a.changes[0].after),
            (1, 0, 1)
        );
        apply(
            &mut ctx,
            &[change("plan", Strategy::Replace, json!({"v": 2}))],
        )
        .unwrap();
        let e = ctx.get("plan").unwrap();
        assert_eq!(
            (e.version, e.kind, e.value.clone()),
            (2, EntryKind::Text, json!({"v": 2}))
        );
        assert_eq!(ctx.version(), 2);
    }

    #[test]
    fn merge_follows_rfc_7396_edge_cases() {
        let mut ctx = SessionContext::new();
        apply(
            &mut ctx,
            &[change(
                "cfg",
                Strategy::Replace,
                json!({"a": 1, "b": {"c": 2, "d": 3}}),
            )],
        )
        .unwrap();
        apply(
            &mut ctx,
            &[change(
                "cfg",
                Strategy::Merge,
                json!({"a": null, "b": {"c": 9}, "e": [1]}),
            )],
        )
        .unwrap();
        assert_eq!(
            value(&ctx, "cfg"),
            Some(json!({"b": {"c": 9, "d": 3}, "e": [1]}))
        );
        // Merging into a non-object starts from an empty object.
        apply(&mut ctx, &[change("n", Strategy::Replace, json!(5))]).unwrap();
        apply(&mut ctx, &[change("n", Strategy::Merge, json!({"x": 1}))]).unwrap();
        assert_eq!(value(&ctx, "n"), Some(json!({"x": 1})));
        // A patch that is not an object replaces; merging into a missing key creates it.
        apply(&mut ctx, &[change("cfg", Strategy::Merge, json!([1, 2]))]).unwrap();
        assert_eq!(value(&ctx, "cfg"), Some(json!([1, 2])));
        apply(
            &mut ctx,
            &[change("new", Strategy::Merge, json!({"k": null, "j": 1}))],
        )
        .unwrap();
        assert_eq!(value(&ctx, "new"), Some(json!({"j": 1})));
        // A null patch deletes the entry.
        let a = apply(&mut ctx, &[change("new", Strategy::Merge, Value::Null)]).unwrap();
        assert_eq!(value(&ctx, "new"), None);
        assert_eq!(a.changes[0].after, 0);
    }

    #[test]
    fn append_extends_arrays_and_text_and_creates_missing_keys() {
        let mut ctx = SessionContext::new();
        apply(&mut ctx, &[change("log", Strategy::Append, json!("a"))]).unwrap();
        apply(&mut ctx, &[change("log", Strategy::Append, json!("b"))]).unwrap();
        assert_eq!(value(&ctx, "log"), Some(json!("ab")));
        apply(&mut ctx, &[change("list", Strategy::Append, json!([1]))]).unwrap();
        apply(&mut ctx, &[change("list", Strategy::Append, json!([2, 3]))]).unwrap();
        apply(
            &mut ctx,
            &[change("list", Strategy::Append, json!({"four": 4}))],
        )
        .unwrap();
        assert_eq!(value(&ctx, "list"), Some(json!([1, 2, 3, {"four": 4}])));
        apply(&mut ctx, &[change("one", Strategy::Append, json!(7))]).unwrap();
        assert_eq!(value(&ctx, "one"), Some(json!([7])));
        for (key, given, expected) in [
            (
                "log",
                json!([1]),
                "cannot append an array to `log`, which holds text",
            ),
            ("one", json!(null), ""),
        ] {
            let result = apply(&mut ctx, &[change(key, Strategy::Append, given)]);
            if expected.is_empty() {
                assert!(result.is_ok());
            } else {
                assert!(result.unwrap_err().to_string().starts_with(expected));
            }
        }
        apply(&mut ctx, &[change("obj", Strategy::Replace, json!({}))]).unwrap();
        let err = apply(&mut ctx, &[change("obj", Strategy::Append, json!("x"))]).unwrap_err();
        assert!(matches!(
            err,
            ContextError::WrongType {
                holds: "an object",
                given: "text",
                ..
            }
        ));
    }

    #[test]
    fn a_batch_applies_whole_or_not_at_all() {
        let mut ctx = SessionContext::new();
        apply(
            &mut ctx,
            &[
                change("a", Strategy::Replace, json!("1")),
                change("b", Strategy::Replace, json!([])),
            ],
        )
        .unwrap();
        let before = ctx.clone();
        let mut stale = change("a", Strategy::Replace, json!("2"));
        stale.expected_version = Some(7);
        for batch in [
            vec![change("a", Strategy::Replace, json!("x")), stale],
            vec![
                change("b", Strategy::Append, json!(1)),
                change("a", Strategy::Append, json!([1])),
            ],
            vec![
                change("a", Strategy::Replace, json!("x")),
                change("", Strategy::Replace, json!(1)),
            ],
        ] {
            assert!(apply(&mut ctx, &batch).is_err());
            assert_eq!(ctx, before);
        }
        let err = apply(
            &mut ctx,
            &[{
                let mut c = change("a", Strategy::Replace, json!("2"));
                c.expected_version = Some(3);
                c
            }],
        )
        .unwrap_err();
        assert!(
            matches!(
                &err,
                ContextError::Conflict { key, expected: 3, actual: 1 } if key == "a"
            ),
            "{err}"
        );
        // Expected version 0: create only if absent.
        let mut create = change("c", Strategy::Replace, json!(1));
        create.expected_version = Some(0);
        apply(&mut ctx, &[create.clone()]).unwrap();
        assert!(matches!(
            apply(&mut ctx, &[create]),
            Err(ContextError::Conflict { actual: 1, .. })
        ));
    }

    #[test]
    fn sizes_are_limited() {
        let limits = ContextLimits {
            max_entry_bytes: 20,
            max_session_bytes: 30,
            ..ContextLimits::default()
        };
        let mut ctx = SessionContext::new();
        let err = ctx
            .apply(
                &[change("k", Strategy::Replace, json!("x".repeat(30)))],
                None,
                0,
                &limits,
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("entry `k` is 32 bytes; the limit is 20"),
            "{err}"
        );
        ctx.apply(
            &[change("a", Strategy::Replace, json!("x".repeat(15)))],
            None,
            0,
            &limits,
        )
        .unwrap();
        let err = ctx
            .apply(
                &[change("b", Strategy::Replace, json!("y".repeat(15)))],
                None,
                0,
                &limits,
            )
            .unwrap_err();
        assert!(err.to_string().contains("the session is 34 bytes"), "{err}");
        assert_eq!(ctx.bytes(), 17);
    }

    /// JSON values of bounded depth, with small key sets so patches and targets overlap.
    fn json_value() -> impl PropStrategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-5i64..5).prop_map(|n| json!(n)),
            "[a-c]{0,2}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// RFC 7396, section 2, as written: the reference the merge strategy is held to.
    fn rfc_merge_patch(target: &Value, patch: &Value) -> Value {
        match patch {
            Value::Object(p) => {
                let mut t = match target {
                    Value::Object(t) => t.clone(),
                    _ => serde_json::Map::new(),
                };
                for (name, value) in p {
                    if value.is_null() {
                        t.remove(name);
                    } else {
                        let current = t.get(name).cloned().unwrap_or(Value::Null);
                        t.insert(name.clone(), rfc_merge_patch(&current, value));
                    }
                }
                Value::Object(t)
            }
            _ => patch.clone(),
        }
    }

    proptest! {
        #[test]
        fn merge_follows_rfc_7396(target in json_value(), patch in json_value()) {
            let mut ctx = SessionContext::new();
            if !target.is_null() {
                apply(&mut ctx, &[change("k", Strategy::Replace, target.clone())]).unwrap();
            }
            apply(&mut ctx, &[change("k", Strategy::Merge, patch.clone())]).unwrap();
            let expected = rfc_merge_patch(&target, &patch);
            prop_assert_eq!(value(&ctx, "k"), (!expected.is_null()).then_some(expected));
        }

        #[test]
        fn json_size_is_the_length_serde_json_writes(
            value in json_value(),
            text in "[\\x00-\\x7f\"\\\\é€😀]{0,12}",
            n in any::<i64>(),
            f in any::<f64>(),
        ) {
            let value = json!([value, text, n, f, {text.clone(): u64::MAX}]);
            prop_assert_eq!(json_size(&value), serde_json::to_vec(&value).unwrap().len());
        }

        #[test]
        fn merge_is_idempotent(target in json_value(), patch in json_value()) {
            let once = rfc_merge_patch(&target, &patch);
            let mut ctx = SessionContext::new();
            if !target.is_null() {
                apply(&mut ctx, &[change("k", Strategy::Replace, target)]).unwrap();
            }
            apply(&mut ctx, &[change("k", Strategy::Merge, patch.clone())]).unwrap();
            apply(&mut ctx, &[change("k", Strategy::Merge, patch)]).unwrap();
            prop_assert_eq!(value(&ctx, "k"), (!once.is_null()).then_some(once));
        }

        #[test]
        fn replaying_batches_rebuilds_the_same_context(
            ops in prop::collection::vec((0..3usize, 0..3usize, json_value()), 1..20)
        ) {
            let strategies = [Strategy::Replace, Strategy::Merge, Strategy::Append];
            let mut live = SessionContext::new();
            let mut log = Vec::new();
            for (i, (key, strategy, value)) in ops.into_iter().enumerate() {
                let batch = vec![change(&format!("k{key}"), strategies[strategy], value)];
                if live.apply(&batch, None, i as u64, &ContextLimits::default()).is_ok() {
                    log.push((batch, i as u64));
                }
            }
            let mut replayed = SessionContext::new();
            for (batch, at) in &log {
                replayed.apply(batch, None, *at, &ContextLimits::default()).unwrap();
            }
            prop_assert_eq!(replayed, live);
        }
    }
}
