use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guildhall::supervision::{
    Backoff, ChildSpec, ChildStatus, DynamicSpec, Restart, RestartIntensity, Shutdown, Strategy,
    Supervisor, SupervisorError, SupervisorSpec, Unreachable,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::support::eventually;

#[derive(Default, Clone)]
struct World {
    log: Arc<Mutex<Vec<String>>>,
    refs: Arc<Mutex<HashMap<String, ActorRef<ProbeMsg>>>>,
}

impl World {
    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    fn log_len(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    fn send(&self, id: &str, msg: ProbeMsg) {
        let actor = self.refs.lock().unwrap()[id].clone();
        actor.send_message(msg).unwrap();
    }

    fn spec(&self, id: &'static str) -> ChildSpec {
        let world = self.clone();
        ChildSpec::actor(id, move || {
            (
                Probe {
                    id,
                    world: world.clone(),
                },
                (),
            )
        })
    }
}

/// Logs its starts and clean stops; panics, stops or blocks on request.
struct Probe {
    id: &'static str,
    world: World,
}

enum ProbeMsg {
    Panic,
    Stop,
    Block,
}

impl Actor for Probe {
    type Msg = ProbeMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, myself: ActorRef<ProbeMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        self.world
            .log
            .lock()
            .unwrap()
            .push(format!("start:{}", self.id));
        self.world
            .refs
            .lock()
            .unwrap()
            .insert(self.id.into(), myself);
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<ProbeMsg>, _: &mut ()) -> Result<(), ActorProcessingErr> {
        self.world
            .log
            .lock()
            .unwrap()
            .push(format!("stop:{}", self.id));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ProbeMsg>,
        msg: ProbeMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ProbeMsg::Panic => panic!("probe {} asked to panic", self.id),
            ProbeMsg::Stop => myself.stop(None),
            ProbeMsg::Block => std::future::pending::<()>().await,
        }
        Ok(())
    }
}

fn quick(strategy: Strategy) -> SupervisorSpec {
    SupervisorSpec::new(strategy)
        .intensity(RestartIntensity::new(10, Duration::from_secs(5)))
        .backoff(Backoff::none())
}

async fn three(world: &World, strategy: Strategy) -> Supervisor {
    let spec = quick(strategy)
        .child(world.spec("a"))
        .child(world.spec("b"))
        .child(world.spec("c"));
    let (sup, _) = Supervisor::spawn(spec, None).await.unwrap();
    assert_eq!(world.take_log(), ["start:a", "start:b", "start:c"]);
    sup
}

async fn crash_and_collect(world: &World, id: &str, expected: usize) -> Vec<String> {
    world.send(id, ProbeMsg::Panic);
    eventually(Duration::from_secs(2), || async {
        world.log_len() >= expected
    })
    .await;
    world.take_log()
}

async fn restarts(sup: &Supervisor) -> Vec<(String, u32)> {
    sup.snapshot()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.id, c.restarts))
        .collect()
}

fn pairs(v: &[(&str, u32)]) -> Vec<(String, u32)> {
    v.iter().map(|(id, n)| ((*id).to_owned(), *n)).collect()
}

