//! `[telemetry] otlp_endpoint`: each tool call a span with its agent, tool, decision and
//! outcome, exported over OTLP/HTTP (JSON) to a collector this test runs on loopback.

use std::sync::{Arc, Mutex};

use guildhall::observe::{TelemetryConfig, TelemetryError, Traces};
use serde_json::{Value, json};

/// What the collector received: each request's path, content type, `x-api-key` and body.
type Received = Arc<Mutex<Vec<(String, String, String, Value)>>>;

fn header(request: &axum::extract::Request, name: &str) -> String {
    request
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

async fn collector() -> (String, Received, tokio_util::sync::CancellationToken) {
    let received: Received = Arc::default();
    let kept = Arc::clone(&received);
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let kept = Arc::clone(&kept);
        async move {
            let path = request.uri().path().to_owned();
            let (kind, key) = (
                header(&request, "content-type"),
                header(&request, "x-api-key"),
            );
            let body = axum::body::to_bytes(request.into_body(), 1 << 24)
                .await
                .unwrap();
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            kept.lock().unwrap().push((path, kind, key, body));
            "{}"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let until = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(until.cancelled_owned())
            .await
            .unwrap();
    });
    (url, received, stop)
}

/// Every span the collector received, checking each export's path, content type, resource
/// and `x-api-key` header (`key`).
fn spans(received: &Received, key: &str) -> Vec<Value> {
    let received = received.lock().unwrap().clone();
    assert!(!received.is_empty(), "the collector got an export");
    let mut spans = Vec::new();
    for (path, kind, sent_key, body) in &received {
        assert_eq!(path, "/v1/traces");
        assert_eq!(
            sent_key, key,
            "the configured header goes with every export"
        );
        assert!(kind.starts_with("application/json"), "{kind}");
        for resource in body["resourceSpans"].as_array().unwrap() {
            let service = &resource["resource"]["attributes"];
            assert!(
                service.to_string().contains("\"guildhall\""),
                "service.name: {service}"
            );
            for scope in resource["scopeSpans"].as_array().unwrap() {
                spans.extend(scope["spans"].as_array().unwrap().iter().cloned());
            }
        }
    }
    spans
}

