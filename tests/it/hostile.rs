//! Random arguments, valid by their schema and not, into every registered tool, by one
//! caller: never a crash, never a circuit opened for others.

use std::collections::BTreeMap;

use guildhall::{AgentSpec, BreakerStatus, CallOptions, ErrorKind, MailboxConfig, Runtime};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};

/// Any JSON value, with the numbers that break careless code: huge, negative, fractional,
/// at the edges of the integer types.
fn any_json() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![
            json!(0),
            json!(-1),
            json!(1e308),
            json!(-1e308),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(4_294_967_296_u64),
            json!(0.5),
        ]),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number,
        ".{0,40}".prop_map(Value::String),
        // Things tools parse: ids, addresses, session names, globs.
        prop::sample::select(vec![
            "*",
            "parent",
            "children",
            "role:dev",
            "alice",
            "mallory",
            "",
            "../..",
            "01890000-0000-7000-8000-000000000000",
            "s1",
            "k",
            "\u{0}",
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Arguments for a tool with these property names: mostly its own fields, with random
/// values (some valid, most not), and now and then a field it does not know.
fn arguments(properties: Vec<String>) -> impl Strategy<Value = Value> {
    let names = if properties.is_empty() {
        vec!["x".to_owned()]
    } else {
        properties
    };
    prop::collection::vec(
        (
            prop_oneof![9 => prop::sample::select(names), 1 => ".{1,6}"],
            any_json(),
        ),
        0..5,
    )
    .prop_map(|fields| {
        let map: BTreeMap<String, Value> = fields.into_iter().collect();
        Value::Object(map.into_iter().collect::<Map<_, _>>())
    })
}

#[test]
fn no_arguments_crash_a_tool_or_open_its_circuit_for_others() {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The file tools too, over a scratch root: random paths and contents land there or are
    // refused.
    let scratch = tempfile::tempdir().unwrap();
    let files = guildhall::files::Files::open(&guildhall::files::FilesConfig {
        roots: vec![scratch.path().to_owned()],
        ..guildhall::files::FilesConfig::default()
    })
    .unwrap();
    let rt = tokio.block_on(async {
        let rt = Runtime::builder()
            .files(&files)
            .mailbox_config(MailboxConfig {
                // Waits end at once: the test is about inputs, not time.
                max_wait: std::time::Duration::from_millis(5),
                ..MailboxConfig::default()
            })
            .build()
            .await
            .unwrap();
        for id in ["mallory", "alice"] {
            rt.register_agent(AgentSpec::new(id, "dev")).await.unwrap();
        }
        rt
    });
    let (mallory, alice) = (rt.agent("mallory").unwrap(), rt.agent("alice").unwrap());
    let tools: Vec<(String, Vec<String>)> = rt
        .tools()
        .into_iter()
        .map(|spec| {
            let properties = spec.input_schema["properties"]
                .as_object()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            (spec.name.clone(), properties)
        })
        .collect();
    assert!(
        tools.len() >= 12,
        "every built-in tool is registered: {tools:?}"
    );
    let calls = tools.iter().map(|(name, properties)| {
        arguments(properties.clone()).prop_map({
            let name = name.clone();
            move |args| (name.clone(), args)
        })
    });
    let strategy = prop::sample::select(
        calls
            .collect::<Vec<_>>()
            .into_iter()
            .map(|s| s.boxed())
            .collect::<Vec<_>>(),
    )
    .prop_flat_map(|s| s);
    let mut runner = TestRunner::new(Config {
        cases: 600,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(tool, args)| {
            let outcome = tokio.block_on(rt.call_json(
                &tool,
                args.clone(),
                CallOptions::new().as_agent(&mallory),
            ));
            if let Err(err) = &outcome {
                prop_assert_ne!(err.kind(), ErrorKind::Crashed, "{} {}: {}", tool, args, err);
                prop_assert_ne!(err.kind(), ErrorKind::Timeout, "{} {}: {}", tool, args, err);
            }
            Ok(())
        })
        .unwrap();
    tokio.block_on(async {
        let tree = rt.tree().await.unwrap();
        for (name, _) in &tools {
            let breaker = tree.find(&["tools", name]).and_then(|n| n.breaker);
            assert!(
                matches!(breaker, None | Some(BreakerStatus::Closed { .. })),
                "{name}: {breaker:?}"
            );
            // Another agent is served by every tool (an ordinary answer or its own error,
            // never a circuit opened by the other agent's calls).
            let answer = rt
                .call_json(name, json!({}), CallOptions::new().as_agent(&alice))
                .await;
            if let Err(err) = answer {
                assert_ne!(err.kind(), ErrorKind::CircuitOpen, "{name}: {err}");
            }
        }
        rt.shutdown().await;
    });
}
