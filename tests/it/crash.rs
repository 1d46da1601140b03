use std::sync::atomic::Ordering;
use std::time::Duration;

use guildhall::{CallError, ErrorKind, Runtime, ToolOptions};

use crate::support::{Act, Chaos, eventually, input, one_chaos};

async fn restarts(rt: &Runtime, tool: &str) -> u32 {
    let tree = rt.tree().await.unwrap();
    tree.find(&["tools", tool]).map_or(0, |n| n.restarts)
}

#[tokio::test(start_paused = true)]
async fn panicking_tool_reports_crashed_restarts_and_serves_the_next_call() {
    let (rt, h, record) = one_chaos("chaos", ToolOptions::default()).await;

    assert_eq!(h.call(input(Act::Ok)).await.unwrap().calls_since_start, 1);
    assert_eq!(h.call(input(Act::Ok)).await.unwrap().calls_since_start, 2);

    let err = h.call(input(Act::Panic)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Crashed);
    assert!(err.to_string().contains("asked to panic"), "{err}");

    // Fresh state after the restart: the count starts again.
    assert_eq!(h.call(input(Act::Ok)).await.unwrap().calls_since_start, 1);
    assert_eq!(record.inits.load(Ordering::SeqCst), 2);
    eventually(Duration::from_secs(1), || async {
        restarts(&rt, "chaos").await == 1
    })
    .await;
    assert_eq!(restarts(&rt, "chaos").await, 1);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_does_not_touch_other_tools() {
    let (a, _) = Chaos::new("a");
    let (b, b_record) = Chaos::new("b");
    let rt = Runtime::builder().tool(a).tool(b).build().await.unwrap();
    let b_handle = rt.handle::<Chaos>("b").unwrap();
    b_handle.call(input(Act::Ok)).await.unwrap();

    let err = rt.call::<Chaos>("a", input(Act::Panic)).await.unwrap_err();
    assert!(matches!(err, CallError::Crashed { .. }));

    // b kept its state and was never restarted.
    assert_eq!(
        b_handle
            .call(input(Act::Ok))
            .await
            .unwrap()
            .calls_since_start,
        2
    );
    assert_eq!(b_record.inits.load(Ordering::SeqCst), 1);
    assert_eq!(restarts(&rt, "b").await, 0);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn calls_queued_behind_a_crash_run_once_on_the_restarted_actor() {
    let (rt, h, record) = one_chaos("chaos", ToolOptions::default()).await;

    // The panic is sent first; the others queue in the same actor's mailbox behind it.
    let mut calls = vec![tokio::spawn({
        let h = h.clone();
        async move { h.call(input(Act::Panic)).await }
    })];
    for id in 1..=5 {
        let h = h.clone();
        calls.push(tokio::spawn(
            async move { h.call(guildhall_it_input(id)).await },
        ));
    }
    let mut results = Vec::new();
    for c in calls {
        results.push(c.await.unwrap());
    }
    assert_eq!(results[0].as_ref().unwrap_err().kind(), ErrorKind::Crashed);
    for r in &results[1..] {
        assert!(
            r.is_ok(),
            "a queued call must not be reported crashed: {r:?}"
        );
    }
    // Each queued call ran exactly once.
    let mut ids = record.ids.lock().unwrap().clone();
    ids.retain(|&id| id != 0);
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
    rt.shutdown().await;
}

fn guildhall_it_input(id: u64) -> crate::support::ChaosInput {
    crate::support::ChaosInput { act: Act::Ok, id }
}

#[tokio::test(start_paused = true)]
async fn idempotent_tools_retry_a_crash_and_others_do_not() {
    let (mut tool, record) = Chaos::new("retried");
    tool.idempotent = true;
    let (plain, plain_record) = Chaos::new("plain");
    let rt = Runtime::builder()
        .tool(tool)
        .tool(plain)
        .build()
        .await
        .unwrap();

    // The first attempt panics, the retry on the restarted actor succeeds.
    let out = rt
        .call::<Chaos>("retried", input(Act::PanicOnce))
        .await
        .unwrap();
    assert_eq!(out.calls_since_start, 1);
    assert_eq!(record.runs.load(Ordering::SeqCst), 2);

    // A tool not declared idempotent is never run twice for one call.
    let err = rt
        .call::<Chaos>("plain", input(Act::PanicOnce))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Crashed);
    assert_eq!(plain_record.runs.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn tool_errors_are_not_retried_even_for_idempotent_tools() {
    let (mut tool, record) = Chaos::new("retried");
    tool.idempotent = true;
    let rt = Runtime::builder().tool(tool).build().await.unwrap();
    let err = rt
        .call::<Chaos>("retried", input(Act::Fail))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ToolError);
    assert_eq!(record.runs.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
}

/// A stateless tool whose calls run apart from its actor, in the caller's task.
struct Apart(std::sync::Arc<tokio::sync::Barrier>);

#[derive(Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct ApartInput {
    act: ApartAct,
}

#[derive(Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
enum ApartAct {
    Ok,
    Panic,
    IgnoreCancel,
    MeetAnother,
}

impl guildhall::Tool for Apart {
    type Input = ApartInput;
    type Output = String;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        "apart"
    }

    fn description(&self) -> &str {
        "Runs in the caller's task"
    }

    fn apart(&self, _: &ApartInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ApartInput,
        _: guildhall::CallContext,
    ) -> Result<String, std::convert::Infallible> {
        match input.act {
            ApartAct::Ok => Ok("ok".into()),
            ApartAct::Panic => panic!("asked to panic apart"),
            ApartAct::IgnoreCancel => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok("too late".into())
            }
            ApartAct::MeetAnother => {
                self.0.wait().await;
                Ok("met".into())
            }
        }
    }
}

fn act(act: ApartAct) -> ApartInput {
    ApartInput { act }
}

#[tokio::test(start_paused = true)]
async fn calls_run_apart_from_the_actor_keep_the_contract() {
    let options = ToolOptions::default()
        .timeout(Duration::from_millis(50))
        .grace(Duration::from_millis(20))
        .max_retries(0);
    let rt = Runtime::builder()
        .tool_with(
            Apart(std::sync::Arc::new(tokio::sync::Barrier::new(2))),
            options,
        )
        .build()
        .await
        .unwrap();
    let h = rt.handle::<Apart>("apart").unwrap();

    let err = h.call(act(ApartAct::Panic)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Crashed);
    assert!(err.to_string().contains("asked to panic apart"), "{err}");
    assert_eq!(h.call(act(ApartAct::Ok)).await.unwrap(), "ok");
    assert_eq!(
        restarts(&rt, "apart").await,
        0,
        "the actor's state was never at stake"
    );

    let err = h.call(act(ApartAct::IgnoreCancel)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);

    // A sequential tool's calls meet each other: neither waits for the actor.
    let (a, b) = tokio::join!(
        h.call(act(ApartAct::MeetAnother)),
        h.call(act(ApartAct::MeetAnother))
    );
    assert_eq!((a.unwrap(), b.unwrap()), ("met".into(), "met".into()));

    rt.shutdown().await;
    let closed = h.call(act(ApartAct::Ok)).await.unwrap_err();
    assert_eq!(closed.kind(), ErrorKind::Unavailable, "{closed}");
}
