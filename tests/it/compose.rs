//! Tools composed of tools (`guildhall::compose`): the identity and associativity laws over
//! random plans, inputs and failing steps (the same results, errors and audit records per
//! step); fan-out under both failure policies; step and composite deadlines; and
//! `[pipelines.NAME]` served over MCP, checked when read and when served.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use guildhall::compose::pipelines::{self, PipelineConfig};
use guildhall::compose::{ComposeError, Composite, Failure};
use guildhall::governance::AuditQuery;
use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::{AgentSpec, CallContext, CallOptions, Runtime, Tool};
use proptest::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::mcp::Wire;

/// What every test tool takes and gives, so any plan of them is well typed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Num {
    /// The number.
    n: i64,
}

#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("{0} is a multiple of 3")]
    Three(i64),
}

/// `inc` adds one, `dbl` doubles, `gate` refuses multiples of 3, `slow` waits 10 s (or
/// its cancellation).
struct Arith(&'static str);

impl Tool for Arith {
    type Input = Num;
    type Output = Num;
    type Error = Refused;
    type State = ();

    fn name(&self) -> &str {
        self.0
    }

    fn description(&self) -> &str {
        "arithmetic for the laws"
    }

    fn apart(&self, _: &Num) -> Option<()> {
        Some(())
    }

    async fn call(&self, _: &mut (), input: Num, ctx: CallContext) -> Result<Num, Refused> {
        let n = input.n;
        match self.0 {
            "inc" => Ok(Num {
                n: n.saturating_add(1),
            }),
            "dbl" => Ok(Num {
                n: n.saturating_mul(2),
            }),
            "gate" if n % 3 == 0 => Err(Refused::Three(n)),
            "slow" => {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(10)) => Ok(input),
                    () = ctx.cancellation().cancelled() => Ok(input),
                }
            }
            _ => Ok(input),
        }
    }
}

async fn runtime() -> Runtime {
    let rt = Runtime::builder().build().await.unwrap();
    for name in ["inc", "dbl", "gate", "slow"] {
        rt.register(Arith(name)).await.unwrap();
    }
    rt.register_agent(AgentSpec::new("alice", "dev"))
        .await
        .unwrap();
    rt
}

fn step(op: u8) -> Composite<Num, Num> {
    match op % 4 {
        0 => Composite::identity(),
        1 => Composite::tool("inc"),
        2 => Composite::tool("dbl"),
        _ => Composite::tool("gate"),
    }
}

fn plan(ops: &[u8]) -> Composite<Num, Num> {
    ops.iter()
        .fold(Composite::identity(), |plan, op| plan.then(step(*op)))
}

/// One step's audit record as the laws compare them: tool, arguments, outcome.
type Record = (String, String, String);

/// Runs `composite` on `n` as a fresh agent (its own loop-guard history): its result or
/// error, and the audit records of its steps (sorted: records made within a millisecond
/// have no order of their own).
async fn observe(
    rt: &Runtime,
    composite: &Composite<Num, Num>,
    n: i64,
) -> (Result<i64, String>, Vec<Record>) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let id = format!("law-{}", RUNS.fetch_add(1, Ordering::Relaxed));
    let agent = rt.register_agent(AgentSpec::new(&id, "dev")).await.unwrap();
    let out = composite
        .run(rt, Num { n }, CallOptions::new().as_agent(&agent))
        .await
        .map(|num| num.n)
        // The loop guard names the agent, which is each run's own.
        .map_err(|err| err.to_string().replace(&id, "AGENT"));
    let audit = rt.governance().audit().expect("auditing is on");
    audit.flush().await.unwrap();
    let records = audit
        .query(&AuditQuery {
            agent: Some(id),
            ..AuditQuery::default()
        })
        .unwrap();
    let mut records: Vec<Record> = records
        .into_iter()
        .map(|r| (r.tool, r.args_digest, format!("{:?}", r.outcome)))
        .collect();
    records.sort();
    (out, records)
}

