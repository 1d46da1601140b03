use std::sync::atomic::Ordering;
use std::time::Duration;

use guildhall::supervision::{Backoff, BreakerConfig};
use guildhall::{BreakerStatus, CallError, ErrorKind, Runtime, ToolOptions};

use crate::support::{Act, Chaos, input, one_chaos};

const S: Duration = Duration::from_secs(1);

fn options() -> ToolOptions {
    ToolOptions::default()
        .breaker(BreakerConfig {
            max_failures: 3,
            reset_timeout: S,
            backoff_factor: 2.0,
            max_reset_timeout: 10 * S,
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
