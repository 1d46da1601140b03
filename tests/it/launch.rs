//! Agents the runtime launches: bound to their identity, supervised (restart types, the
//! intensity that gives them up), their exits mailed to their parents, stopped with every
//! process they started, and bounded in number. The fake agent is a bash script that reads
//! its prompt as `$1`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use guildhall::launch::{LaunchConfig, LaunchState, Launcher, Profile, SpawnRequest};
use guildhall::servers::RestartType;
use guildhall::{AgentSpec, InboxQuery, Runtime};
use serde_json::{Value, json};

use crate::support::{as_agent, eventually, pids, process_gone};

/// The fake agent: says who it is, keeps its pids, then does what its prompt says:
/// `exit N`, or `hang` (a background child, then waits). Braces are doubled: the command is
/// a template.
const FAKE: &str = r#"echo "I am $GUILDHALL_AGENT ($GUILDHALL_ROLE) under ${{GUILDHALL_PARENT:-nobody}}: $1"
echo $$ >> "$GUILDHALL_DATA_DIR/$GUILDHALL_AGENT.pids"
case "$1" in
  exit*) exit "${{1#exit }}" ;;
  hang) sleep 300 & echo $! >> "$GUILDHALL_DATA_DIR/$GUILDHALL_AGENT.pids"; wait ;;
esac"#;

fn profile(restart: RestartType, max_restarts: u32) -> Profile {
    Profile {
        restart,
        max_restarts,
        ..Profile::new(["bash", "-c", FAKE, "fake", "{prompt}"])
    }
}

async fn launcher(dir: &Path, config: LaunchConfig) -> (Runtime, Arc<Launcher>) {
    let rt = Runtime::builder().data_dir(dir).build().await.unwrap();
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    rt.register_agent(AgentSpec::new("other", "tl"))
        .await
        .unwrap();
    let launcher = Launcher::start(
        &rt,
        config,
        dir.to_owned(),
        Some(dir.to_owned()),
        env!("CARGO_BIN_EXE_guildhall").into(),
    )
    .await
    .unwrap();
    (rt, launcher)
}