/// A span's attributes as a map of string values.
fn attributes(span: &Value) -> serde_json::Map<String, Value> {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["key"].as_str().unwrap().to_owned(),
                a["value"]["stringValue"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn each_call_is_a_span_a_collector_receives_with_agent_tool_decision_and_outcome() {
    let (rt, _) = crate::mcp::runtime().await;
    let (url, received, stop) = collector().await;
    let config = TelemetryConfig {
        otlp_endpoint: Some(url),
        otlp_headers: [("x-api-key".to_owned(), "k1".to_owned())].into(),
    };
    let traces = Traces::start(&rt, &config)
        .unwrap()
        .expect("an endpoint: traces");
    let alice = crate::support::as_agent(&rt, "alice");
    rt.call_json("gate", json!({ "mode": "progress" }), alice.clone())
        .await
        .unwrap();
    let refused = rt.call_json("gate", json!({ "mode": 7 }), alice).await;
    assert!(refused.is_err());
    traces.flush().await;

    let spans = spans(&received, "k1");
    let gate: Vec<_> = spans
        .iter()
        .filter(|s| s["name"] == "execute_tool gate")
        .map(attributes)
        .collect();
    assert_eq!(gate.len(), 2, "{spans:?}");
    let outcomes: Vec<_> = gate
        .iter()
        .map(|a| a["guildhall.outcome"].clone())
        .collect();
    assert_eq!(outcomes, [json!("ok"), json!("invalid_arguments")]);
    for a in &gate {
        assert_eq!(a["guildhall.agent"], "alice");
        assert_eq!(a["guildhall.tool"], "gate");
        assert_eq!(a["guildhall.decision"], "allow");
    }
    let failed = spans
        .iter()
        .find(|s| attributes(s)["guildhall.outcome"] == "invalid_arguments")
        .unwrap();
    assert_eq!(failed["status"]["code"], 2, "an error status: {failed}");
    drop(traces);
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn traces_are_off_without_an_endpoint_and_a_bad_one_is_named() {
    let (rt, _) = crate::mcp::runtime().await;
    assert!(
        Traces::start(&rt, &TelemetryConfig::default())
            .unwrap()
            .is_none()
    );
    let bad = TelemetryConfig {
        otlp_endpoint: Some("collector:4318".into()),
        ..TelemetryConfig::default()
    };
    let err = Traces::start(&rt, &bad).unwrap_err();
    assert!(matches!(err, TelemetryError::Endpoint(_)));
    assert!(err.to_string().contains("collector:4318"), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_call_naming_its_trace_in_meta_is_a_span_of_that_trace_unless_unsampled() {
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";
    let (rt, _) = crate::mcp::runtime().await;
    let (url, received, stop) = collector().await;
    let config = TelemetryConfig {
        otlp_endpoint: Some(url),
        ..TelemetryConfig::default()
    };
    let traces = Traces::start(&rt, &config).unwrap().expect("traces");
    let server = guildhall::mcp::McpServer::new(rt.clone())
        .connection(Some(Arc::from("alice")), guildhall::mcp::ToolFilter::all());
    let mut alice = crate::mcp::Wire::legacy(server).await;
    for (id, flags) in [(1, "01"), (2, "00")] {
        let answer = alice
            .request(
                id,
                "tools/call",
                json!({ "name": "whoami", "arguments": {},
                        "_meta": { "traceparent": format!("00-{TRACE}-{PARENT}-{flags}") } }),
            )
            .await;
        assert!(answer.get("result").is_some(), "{answer}");
    }
    // One with a traceparent that is not one: ignored, a trace of its own.
    let answer = alice
        .request(
            3,
            "tools/call",
            json!({ "name": "whoami", "arguments": {}, "_meta": { "traceparent": "nope" } }),
        )
        .await;
    assert!(answer.get("result").is_some(), "{answer}");
    traces.flush().await;

    let whoami: Vec<Value> = spans(&received, "")
        .into_iter()
        .filter(|s| s["name"] == "execute_tool whoami")
        .collect();
    assert_eq!(
        whoami.len(),
        2,
        "the unsampled call is not exported: {whoami:?}"
    );
    assert_eq!(whoami[0]["traceId"], TRACE, "{whoami:?}");
    assert_eq!(whoami[0]["parentSpanId"], PARENT, "{whoami:?}");
    let own = attributes(&whoami[1])["guildhall.call_id"].clone();
    assert_eq!(
        whoami[1]["traceId"],
        own.as_str().unwrap().replace('-', ""),
        "without a valid parent the call id is the trace id"
    );
    assert!(
        whoami[1]["parentSpanId"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{whoami:?}"
    );
    drop(traces);
    stop.cancel();
    rt.shutdown().await;
}

#[tokio::test]
async fn an_ungoverned_runtimes_typed_calls_are_counted_once_metrics_start() {
    use crate::support::{Act, Chaos, ChaosInput};
    let (tool, _) = Chaos::new("chaos");
    let rt = guildhall::Runtime::builder()
        .governance(guildhall::governance::GovernanceConfig::off())
        .tool(tool)
        .build()
        .await
        .unwrap();
    let chaos = rt.handle::<Chaos>("chaos").unwrap();
    let call = |act| chaos.call(ChaosInput { act, id: 0 });
    call(Act::Ok).await.unwrap();
    assert!(
        rt.governance().call_stats().read()[0].outcomes.is_empty(),
        "nothing counted before the metrics start"
    );
    let _metrics = guildhall::observe::Metrics::start(&rt);
    call(Act::Ok).await.unwrap();
    call(Act::Fail).await.unwrap_err();
    let counted = rt.governance().call_stats().read();
    assert_eq!(counted[0].tool.as_ref(), "chaos");
    assert_eq!(counted[0].outcomes, [("ok", 1), ("tool_error", 1)]);
    rt.shutdown().await;
}

/// A message carries its sender's span: the recipient's calls that name it (as
/// `_meta.traceparent`) are spans of the sender's trace, children of the send. Every span
/// carries OpenTelemetry's GenAI attributes for a tool's execution.
#[tokio::test]
async fn a_recipients_span_is_a_child_of_the_senders_in_genai_terms() {
    const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const PARENT: &str = "b7ad6b7169203331";
    let (rt, _) = crate::mcp::runtime().await;
    let (url, received, stop) = collector().await;
    let config = TelemetryConfig {
        otlp_endpoint: Some(url),
        ..TelemetryConfig::default()
    };
    let traces = Traces::start(&rt, &config).unwrap().expect("traces");
    let server = guildhall::mcp::McpServer::new(rt.clone());
    let wire = |agent: &str| {
        crate::mcp::Wire::legacy(
            server.connection(Some(Arc::from(agent)), guildhall::mcp::ToolFilter::all()),
        )
    };
    let (mut alice, mut bob) = (wire("alice").await, wire("bob").await);
    let sent = alice
        .request(
            1,
            "tools/call",
            json!({ "name": "send_message",
                    "arguments": { "to": "bob", "subject": "build it", "body": "now" },
                    "_meta": { "traceparent": format!("00-{TRACE}-{PARENT}-01") } }),
        )
        .await;
    let id = sent["result"]["structuredContent"]["id"].clone();
    assert!(id.is_string(), "{sent}");
    let read = bob
        .request(
            1,
            "tools/call",
            json!({ "name": "read_message", "arguments": { "id": id } }),
        )
        .await;
    let carried = read["result"]["structuredContent"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("the message names its sender's span: {read}"))
        .to_owned();
    assert!(carried.starts_with(&format!("00-{TRACE}-")), "{carried}");
    // What bob does about it, naming that context, is in alice's trace.
    let reply = bob
        .request(
            2,
            "tools/call",
            json!({ "name": "send_message",
                    "arguments": { "reply_to": id, "body": "on it" },
                    "_meta": { "traceparent": carried } }),
        )
        .await;
    assert!(
        reply["result"]["structuredContent"]["id"].is_string(),
        "{reply}"
    );
    traces.flush().await;

    let spans = spans(&received, "");
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {spans:?}"))
            .clone()
    };
    let sends: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "execute_tool send_message")
        .collect();
    assert_eq!(sends.len(), 2, "{sends:?}");
    let (send, answer) = (sends[0].clone(), sends[1].clone());
    let read = named("execute_tool read_message");
    assert_eq!(send["traceId"], TRACE);
    assert_eq!(send["parentSpanId"], PARENT);
    assert_ne!(
        read["traceId"], TRACE,
        "a call naming no context has its own trace"
    );
    assert_eq!(
        answer["traceId"], TRACE,
        "the recipient joins the sender's trace"
    );
    assert_eq!(
        answer["parentSpanId"], send["spanId"],
        "the reply is a child of the send"
    );
    assert_eq!(carried.split('-').nth(2), send["spanId"].as_str());
    for span in [&send, &read, &answer] {
        // OTLP's SPAN_KIND_INTERNAL, as the conventions ask of `execute_tool`.
        assert_eq!(span["kind"], 1, "{span}");
        let a = attributes(span);
        assert_eq!(a["gen_ai.operation.name"], "execute_tool", "{span}");
        assert_eq!(
            a["gen_ai.tool.name"],
            span["name"]
                .as_str()
                .unwrap()
                .trim_start_matches("execute_tool ")
        );
        assert_eq!(a["gen_ai.tool.call.id"], a["guildhall.call_id"]);
        assert_eq!(a["gen_ai.tool.type"], "function");
    }
    assert_eq!(attributes(&send)["gen_ai.agent.id"], "alice");
    assert_eq!(attributes(&read)["gen_ai.agent.id"], "bob");
    drop(traces);
    stop.cancel();
    rt.shutdown().await;
}
