use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use guildhall::{CallContext, Concurrency, Runtime, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::support::as_agent;

/// Holds each call until released, tracking how many run at once.
struct Gate {
    actors: usize,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct Nothing {}

#[derive(Serialize, JsonSchema)]
struct Done {}

impl Tool for Gate {
    type Input = Nothing;
    type Output = Done;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        "gate"
    }

    fn description(&self) -> &str {
        "Waits to be released."
    }

    fn concurrency(&self) -> Concurrency {
        Concurrency::up_to(self.actors)
    }

    async fn call(&self, _: &mut (), _: Nothing, _: CallContext) -> Result<Done, Self::Error> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.release.notified().await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Done {})
    }
}

async fn peak_with(actors: usize) -> usize {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Notify::new());
    let gate = Gate {
        actors,
        running: Arc::clone(&running),
        peak: Arc::clone(&peak),
        release: Arc::clone(&release),
    };
    let rt = Runtime::builder().tool(gate).build().await.unwrap();
    let h = rt.handle::<Gate>("gate").unwrap();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move { h.call(Nothing {}).await })
        })
        .collect();
    let expected = actors.min(8);
    crate::support::eventually(Duration::from_secs(5), || async {
        running.load(Ordering::SeqCst) == expected
    })
    .await;
    // Let any further (wrongly admitted) calls start before measuring.
    tokio::task::yield_now().await;
    let seen = peak.load(Ordering::SeqCst);
    for c in calls {
        while !c.is_finished() {
            release.notify_waiters();
            tokio::task::yield_now().await;
        }
        c.await.unwrap().unwrap();
    }
    rt.shutdown().await;
    seen
}

#[tokio::test(start_paused = true)]
async fn sequential_tools_run_one_call_at_a_time() {
    assert_eq!(peak_with(1).await, 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_tools_run_up_to_n_calls_at_once() {
    assert_eq!(peak_with(3).await, 3);
}

#[tokio::test(start_paused = true)]
async fn concurrent_tool_shows_each_of_its_actors_in_the_tree() {
    let gate = Gate {
        actors: 3,
        running: Arc::default(),
        peak: Arc::default(),
        release: Arc::default(),
    };
    let rt = Runtime::builder().tool(gate).build().await.unwrap();
    let tree = rt.tree().await.unwrap();
    let tools = tree.find(&["tools"]).unwrap();
    let gates: Vec<_> = tools
        .children
        .iter()
        .filter(|c| c.id.starts_with("gate"))
        .collect();
    let ids: Vec<_> = gates.iter().map(|c| c.id.clone()).collect();
    assert_eq!(ids, ["gate/0", "gate/1", "gate/2"]);
    assert!(gates.iter().all(|c| c.breaker.is_some()));
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn two_thousand_waiting_inbox_checks_do_not_hold_up_another_agents_check() {
    let rt = guildhall::Runtime::builder().build().await.unwrap();
    for i in 0..2_001 {
        rt.register_agent(guildhall::AgentSpec::new(format!("a-{i}"), "dev"))
            .await
            .unwrap();
    }
    let started = tokio::time::Instant::now();
    let waits: Vec<_> = (0..2_000)
        .map(|i| {
            let rt = rt.clone();
            tokio::spawn(async move {
                rt.call_json(
                    "check_inbox",
                    serde_json::json!({"wait_secs": 30}),
                    as_agent(&rt, format!("a-{i}")),
                )
                .await
            })
        })
        .collect();
    // In paused time a timer fires only once every task is idle: every wait is then parked
    // in its mailbox (or queued for a slot, as it was when waits held slots).
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    // Paused time jumps ahead whenever everything waits: had this call queued behind the
    // waits, it would answer only once they expired, 30 s on.
    let inbox = rt
        .call_json(
            "check_inbox",
            serde_json::json!({}),
            as_agent(&rt, "a-2000"),
        )
        .await
        .expect("answered");
    assert_eq!(inbox["unread"], 0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the check waited {:?} behind the waiting ones",
        started.elapsed()
    );
    assert!(waits.iter().all(|w| !w.is_finished()));
    for wait in waits {
        wait.await.unwrap().expect("each wait ends with an answer");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn a_mailbox_admits_a_bounded_number_of_waiting_checks() {
    let rt = guildhall::Runtime::builder()
        .mailbox_config(guildhall::MailboxConfig {
            max_waiters: 3,
            ..guildhall::MailboxConfig::default()
        })
        .build()
        .await
        .unwrap();
    rt.register_agent(guildhall::AgentSpec::new("a", "dev"))
        .await
        .unwrap();
    let check = |wait: f64| {
        let rt = rt.clone();
        async move {
            rt.call_json(
                "check_inbox",
                serde_json::json!({ "wait_secs": wait }),
                as_agent(&rt, "a"),
            )
            .await
        }
    };
    let waiting: Vec<_> = (0..3).map(|_| tokio::spawn(check(60.0))).collect();
    // Once the three waits are parked, a fourth is refused (a short one, in case it is
    // admitted while they are still on their way).
    crate::support::eventually(Duration::from_secs(5), || async {
        matches!(check(0.05).await,
            Err(err) if err.to_string().contains("3 inbox checks waiting"))
    })
    .await;
    for w in waiting {
        w.abort();
    }
    rt.shutdown().await;
}
