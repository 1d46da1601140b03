//! The official conformance suite's fixtures (`--conformance-fixtures`, off by default):
//! the tools, resources and prompts its scenarios call by name. Built from JSON: this is a
//! test surface, kept apart from the runtime's tools and never on a hot path.

// Logging and server-to-client requests are deprecated by the 2026 revision; the
// handshake-era scenarios still call them.
#![allow(deprecated)]

mod input_required;
mod model;
mod tasks;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, LoggingLevel,
    LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

use model::from_json;

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==";
/// An empty WAV.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

const NAMES: &[&str] = &[
    "json_schema_2020_12_tool",
    "test_audio_content",
    "test_custom_headers",
    "test_elicitation",
    "test_elicitation_sep1034_defaults",
    "test_elicitation_sep1330_enums",
    "test_embedded_resource",
    "test_error_handling",
    "test_image_content",
    "test_multiple_content_types",
    "test_reconnection",
    "test_sampling",
    "test_simple_text",
    "test_tool_with_logging",
    "test_tool_with_progress",
    "test_logging_tool",
    "test_missing_capability",
    "test_streaming_elicitation",
    "test_trigger_tool_change",
    "test_trigger_prompt_change",
];

/// Whether `name` is a fixture tool.
pub(super) fn is_fixture(name: &str) -> bool {
    NAMES.contains(&name) || input_required::is_tool(name) || tasks::is_tool(name)
}

/// What a fixture server declares: tools, resources, prompts, logging and completions.
pub(super) fn capabilities() -> ServerCapabilities {
    from_json(json!({
        "tools": { "listChanged": true },
        "resources": { "subscribe": true, "listChanged": true },
        "prompts": { "listChanged": true },
        "logging": {},
        "completions": {},
        "extensions": { "io.modelcontextprotocol/tasks": {} }
    }))
}

fn empty_input() -> Value {
    json!({ "type": "object", "properties": {} })
}

/// The fixture tools.
pub(super) fn tools() -> Vec<Tool> {
    let describe = |name: &str| match name {
        "json_schema_2020_12_tool" => (
            "Tool with JSON Schema 2020-12 features",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "$anchor": "addressDef",
                        "type": "object",
                        "properties": {
                            "street": { "type": "string" },
                            "city": { "type": "string" }
                        }
                    }
                },
                "properties": {
                    "name": { "type": "string" },
                    "address": { "$ref": "#/$defs/address" },
                    "contactMethod": { "type": "string", "enum": ["phone", "email"] },
                    "phone": { "type": "string" },
                    "email": { "type": "string" }
                },
                // Composition, conditional and anchor keywords pass through untouched
                // (SEP-2106).
                "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
                "if": {
                    "properties": { "contactMethod": { "const": "phone" } },
                    "required": ["contactMethod"]
                },
                "then": { "required": ["phone"] },
                "else": { "required": ["email"] },
                "additionalProperties": false
            }),
        ),
        "test_sampling" => (
            "Asks the client's model to complete a prompt",
            json!({ "type": "object", "properties": { "prompt": { "type": "string" } }, "required": ["prompt"] }),
        ),
        "test_elicitation" => (
            "Asks the user for input",
            json!({ "type": "object", "properties": { "message": { "type": "string" } }, "required": ["message"] }),
        ),
        "test_custom_headers" => (
            "Echoes a region mirrored in the Mcp-Param-Region header (SEP-2243)",
            json!({
                "type": "object",
                "properties": {
                    "region": { "type": "string", "x-mcp-header": "Region" },
                    "priority": { "type": "integer", "x-mcp-header": "Priority" },
                    "query": { "type": "string" }
                },
                "required": ["region", "priority", "query"]
            }),
        ),
        other => (fixture_description(other), empty_input()),
    };
    let mrtr = input_required::TOOLS
        .iter()
        .map(|(name, description)| (*name, *description, empty_input()));
    let tasks = tasks::TOOLS
        .iter()
        .map(|(name, description)| (*name, *description, tasks::schema(name)));
    NAMES
        .iter()
        .map(|name| {
            let (description, schema) = describe(name);
            (*name, description, schema)
        })
        .chain(mrtr)
        .chain(tasks)
        .map(|(name, description, schema)| {
            from_json(json!({ "name": name, "description": description, "inputSchema": schema }))
        })
        .collect()
}

