//! Decoding JSON arguments into a tool's input type.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::CallError;

/// Decodes `args` into `I`, or says which field is wrong and what was expected.
///
/// A missing `args` (JSON `null`) is read as an empty object, since MCP clients omit
/// `arguments` for tools without parameters.
///
/// # Errors
/// [`CallError::InvalidArguments`] with the path of the offending field.
pub fn decode<I: DeserializeOwned>(tool: &str, args: Value) -> Result<I, CallError> {
    let args = match args {
        Value::Null => Value::Object(serde_json::Map::new()),
        other => other,
    };
    if !args.is_object() {
        return Err(CallError::InvalidArguments {
            tool: tool.to_owned(),
            path: ".".into(),
            reason: format!(
                "expected an object of named arguments, found {}",
                kind_of(&args)
            ),
        });
    }
    serde_path_to_error::deserialize(args).map_err(|err| {
        let path = err.path().to_string();
        CallError::InvalidArguments {
            tool: tool.to_owned(),
            path,
            reason: err.into_inner().to_string(),
        }
    })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Input {
        name: String,
        limits: Limits,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Limits {
        max: u32,
    }

    fn err(v: Value) -> (String, String) {
        match decode::<Input>("t", v).unwrap_err() {
            CallError::InvalidArguments { path, reason, .. } => (path, reason),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn wrong_type_names_nested_field_and_expectation() {
        let (path, reason) = err(json!({"name": "a", "limits": {"max": "ten"}}));
        assert_eq!(path, "limits.max");
        assert!(reason.contains("expected u32"), "{reason}");
    }

    #[test]
    fn missing_field_is_named() {
        let (_, reason) = err(json!({"limits": {"max": 1}}));
        assert!(reason.contains("missing field `name`"), "{reason}");
    }

    #[test]
    fn unknown_field_is_named() {
        let (_, reason) = err(json!({"name": "a", "limits": {"max": 1}, "extra": true}));
        assert!(reason.contains("unknown field `extra`"), "{reason}");
    }

    #[test]
    fn non_object_is_rejected() {
        let (path, reason) = err(json!([1, 2]));
        assert_eq!(path, ".");
        assert!(reason.contains("an array"));
    }

    #[test]
    fn null_means_no_arguments() {
        #[derive(Deserialize)]
        struct Empty {}
        assert!(decode::<Empty>("t", Value::Null).is_ok());
    }
}
