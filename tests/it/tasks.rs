//! The task board: many workers claiming at once, leases that expire, dependency order,
//! notices by mail, history across restarts, refusals that name the problem, passivation,
//! and the CLI.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guildhall::tasks::{
    Action, ClaimFilter, TaskChange, TaskConfig, TaskQuery, TaskSpec, TaskStatus,
};
use guildhall::{AgentSpec, CallError, InboxQuery, Runtime};
use serde_json::{Value, json};

use crate::support::{as_agent, eventually, guildhall, guildhall_ok};

const TASKS: u64 = 1_000;
const WORKERS: usize = 50;

async fn call(rt: &Runtime, agent: &str, tool: &str, args: Value) -> Result<Value, CallError> {
    rt.call_json(tool, args, as_agent(rt, agent)).await
}

async fn ok(rt: &Runtime, agent: &str, tool: &str, args: Value) -> Value {
    call(rt, agent, tool, args.clone())
        .await
        .unwrap_or_else(|err| panic!("{tool} {args}: {err}"))
}

async fn refused(rt: &Runtime, agent: &str, tool: &str, args: Value) -> String {
    match call(rt, agent, tool, args.clone()).await {
        Ok(out) => panic!("{tool} {args} should be refused, got {out}"),
        Err(err) => err.to_string(),
    }
}

