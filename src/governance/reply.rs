//! [`ToolReply`]: a JSON call's result as a model is to see it.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::Value;

use super::truncate::Truncated;

/// A JSON call's result as a model is to see it. Serializes as its value.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    /// The whole result.
    pub value: Value,
    /// The result as text: a string result as is, anything else as compact JSON; for a
    /// [`verbatim`](Self::verbatim) result, the texts of its text blocks.
    pub text: String,
    /// Notes from hooks, for the model.
    pub notes: Vec<String>,
    /// Set when the text is over the tool's limits: what the model should see instead.
    pub truncated: Option<Truncated>,
    /// The result as another MCP server gave it (a proxied tool's), which an MCP client is
    /// sent as it is: every content block with its annotations and `_meta`, the structured
    /// content, the result's own `_meta`. `value` and `text` are views of it for everyone
    /// else (Rust callers, hooks, the audit, truncation).
    pub verbatim: Option<Arc<CallToolResult>>,
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
            verbatim: None,
        }
    }

    /// A reply holding an MCP server's result, kept whole for MCP clients. Its value is
    /// what a Rust caller is given: the structured content when there is some, the texts
    /// (one per line) when every block is text, otherwise the blocks as JSON (a lone block
    /// as itself, not in a list).
    pub fn verbatim(result: CallToolResult) -> Self {
        let text = texts(&result.content);
        let value = match (&result.structured_content, result.content.as_slice()) {
            (Some(structured), _) if !structured.is_null() => structured.clone(),
            (_, blocks) if blocks.iter().all(|b| b.as_text().is_some()) => {
                Value::String(text.clone())
            }
            (_, [block]) => serde_json::to_value(block).unwrap_or_default(),
            (_, blocks) => serde_json::to_value(blocks).unwrap_or_default(),
        };
        Self {
            value,
            text,
            notes: Vec::new(),
            truncated: None,
            verbatim: Some(Arc::new(result)),
        }
    }
}

/// The texts of `blocks`' text blocks, one per line.
pub(crate) fn texts(blocks: &[ContentBlock]) -> String {
    let mut texts = blocks.iter().filter_map(|b| b.as_text().map(|t| &*t.text));
    let Some(first) = texts.next() else {
        return String::new();
    };
    let mut text = first.to_owned();
    for more in texts {
        text.push('\n');
        text.push_str(more);
    }
    text
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).expect("a result")
    }

    #[test]
    fn a_servers_result_is_kept_whole_and_viewed_as_json() {
        let text = result(json!({"content": [
            {"type": "text", "text": "a", "annotations": {"priority": 1.0}},
            {"type": "text", "text": "b"}]}));
        let reply = ToolReply::verbatim(text.clone());
        assert_eq!((reply.value.clone(), &*reply.text), (json!("a\nb"), "a\nb"));
        assert_eq!(reply.verbatim.as_deref(), Some(&text), "annotations kept");

        let structured = result(json!({"content": [{"type": "text", "text": "{\"n\":1}"}],
            "structuredContent": {"n": 1}}));
        assert_eq!(ToolReply::verbatim(structured).value, json!({"n": 1}));

        let image = json!({"type": "image", "data": "AAAA", "mimeType": "image/png"});
        let lone = ToolReply::verbatim(result(json!({"content": [image]})));
        assert_eq!(
            (lone.value.clone(), lone.image()),
            (image.clone(), Some(("AAAA", "image/png")))
        );
        assert_eq!(lone.text, "", "no text to cut");

        let link = json!({"type": "resource_link", "uri": "file:///a", "name": "a"});
        let mixed = ToolReply::verbatim(result(json!({"content": [
            {"type": "text", "text": "see"}, image, link]})));
        assert_eq!(mixed.value.as_array().map(Vec::len), Some(3));
        assert_eq!(mixed.text, "see");
    }
}
