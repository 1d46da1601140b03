use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use guildhall::supervision::BreakerConfig;
use guildhall::{ChildStatus, ErrorKind, Runtime, ToolOptions};

use crate::support::{Act, Chaos, ChaosInput, Record, eventually};

const TOOLS: usize = 10;
const CALLS: u64 = 1_000;

fn allowed(act: Act) -> &'static [ErrorKind] {
    use ErrorKind::*;
    match act {
        Act::Ok | Act::WaitForCancel => &[Timeout, CircuitOpen],
        Act::Fail => &[ToolError, Timeout, CircuitOpen],
        Act::Panic => &[Crashed, Timeout, CircuitOpen],
        Act::Hang => &[Timeout, CircuitOpen],
        Act::PanicOnce => &[Crashed, Timeout, CircuitOpen],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_gets_exactly_one_reply_under_random_failures() {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = fastrand::Rng::with_seed(seed);
    let options = ToolOptions::default()
        .timeout(Duration::from_millis(300))
        .grace(Duration::from_millis(50))
        .breaker(BreakerConfig {
            reset_timeout: Duration::from_millis(50),
            ..BreakerConfig::default()
        });
    let mut builder = Runtime::builder();
    let mut records: Vec<Arc<Record>> = Vec::new();
    for t in 0..TOOLS {
        let (mut tool, record) = Chaos::new(&format!("chaos_{t}"));
        tool.actors = 1 + t % 4;
        tool.idempotent = t % 2 == 0;
        records.push(record);
        builder = builder.tool_with(tool, options.clone());
    }
    let rt = builder.build().await.unwrap();

    let calls: Vec<_> = (1..=CALLS)
        .map(|id| {
            let act = match rng.u8(0..100) {
                0..70 => Act::Ok,
                70..82 => Act::Fail,
                82..94 => Act::Panic,
                _ => Act::Hang,
            };
            let tool = format!("chaos_{}", rng.usize(0..TOOLS));
            let rt = rt.clone();
            let call =
                tokio::spawn(async move { rt.call::<Chaos>(&tool, ChaosInput { act, id }).await });
            (id, act, call)
        })
        .collect();

    let mut ok_ids = HashSet::new();
    let all = async {
        for (id, act, call) in calls {
            match call.await.expect("the call's task must not panic") {
                Ok(_) => {
                    assert!(matches!(act, Act::Ok), "call {id} ({act:?}) succeeded");
                    ok_ids.insert(id);
                }
                Err(err) => assert!(
                    allowed(act).contains(&err.kind()),
                    "call {id} ({act:?}) got {:?}: {err} (seed {seed})",
                    err.kind()
                ),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .unwrap_or_else(|_| panic!("some call never got a reply (seed {seed})"));

    // A call that succeeded ran exactly once, on exactly one tool.
    let mut ran: Vec<u64> = records
        .iter()
        .flat_map(|r| r.ids.lock().unwrap().clone())
        .collect();
    ran.retain(|id| ok_ids.contains(id));
    let distinct: HashSet<_> = ran.iter().copied().collect();
    assert_eq!(
        ran.len(),
        distinct.len(),
        "a successful call ran twice (seed {seed})"
    );
    assert_eq!(distinct, ok_ids);

    // And the runtime still serves every tool.
    for t in 0..TOOLS {
        let name = format!("chaos_{t}");
        eventually(Duration::from_secs(10), || async {
            rt.call::<Chaos>(
                &name,
                ChaosInput {
                    act: Act::Ok,
                    id: 0,
                },
            )
            .await
            .is_ok()
        })
        .await;
    }
    // Actors still in their restart backoff come back too.
    eventually(Duration::from_secs(10), || async {
        let tree = rt.tree().await.unwrap();
        let actors: Vec<_> = tree
            .find(&["tools"])
            .unwrap()
            .children
            .iter()
            .filter(|a| a.id.starts_with("chaos"))
            .collect();
        actors.len() == (0..TOOLS).map(|t| 1 + t % 4).sum::<usize>()
            && actors.iter().all(|a| a.status == ChildStatus::Running)
    })
    .await;
    rt.shutdown().await;
}
