use std::sync::atomic::Ordering;
use std::time::Duration;

use guildhall::supervision::Backoff;
use guildhall::{CallOptions, ErrorKind, Runtime, ToolOptions};
use tokio::time::Instant;

use crate::support::{Act, Chaos, Record, eventually, input, one_chaos};

const DEADLINE: Duration = Duration::from_millis(100);
const GRACE: Duration = Duration::from_millis(300);

fn options() -> ToolOptions {
    ToolOptions::default()
        .timeout(DEADLINE)
        .grace(GRACE)
        .backoff(Backoff::none())
}

/// Waits until the tool has seen its call's token fire once.
async fn saw_cancellation(record: &Record) {
    eventually(Duration::from_secs(1), || async {
        record.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_tool_ignoring_cancellation_times_out_and_is_restarted() {
    let (rt, h, record) = one_chaos("stuck", options()).await;
    h.call(input(Act::Ok)).await.unwrap();

    let start = Instant::now();
    let err = h.call(input(Act::Hang)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(
        start.elapsed() <= DEADLINE + GRACE,
        "took {:?}",
        start.elapsed()
    );

    // After the grace period the stuck actor is replaced; the next call gets fresh state.
    eventually(Duration::from_secs(2), || async {
        record.inits.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(h.call(input(Act::Ok)).await.unwrap().calls_since_start, 1);
    let tree = rt.tree().await.unwrap();
    assert_eq!(tree.find(&["tools", "stuck"]).unwrap().restarts, 1);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_cooperative_tool_sees_its_token_fire_at_the_deadline_and_keeps_its_state() {
    let (rt, h, record) = one_chaos("polite", options()).await;

    let err = h.call(input(Act::WaitForCancel)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    saw_cancellation(&record).await;
    // It stopped within the grace period, so it was not restarted.
    assert_eq!(h.call(input(Act::Ok)).await.unwrap().calls_since_start, 2);
    assert_eq!(record.inits.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_cancels_the_tool() {
    let (rt, h, record) = one_chaos("polite", options()).await;
    let long = CallOptions::new().timeout(Duration::from_secs(60));
    let call = h.call_with(input(Act::WaitForCancel), long);
    // Give up on the call long before its deadline.
    assert!(
        tokio::time::timeout(Duration::from_millis(10), call)
            .await
            .is_err()
    );
    saw_cancellation(&record).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stuck_tool_does_not_block_another_tool() {
    let (stuck, _) = Chaos::new("stuck");
    let (free, _) = Chaos::new("free");
    let rt = Runtime::builder()
        .tool_with(stuck, options().timeout(Duration::from_secs(60)))
        .tool(free)
        .build()
        .await
        .unwrap();
    let stuck = rt.handle::<Chaos>("stuck").unwrap();
    let pending = tokio::spawn(async move { stuck.call(input(Act::Hang)).await });
    let start = Instant::now();
    rt.call::<Chaos>("free", input(Act::Ok)).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "blocked for {:?}",
        start.elapsed()
    );
    pending.abort();
    rt.shutdown().await;
}