fn config(profiles: impl IntoIterator<Item = (&'static str, Profile)>) -> LaunchConfig {
    LaunchConfig {
        profiles: profiles
            .into_iter()
            .map(|(name, p)| (name.to_owned(), p))
            .collect::<BTreeMap<_, _>>(),
        ..LaunchConfig::default()
    }
}

/// Waits for `count` messages in `agent`'s inbox and takes them: (subject, payload).
async fn mail(rt: &Runtime, agent: &str, count: usize) -> Vec<(String, Value)> {
    let agent = rt.agent(agent).unwrap();
    eventually(Duration::from_secs(20), || async {
        agent.unread().await.unwrap() >= count
    })
    .await;
    let inbox = agent
        .check_inbox(InboxQuery {
            mark_read: true,
            limit: usize::MAX,
            ..InboxQuery::default()
        })
        .await
        .unwrap();
    inbox
        .messages
        .iter()
        .map(|m| {
            let payload = m.payload.as_deref().cloned().unwrap_or(Value::Null);
            (m.subject.to_string(), payload)
        })
        .collect()
}

#[tokio::test]
async fn a_launched_agent_runs_as_itself_and_its_exit_reaches_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, launcher) = launcher(
        dir.path(),
        config([("fake", profile(RestartType::Transient, 3))]),
    )
    .await;
    let spawned = rt
        .call_json(
            "spawn_agent",
            json!({"role": "dev", "id": "dev-1", "prompt": "exit 0"}),
            as_agent(&rt, "tl"),
        )
        .await
        .unwrap();
    assert_eq!(spawned["parent"], "tl", "{spawned}");
    assert_eq!(spawned["profile"], "fake", "{spawned}");
    let exits = mail(&rt, "tl", 1).await;
    assert_eq!(exits[0].0, "agent dev-1 exited");
    assert_eq!(exits[0].1["exit_code"], 0);
    // Registered with its role and parent, and told who it is.
    let record = rt.lookup_agent("dev-1").unwrap();
    assert_eq!(
        (
            record.role.as_str(),
            record.parent.as_ref().map(|p| p.as_str())
        ),
        ("dev", Some("tl"))
    );
    let log = std::fs::read_to_string(dir.path().join("launched/dev-1.log")).unwrap();
    assert!(log.contains("I am dev-1 (dev) under tl: exit 0"), "{log}");
    // Its MCP config connects back as itself, through guildhall mcp.
    let mcp: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("launched/dev-1.mcp.json")).unwrap())
            .unwrap();
    let args: Vec<&str> = mcp["mcpServers"]["guildhall"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.ends_with(&["mcp", "--agent", "dev-1", "--role", "dev", "--parent", "tl"]),
        "{args:?}"
    );
    // A transient agent that exited 0 is done, and the directory shows it.
    let info = &launcher.list().await[0];
    assert_eq!(
        (info.state, info.restarts),
        (LaunchState::Ended, 0),
        "{info:?}"
    );
    let listed = rt
        .call_json("list_agents", json!({"role": "dev"}), as_agent(&rt, "tl"))
        .await
        .unwrap();
    let launched = &listed["agents"][0]["launched"];
    assert_eq!(launched["state"], "ended", "{listed}");
    assert_eq!(launched["last_exit"], "exited with code 0", "{listed}");
    // Launched again under the same id once it ended: a new run, reported again.
    rt.call_json(
        "spawn_agent",
        json!({"role": "dev", "id": "dev-1", "prompt": "exit 0"}),
        as_agent(&rt, "tl"),
    )
    .await
    .unwrap();
    assert_eq!(mail(&rt, "tl", 1).await[0].0, "agent dev-1 exited");
    let log = std::fs::read_to_string(dir.path().join("launched/dev-1.log")).unwrap();
    assert_eq!(log.matches("I am dev-1").count(), 2, "{log}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_crashing_agent_is_restarted_up_to_its_intensity_then_given_up_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, launcher) = launcher(
        dir.path(),
        config([("fake", profile(RestartType::Transient, 2))]),
    )
    .await;
    launcher
        .spawn(
            Some("tl"),
            SpawnRequest {
                id: Some("crashy".into()),
                role: "dev".into(),
                prompt: Some("exit 3".into()),
                ..SpawnRequest::default()
            },
        )
        .await
        .unwrap();
    // Three runs (the first and two restarts) each exit 3; the next restart is given up.
    let mail = mail(&rt, "tl", 4).await;
    let subjects: Vec<&str> = mail.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        subjects,
        [
            "agent crashy exited",
            "agent crashy exited",
            "agent crashy exited",
            "agent crashy gave up"
        ]
    );
    assert!(
        mail[..3].iter().all(|(_, p)| p["exit_code"] == 3),
        "{mail:?}"
    );
    let info = &launcher.list().await[0];
    assert_eq!(
        (info.state, info.restarts),
        (LaunchState::GaveUp, 2),
        "{info:?}"
    );
    assert_eq!(info.pid, None);
    rt.shutdown().await;
}

#[tokio::test]
async fn stop_agent_leaves_no_process_and_only_those_above_may_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, launcher) = launcher(
        dir.path(),
        config([("fake", profile(RestartType::Permanent, 3))]),
    )
    .await;
    let spawn = |id: &str, parent: &str| SpawnRequest {
        id: Some(id.into()),
        role: "dev".into(),
        parent: Some(parent.into()),
        prompt: Some("hang".into()),
        ..SpawnRequest::default()
    };
    launcher.spawn(Some("tl"), spawn("pm", "tl")).await.unwrap();
    // pm's own worker, which stops with it.
    launcher.spawn(Some("pm"), spawn("w", "pm")).await.unwrap();
    let pm_pids = pids(&dir.path().join("pm.pids"), 2).await;
    let w_pids = pids(&dir.path().join("w.pids"), 2).await;
    // list_agents shows each running, with its process.
    let listed = rt
        .call_json("list_agents", json!({"role": "dev"}), as_agent(&rt, "tl"))
        .await
        .unwrap();
    let pm = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == "pm")
        .unwrap();
    assert_eq!(pm["launched"]["state"], "running", "{listed}");
    assert_eq!(pm["launched"]["pid"], pm_pids[0], "{listed}");

    let refused = rt
        .call_json("stop_agent", json!({"id": "w"}), as_agent(&rt, "other"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("may not stop"), "{refused}");
    // tl is above w's parent: it may stop pm, and w goes with it, grandchildren included.
    let stopped = rt
        .call_json("stop_agent", json!({"id": "pm"}), as_agent(&rt, "tl"))
        .await
        .unwrap();
    assert_eq!(stopped["state"], "ended", "{stopped}");
    eventually(Duration::from_secs(10), || async {
        pm_pids.iter().chain(&w_pids).all(|p| process_gone(*p))
    })
    .await;
    eventually(Duration::from_secs(10), || async {
        launcher
            .list()
            .await
            .iter()
            .all(|l| l.state == LaunchState::Ended)
    })
    .await;
    // A permanent agent that was stopped is not restarted.
    assert!(launcher.list().await.iter().all(|l| l.pid.is_none()));
    rt.shutdown().await;
}

