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
        let input_schema = schema_of::<T::Input>();
        if input_schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(RegistrationError::InvalidSchema {
                name,
                reason: format!(
                    "expected `\"type\": \"object\"`, found {}",
                    input_schema.get("type").unwrap_or(&Value::Null)
                ),
            });
        }
        Ok(Self {
            name,
            description: tool.description().to_owned(),
            input_schema,
            output_schema: schema_of::<T::Output>(),
            annotations: tool.annotations(),
            concurrency: tool.concurrency(),
        })
    }
}

/// The JSON Schema (draft 2020-12) of `T`, with doc comments as descriptions. Generated
/// once per type and shared, since many tools (and every actor of a tool) use the same types.
pub fn schema_of<T: JsonSchema + 'static>() -> Arc<Value> {
    static CACHE: OnceLock<Mutex<HashMap<TypeId, Arc<Value>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(schema) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&TypeId::of::<T>())
    {
        return Arc::clone(schema);
    }
    let schema = Arc::new(
        schemars::generate::SchemaSettings::draft2020_12()
            .into_generator()
            .into_root_schema_for::<T>()
            .to_value(),
    );
    cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(TypeId::of::<T>())
        .or_insert(schema)
        .clone()
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
        return Err(invalid(format!("it is {} characters long; the limit is 128", name.len())));
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