#[test]
fn identity_and_associativity_hold_over_random_plans_inputs_and_failing_steps() {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let rt = tokio.block_on(runtime());
    let ops = || proptest::collection::vec(0u8..4, 0..4);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 40,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let checked = runner.run(&(ops(), ops(), ops(), -20i64..20), |(a, b, c, n)| {
        tokio.block_on(async {
            let t = plan(&a);
            let id = Composite::<Num, Num>::identity;
            let alone = observe(&rt, &t, n).await;
            prop_assert_eq!(&observe(&rt, &id().then(t.clone()), n).await, &alone);
            prop_assert_eq!(&observe(&rt, &t.clone().then(id()), n).await, &alone);
            let (b, c) = (plan(&b), plan(&c));
            let left = t.clone().then(b.clone()).then(c.clone());
            let right = t.then(b.then(c));
            prop_assert_eq!(observe(&rt, &left, n).await, observe(&rt, &right, n).await);
            // Each step made one call, audited once, up to the first failure.
            let (out, records) = alone;
            let steps = a.iter().filter(|op| **op % 4 != 0).count();
            let failed = records.iter().filter(|r| r.2 != "Ok").count();
            prop_assert!(failed <= 1);
            let whole = records.len() == steps && failed == 0;
            let cut = failed == 1 && records.len() <= steps;
            prop_assert!(
                if out.is_ok() { whole } else { cut },
                "{:?} {:?}",
                out,
                records
            );
            Ok(())
        })
    });
    if let Err(failure) = checked {
        panic!("{failure}");
    }
    tokio.block_on(rt.shutdown());
}

#[tokio::test]
async fn a_fan_out_collects_every_result_or_fails_on_the_first() {
    let rt = runtime().await;
    let alice = rt.agent("alice").unwrap();
    let branches = || {
        [
            Composite::<Num, Num>::tool("inc"),
            Composite::tool("gate"),
            Composite::tool("dbl"),
        ]
    };
    let all = Composite::all(branches(), Failure::CollectAll);
    let out = all
        .run(&rt, Num { n: 3 }, CallOptions::new().as_agent(&alice))
        .await
        .unwrap();
    assert_eq!(out[0], json!({"n": 4}));
    let error = out[1]["error"].as_str().unwrap();
    assert!(error.starts_with("step 2 (`gate`): "), "{error}");
    assert!(error.contains("3 is a multiple of 3"), "{error}");
    assert_eq!(out[2], json!({"n": 6}));
    let fast = Composite::all(branches(), Failure::FailFast)
        .run(&rt, Num { n: 3 }, CallOptions::new().as_agent(&alice))
        .await
        .unwrap_err();
    assert!(
        matches!(&fast, ComposeError::Step { step: 2, tool, .. } if tool == "gate"),
        "{fast}"
    );
    // A fan-out in a sequence: steps are numbered through it.
    let then = Composite::<Num, Num>::tool("inc")
        .then(Composite::all([step(2), step(3)], Failure::FailFast));
    let err = then
        .run(&rt, Num { n: 2 }, CallOptions::new().as_agent(&alice))
        .await
        .unwrap_err();
    assert!(matches!(err, ComposeError::Step { step: 3, .. }), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_step_is_bounded_by_its_own_timeout_and_by_what_is_left_of_the_composite() {
    let rt = runtime().await;
    let alice = rt.agent("alice").unwrap();
    let bounded = Composite::<Num, Num>::tool("inc")
        .then(Composite::<Num, Num>::tool("slow").timeout(Duration::from_millis(100)));
    let started = std::time::Instant::now();
    let err = bounded
        .run(&rt, Num { n: 1 }, CallOptions::new().as_agent(&alice))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ComposeError::Step { step: 2, tool, .. } if tool == "slow"),
        "{err}"
    );
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The composite's own budget bounds a step that has none.
    let slow = Composite::<Num, Num>::tool("slow");
    let err = slow
        .run(
            &rt,
            Num { n: 1 },
            CallOptions::new()
                .as_agent(&alice)
                .timeout(Duration::from_millis(100)),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err}");
    rt.shutdown().await;
}

fn pipeline(toml: &str) -> PipelineConfig {
    toml::from_str(toml).unwrap()
}

