use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use guildhall::{CallContext, Concurrency, Runtime, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

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

    async fn init(&self) -> Result<(), Self::Error> {
        Ok(())
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