fn fixture_description(name: &str) -> &'static str {
    match name {
        "test_audio_content" => "Returns audio content",
        "test_elicitation_sep1034_defaults" => "Elicitation with default values (SEP-1034)",
        "test_elicitation_sep1330_enums" => "Elicitation with enum schemas (SEP-1330)",
        "test_embedded_resource" => "Returns an embedded resource",
        "test_error_handling" => "Always fails",
        "test_image_content" => "Returns image content",
        "test_multiple_content_types" => "Returns text, an image and a resource",
        "test_reconnection" => "Answers after a short pause",
        "test_simple_text" => "Returns simple text content",
        "test_tool_with_logging" => "Sends three log notifications",
        "test_tool_with_progress" => "Reports progress 0, 50 and 100 of 100",
        "test_logging_tool" => "Logs only when the request's _meta names a log level",
        "test_missing_capability" => "Needs the client's sampling capability",
        "test_streaming_elicitation" => "Asks for the user's name through an input_required result",
        "test_trigger_tool_change" => "Registers a new tool, changing the tool list",
        "test_trigger_prompt_change" => "Adds a prompt, changing the prompt list",
        _ => "A conformance fixture",
    }
}

fn content(blocks: Value) -> CallToolResult {
    from_json(json!({ "resultType": "complete", "content": blocks }))
}

/// Runs fixture tool `request.name`.
pub(super) async fn call(
    request: CallToolRequestParams,
    cx: RequestContext<RoleServer>,
    call_tasks: &super::tasks::CallTasks,
) -> Result<CallToolResponse, McpError> {
    let name = request.name.as_ref();
    if tasks::is_tool(name) {
        return tasks::call(request, cx, call_tasks).await;
    }
    if input_required::is_tool(name) {
        return input_required::call(&request, &cx);
    }
    match name {
        "test_streaming_elicitation" => {
            // The same rounds as the elicitation fixture.
            let mut request = request.clone();
            request.name = "test_input_required_result_elicitation".into();
            return input_required::call(&request, &cx);
        }
        "test_missing_capability" => {
            let sampling = cx.client_capabilities().and_then(|c| c.sampling);
            if sampling.is_none() {
                return Err(McpError::missing_required_client_capability(from_json(
                    json!({ "sampling": {} }),
                )));
            }
            return Ok(
                content(json!([{ "type": "text", "text": "The client can sample" }])).into(),
            );
        }
        "test_logging_tool" => {
            if cx.meta.get(LOG_LEVEL).is_some() {
                #[allow(deprecated)]
                let _ = cx
                    .peer
                    .notify_logging_message(
                        LoggingMessageNotificationParam::new(
                            LoggingLevel::Info,
                            json!("Logged as asked"),
                        )
                        .with_logger("guildhall"),
                    )
                    .await;
            }
            return Ok(
                content(json!([{ "type": "text", "text": "Logging test completed" }])).into(),
            );
        }
        _ => {}
    }
    one_round(request, cx).await.map(CallToolResponse::from)
}

/// A list the fixture triggers change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListChange {
    /// `test_trigger_tool_change`: a tool is registered.
    Tools,
    /// `test_trigger_prompt_change`: a prompt is added.
    Prompts,
}

impl ListChange {
    /// The change the fixture tool `name` triggers, if it is a trigger.
    pub(super) fn triggered_by(name: &str) -> Option<Self> {
        match name {
            "test_trigger_tool_change" => Some(Self::Tools),
            "test_trigger_prompt_change" => Some(Self::Prompts),
            _ => None,
        }
    }
}

/// The tool `test_trigger_tool_change` registers: a real tool, so the tool set changes as it
/// would when an embedder registers one.
#[derive(Debug, Clone)]
pub(super) struct AddedTool(pub(super) String);

/// [`AddedTool`]'s input and output: nothing.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(super) struct Nothing {}

impl crate::Tool for AddedTool {
    type Input = Nothing;
    type Output = Nothing;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        &self.0
    }

    fn description(&self) -> &str {
        "Added by test_trigger_tool_change."
    }

    async fn call(
        &self,
        _: &mut (),
        _: Nothing,
        _: crate::CallContext,
    ) -> Result<Nothing, Self::Error> {
        Ok(Nothing {})
    }
}