/// One worker: claims, checks the task's blockers are done, finishes it, until every task
/// is done. Returns the tasks it finished.
async fn worker(
    rt: Runtime,
    me: String,
    finished: Arc<Mutex<HashMap<u64, String>>>,
    progress: Arc<tokio::sync::Notify>,
) -> Vec<u64> {
    let mut mine = Vec::new();
    loop {
        let notified = progress.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let claimed = ok(&rt, &me, "task_claim", json!({"lease_secs": 60})).await;
        let Some(task) = claimed.get("task") else {
            if finished.lock().unwrap().len() as u64 == TASKS {
                return mine;
            }
            // Woken by a finished task; an expired lease makes no noise, so look again soon.
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            continue;
        };
        let id = task["id"].as_u64().unwrap();
        for blocker in task["blocked_by"].as_array().into_iter().flatten() {
            let blocker = ok(&rt, &me, "task_get", json!({"id": blocker})).await;
            assert_eq!(
                blocker["status"], "done",
                "task {id} was claimed before its blocker {blocker} was done"
            );
        }
        ok(
            &rt,
            &me,
            "task_update",
            json!({"id": id, "status": "done", "note": format!("done by {me}")}),
        )
        .await;
        let previous = finished.lock().unwrap().insert(id, me.clone());
        assert_eq!(previous, None, "task {id} was finished twice");
        mine.push(id);
        progress.notify_waiters();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_workers_finish_a_thousand_tasks_once_each_in_dependency_order() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .data_dir(dir.path())
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    rt.register_agent(AgentSpec::new("ghost", "dev").parent("tl"))
        .await
        .unwrap();
    let workers: Vec<String> = (0..WORKERS).map(|i| format!("w{i}")).collect();
    for w in &workers {
        rt.register_agent(AgentSpec::new(w, "dev").parent("tl"))
            .await
            .unwrap();
    }
    // Every third task waits on the one 40 before it; a fifth of them are for the role.
    for i in 1..=TASKS {
        let mut args = json!({"title": format!("task {i}")});
        if i > 40 && i % 3 == 0 {
            args["blocked_by"] = json!([i - 40]);
        }
        if i % 5 == 0 {
            args["assignee"] = json!("role:dev");
        }
        let created = ok(&rt, "tl", "task_create", args).await;
        assert_eq!(created["id"], i);
    }
    // A worker that claims the first task and dies: its lease ends, someone else does it.
    let abandoned = ok(&rt, "ghost", "task_claim", json!({"lease_secs": 1})).await;
    let abandoned = abandoned["task"]["id"].as_u64().unwrap();

    let finished = Arc::new(Mutex::new(HashMap::new()));
    let progress = Arc::new(tokio::sync::Notify::new());
    let handles: Vec<_> = workers
        .iter()
        .map(|w| {
            tokio::spawn(worker(
                rt.clone(),
                w.clone(),
                Arc::clone(&finished),
                Arc::clone(&progress),
            ))
        })
        .collect();
    let per_worker = tokio::time::timeout(Duration::from_secs(120), async {
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    })
    .await
    .expect("the workers finished within two minutes");
    let total: usize = per_worker.iter().map(Vec::len).sum();
    assert_eq!(total as u64, TASKS, "every task finished exactly once");
    assert!(
        per_worker.iter().filter(|m| !m.is_empty()).count() > 1,
        "the work was shared"
    );
    // The dead worker cannot finish what it lost.
    let err = refused(
        &rt,
        "ghost",
        "task_update",
        json!({"id": abandoned, "status": "failed"}),
    )
    .await;
    assert!(
        err.contains("ended") || err.contains("claimed by") || err.contains("reopened"),
        "{err}"
    );
    let history = rt
        .tasks()
        .expect("the task board")
        .history(abandoned)
        .await
        .unwrap();
    let actions: Vec<(Action, Option<String>)> = history
        .iter()
        .map(|e| (e.action, e.by.as_ref().map(ToString::to_string)))
        .collect();
    assert_eq!(
        actions[1],
        (Action::Claimed, Some("ghost".into())),
        "{actions:?}"
    );
    assert_eq!(
        actions[2],
        (Action::LeaseExpired, Some("ghost".into())),
        "{actions:?}"
    );
    assert_eq!(actions[3].0, Action::Claimed, "{actions:?}");
    assert_ne!(actions[3].1.as_deref(), Some("ghost"));
    rt.shutdown().await;

    // After a restart: every task done, its history whole (versions 1, 2, … with no gap).
    let rt = Runtime::builder()
        .data_dir(dir.path())
        .build()
        .await
        .unwrap();
    let tasks = rt.tasks().expect("the task board");
    let (all, total) = tasks
        .list(TaskQuery {
            limit: usize::MAX,
            ..TaskQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(total as u64, TASKS);
    let finished = finished.lock().unwrap().clone();
    for task in &all {
        assert_eq!(task.status, TaskStatus::Done, "task {}", task.id);
        assert_eq!(
            task.notes.last().map(|n| n.text.clone()),
            Some(format!("done by {}", finished[&task.id]))
        );
        let history = tasks.history(task.id).await.unwrap();
        let versions: Vec<u64> = history.iter().map(|e| e.version).collect();
        assert_eq!(
            versions,
            (1..=task.version).collect::<Vec<_>>(),
            "task {}",
            task.id
        );
        let done = history
            .iter()
            .filter(|e| e.status.is_some_and(|[_, to]| to == TaskStatus::Done))
            .count();
        assert_eq!(done, 1, "task {} was done once", task.id);
    }
    rt.shutdown().await;
}

/// Takes `agent`'s unread mail once `count` messages are there (notices are mailed just
/// after their change commits), then checks that no more come: (sender, subject) each.
async fn mail(rt: &Runtime, agent: &str, count: usize) -> Vec<(String, String)> {
    let agent = rt.agent(agent).unwrap();
    eventually(Duration::from_secs(5), || async {
        agent.unread().await.unwrap() >= count
    })
    .await;
    let inbox = agent
        .check_inbox(InboxQuery {
            mark_read: true,
            ..InboxQuery::default()
        })
        .await
        .unwrap();
    inbox
        .messages
        .iter()
        .map(|m| (m.from.to_string(), m.subject.to_string()))
        .collect()
}

#[tokio::test]
async fn changes_that_concern_someone_reach_them_by_mail() {
    let rt = Runtime::builder().build().await.unwrap();
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    rt.register_agent(AgentSpec::new("pm", "pm").parent("tl"))
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev-1", "dev").parent("pm"))
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev-2", "dev").parent("pm"))
        .await
        .unwrap();
    let epic = ok(
        &rt,
        "tl",
        "task_create",
        json!({"title": "epic", "assignee": "pm"}),
    )
    .await;
    let design = ok(
        &rt,
        "pm",
        "task_create",
        json!({"title": "design", "parent": epic["id"], "assignee": "dev-1"}),
    )
    .await;
    let build = ok(
        &rt,
        "pm",
        "task_create",
        json!({"title": "build", "parent": epic["id"], "blocked_by": [design["id"]], "assignee": "role:dev"}),
    )
    .await;
    assert_eq!(build["ready"], false);

    assert_eq!(
        mail(&rt, "pm", 1).await,
        [("tl".into(), "task 1 assigned: epic".into())]
    );
    assert_eq!(
        mail(&rt, "dev-1", 2).await,
        [
            ("pm".into(), "task 2 assigned: design".into()),
            ("pm".into(), "task 3 assigned (blocked): build".into())
        ]
    );
    assert_eq!(mail(&rt, "dev-2", 1).await.len(), 1);

    // dev-1 finishes the design: the build becomes ready for the role (dev-1 did it, so
    // only dev-2 is told), and the design's creator, pm, also the epic's assignee, hears it
    // is done, once.
    ok(
        &rt,
        "dev-1",
        "task_update",
        json!({"id": design["id"], "status": "done"}),
    )
    .await;
    assert_eq!(
        mail(&rt, "dev-2", 1).await,
        [("dev-1".into(), "task 3 ready: build".into())]
    );
    assert_eq!(
        mail(&rt, "pm", 1).await,
        [("dev-1".into(), "task 2 done: design".into())]
    );
    let build = ok(&rt, "dev-2", "task_get", json!({"id": build["id"]})).await;
    assert_eq!(build["ready"], true);
    rt.shutdown().await;
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_problem_and_change_nothing() {
    let rt = Runtime::builder().build().await.unwrap();
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    rt.register_agent(AgentSpec::new("w1", "dev"))
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("w2", "dev"))
        .await
        .unwrap();
    let a = ok(&rt, "tl", "task_create", json!({"title": "a"})).await;
    let b = ok(
        &rt,
        "tl",
        "task_create",
        json!({"title": "b", "blocked_by": [1]}),
    )
    .await;
    assert_eq!((a["id"].as_u64(), b["id"].as_u64()), (Some(1), Some(2)));

    for (tool, args, expect) in [
        (
            "task_update",
            json!({"id": 1, "blocked_by": [2]}),
            "cycle (1 → 2 → 1)",
        ),
        ("task_update", json!({"id": 1, "parent": 1}), "cycle"),
        (
            "task_create",
            json!({"title": "c", "blocked_by": [9]}),
            "no task 9",
        ),
        (
            "task_create",
            json!({"title": "  "}),
            "`title`: it is empty",
        ),
        (
            "task_create",
            json!({"title": "c", "assignee": "nobody"}),
            "nobody",
        ),
        (
            "task_create",
            json!({"title": "c", "due": "tomorrow"}),
            "RFC 3339",
        ),
        ("task_create", json!({"title": "c", "bogus": 1}), "bogus"),
        (
            "task_update",
            json!({"id": 2, "status": "in_progress"}),
            "blocked by task(s) 1",
        ),
        (
            "task_update",
            json!({"id": 1, "expected_version": 7, "title": "x"}),
            "expected version 7",
        ),
        ("task_update", json!({"id": 99, "note": "x"}), "no task 99"),
        ("task_claim", json!({"lease_secs": 0}), "lease_secs"),
        (
            "task_claim",
            json!({"lease_secs": 100_000_000}),
            "lease_secs",
        ),
        ("task_heartbeat", json!({"id": 1}), "claim it first"),
        ("task_release", json!({"id": 1}), "claim it first"),
    ] {
        let err = refused(&rt, "w1", tool, args.clone()).await;
        assert!(err.contains(expect), "{tool} {args}: {err}");
    }
    // A claimed task is its holder's: others may add notes, not change it.
    let claimed = ok(&rt, "w1", "task_claim", json!({})).await;
    assert_eq!(claimed["task"]["id"], 1);
    let err = refused(&rt, "w2", "task_update", json!({"id": 1, "status": "done"})).await;
    assert!(err.contains("claimed by `w1`"), "{err}");
    assert!(
        refused(&rt, "w2", "task_release", json!({"id": 1}))
            .await
            .contains("w1")
    );
    ok(
        &rt,
        "w2",
        "task_update",
        json!({"id": 1, "note": "found a bug"}),
    )
    .await;
    // Its creator may cancel it.
    let cancelled = ok(
        &rt,
        "tl",
        "task_update",
        json!({"id": 1, "status": "cancelled"}),
    )
    .await;
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled.get("claimed_by").is_none(), "{cancelled}");
    // Without an identity nothing is claimed.
    let anonymous = rt
        .call_json("task_claim", json!({}), guildhall::CallOptions::new())
        .await
        .unwrap_err();
    assert!(
        anonymous.to_string().contains("agent identity"),
        "{anonymous}"
    );
    // None of the refusals changed anything.
    let b = ok(&rt, "tl", "task_get", json!({"id": 2})).await;
    assert_eq!(
        (b["version"].as_u64(), b["status"].as_str()),
        (Some(1), Some("open"))
    );
    rt.shutdown().await;
}

/// Ended tasks leave the board's memory once committed (it holds the work in progress, not
/// every task there was); read back from the store, they are still what they were: got,
/// listed, blockers and parents, noted, reopened, and across a restart.
#[tokio::test]
async fn ended_tasks_are_read_back_from_the_store_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let open = || Runtime::builder().data_dir(dir.path()).build();
    let rt = open().await.unwrap();
    rt.register_agent(AgentSpec::new("w", "dev")).await.unwrap();
    let tasks = rt.tasks().unwrap();
    let spec = |title: &str, blocked_by: Vec<u64>| TaskSpec {
        title: title.into(),
        blocked_by,
        ..TaskSpec::default()
    };
    let status = |status| TaskChange {
        status: Some(status),
        ..TaskChange::default()
    };
    let a = tasks.create(Some("w"), spec("a", vec![])).await.unwrap();
    let b = tasks
        .create(Some("w"), spec("b", vec![a.id]))
        .await
        .unwrap();
    let done = tasks
        .update(Some("w"), a.id, status(TaskStatus::Done))
        .await
        .unwrap();
    // Each call below finds `a` ended and committed, so out of memory.
    assert_eq!(tasks.get(a.id).await.unwrap(), done);
    let claimed = tasks.claim("w", ClaimFilter::default(), None).await;
    assert_eq!(claimed.unwrap().unwrap().id, b.id, "its dependent is ready");
    let c = tasks
        .create(
            Some("w"),
            TaskSpec {
                parent: Some(a.id),
                ..spec("c", vec![a.id])
            },
        )
        .await
        .unwrap();
    assert!(c.ready, "{c:?}");
    let noted = tasks
        .update(
            Some("w"),
            a.id,
            TaskChange {
                note: Some("for the record".into()),
                ..TaskChange::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(noted.version, done.version + 1);
    let all = TaskQuery {
        limit: 10,
        ..TaskQuery::default()
    };
    let (listed, total) = tasks.list(all.clone()).await.unwrap();
    assert_eq!(total, 3);
    assert_eq!(listed[0], tasks.get(a.id).await.unwrap());
    assert_eq!(listed[0].notes.len(), 1, "the note is kept: {listed:?}");
    let only_done = TaskQuery {
        status: vec![TaskStatus::Done],
        ..all.clone()
    };
    assert_eq!(tasks.list(only_done.clone()).await.unwrap().1, 1);
    rt.shutdown().await;

    // After a restart, the same; reopened, `a` is in progress work again.
    let rt = open().await.unwrap();
    let tasks = rt.tasks().unwrap();
    assert_eq!(tasks.list(all.clone()).await.unwrap().0, listed);
    let reopened = tasks
        .update(Some("w"), a.id, status(TaskStatus::Open))
        .await
        .unwrap();
    assert_eq!(reopened.version, noted.version + 1);
    assert!(!tasks.get(c.id).await.unwrap().ready, "c waits on a again");
    assert_eq!(tasks.list(only_done).await.unwrap().1, 0);
    let next = tasks.create(Some("w"), spec("d", vec![])).await.unwrap();
    assert_eq!(next.id, c.id + 1, "ids go on after the archived ones");
    rt.shutdown().await;
}

#[tokio::test]
async fn the_board_stops_when_idle_but_not_while_a_lease_is_held() {
    let rt = Runtime::builder()
        .task_config(TaskConfig {
            idle: Duration::from_millis(40),
            ..TaskConfig::default()
        })
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("w", "dev")).await.unwrap();
    let tasks = rt.tasks().expect("the task board");
    let first = tasks
        .create(
            Some("w"),
            TaskSpec {
                title: "a".into(),
                ..TaskSpec::default()
            },
        )
        .await
        .unwrap();
    assert!(tasks.is_active());
    eventually(Duration::from_secs(5), || async { !tasks.is_active() }).await;
    // Woken by the next request, with the board as it was.
    let held = tasks
        .claim(
            "w",
            ClaimFilter::default(),
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.id, first.id);
    // Held: the actor stays until the lease ends and the task is back in the pool.
    eventually(Duration::from_secs(5), || async {
        tasks.get(first.id).await.unwrap().status == TaskStatus::Open
    })
    .await;
    eventually(Duration::from_secs(5), || async { !tasks.is_active() }).await;
    let history = tasks.history(first.id).await.unwrap();
    assert_eq!(history.last().unwrap().action, Action::LeaseExpired);
    rt.shutdown().await;
}

#[tokio::test]
async fn leases_end_on_time_without_anyone_asking() {
    let rt = Runtime::builder().build().await.unwrap();
    rt.register_agent(AgentSpec::new("w", "dev")).await.unwrap();
    let tasks = rt.tasks().expect("the task board");
    tasks
        .create(
            None,
            TaskSpec {
                title: "a".into(),
                ..TaskSpec::default()
            },
        )
        .await
        .unwrap();
    tasks
        .claim(
            "w",
            ClaimFilter::default(),
            Some(Duration::from_millis(200)),
        )
        .await
        .unwrap()
        .unwrap();
    // The board's own timer returns it: history shows the expiry within a moment of the end.
    eventually(Duration::from_secs(5), || async {
        let history = tasks.history(1).await.unwrap();
        history
            .last()
            .is_some_and(|e| e.action == Action::LeaseExpired)
    })
    .await;
    let history = tasks.history(1).await.unwrap();
    let claimed = history[1].at_ms;
    let expired = history[2].at_ms;
    assert!(expired >= claimed + 200, "{history:?}");
    // The latest changes alone, read without the ones before them.
    let versions = |events: Vec<guildhall::tasks::TaskEvent>| -> Vec<u64> {
        events.iter().map(|e| e.version).collect()
    };
    assert_eq!(versions(tasks.latest_history(1, 2).await.unwrap()), [2, 3]);
    assert_eq!(versions(tasks.latest_history(1, 1).await.unwrap()), [3]);
    assert!(tasks.latest_history(1, 0).await.unwrap().is_empty());
    assert_eq!(
        versions(tasks.latest_history(1, 99).await.unwrap()),
        [1, 2, 3]
    );
    rt.shutdown().await;
}

#[test]
fn the_cli_lists_tasks_as_a_tree_and_as_json_and_changes_them() {
    let dir = tempfile::tempdir().unwrap();
    guildhall_ok(dir.path(), &["agents", "register", "tl", "--role", "tl"]);
    let out = guildhall_ok(dir.path(), &["tasks", "add", "epic", "--as", "tl"]);
    assert_eq!(out.trim(), "created task 1");
    guildhall_ok(
        dir.path(),
        &["tasks", "add", "design", "--parent", "1", "--label", "ui"],
    );
    guildhall_ok(
        dir.path(),
        &[
            "tasks",
            "add",
            "build",
            "--parent",
            "1",
            "--blocked-by",
            "2",
            "--assignee",
            "role:dev",
        ],
    );
    guildhall_ok(dir.path(), &["tasks", "add", "other"]);
    let tree = guildhall_ok(dir.path(), &["tasks", "--tree"]);
    let titles: Vec<&str> = tree
        .lines()
        .skip(1)
        .map(|l| l.rsplit("  ").find(|s| !s.is_empty()).unwrap_or(""))
        .collect();
    assert_eq!(titles, ["epic", "design", "build", "other"], "{tree}");
    assert!(tree.lines().nth(3).unwrap().contains("blocked"), "{tree}");
    assert!(tree.lines().nth(3).unwrap().contains("    build"), "{tree}");

    let out = guildhall_ok(
        dir.path(),
        &[
            "tasks", "update", "2", "--status", "done", "--note", "drawn", "--as", "tl",
        ],
    );
    assert_eq!(out.trim(), "task 2 is done (version 2)");
    let json: Vec<Value> = guildhall_ok(dir.path(), &["tasks", "list", "--json", "--ready"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ready: Vec<u64> = json.iter().map(|t| t["id"].as_u64().unwrap()).collect();
    assert_eq!(ready, [1, 3, 4]);
    let shown: Value = serde_json::from_str(&guildhall_ok(
        dir.path(),
        &["tasks", "show", "2", "--history"],
    ))
    .unwrap();
    assert_eq!(shown["notes"][0]["text"], "drawn");
    assert_eq!(shown["history"][1]["status"], json!(["open", "done"]));

    let bad = guildhall(dir.path())
        .args([
            "tasks",
            "update",
            "3",
            "--status",
            "in_progress",
            "--expect",
            "5",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("expected version 5"), "{err}");
    let by_status: BTreeMap<String, usize> = guildhall_ok(dir.path(), &["tasks", "--json"])
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["status"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .fold(BTreeMap::new(), |mut m, s| {
            *m.entry(s).or_default() += 1;
            m
        });
    assert_eq!(
        by_status,
        BTreeMap::from([("done".into(), 1), ("open".into(), 3)])
    );
}

#[tokio::test]
async fn a_parent_is_told_when_its_agent_leaves_holding_work_and_not_otherwise() {
    use guildhall::mcp::{McpServer, ToolFilter};
    let rt = Runtime::builder().build().await.unwrap();
    rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    for dev in ["dev", "idle", "back"] {
        rt.register_agent(AgentSpec::new(dev, "dev").parent("pm"))
            .await
            .unwrap();
    }
    let server = McpServer::new(rt.clone());
    let connect = |agent: &str| server.connection(Some(Arc::from(agent)), ToolFilter::all());
    // One that leaves holding nothing, and one that comes back at once: no news.
    drop(connect("idle"));
    let back = connect("back");
    ok(&rt, "back", "task_create", json!({"title": "kept"})).await;
    ok(&rt, "back", "task_claim", json!({})).await;
    drop(back);
    let _back_again = connect("back");
    // One that leaves holding a claimed task, with urgent mail unread.
    let dev = connect("dev");
    let task = ok(
        &rt,
        "dev",
        "task_create",
        json!({"title": "parse the logs"}),
    )
    .await;
    ok(&rt, "dev", "task_claim", json!({})).await;
    ok(
        &rt,
        "pm",
        "send_message",
        json!({"to": "dev", "body": "stop the deploy", "priority": "urgent"}),
    )
    .await;
    drop(dev);
    let pm = rt.agent("pm").unwrap();
    let told =
        crate::support::eventually_some(Duration::from_secs(20), "the pm is told", async || {
            let inbox = pm.check_inbox(InboxQuery::default()).await.unwrap();
            (!inbox.messages.is_empty()).then_some(inbox.messages)
        })
        .await;
    let [left] = told.as_slice() else {
        panic!("only the agent that left with work: {told:?}");
    };
    assert_eq!(&*left.subject, "agent dev left");
    assert_eq!(left.from.as_str(), "dev");
    assert!(
        left.body.contains(&format!(
            "holding 1 task(s): #{} \"parse the logs\" (in_progress)",
            task["id"]
        )),
        "{}",
        left.body
    );
    assert!(
        left.body.contains("1 unread message(s), 1 of them urgent"),
        "{}",
        left.body
    );
    let payload = left.payload.as_deref().unwrap();
    assert_eq!(payload["event"], "agent_left");
    assert_eq!(payload["tasks"], json!([task["id"]]));
    rt.shutdown().await;
}