#[tokio::test]
async fn limits_bound_launched_agents_and_the_runtime_stops_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut limited = config([
        ("fake", profile(RestartType::Transient, 3)),
        ("other", profile(RestartType::Temporary, 0)),
    ]);
    limited.max_agents = 3;
    limited.max_per_parent = 2;
    let (rt, launcher) = launcher(dir.path(), limited).await;
    let hang = |id: &str| SpawnRequest {
        id: Some(id.into()),
        role: "dev".into(),
        prompt: Some("hang".into()),
        profile: Some("fake".into()),
        ..SpawnRequest::default()
    };
    launcher.spawn(Some("tl"), hang("a")).await.unwrap();
    launcher.spawn(Some("tl"), hang("b")).await.unwrap();
    let err = launcher.spawn(Some("tl"), hang("c")).await.unwrap_err();
    assert!(err.to_string().contains("max_per_parent"), "{err}");
    launcher.spawn(Some("other"), hang("c")).await.unwrap();
    let err = launcher.spawn(Some("other"), hang("d")).await.unwrap_err();
    assert!(err.to_string().contains("max_agents"), "{err}");
    let err = launcher.spawn(Some("other"), hang("a")).await.unwrap_err();
    assert!(err.to_string().contains("already launched"), "{err}");
    // Bad requests name the problem and start nothing.
    for (request, says) in [
        (
            SpawnRequest {
                profile: Some("nope".into()),
                ..hang("e")
            },
            "no launch profile `nope`; there are fake, other",
        ),
        (
            SpawnRequest {
                profile: None,
                ..hang("e")
            },
            "name a launch profile",
        ),
        (
            SpawnRequest {
                role: "bad role".into(),
                ..hang("e")
            },
            "invalid `role`",
        ),
        (
            SpawnRequest {
                parent: Some("ghost".into()),
                ..hang("e")
            },
            "ghost",
        ),
        // `other` may not launch in `tl`'s name.
        (
            SpawnRequest {
                parent: Some("tl".into()),
                ..hang("e")
            },
            "not for `tl`",
        ),
    ] {
        let err = launcher.spawn(Some("other"), request).await.unwrap_err();
        assert!(err.to_string().contains(says), "{says}: {err}");
    }
    let mut all = Vec::new();
    for id in ["a", "b", "c"] {
        all.extend(pids(&dir.path().join(format!("{id}.pids")), 2).await);
    }
    rt.shutdown().await;
    eventually(Duration::from_secs(10), || async {
        all.iter().all(|p| process_gone(*p))
    })
    .await;
}

/// Mails `body` to `agent` from `tl`, subject `subject`.
async fn send(rt: &Runtime, to: &str, subject: &str) {
    rt.agent("tl")
        .unwrap()
        .send(guildhall::Outgoing::to(to).subject(subject).body("please"))
        .await
        .unwrap();
}

fn log(dir: &Path, agent: &str) -> String {
    std::fs::read_to_string(dir.join(format!("launched/{agent}.log"))).unwrap_or_default()
}

