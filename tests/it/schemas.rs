use guildhall::{AgentSpec, Runtime};
use serde_json::{Value, json};

use crate::support::as_agent;

/// The formats JSON Schema 2020-12 defines; a validator knows no others.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Every `format` keyword in a schema (a property named `format` is an object, not one).
fn formats(schema: &Value, found: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("format", Value::String(format)) => found.push(format.clone()),
                    _ => formats(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| formats(v, found)),
        _ => {}
    }
}

/// Keywords that describe a schema without constraining it.
const ANNOTATIONS: &[&str] = &["description", "title", "default", "examples", "deprecated"];

/// Where a schema is less portable than it could be, as MCP Inspector's schema-portability
/// check reports it: a `type` array (single-`type` dialects reject it) or a subschema that
/// constrains nothing.
fn unportable(schema: &Value, at: &str, found: &mut Vec<String>) {
    let Value::Object(map) = schema else { return };
    if map.get("type").is_some_and(Value::is_array) {
        found.push(format!("{at}: type array {}", map["type"]));
    }
    if !map.keys().any(|k| !ANNOTATIONS.contains(&k.as_str())) {
        found.push(format!("{at}: no validation keyword"));
    }
    for (key, value) in map {
        match key.as_str() {
            "properties" | "$defs" => {
                for (name, sub) in value.as_object().into_iter().flatten() {
                    unportable(sub, &format!("{at}.{key}.{name}"), found);
                }
            }
            "items" | "additionalProperties" | "not" => {
                unportable(value, &format!("{at}.{key}"), found);
            }
            "anyOf" | "oneOf" | "allOf" => {
                for (i, sub) in value.as_array().into_iter().flatten().enumerate() {
                    unportable(sub, &format!("{at}.{key}[{i}]"), found);
                }
            }
            _ => {}
        }
    }
}

/// Compiles `schema` with a JSON Schema 2020-12 validator (which checks it against the
/// meta-schema) and validates `instance` against it when given.
pub(crate) fn check(tool: &str, which: &str, schema: &Value, instance: Option<&Value>) {
    let url = format!("urn:guildhall:{tool}:{which}");
    let mut compiler = boon::Compiler::new();
    let mut schemas = boon::Schemas::new();
    compiler.add_resource(&url, schema.clone()).unwrap();
    let index = compiler
        .compile(&url, &mut schemas)
        .unwrap_or_else(|err| panic!("{tool}'s {which} schema does not compile: {err:#}"));
    if let Some(instance) = instance
        && let Err(err) = schemas.validate(instance, index)
    {
        panic!("{tool}'s {which} does not match its schema: {err:#}\n{instance:#}");
    }
}

#[tokio::test]
async fn every_tool_schema_is_standard_json_schema_and_real_results_match_it() {
    let scratch = tempfile::tempdir().unwrap();
    let files = guildhall::files::Files::open(&guildhall::files::FilesConfig {
        roots: vec![scratch.path().to_owned()],
        ..guildhall::files::FilesConfig::default()
    })
    .unwrap();
    let shell = guildhall::shell::Shell::new(Default::default(), files.clone()).unwrap();
    let fetch = guildhall::fetch::Fetch::new(Default::default()).unwrap();
    let rt = Runtime::builder()
        .files(&files)
        .shell(&shell)
        .fetch(&fetch)
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    rt.register_agent(AgentSpec::new("pm", "pm").parent("tl"))
        .await
        .unwrap();
    let tools = rt.tools();
    assert!(tools.len() >= 17, "{} tools", tools.len());
    for spec in &tools {
        for (which, schema) in [
            ("input", &*spec.input_schema),
            ("output", &*spec.output_schema),
        ] {
            let mut found = Vec::new();
            formats(schema, &mut found);
            found.retain(|f| !STANDARD_FORMATS.contains(&f.as_str()));
            assert!(
                found.is_empty(),
                "{}'s {which} schema has non-standard formats {found:?}",
                spec.name
            );
            let mut issues = Vec::new();
            unportable(schema, which, &mut issues);
            assert!(issues.is_empty(), "{}: {issues:#?}", spec.name);
            check(&spec.name, which, schema, None);
        }
    }
    // Real results validate against the output schemas clients check them with.
    let calls = [
        (
            "send_message",
            json!({"to": "parent", "subject": "s", "body": "b", "expires_in_secs": 60}),
        ),
        ("check_inbox", json!({"full": true})),
        (
            "context_update",
            json!({"session": "s", "changes": [{"key": "k", "strategy": "replace", "value": 1}]}),
        ),
        ("context_get", json!({"session": "s"})),
        ("context_history", json!({"session": "s"})),
        (
            "task_create",
            json!({"title": "parse", "assignee": "role:pm", "labels": ["p"], "due": "2030-01-01T00:00:00Z"}),
        ),
        ("task_list", json!({"ready_only": true})),
        ("task_claim", json!({"lease_secs": 60})),
        ("task_heartbeat", json!({"id": 1})),
        (
            "task_update",
            json!({"id": 1, "note": "half way", "due": null}),
        ),
        ("task_get", json!({"id": 1, "history": true})),
        ("task_release", json!({"id": 1, "note": "blocked"})),
        (
            "write_file",
            json!({"path": "notes.md", "content": "a\nb\n"}),
        ),
        ("read_file", json!({"path": "notes.md"})),
        (
            "edit_file",
            json!({"path": "notes.md", "old_string": "b", "new_string": "c"}),
        ),
        (
            "multi_edit",
            json!({"path": "notes.md", "edits": [{"old_string": "c", "new_string": "d"}]}),
        ),
        (
            "apply_patch",
            json!({"input": "*** Begin Patch\n*** Update File: notes.md\n-d\n+e\n*** End Patch"}),
        ),
        ("list_dir", json!({})),
        ("glob", json!({"pattern": "*.md"})),
        ("grep", json!({"pattern": "d", "mode": "content"})),
        ("bash", json!({"command": "echo hi"})),
        ("shell_start", json!({"command": "echo hi"})),
        ("shell_output", json!({"id": "sh1", "wait_secs": 10})),
        ("shell_kill", json!({"id": "sh1"})),
    ];
    for (tool, args) in calls {
        let caller = if tool == "check_inbox" { "tl" } else { "pm" };
        let result = rt
            .call_json(tool, args, as_agent(&rt, caller))
            .await
            .unwrap_or_else(|err| panic!("{tool}: {err}"));
        let spec = tools.iter().find(|s| s.name == tool).unwrap();
        check(tool, "output", &spec.output_schema, Some(&result));
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn integer_ranges_are_minimum_and_maximum_and_nullable_is_an_any_of() {
    let rt = Runtime::builder().build().await.unwrap();
    let spec = rt.tool("send_message").unwrap();
    let expires = &spec.input_schema["properties"]["expires_in_secs"];
    // Optional, so nullable: the integer's branch carries the declared range (narrower than
    // u64's, so kept) and no `format: uint64`.
    assert_eq!(
        expires["anyOf"],
        json!([
            {"type": "integer", "minimum": 1, "maximum": 315_360_000},
            {"type": "null"}
        ]),
        "{expires}"
    );
    assert!(expires["description"].is_string(), "{expires}");
    rt.shutdown().await;
}