/// The name of the `n`th prompt added by `test_trigger_prompt_change`.
pub(super) fn added_prompt_name(n: u64) -> String {
    format!("test_dynamic_prompt_{n}")
}

/// Where a 2026-07-28 request asks for log messages.
const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// Runs a fixture tool that answers in one round.
async fn one_round(
    request: CallToolRequestParams,
    cx: RequestContext<RoleServer>,
) -> Result<CallToolResult, McpError> {
    let args = request.arguments.unwrap_or_default();
    let arg = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_owned);
    Ok(match request.name.as_ref() {
        "test_simple_text" => content(json!([
            { "type": "text", "text": "This is a simple text response for testing." }
        ])),
        "test_image_content" => content(json!([
            { "type": "image", "data": PNG, "mimeType": "image/png" }
        ])),
        "test_audio_content" => content(json!([
            { "type": "audio", "data": WAV, "mimeType": "audio/wav" }
        ])),
        "test_embedded_resource" => content(json!([{
            "type": "resource",
            "resource": { "uri": "test://embedded-resource", "mimeType": "text/plain",
                          "text": "This is an embedded resource content." }
        }])),
        "test_multiple_content_types" => content(json!([
            { "type": "text", "text": "Multiple content types test:" },
            { "type": "image", "data": PNG, "mimeType": "image/png" },
            { "type": "resource", "resource": { "uri": "test://mixed-content-resource",
              "mimeType": "application/json", "text": "{\"test\":\"data\",\"value\":123}" } }
        ])),
        "test_tool_with_logging" => {
            for message in [
                "Tool execution started",
                "Tool processing data",
                "Tool execution completed",
            ] {
                #[allow(deprecated)]
                let _ = cx
                    .peer
                    .notify_logging_message(
                        LoggingMessageNotificationParam::new(LoggingLevel::Info, json!(message))
                            .with_logger("guildhall"),
                    )
                    .await;
            }
            content(json!([{ "type": "text", "text": "Logging test completed" }]))
        }
        "test_tool_with_progress" => {
            if let Some(token) = cx.meta.get_progress_token() {
                for (progress, message) in [(0.0, "Starting"), (50.0, "Halfway"), (100.0, "Done")] {
                    let _ = cx
                        .peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), progress)
                                .with_total(100.0)
                                .with_message(message),
                        )
                        .await;
                }
            }
            content(json!([{ "type": "text", "text": "Progress test completed" }]))
        }
        "test_error_handling" => from_json(json!({
            "resultType": "complete",
            "content": [{ "type": "text", "text": "This tool intentionally returns an error for testing" }],
            "isError": true
        })),
        "test_custom_headers" => {
            // The transport compared each Mcp-Param-* header with its argument before the
            // call reached here.
            let region = arg("region").unwrap_or_default();
            content(json!([{ "type": "text", "text": format!("region {region}") }]))
        }
        "json_schema_2020_12_tool" => {
            let name = arg("name").unwrap_or_else(|| "world".to_owned());
            content(json!([{ "type": "text", "text": format!("Hello, {name}!") }]))
        }
        "test_reconnection" => {
            content(json!([{ "type": "text", "text": "Reconnection test completed" }]))
        }
        "test_sampling" => {
            let prompt = arg("prompt").unwrap_or_else(|| "Hello".to_owned());
            let params = from_json(json!({
                "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }],
                "maxTokens": 100
            }));
            #[allow(deprecated)]
            match cx.peer.create_message(params).await {
                Ok(result) => {
                    let reply = serde_json::to_value(&result.message).unwrap_or_default();
                    let text = reply
                        .pointer("/content/text")
                        .or_else(|| reply.pointer("/content/0/text"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    content(json!([{ "type": "text", "text": format!("LLM response: {text}") }]))
                }
                Err(err) => failure(format!("sampling failed: {err}")),
            }
        }
        name @ ("test_elicitation"
        | "test_elicitation_sep1034_defaults"
        | "test_elicitation_sep1330_enums") => {
            let message = arg("message").unwrap_or_else(|| "Please provide values".to_owned());
            let params = from_json(json!({
                "mode": "form",
                "message": message,
                "requestedSchema": elicitation_schema(name)
            }));
            match cx.peer.create_elicitation(params).await {
                Ok(result) => {
                    let answer = serde_json::to_value(&result).unwrap_or_default();
                    content(json!([{ "type": "text", "text": format!("User response: {answer}") }]))
                }
                Err(err) => failure(format!("elicitation failed: {err}")),
            }
        }
        other => {
            return Err(McpError::invalid_params(
                format!("unknown tool `{other}`"),
                None,
            ));
        }
    })
}