/// Mail for an idle agent when `max_agents` is reached does not wake it then: the wake
/// waits, and once another agent stops and makes room, the agent starts (one restart) with
/// the mail that came meanwhile named in its prompt.
#[tokio::test]
async fn an_idle_agent_mailed_without_room_is_woken_once_room_comes() {
    let dir = tempfile::tempdir().unwrap();
    let waking = Profile {
        wake_on_mail: true,
        resume: Some(
            ["bash", "-c", FAKE, "woken", "{prompt}"]
                .map(String::from)
                .to_vec(),
        ),
        ..profile(RestartType::Transient, 2)
    };
    let mut config = config([
        ("wake", waking),
        ("fake", profile(RestartType::Permanent, 3)),
    ]);
    config.max_agents = 1;
    let (rt, launcher) = launcher(dir.path(), config).await;
    let spawn = |id: &str, profile: &str, prompt: &str| SpawnRequest {
        id: Some(id.into()),
        role: "dev".into(),
        parent: Some("tl".into()),
        profile: Some(profile.into()),
        prompt: Some(prompt.into()),
        ..SpawnRequest::default()
    };
    let state = async |agent: &str| {
        let list = launcher.list().await;
        let info = list.iter().find(|l| l.agent == agent).unwrap();
        (info.state, info.restarts)
    };
    launcher
        .spawn(Some("tl"), spawn("dev-1", "wake", "exit 0"))
        .await
        .unwrap();
    eventually(Duration::from_secs(20), async || {
        state("dev-1").await == (LaunchState::Idle, 0)
    })
    .await;
    // An idle agent holds no room: another takes the only one.
    launcher
        .spawn(Some("tl"), spawn("w", "fake", "hang"))
        .await
        .unwrap();
    pids(&dir.path().join("w.pids"), 2).await;
    send(&rt, "dev-1", "first").await;
    send(&rt, "dev-1", "second").await;
    assert_eq!(
        state("dev-1").await,
        (LaunchState::Idle, 0),
        "no room: not woken"
    );
    let stopped = rt
        .call_json("stop_agent", json!({"id": "w"}), as_agent(&rt, "tl"))
        .await
        .unwrap();
    assert_eq!(stopped["state"], "ended", "{stopped}");
    // Room now: woken within the retry, once, told of both messages (it ran and is idle
    // again).
    eventually(Duration::from_secs(20), async || {
        state("dev-1").await == (LaunchState::Idle, 1)
    })
    .await;
    let woken = log(dir.path(), "dev-1");
    assert!(
        woken.contains("\"first\"") && woken.contains("\"second\""),
        "{woken}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn an_idle_agent_is_woken_by_mail_and_told_it_within_its_intensity() {
    let dir = tempfile::tempdir().unwrap();
    let waking = Profile {
        wake_on_mail: true,
        resume: Some(
            ["bash", "-c", FAKE, "woken", "{prompt}"]
                .map(String::from)
                .to_vec(),
        ),
        ..profile(RestartType::Transient, 2)
    };
    let (rt, launcher) = launcher(
        dir.path(),
        config([
            ("wake", waking),
            ("fake", profile(RestartType::Permanent, 3)),
        ]),
    )
    .await;
    let spawn = |id: &str, parent: &str, profile: &str, prompt: &str| SpawnRequest {
        id: Some(id.into()),
        role: "dev".into(),
        parent: Some(parent.into()),
        profile: Some(profile.into()),
        prompt: Some(prompt.into()),
        ..SpawnRequest::default()
    };
    // dev-1 has a worker of its own (started first, so it is there when dev-1 ends).
    rt.register_agent(AgentSpec::new("dev-1", "dev").parent("tl"))
        .await
        .unwrap();
    launcher
        .spawn(Some("tl"), spawn("w", "dev-1", "fake", "hang"))
        .await
        .unwrap();
    let w_pids = pids(&dir.path().join("w.pids"), 2).await;
    launcher
        .spawn(Some("tl"), spawn("dev-1", "tl", "wake", "exit 0"))
        .await
        .unwrap();
    let state = async |agent: &str| {
        let list = launcher.list().await;
        let info = list.iter().find(|l| l.agent == agent).unwrap();
        (info.state, info.restarts)
    };
    // Its exit makes it idle, and its parent is told so.
    let body = async |rt: &Runtime| {
        let tl = rt.agent("tl").unwrap();
        eventually(Duration::from_secs(20), || async {
            tl.unread().await.unwrap() >= 1
        })
        .await;
        let inbox = tl
            .check_inbox(InboxQuery {
                mark_read: true,
                ..InboxQuery::default()
            })
            .await
            .unwrap();
        inbox.messages[0].body.to_string()
    };
    assert!(
        body(&rt)
            .await
            .contains("exited with code 0; it is idle until mail wakes it"),
        "{}",
        log(dir.path(), "dev-1")
    );
    assert_eq!(state("dev-1").await, (LaunchState::Idle, 0));

    // Mail wakes it: its resume command runs, its prompt naming the mail.
    send(&rt, "dev-1", "review PR 7").await;
    eventually(Duration::from_secs(20), async || {
        state("dev-1").await == (LaunchState::Idle, 1)
    })
    .await;
    let woken = log(dir.path(), "dev-1");
    assert!(
        woken.contains("I am dev-1 (dev) under tl: You are agent `dev-1`, woken by new mail")
            && woken.contains("from `tl`: \"review PR 7\""),
        "{woken}"
    );
    // Its worker ran on while it was idle, and goes with it when it is stopped.
    assert!(w_pids.iter().all(|p| !process_gone(*p)));
    let stopped = rt
        .call_json("stop_agent", json!({"id": "dev-1"}), as_agent(&rt, "tl"))
        .await
        .unwrap();
    assert_eq!(stopped["state"], "ended", "{stopped}");
    eventually(Duration::from_secs(10), || async {
        w_pids.iter().all(|p| process_gone(*p))
    })
    .await;

    // dev-2 is woken within its intensity (2 restarts a minute), then given up; dev-1,
    // stopped, is mailed first each time and never woken again.
    launcher
        .spawn(Some("tl"), spawn("dev-2", "tl", "wake", "exit 0"))
        .await
        .unwrap();
    body(&rt).await;
    for round in 1..=2 {
        send(&rt, "dev-1", "are you there?").await;
        send(&rt, "dev-2", &format!("round {round}")).await;
        eventually(Duration::from_secs(20), async || {
            state("dev-2").await == (LaunchState::Idle, round)
        })
        .await;
    }
    // Its parent heard of its first going idle, not of each round.
    assert_eq!(rt.agent("tl").unwrap().unread().await.unwrap(), 0);
    send(&rt, "dev-2", "round 3").await;
    let tl = rt.agent("tl").unwrap();
    eventually(Duration::from_secs(20), || async {
        tl.unread().await.unwrap() >= 1
    })
    .await;
    let gave_up = tl
        .check_inbox(InboxQuery::default())
        .await
        .unwrap()
        .messages[0]
        .subject
        .to_string();
    assert_eq!(gave_up, "agent dev-2 gave up");
    assert_eq!(state("dev-2").await.0, LaunchState::GaveUp);
    assert_eq!(
        log(dir.path(), "dev-1")
            .matches("woken by new mail")
            .count(),
        1
    );
    assert_eq!(
        log(dir.path(), "dev-2")
            .matches("woken by new mail")
            .count(),
        2
    );
    rt.shutdown().await;
}

#[test]
fn profiles_that_would_run_a_value_as_code_or_cannot_work_are_refused() {
    for (command, says) in [
        (
            vec!["bash", "-c", "echo {prompt}"],
            "would read a value as shell code",
        ),
        (vec!["{agent}"], "cannot be a placeholder"),
        (vec!["claude", "{nope}"], "`{nope}` is not a placeholder"),
        (vec![], "`command` is empty"),
    ] {
        let config = config([("p", Profile::new(command.clone()))]);
        let err = config.validate().unwrap_err();
        assert!(err.contains(says), "{command:?}: {err}");
    }
    let mut env = Profile::new(["claude"]);
    env.env.insert("GUILDHALL_AGENT".into(), "x".into());
    assert!(
        config([("p", env)])
            .validate()
            .unwrap_err()
            .contains("GUILDHALL_")
    );
    config([(
        "p",
        Profile::new(["bash", "-c", "echo \"$1\"", "x", "{prompt}"]),
    )])
    .validate()
    .unwrap();
    // A woken agent's command is checked like the first, and only where agents wake.
    let resume = |wake_on_mail, resume: &[&str]| Profile {
        wake_on_mail,
        resume: Some(resume.iter().map(|a| (*a).to_owned()).collect()),
        ..Profile::new(["claude"])
    };
    for (profile, says) in [
        (
            resume(true, &["claude", "{mail}"]),
            "[launch.profiles.p]: `{mail}` is not a placeholder",
        ),
        (resume(true, &[]), "`resume` is empty"),
        (
            resume(false, &["claude", "--continue"]),
            "give `wake_on_mail = true`",
        ),
    ] {
        let err = config([("p", profile)]).validate().unwrap_err();
        assert!(err.contains(says), "{err}");
    }
}

/// `examples/launched_swarm.rs` (built by `cargo test`, not run by it): a TL launches a PM
/// process, which splits its epic on the board, launches three worker processes and ends;
/// one worker crashes holding a task and is restarted, the task's lease ends and another
/// finishes it; mail wakes the PM each round (`wake_on_mail`), and the last closes the epic
/// and reports. The example itself fails unless every task is done
/// and every agent ended well.
#[test]
fn the_launched_swarm_example_runs_a_whole_tl_pm_workers_flow() {
    let example = crate::support::example("launched_swarm");
    let out = std::process::Command::new(&example)
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("6 of 6 tasks done by 3 workers"),
        "{stdout}"
    );
    assert!(stdout.contains("w3: crashing while holding"), "{stdout}");
    // The PM is woken by mail rather than polling, and reads the mail that woke it.
    assert!(stdout.contains("| pm: woken by task "), "{stdout}");
    assert!(
        stdout.contains("tl's inbox: release 1.0 is done (from pm)"),
        "{stdout}"
    );
}
