//! A tool's public description, with schemas derived from its types.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::error::RegistrationError;
use crate::tool::{Annotations, Concurrency, Tool};

/// What clients see of a tool: name, description, JSON Schemas and hints.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// The tool's unique name.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments; always an object schema. Shared by
    /// every tool with the same input type.
    pub input_schema: Arc<Value>,
    /// JSON Schema (draft 2020-12) of the result.
    pub output_schema: Arc<Value>,
    /// Behaviour hints.
    pub annotations: Annotations,
    /// How many calls may run at once.
    pub concurrency: Concurrency,
}

impl ToolSpec {
    /// Describes `tool`, validating its name and input schema.
    ///
    /// # Errors
    /// [`RegistrationError::InvalidName`] or [`RegistrationError::InvalidSchema`].
    pub fn of<T: Tool>(tool: &T) -> Result<Self, RegistrationError> {
        let name = tool.name().to_owned();
        validate_name(&name)?;
        let declared = tool.input_schema().unwrap_or_else(schema_of::<T::Input>);
        let input_schema =
            object_schema(declared).map_err(|reason| RegistrationError::InvalidSchema {
                name: name.clone(),
                reason,
            })?;
        Ok(Self {
            name,
            description: tool.description().to_owned(),
            input_schema,
            output_schema: tool
                .output_schema()
                .unwrap_or_else(output_schema_of::<T::Output>),
            annotations: tool.annotations(),
            concurrency: tool.concurrency(),
        })
    }
}

/// The JSON Schema (draft 2020-12) of `T` as it is read (a tool's input), with doc comments
/// as descriptions. Generated once per type and shared, since many tools (and every actor of
/// a tool) use the same types.
pub fn schema_of<T: JsonSchema + 'static>() -> Arc<Value> {
    cached_schema::<T>(false)
}

/// The JSON Schema of `T` as it is written (a tool's output): a field skipped when empty is
/// not required, so a client validating `structuredContent` against it accepts every value
/// the tool produces.
pub fn output_schema_of<T: JsonSchema + 'static>() -> Arc<Value> {
    cached_schema::<T>(true)
}

fn cached_schema<T: JsonSchema + 'static>(for_output: bool) -> Arc<Value> {
    type Cache = Mutex<HashMap<(TypeId, bool), Arc<Value>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    let key = (TypeId::of::<T>(), for_output);
    if let Some(schema) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Arc::clone(schema);
    }
    let settings = schemars::generate::SchemaSettings::draft2020_12()
        .with_transform(schemars::transform::RecursiveTransform(portable));
    let settings = if for_output {
        settings.for_serialize()
    } else {
        settings.for_deserialize()
    };
    let schema = Arc::new(
        settings
            .into_generator()
            .into_root_schema_for::<T>()
            .to_value(),
    );
    cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(key)
        .or_insert(schema)
        .clone()
}

/// Rewrites what schemars generates into the JSON Schema every client handles: standard
/// number ranges, nullable values as `anyOf` branches, and any-JSON values spelled out.
fn portable(schema: &mut schemars::Schema) {
    portable_numbers(schema);
    nullable_as_branches(schema);
    any_json_spelled_out(schema);
}

/// Keywords that describe a schema without constraining it.
const ANNOTATIONS: &[&str] = &[
    "description",
    "title",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
];

/// `"type": ["string", "null"]` (how schemars writes an `Option`) becomes
/// `"anyOf": [{"type": "string", …}, {"type": "null"}]`: legal either way, but clients that
/// map tool schemas onto a single-`type` dialect (Gemini's function declarations, for one)
/// reject or drop the array form. The type's own constraints move into its branch; the
/// annotations stay outside.
fn nullable_as_branches(schema: &mut schemars::Schema) {
    let Some(Value::Array(types)) = schema.get("type") else {
        return;
    };
    let (nulls, others): (Vec<&Value>, Vec<&Value>) =
        types.iter().partition(|t| t.as_str() == Some("null"));
    if nulls.is_empty() || others.len() != 1 || schema.get("anyOf").is_some() {
        return;
    }
    let kind = others[0].clone();
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let mut branch = serde_json::Map::new();
    branch.insert("type".into(), kind);
    let moved: Vec<String> = object
        .keys()
        .filter(|k| *k != "type" && !ANNOTATIONS.contains(&k.as_str()))
        .cloned()
        .collect();
    for key in moved {
        if let Some(value) = object.remove(&key) {
            branch.insert(key, value);
        }
    }
    object.remove("type");
    object.insert(
        "anyOf".into(),
        Value::Array(vec![
            Value::Object(branch),
            serde_json::json!({ "type": "null" }),
        ]),
    );
}

/// A schema with no constraining keyword (schemars' spelling of "any JSON value", e.g. for a
/// `serde_json::Value` payload) says so with one branch per JSON type, which a client can
/// tell from a schema that forgot to say what it accepts.
fn any_json_spelled_out(schema: &mut schemars::Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    if object.keys().any(|k| !ANNOTATIONS.contains(&k.as_str())) {
        return;
    }
    let any: Vec<Value> = ["object", "array", "string", "number", "boolean", "null"]
        .iter()
        .map(|t| serde_json::json!({ "type": t }))
        .collect();
    object.insert("anyOf".into(), Value::Array(any));
}

