//! How a composed step's arguments are made: JSON pointers into the composite's input and
//! the previous step's result, and values given as they are.

use serde_json::{Map, Value};

/// How a step's arguments are made from the pipeline's input and the previous result.
#[derive(Debug, Clone)]
pub(crate) struct Mapping {
    pointers: Vec<(String, String)>,
    set: Map<String, Value>,
}

impl Mapping {
    /// Arguments from `pointers` (name → pointer) and `set` (name → value).
    pub(crate) fn new(pointers: Vec<(String, String)>, set: Map<String, Value>) -> Self {
        Self { pointers, set }
    }

    /// The arguments, or which pointer found nothing.
    pub(crate) fn apply(&self, input: &Value, result: &Value) -> Result<Value, String> {
        let mut args = self.set.clone();
        for (name, pointer) in &self.pointers {
            let (root, rest) = split(pointer).ok_or_else(|| format!("`{pointer}`"))?;
            let from = if root == "input" { input } else { result };
            let value = from.pointer(rest).ok_or_else(|| {
                let what = if root == "input" {
                    "the pipeline's arguments"
                } else {
                    "the previous step's result"
                };
                format!("`{name}` = `{pointer}`: {what} have no `{rest}`")
            })?;
            args.insert(name.clone(), value.clone());
        }
        Ok(Value::Object(args))
    }
}

/// A pointer's root (`input`, `result`) and the rest (`/a/b`, or empty for the whole).
pub(crate) fn split(pointer: &str) -> Option<(&str, &str)> {
    let rest = pointer.strip_prefix('/')?;
    let (root, tail) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    matches!(root, "input" | "result").then_some((root, tail))
}
