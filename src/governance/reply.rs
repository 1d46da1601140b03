//! [`ToolReply`]: a JSON call's result as a model is to see it.

use serde::Serialize;
use serde_json::Value;

use super::truncate::Truncated;

/// A JSON call's result as a model is to see it. Serializes as its value.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    /// The whole result.
    pub value: Value,
    /// The result as text: a string result as is, anything else as compact JSON.
    pub text: String,
    /// Notes from hooks, for the model.
    pub notes: Vec<String>,
    /// Set when the text is over the tool's limits: what the model should see instead.
    pub truncated: Option<Truncated>,
}

impl ToolReply {
    /// A reply holding `value`.
    pub fn new(value: Value) -> Self {
        let text = match &value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Self {
            value,
            text,
            notes: Vec::new(),
            truncated: None,
        }
    }
}

impl ToolReply {
    /// The image this reply is, when its value is an MCP image content block
    /// (`{"type": "image", "data": base64, "mimeType": ...}`, as `read_file` returns one):
    /// its data and type. An image is sent as one, and never cut as text is.
    pub fn image(&self) -> Option<(&str, &str)> {
        let object = self.value.as_object()?;
        if object.len() != 3 || object.get("type")?.as_str()? != "image" {
            return None;
        }
        Some((
            object.get("data")?.as_str()?,
            object.get("mimeType")?.as_str()?,
        ))
    }
}

impl Serialize for ToolReply {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}