#[tokio::test(start_paused = true)]
async fn one_for_one_restarts_only_the_failed_child() {
    let world = World::default();
    let sup = three(&world, Strategy::OneForOne).await;
    assert_eq!(crash_and_collect(&world, "b", 1).await, ["start:b"]);
    assert_eq!(restarts(&sup).await, pairs(&[("a", 0), ("b", 1), ("c", 0)]));
    sup.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_for_all_restarts_every_child_stopping_in_reverse_and_starting_in_order() {
    let world = World::default();
    let sup = three(&world, Strategy::OneForAll).await;
    assert_eq!(
        crash_and_collect(&world, "b", 5).await,
        ["stop:c", "stop:a", "start:a", "start:b", "start:c"]
    );
    assert_eq!(restarts(&sup).await, pairs(&[("a", 1), ("b", 1), ("c", 1)]));
    sup.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn rest_for_one_restarts_the_child_and_those_started_after_it() {
    let world = World::default();
    let sup = three(&world, Strategy::RestForOne).await;
    assert_eq!(
        crash_and_collect(&world, "b", 3).await,
        ["stop:c", "start:b", "start:c"]
    );
    assert_eq!(restarts(&sup).await, pairs(&[("a", 0), ("b", 1), ("c", 1)]));
    sup.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn exceeding_intensity_stops_children_and_escalates_to_the_parent() {
    let world = World::default();
    let inner = SupervisorSpec::new(Strategy::OneForOne)
        .intensity(RestartIntensity::new(1, Duration::from_secs(5)))
        .backoff(Backoff::none())
        .child(world.spec("w"))
        .child(world.spec("x"));
    let root = quick(Strategy::OneForOne).child(ChildSpec::supervisor("inner", inner));
    let (root, _) = Supervisor::spawn(root, None).await.unwrap();
    world.take_log();

    // First crash: within intensity, restarted by `inner`.
    assert_eq!(crash_and_collect(&world, "w", 1).await, ["start:w"]);
    // Second crash within 5 s: `inner` gives up, stops `x`, and fails; `root` restarts it.
    assert_eq!(
        crash_and_collect(&world, "w", 3).await,
        ["stop:x", "start:w", "start:x"]
    );
    let tree = root.snapshot().await.unwrap();
    let inner = &tree[0];
    assert_eq!(
        (inner.id.as_str(), inner.restarts, inner.status),
        ("inner", 1, ChildStatus::Running)
    );
    // The restarted supervisor starts with fresh children and a fresh window.
    assert!(inner.children.iter().all(|c| c.restarts == 0));
    root.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn restart_types_decide_what_comes_back() {
    let world = World::default();
    let spec = quick(Strategy::OneForOne)
        .child(world.spec("perm"))
        .child(world.spec("trans").restart(Restart::Transient))
        .child(world.spec("temp").restart(Restart::Temporary));
    let (sup, _) = Supervisor::spawn(spec, None).await.unwrap();
    world.take_log();

    // Normal stops: only the permanent child comes back.
    for id in ["perm", "trans", "temp"] {
        world.send(id, ProbeMsg::Stop);
    }
    eventually(Duration::from_secs(2), || async { world.log_len() >= 4 }).await;
    let mut log = world.take_log();
    log.sort();
    assert_eq!(log, ["start:perm", "stop:perm", "stop:temp", "stop:trans"]);
    let snap = sup.snapshot().await.unwrap();
    let ids: Vec<_> = snap.iter().map(|c| (c.id.as_str(), c.status)).collect();
    // The temporary child is forgotten; the transient one is kept, stopped.
    assert_eq!(
        ids,
        [
            ("perm", ChildStatus::Running),
            ("trans", ChildStatus::Stopped)
        ]
    );
    sup.shutdown().await.unwrap();

    // A transient child that crashes is restarted.
    let world = World::default();
    let spec = quick(Strategy::OneForOne).child(world.spec("trans").restart(Restart::Transient));
    let (sup, _) = Supervisor::spawn(spec, None).await.unwrap();
    world.take_log();
    assert_eq!(crash_and_collect(&world, "trans", 1).await, ["start:trans"]);
    sup.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_children_in_reverse_start_order() {
    let world = World::default();
    let sup = three(&world, Strategy::OneForOne).await;
    sup.shutdown().await.unwrap();
    assert_eq!(world.take_log(), ["stop:c", "stop:b", "stop:a"]);
    assert!(sup.snapshot().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn shutdown_timeout_kills_a_child_that_will_not_stop() {
    let world = World::default();
    let spec = quick(Strategy::OneForOne).child(world.spec("a")).child(
        world
            .spec("stuck")
            .shutdown(Shutdown::Timeout(Duration::from_millis(100))),
    );
    let (sup, _) = Supervisor::spawn(spec, None).await.unwrap();
    world.take_log();
    world.send("stuck", ProbeMsg::Block);
    let start = tokio::time::Instant::now();
    sup.shutdown().await.unwrap();
    // Killed after its timeout (so no clean stop), then the next child stopped cleanly.
    assert_eq!(world.take_log(), ["stop:a"]);
    assert!(start.elapsed() >= Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn repeated_crashes_back_off_before_restarting() {
    let world = World::default();
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .intensity(RestartIntensity::new(10, Duration::from_secs(5)))
        .backoff(Backoff {
            jitter: 0.0,
            ..Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1))
        })
        .child(world.spec("a"));
    let (sup, _) = Supervisor::spawn(spec, None).await.unwrap();
    world.take_log();

    // The first restart in a quiet window is immediate.
    assert_eq!(crash_and_collect(&world, "a", 1).await, ["start:a"]);
    // The second waits 100 ms, showing as restarting meanwhile.
    world.send("a", ProbeMsg::Panic);
    eventually(Duration::from_millis(50), || async {
        sup.snapshot().await.unwrap()[0].status == ChildStatus::Restarting
    })
    .await;
    let crashed_at = tokio::time::Instant::now();
    eventually(Duration::from_secs(1), || async { world.log_len() == 1 }).await;
    assert!(
        crashed_at.elapsed() >= Duration::from_millis(90),
        "{:?}",
        crashed_at.elapsed()
    );
    assert_eq!(
        sup.snapshot().await.unwrap()[0].status,
        ChildStatus::Running
    );
    sup.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_childs_backoff_does_not_delay_a_sibling() {
    let world = World::default();
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .intensity(RestartIntensity::new(10, Duration::from_secs(5)))
        .backoff(Backoff {
            jitter: 0.0,
            ..Backoff::exponential(Duration::from_secs(1), Duration::from_secs(1))
        })
        .child(world.spec("flappy"))
        .child(world.spec("calm"));
    let (sup, _) = Supervisor::spawn(spec, None).await.unwrap();
    world.take_log();

    // flappy's second crash puts it in a one-second backoff.
    assert_eq!(
        crash_and_collect(&world, "flappy", 1).await,
        ["start:flappy"]
    );
    world.send("flappy", ProbeMsg::Panic);
    eventually(Duration::from_millis(50), || async {
        sup.snapshot().await.unwrap()[0].status == ChildStatus::Restarting
    })
    .await;
    // calm's first crash is restarted at once, regardless.
    let start = tokio::time::Instant::now();
    assert_eq!(crash_and_collect(&world, "calm", 1).await, ["start:calm"]);
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
    sup.shutdown().await.unwrap();
}

fn dynamic(max_restarts: u32) -> DynamicSpec {
    DynamicSpec {
        intensity: RestartIntensity::new(max_restarts, Duration::from_secs(5)),
        backoff: Backoff::none(),
    }
}

#[tokio::test(start_paused = true)]
async fn dynamic_supervisor_restarts_crashed_children_and_forgets_finished_ones() {
    let world = World::default();
    let (sup, _) = Supervisor::spawn_dynamic(dynamic(10), None).await.unwrap();
    for id in ["c", "a", "b"] {
        sup.start_child(world.spec(id).restart(Restart::Transient))
            .await
            .unwrap();
    }
    let duplicate = sup.start_child(world.spec("a")).await;
    assert!(
        matches!(duplicate, Err(SupervisorError::DuplicateChild { .. })),
        "{duplicate:?}"
    );
    assert_eq!(world.take_log(), ["start:c", "start:a", "start:b"]);
    // A crash restarts the child alone; snapshots list children by id.
    assert_eq!(crash_and_collect(&world, "b", 1).await, ["start:b"]);
    assert_eq!(restarts(&sup).await, pairs(&[("a", 0), ("b", 1), ("c", 0)]));
    // A transient child that stops normally is not restarted, and is forgotten.
    world.send("c", ProbeMsg::Stop);
    eventually(Duration::from_secs(2), || async {
        restarts(&sup).await.len() == 2
    })
    .await;
    assert_eq!(world.take_log(), ["stop:c"]);
    sup.terminate_child("a").await.unwrap();
    let unknown = sup.terminate_child("a").await;
    assert!(
        matches!(unknown, Err(SupervisorError::UnknownChild { .. })),
        "{unknown:?}"
    );
    assert_eq!(restarts(&sup).await, pairs(&[("b", 1)]));
    sup.shutdown().await.unwrap();
    assert_eq!(world.take_log(), ["stop:a", "stop:b"]);
}

#[tokio::test(start_paused = true)]
async fn dynamic_supervisor_escalates_when_its_intensity_is_exceeded() {
    let world = World::default();
    let root = quick(Strategy::OneForOne).child(ChildSpec::dynamic_supervisor("dyn", dynamic(1)));
    let (root, _) = Supervisor::spawn(root, None).await.unwrap();
    let dyn_sup = Supervisor::from_ref(root.cell().get_children()[0].clone().into());
    for id in ["w", "x"] {
        dyn_sup.start_child(world.spec(id)).await.unwrap();
    }
    world.take_log();
    assert_eq!(crash_and_collect(&world, "w", 1).await, ["start:w"]);
    // A second crash within 5 s: the dynamic supervisor stops `x` and fails; root restarts
    // it, empty (its children were started on demand, not part of its spec).
    assert_eq!(crash_and_collect(&world, "w", 1).await, ["stop:x"]);
    eventually(Duration::from_secs(2), || async {
        let tree = root.snapshot().await.unwrap();
        tree[0].restarts == 1 && tree[0].status == ChildStatus::Running
    })
    .await;
    assert!(root.snapshot().await.unwrap()[0].children.is_empty());
    root.shutdown().await.unwrap();
}

/// Refuses to start, saying why.
struct Refuses;

impl Actor for Refuses {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Err("the disk is full".into())
    }
}

#[tokio::test]
async fn a_failed_start_keeps_the_childs_own_error_and_a_gone_supervisor_says_so() {
    let (sup, _) = Supervisor::spawn_dynamic(dynamic(1), None).await.unwrap();
    let err = sup
        .start_child(ChildSpec::actor("refuses", || (Refuses, ())))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SupervisorError::StartFailed { id, .. } if id == "refuses"),
        "{err:?}"
    );
    // The child's reason is a source, not a copy in the message, and the chain shows it once.
    assert_eq!(err.to_string(), "child `refuses` failed to start");
    let chain = guildhall::ErrorChain(&err).to_string();
    assert_eq!(chain.matches("the disk is full").count(), 1, "{chain}");
    sup.shutdown().await.unwrap();
    let gone = sup.snapshot().await.unwrap_err();
    assert!(
        matches!(
            gone,
            SupervisorError::Unavailable {
                why: Unreachable::Stopped
            }
        ),
        "{gone:?}"
    );
}