fn failure(message: String) -> CallToolResult {
    from_json(
        json!({ "resultType": "complete", "content": [{ "type": "text", "text": message }], "isError": true }),
    )
}

fn elicitation_schema(tool: &str) -> Value {
    match tool {
        "test_elicitation_sep1034_defaults" => json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "description": "User's name", "default": "John Doe" },
                "age": { "type": "integer", "description": "User's age", "default": 30 },
                "score": { "type": "number", "description": "User's score", "default": 95.5 },
                "status": { "type": "string", "description": "User's status",
                            "enum": ["active", "inactive", "pending"], "default": "active" },
                "verified": { "type": "boolean", "description": "Whether user is verified", "default": true }
            }
        }),
        "test_elicitation_sep1330_enums" => json!({
            "type": "object",
            "properties": {
                "untitledSingle": { "type": "string", "enum": ["option1", "option2", "option3"] },
                "titledSingle": { "type": "string", "oneOf": [
                    { "const": "value1", "title": "First Option" },
                    { "const": "value2", "title": "Second Option" },
                    { "const": "value3", "title": "Third Option" } ] },
                "legacyEnum": { "type": "string", "enum": ["opt1", "opt2", "opt3"],
                                "enumNames": ["Option One", "Option Two", "Option Three"] },
                "untitledMulti": { "type": "array", "items": { "type": "string",
                                   "enum": ["option1", "option2", "option3"] } },
                "titledMulti": { "type": "array", "items": { "anyOf": [
                    { "const": "value1", "title": "First Choice" },
                    { "const": "value2", "title": "Second Choice" },
                    { "const": "value3", "title": "Third Choice" } ] } }
            }
        }),
        _ => json!({
            "type": "object",
            "properties": {
                "username": { "type": "string", "description": "User's response" },
                "email": { "type": "string", "description": "User's email address" }
            },
            "required": ["username", "email"]
        }),
    }
}

pub(super) fn list_resources(
    _request: Option<PaginatedRequestParams>,
    _cx: RequestContext<RoleServer>,
) -> Result<ListResourcesResult, McpError> {
    Ok(from_json(json!({ "resultType": "complete", "resources": [
        { "uri": "test://static-text", "name": "static-text", "title": "Static Text Resource",
          "description": "A static text resource", "mimeType": "text/plain" },
        { "uri": "test://static-binary", "name": "static-binary", "title": "Static Binary Resource",
          "description": "A static binary resource", "mimeType": "image/png" },
        { "uri": "test://watched-resource", "name": "watched-resource",
          "description": "A resource that can be subscribed to", "mimeType": "text/plain" }
    ]})))
}

pub(super) fn list_resource_templates(
    _request: Option<PaginatedRequestParams>,
    _cx: RequestContext<RoleServer>,
) -> Result<ListResourceTemplatesResult, McpError> {
    Ok(from_json(
        json!({ "resultType": "complete", "resourceTemplates": [
            { "uriTemplate": "test://template/{id}/data", "name": "template-data",
              "title": "Dynamic Resource", "description": "A resource with a parameter",
              "mimeType": "application/json" }
        ]}),
    ))
}

