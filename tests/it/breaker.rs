use std::sync::atomic::Ordering;
use std::time::Duration;

use guildhall::supervision::{Backoff, BreakerConfig};
use guildhall::{AgentSpec, BreakerStatus, CallError, ErrorKind, Runtime, ToolOptions};
use serde_json::json;

use crate::support::{Act, Chaos, as_agent, input, one_chaos};

const S: Duration = Duration::from_secs(1);

fn options() -> ToolOptions {
    ToolOptions::default()
        .breaker(BreakerConfig {
            max_failures: 3,
            reset_timeout: S,
            backoff_factor: 2.0,
            max_reset_timeout: 10 * S,
            min_callers: 2,
        })
        .backoff(Backoff::none())
}

async fn status(rt: &Runtime) -> BreakerStatus {
    let tree = rt.tree().await.unwrap();
    tree.find(&["tools", "chaos"]).unwrap().breaker.unwrap()
}

#[tokio::test(start_paused = true)]
async fn opens_fails_fast_and_recovers_through_a_probe() {
    let (rt, h, record) = one_chaos("chaos", options()).await;

    // Tool errors are answers, not failures: they never open the circuit.
    for _ in 0..5 {
        assert_eq!(
            h.call(input(Act::Fail)).await.unwrap_err().kind(),
            ErrorKind::ToolError
        );
    }
    assert_eq!(status(&rt).await, BreakerStatus::Closed { failures: 0 });

    // Three crashes in a row open it.
    for _ in 0..3 {
        assert_eq!(
            h.call(input(Act::Panic)).await.unwrap_err().kind(),
            ErrorKind::Crashed
        );
    }
    let runs = record.runs.load(Ordering::SeqCst);
    match h.call(input(Act::Ok)).await.unwrap_err() {
        CallError::CircuitOpen { retry_after, .. } => assert_eq!(retry_after, S),
        other => panic!("expected circuit_open, got {other:?}"),
    }
    assert_eq!(
        record.runs.load(Ordering::SeqCst),
        runs,
        "rejected call must not run"
    );

    // After the reset timeout a failing probe re-opens it with the timeout doubled.
    tokio::time::advance(S).await;
    assert_eq!(
        h.call(input(Act::Panic)).await.unwrap_err().kind(),
        ErrorKind::Crashed
    );
    assert!(matches!(
        status(&rt).await,
        BreakerStatus::Open { reset_timeout, .. } if reset_timeout == 2 * S
    ));
    tokio::time::advance(S).await;
    match h.call(input(Act::Ok)).await.unwrap_err() {
        CallError::CircuitOpen { retry_after, .. } => assert_eq!(retry_after, S),
        other => panic!("expected circuit_open, got {other:?}"),
    }

    // A successful probe closes it.
    tokio::time::advance(S).await;
    assert!(h.call(input(Act::Ok)).await.is_ok());
    assert_eq!(status(&rt).await, BreakerStatus::Closed { failures: 0 });
    assert!(h.call(input(Act::Ok)).await.is_ok());
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn timeouts_count_as_failures() {
    let (tool, _) = Chaos::new("chaos");
    let opts = options()
        .timeout(Duration::from_millis(50))
        .grace(Duration::from_millis(10));
    let rt = Runtime::builder()
        .tool_with(tool, opts)
        .build()
        .await
        .unwrap();
    let h = rt.handle::<Chaos>("chaos").unwrap();
    for _ in 0..3 {
        assert_eq!(
            h.call(input(Act::Hang)).await.unwrap_err().kind(),
            ErrorKind::Timeout
        );
    }
    assert_eq!(
        h.call(input(Act::Ok)).await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn one_agents_crashes_open_only_its_own_circuit() {
    let (rt, h, _) = one_chaos("chaos", options()).await;
    for id in ["mallory", "alice", "bob"] {
        rt.register_agent(AgentSpec::new(id, "dev")).await.unwrap();
    }
    let as_agent = |a: &str| as_agent(&rt, a);
    // Each call differs (its id), so the loop guard has nothing to say.
    let panic = |id: u64| json!({"act": "panic", "id": id});
    for id in 0..3 {
        let err = rt
            .call_json("chaos", panic(id), as_agent("mallory"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Crashed);
    }
    // Mallory's own calls now fail fast, and say whose circuit it is...
    let err = rt
        .call_json("chaos", json!({"act": "ok"}), as_agent("mallory"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CallError::CircuitOpen { own: true, .. }),
        "{err}"
    );
    // ...while every other agent is served, and the tool's own circuit stays closed.
    rt.call_json("chaos", json!({"act": "ok"}), as_agent("alice"))
        .await
        .expect("another agent is served");
    assert!(h.call(input(Act::Ok)).await.is_ok());
    assert_eq!(status(&rt).await, BreakerStatus::Closed { failures: 0 });
    // Failures seen by two agents are the tool's: its circuit opens for everyone.
    tokio::time::advance(2 * S).await;
    for (id, agent) in [(10, "mallory"), (11, "alice"), (12, "alice")] {
        rt.call_json("chaos", panic(id), as_agent(agent))
            .await
            .unwrap_err();
    }
    let err = rt
        .call_json("chaos", json!({"act": "ok"}), as_agent("bob"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CallError::CircuitOpen { own: false, .. }),
        "{err}"
    );
    rt.shutdown().await;
}
