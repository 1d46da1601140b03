use std::sync::atomic::Ordering;

use guildhall::{CallError, CallOptions, ErrorKind, Runtime};
use serde_json::json;

use crate::support::Chaos;

#[tokio::test]
async fn invalid_arguments_name_the_field_and_the_tool_does_not_run() {
    let (tool, record) = Chaos::new("chaos");
    let rt = Runtime::builder().tool(tool).build().await.unwrap();
    let cases = [
        (
            json!({"act": "ok", "id": "seven"}),
            "id",
            "invalid type: string \"seven\", expected an integer from 0 to 18446744073709551615",
        ),
        (
            json!({"act": "explode"}),
            "act",
            "unknown variant `explode`",
        ),
        (json!({"id": 1}), ".", "missing field `act`"),
        (
            json!({"act": "ok", "extra": 1}),
            "extra",
            "unknown field `extra`",
        ),
        (json!("ok"), ".", "expected an object"),
    ];
    for (args, want_path, want_reason) in cases {
        let err = rt
            .call_json("chaos", args.clone(), CallOptions::new())
            .await
            .unwrap_err();
        match &err {
            CallError::InvalidArguments { path, reason, .. } => {
                assert_eq!(path, want_path, "{args}");
                assert!(reason.contains(want_reason), "{args}: {reason}");
            }
            other => panic!("{args}: expected invalid_arguments, got {other:?}"),
        }
        assert!(err.to_string().contains(want_reason));
    }
    assert_eq!(record.runs.load(Ordering::SeqCst), 0);

    let ok = rt
        .call_json("chaos", json!({"act": "ok"}), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(ok, json!({"calls_since_start": 1}));
    rt.shutdown().await;
}

#[tokio::test]
async fn unknown_tool_is_a_clear_error() {
    let rt = Runtime::builder().build().await.unwrap();
    let err = rt
        .call_json("nope", json!({}), CallOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnknownTool);
    assert_eq!(err.to_string(), "unknown tool `nope`");
    assert!(rt.handle::<Chaos>("nope").is_err());
    rt.shutdown().await;
}

#[tokio::test]
async fn tool_errors_keep_their_type_for_typed_callers() {
    let (tool, _) = Chaos::new("chaos");
    let rt = Runtime::builder().tool(tool).build().await.unwrap();
    let err = rt
        .call::<Chaos>("chaos", crate::support::input(crate::support::Act::Fail))
        .await
        .unwrap_err();
    assert!(err.tool_error::<crate::support::AskedToFail>().is_some());
    assert!(!err.is_transient());
    rt.shutdown().await;
}

#[tokio::test]
async fn schemas_are_draft_2020_12_objects_with_doc_comment_descriptions() {
    let (tool, _) = Chaos::new("chaos");
    let rt = Runtime::builder().tool(tool).build().await.unwrap();
    let spec = rt.tool("chaos").unwrap();
    let input = &spec.input_schema;
    assert_eq!(
        input["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(input["type"], "object");
    assert_eq!(
        input["properties"]["id"]["description"],
        "A caller-chosen id, recorded when the call runs."
    );
    assert_eq!(input["required"], json!(["act"]));
    assert_eq!(input["additionalProperties"], false);
    let output = &spec.output_schema;
    assert_eq!(output["type"], "object");
    assert!(output["properties"]["calls_since_start"]["description"].is_string());
    rt.shutdown().await;
}
