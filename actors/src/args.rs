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
            reason: in_json_terms(&err.into_inner().to_string()),
        }
    })
}

/// serde's words for what it expected or found, in the JSON terms a model or a client
/// reading the schema knows: `u32` is "an integer from 0 to 4294967295", a map an object.
fn in_json_terms(reason: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("expected u8", "expected an integer from 0 to 255"),
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        (
            "expected u64",
            "expected an integer from 0 to 18446744073709551615",
        ),
        ("expected u128", "expected an integer of at least 0"),
        (
            "expected usize",
            "expected an integer from 0 to 18446744073709551615",
        ),
        ("expected i8", "expected an integer from -128 to 127"),
        ("expected i16", "expected an integer from -32768 to 32767"),
        (
            "expected i32",
            "expected an integer from -2147483648 to 2147483647",
        ),
        (
            "expected i64",
            "expected an integer from -9223372036854775808 to 9223372036854775807",
        ),
        (
            "expected isize",
            "expected an integer from -9223372036854775808 to 9223372036854775807",
        ),
        ("expected i128", "expected an integer"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
        ("expected unit", "expected null"),
        ("expected a character", "expected a one-character string"),
        ("expected a borrowed string", "expected a string"),
        ("invalid type: map", "invalid type: object"),
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: unit value", "invalid type: null"),
        ("invalid type: floating point", "invalid type: number"),
        ("invalid value: floating point", "invalid value: number"),
    ];
    let mut out = reason.to_owned();
    for (rust, json) in WORDS {
        let mut from = 0;
        while let Some(at) = out[from..].find(rust).map(|i| i + from) {
            let end = at + rust.len();
            // Whole words only: `expected u8` is not the start of `expected u80`.
            if out[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                from = end;
                continue;
            }
            out.replace_range(at..end, json);
            from = at + json.len();
        }
    }
    if let Some(rest) = out.strip_prefix("invalid type: ")
        && let Some(at) = rest.find(", expected struct ")
    {
        // `expected struct Limits` names a Rust type; the client knows an object.
        out = format!("invalid type: {}, expected an object", &rest[..at]);
    }
    out
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
        assert!(
            reason.contains("expected an integer from 0 to 4294967295"),
            "{reason}"
        );
    }

    #[test]
    fn reasons_speak_json_not_rust() {
        let (_, reason) = err(json!({"name": "a", "limits": {"max": -1}}));
        assert!(
            reason.contains("integer `-1`, expected an integer from 0 to 4294967295"),
            "{reason}"
        );
        let (_, reason) = err(json!({"name": "a", "limits": {"max": 1.5}}));
        assert!(reason.contains("invalid type: number `1.5`"), "{reason}");
        let (_, reason) = err(json!({"name": ["a"], "limits": {"max": 1}}));
        assert!(
            reason.contains("invalid type: array, expected a string"),
            "{reason}"
        );
        let (_, reason) = err(json!({"name": "a", "limits": 3}));
        assert_eq!(reason, "invalid type: integer `3`, expected an object");
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