/// Says the range of a Rust number type in standard JSON Schema. schemars marks integers
/// with formats of its own (`uint32`, `int64`, …) and floats with `float`/`double`; no
/// JSON Schema validator knows them, and the TypeScript SDK (so Claude Code and the MCP
/// Inspector) warns about every one. The format goes; an integer's range becomes `minimum`
/// and `maximum`, keeping a narrower bound the type already declares.
fn portable_numbers(schema: &mut schemars::Schema) {
    let Some(format) = schema.get("format").and_then(Value::as_str) else {
        return;
    };
    let range: Option<(Option<i128>, Option<i128>)> = match format {
        "uint8" => Some((Some(0), Some(u8::MAX.into()))),
        "uint16" => Some((Some(0), Some(u16::MAX.into()))),
        "uint32" => Some((Some(0), Some(u32::MAX.into()))),
        "uint64" | "uint" => Some((Some(0), Some(u64::MAX.into()))),
        "uint128" => Some((Some(0), None)),
        "int8" => Some((Some(i8::MIN.into()), Some(i8::MAX.into()))),
        "int16" => Some((Some(i16::MIN.into()), Some(i16::MAX.into()))),
        "int32" => Some((Some(i32::MIN.into()), Some(i32::MAX.into()))),
        "int64" | "int" => Some((Some(i64::MIN.into()), Some(i64::MAX.into()))),
        "int128" => Some((None, None)),
        "float" | "double" => Some((None, None)),
        _ => None,
    };
    let Some((low, high)) = range else { return };
    schema.remove("format");
    let bound = |schema: &mut schemars::Schema,
                 key: &str,
                 value: Option<i128>,
                 wider: fn(f64, f64) -> bool| {
        let Some(value) = value else { return };
        let keep = schema
            .get(key)
            .and_then(Value::as_f64)
            .is_some_and(|declared| !wider(declared, value as f64));
        if !keep {
            let number = i64::try_from(value)
                .map(Value::from)
                .or_else(|_| u64::try_from(value).map(Value::from))
                .unwrap_or(Value::Null);
            if !number.is_null() {
                schema.insert(key.to_owned(), number);
            }
        }
    };
    bound(schema, "minimum", low, |declared, type_min| {
        declared < type_min
    });
    bound(schema, "maximum", high, |declared, type_max| {
        declared > type_max
    });
}

/// Makes sure an input schema describes a JSON object, as MCP requires. A schema whose
/// alternatives (`oneOf` / `anyOf`, e.g. from an internally tagged enum) are all objects gets
/// `"type": "object"` stated at the top, which is what clients look for.
fn object_schema(schema: Arc<Value>) -> Result<Arc<Value>, String> {
    match schema.get("type") {
        Some(Value::String(t)) if t == "object" => return Ok(schema),
        Some(other) => {
            return Err(format!(
                "arguments must be a JSON object, but the schema's type is {other}"
            ));
        }
        None => {}
    }
    let alternatives = ["oneOf", "anyOf"]
        .iter()
        .find_map(|k| schema.get(*k).and_then(Value::as_array));
    let all_objects = alternatives.is_some_and(|alts| {
        !alts.is_empty()
            && alts
                .iter()
                .all(|a| a.get("type").and_then(Value::as_str) == Some("object"))
    });
    if !all_objects {
        return Err("arguments must be a JSON object, but the schema has no `type` and not every alternative is an object".into());
    }
    let mut schema = (*schema).clone();
    if let Value::Object(map) = &mut schema {
        map.insert("type".into(), Value::String("object".into()));
    }
    Ok(Arc::new(schema))
}

/// Checks a tool name against MCP's rule: 1–128 characters of `[A-Za-z0-9_.-]`.
///
/// # Errors
/// [`RegistrationError::InvalidName`] naming the rule broken.
pub fn validate_name(name: &str) -> Result<(), RegistrationError> {
    let invalid = |reason: String| RegistrationError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    if name.len() > 128 {
        return Err(invalid(format!(
            "it is {} characters long; the limit is 128",
            name.len()
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(invalid(format!(
            "character {c:?} is not allowed; use letters, digits, `_`, `-` or `.`"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_enum_inputs_become_object_schemas() {
        #[derive(schemars::JsonSchema)]
        #[serde(tag = "op")]
        #[allow(dead_code)]
        enum Op {
            A { x: u8 },
            B { y: String },
        }
        let schema = object_schema(schema_of::<Op>()).unwrap();
        assert_eq!(schema["type"], "object");
        assert!(schema["oneOf"].is_array());
    }

    #[test]
    fn non_object_inputs_are_rejected() {
        assert!(
            object_schema(schema_of::<u32>())
                .unwrap_err()
                .contains("must be a JSON object")
        );
        assert!(object_schema(schema_of::<Vec<String>>()).is_err());
    }

    #[test]
    fn names_follow_the_mcp_rule() {
        assert!(validate_name("send_message").is_ok());
        assert!(validate_name("ns.tool-2").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("has space").is_err());
        assert!(validate_name("naïve").is_err());
        assert!(validate_name(&"a".repeat(129)).is_err());
        assert!(validate_name(&"a".repeat(128)).is_ok());
    }
}
