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

/// Compiles `schema` with a JSON Schema 2020-12 validator (which checks it against the
/// meta-schema) and validates `instance` against it when given.
fn check(tool: &str, which: &str, schema: &Value, instance: Option<&Value>) {
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
    let rt = Runtime::builder().build().await.unwrap();
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    rt.register_agent(AgentSpec::new("pm", "pm").parent("tl"))
        .await
        .unwrap();
    let tools = rt.tools();
    assert!(tools.len() >= 7, "{} tools", tools.len());
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
async fn integer_ranges_are_stated_with_minimum_and_maximum() {
    let rt = Runtime::builder().build().await.unwrap();
    let spec = rt.tool("send_message").unwrap();
    let expires = &spec.input_schema["properties"]["expires_in_secs"];
    // The declared range is narrower than u64's and is kept; no `format: uint64`.
    assert_eq!(expires["minimum"], 1, "{expires}");
    assert_eq!(expires["maximum"], 315_360_000, "{expires}");
    assert!(expires.get("format").is_none(), "{expires}");
    rt.shutdown().await;
}