pub(super) async fn read_resource(
    request: ReadResourceRequestParams,
    _cx: RequestContext<RoleServer>,
) -> Result<ReadResourceResponse, McpError> {
    let uri = request.uri.as_str();
    let contents = match uri {
        "test://static-text" => json!({ "uri": uri, "mimeType": "text/plain",
            "text": "This is the content of the static text resource." }),
        "test://static-binary" => json!({ "uri": uri, "mimeType": "image/png", "blob": PNG }),
        "test://watched-resource" => json!({ "uri": uri, "mimeType": "text/plain",
            "text": "Watched resource content" }),
        _ => match uri
            .strip_prefix("test://template/")
            .and_then(|rest| rest.strip_suffix("/data"))
        {
            Some(id) => json!({ "uri": uri, "mimeType": "application/json",
                "text": json!({ "id": id, "templateTest": true, "data": format!("Data for ID: {id}") }).to_string() }),
            None => {
                return Err(McpError::resource_not_found(
                    format!("no resource `{uri}`"),
                    Some(json!({ "uri": uri })),
                ));
            }
        },
    };
    let result: ReadResourceResult =
        from_json(json!({ "resultType": "complete", "contents": [contents] }));
    Ok(ReadResourceResponse::from(result))
}

/// The fixture prompts, with the `added` ones from `test_trigger_prompt_change` last.
pub(super) fn list_prompts(
    added: u64,
    _request: Option<PaginatedRequestParams>,
    _cx: RequestContext<RoleServer>,
) -> Result<ListPromptsResult, McpError> {
    let mut prompts = json!([
        { "name": "test_prompt_with_arguments", "description": "A prompt with arguments",
          "arguments": [
            { "name": "arg1", "description": "First test argument", "required": true },
            { "name": "arg2", "description": "Second test argument", "required": true } ] },
        { "name": "test_prompt_with_embedded_resource", "description": "A prompt with an embedded resource",
          "arguments": [ { "name": "resourceUri", "description": "URI of the resource", "required": true } ] },
        { "name": "test_prompt_with_image", "description": "A prompt with an image" },
        { "name": "test_simple_prompt", "description": "A simple prompt without arguments" },
        { "name": input_required::PROMPT,
          "description": "Asks for context through an input_required result, then uses it" }
    ]);
    if let Some(list) = prompts.as_array_mut() {
        list.extend((1..=added).map(|n| {
            json!({ "name": added_prompt_name(n), "description": "A prompt added at run time" })
        }));
    }
    Ok(from_json(
        json!({ "resultType": "complete", "prompts": prompts }),
    ))
}

pub(super) async fn get_prompt(
    request: GetPromptRequestParams,
    _cx: RequestContext<RoleServer>,
) -> Result<GetPromptResponse, McpError> {
    if request.name == input_required::PROMPT {
        return input_required::get_prompt(&request);
    }
    let args = request.arguments.unwrap_or_default();
    let arg = |key: &str| {
        args.get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let user_text =
        |text: String| json!({ "role": "user", "content": { "type": "text", "text": text } });
    let messages = match request.name.as_str() {
        "test_simple_prompt" => json!([user_text("This is a simple prompt for testing.".into())]),
        "test_prompt_with_arguments" => json!([user_text(format!(
            "Prompt with arguments: arg1='{}', arg2='{}'",
            arg("arg1"),
            arg("arg2")
        ))]),
        "test_prompt_with_embedded_resource" => {
            let uri = arg("resourceUri");
            json!([
                { "role": "user", "content": { "type": "resource", "resource": {
                    "uri": uri, "mimeType": "text/plain", "text": "Embedded resource content for testing." } } },
                user_text("Please process the embedded resource above.".into())
            ])
        }
        name if name.starts_with("test_dynamic_prompt_") => {
            json!([user_text(format!("This is {name}, added at run time."))])
        }
        "test_prompt_with_image" => json!([
            { "role": "user", "content": { "type": "image", "data": PNG, "mimeType": "image/png" } },
            user_text("Please analyze the image above.".into())
        ]),
        other => {
            return Err(McpError::invalid_params(
                format!("unknown prompt `{other}`"),
                None,
            ));
        }
    };
    let result: GetPromptResult =
        from_json(json!({ "resultType": "complete", "messages": messages }));
    Ok(GetPromptResponse::from(result))
}

pub(super) fn complete(request: &CompleteRequestParams) -> Result<CompleteResult, McpError> {
    let _ = request;
    Ok(from_json(
        json!({ "resultType": "complete", "completion": { "values": [], "total": 0, "hasMore": false } }),
    ))
}