#[tokio::test]
async fn a_pipeline_is_served_over_mcp_with_one_audit_record_per_step() {
    let rt = runtime().await;
    let pipelines = BTreeMap::from([
        (
            "inc_gate_dbl".to_owned(),
            pipeline(
                r#"
                description = "adds one, refuses multiples of 3, doubles"
                steps = [
                  { tool = "inc", args = { n = "/input/n" } },
                  { tool = "gate" },
                  { tool = "dbl", args = { n = "/result/n" }, timeout = "5s" },
                ]"#,
            ),
        ),
        (
            "seven".to_owned(),
            pipeline(r#"steps = [{ tool = "inc", set = { n = 6 } }]"#),
        ),
    ]);
    let served = pipelines::serve(&rt, &pipelines).await.unwrap();
    assert_eq!(served, ["inc_gate_dbl", "seven"]);
    let server = McpServer::new(rt.clone()).connection(Some(Arc::from("alice")), ToolFilter::all());
    let mut wire = Wire::legacy(server).await;
    let listed = wire.request(1, "tools/list", json!({})).await;
    let tool = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "inc_gate_dbl")
        .unwrap()
        .clone();
    // Its input is what its first step's pointers take; its output its last step's.
    assert_eq!(tool["inputSchema"]["required"], json!(["n"]), "{tool}");
    assert_eq!(
        tool["outputSchema"]["properties"]["n"]["type"], "integer",
        "{tool}"
    );
    let call = |n: i64| json!({"name": "inc_gate_dbl", "arguments": {"n": n}});
    let ok = wire.request(2, "tools/call", call(1)).await;
    assert_eq!(ok["result"]["structuredContent"], json!({"n": 4}), "{ok}");
    // A failing middle step: one error naming it; the last step never runs.
    let failed = wire.request(3, "tools/call", call(2)).await;
    assert_eq!(failed["result"]["isError"], true, "{failed}");
    let text = failed["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("step 2 (`gate`)") && text.contains("3 is a multiple of 3"),
        "{text}"
    );
    let seven = wire
        .request(4, "tools/call", json!({"name": "seven", "arguments": {}}))
        .await;
    assert_eq!(
        seven["result"]["structuredContent"],
        json!({"n": 7}),
        "{seven}"
    );
    // Audited per step as alice's own calls, and the pipeline's call once (sorted: records
    // made within a millisecond have no order of their own).
    let audit = rt.governance().audit().unwrap();
    audit.flush().await.unwrap();
    let records = audit
        .query(&AuditQuery {
            agent: Some("alice".into()),
            ..AuditQuery::default()
        })
        .unwrap();
    let mut tools: Vec<(String, String)> = records
        .iter()
        .map(|r| (r.tool.clone(), format!("{:?}", r.outcome)))
        .collect();
    tools.sort();
    let ok = "Ok".to_owned();
    let expected = [
        ("inc", ok.as_str()),
        ("gate", "Ok"),
        ("dbl", "Ok"),
        ("inc_gate_dbl", "Ok"),
        ("inc", "Ok"),
        ("gate", "ToolError"),
        ("inc_gate_dbl", "ToolError"),
        ("inc", "Ok"),
        ("seven", "Ok"),
    ];
    let mut expected: Vec<(String, String)> = expected
        .iter()
        .map(|(t, o)| ((*t).to_owned(), (*o).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(tools, expected);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_pipeline_whose_mapping_cannot_hold_is_refused_naming_the_step() {
    let rt = runtime().await;
    for (toml, says) in [
        (r#"steps = []"#, "`steps` is empty"),
        (
            r#"steps = [{ tool = "inc", args = { n = "/result/n" } }]"#,
            "step 1 (`inc`): `args.n` = `/result/n`: the first step has no previous result",
        ),
        (
            r#"steps = [{ tool = "inc", args = { n = "n" } }]"#,
            "is not a pointer into `/input`",
        ),
        (
            r#"steps = [{ tool = "nope" }]"#,
            "step 1 (`nope`): there is no such tool",
        ),
        (
            r#"steps = [{ tool = "inc" }, { tool = "dbl", args = { n = "/result/count" } }]"#,
            "step 2 (`dbl`): `args.n` = `/result/count`: the previous step's result has no `/count`",
        ),
        (
            r#"steps = [{ tool = "inc", args = { m = "/input/n" } }]"#,
            "step 1 (`inc`): it requires `n`, which neither `args` nor `set` gives",
        ),
        (
            // An empty `set` is no arguments, not the previous result.
            r#"steps = [{ tool = "inc" }, { tool = "dbl", set = {} }]"#,
            "step 2 (`dbl`): it requires `n`, which neither `args` nor `set` gives",
        ),
    ] {
        let pipelines = BTreeMap::from([("p".to_owned(), pipeline(toml))]);
        let (name, reason) = pipelines::serve(&rt, &pipelines).await.unwrap_err();
        assert_eq!(name, "p");
        assert!(reason.contains(says), "{toml}: {reason}");
    }
    // When guildhall.toml is read, what needs no tool is checked, with its line.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("guildhall.toml");
    std::fs::write(
        &file,
        "[roles.dev]\n\n[pipelines.p]\nsteps = [{ tool = \"inc\", args = { n = \"/result/n\" } }]\n",
    )
    .unwrap();
    let err = guildhall::config::Config::load(&file, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("guildhall.toml:3: [pipelines.p]: step 1 (`inc`)"),
        "{err}"
    );
    rt.shutdown().await;
}
