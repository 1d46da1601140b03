//! Other MCP servers proxied as supervised tools. The server proxied is a real one over
//! stdio: guildhall's own `serve --stdio`, whose process the tests kill, stop and break.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use guildhall::governance::{Action, GovernanceConfig, Rule};
use guildhall::servers::{ServerConfig, ServerInfo, ServerState, Servers};
use guildhall::{BreakerStatus, CallError, CallOptions, Runtime, ToolEvent};
use serde_json::{Value, json};

use crate::support::{eventually, guildhall_ok, serve_in_background};

/// `guildhall serve --stdio` as an MCP server with the bench `echo` tool, its own data
/// directory under `dir`.
fn inner_server(dir: &Path) -> ServerConfig {
    inner_serving(dir, &["--bench-echo"])
}

/// `guildhall serve --stdio --in-memory` with `extra` arguments, as an MCP server.
fn inner_serving(dir: &Path, extra: &[&str]) -> ServerConfig {
    let mut config = ServerConfig::command(
        env!("CARGO_BIN_EXE_guildhall"),
        [
            "--data-dir".to_owned(),
            dir.join("inner").display().to_string(),
            "serve".into(),
            "--stdio".into(),
            "--in-memory".into(),
        ]
        .into_iter()
        .chain(extra.iter().map(|a| (*a).to_owned())),
    );
    config.env.insert("RUST_LOG".into(), "off".into());
    config
}

async fn with_servers(governance: GovernanceConfig) -> (Runtime, Arc<Servers>) {
    let rt = Runtime::builder()
        .governance(governance)
        .build()
        .await
        .unwrap();
    let servers = Servers::start(&rt, std::env::temp_dir(), None)
        .await
        .unwrap();
    (rt, servers)
}

async fn info(servers: &Servers, name: &str) -> ServerInfo {
    servers
        .list()
        .await
        .into_iter()
        .find(|s| s.name == name)
        .unwrap()
}

/// Waits until `name` serves, with `starts` starts so far, and returns its pid.
async fn running(servers: &Servers, name: &str, starts: u64) -> u32 {
    eventually(Duration::from_secs(30), || async {
        let info = info(servers, name).await;
        info.state == ServerState::Running && info.starts == starts && !info.tools.is_empty()
    })
    .await;
    info(servers, name).await.pid.unwrap()
}

/// The next `Restarted` event: the tool and its restarts.
async fn restart_event(events: &mut guildhall::EventStream) -> (String, u64) {
    loop {
        if let ToolEvent::Restarted { tool, restarts } = events.next().await.unwrap() {
            return (tool.to_string(), restarts);
        }
    }
}

/// The audit records of `agent`'s calls, once every record is written.
async fn audited(rt: &Runtime, agent: &str) -> Vec<guildhall::governance::AuditRecord> {
    let audit = rt.governance().audit().expect("auditing is on");
    audit.flush().await.unwrap();
    audit
        .query(&guildhall::governance::AuditQuery {
            agent: Some(agent.into()),
            ..Default::default()
        })
        .unwrap()
}

fn echo(text: &str) -> Value {
    json!({ "text": text })
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn a_server_s_tools_are_guildhall_tools_under_its_governance() {
    let dir = tempfile::tempdir().unwrap();
    let governance = GovernanceConfig {
        rules: vec![Rule::new("mcp__inner__send_*", Action::Deny).unwrap()],
        ..GovernanceConfig::default()
    };
    let (rt, servers) = with_servers(governance).await;
    let tools_changed = rt.tool_set_changes();
    servers
        .add("inner", inner_server(dir.path()))
        .await
        .unwrap();
    running(&servers, "inner", 1).await;
    assert!(
        tools_changed.has_changed().unwrap(),
        "clients are told the tool list changed"
    );

    // The server's own schema and hints, under guildhall's name for the tool.
    let spec = rt.tool("mcp__inner__echo").unwrap();
    assert_eq!(spec.input_schema["properties"]["text"]["type"], "string");
    assert!(rt.tool("mcp__inner__check_inbox").is_some());
    assert!(
        info(&servers, "inner")
            .await
            .tools
            .iter()
            .all(|t| t.starts_with("mcp__inner__")),
        "every tool is named after its server"
    );

    let out = rt
        .call_json("mcp__inner__echo", echo("through"), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(
        out["text"], "through",
        "structured content passes through: {out}"
    );

    // A rule on the proxied name holds: the call never reaches the server.
    let denied = rt
        .call_json(
            "mcp__inner__send_message",
            json!({"to": "x", "subject": "s", "body": "b"}),
            CallOptions::new(),
        )
        .await;
    assert!(
        matches!(denied, Err(CallError::Denied { .. })),
        "{denied:?}"
    );

    // The server's own error is the tool's error, with its text.
    let bad = rt
        .call_json("mcp__inner__echo", json!({"text": 5}), CallOptions::new())
        .await;
    assert!(matches!(bad, Err(CallError::Tool { .. })), "{bad:?}");

    servers.remove("inner").await.unwrap();
    assert!(
        rt.tool("mcp__inner__echo").is_none(),
        "removing a server removes its tools"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_server_killed_mid_call_answers_crashed_once_per_call_and_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    let mut events = rt.governance().events();
    servers
        .add("inner", inner_server(dir.path()))
        .await
        .unwrap();
    let pid = running(&servers, "inner", 1).await;

    // Five calls waiting on the server (an inbox check that waits for mail).
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let rt = rt.clone();
            tokio::spawn(async move {
                rt.call_json(
                    "mcp__inner__check_inbox",
                    json!({"wait_secs": 30}),
                    CallOptions::new(),
                )
                .await
            })
        })
        .collect();
    eventually(Duration::from_secs(10), || async {
        info(&servers, "inner").await.in_flight == 5
    })
    .await;
    signal(pid, "-KILL");
    for call in calls {
        let outcome = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("every call gets its reply, none hangs")
            .unwrap();
        assert!(
            matches!(&outcome, Err(CallError::Crashed { reason, .. }) if reason.contains("inner")),
            "{outcome:?}"
        );
    }

    let new_pid = running(&servers, "inner", 2).await;
    assert_ne!(new_pid, pid);
    assert_eq!(
        restart_event(&mut events).await,
        ("inner".to_owned(), 1),
        "watchers see the server restarted, under its name in the tree"
    );
    let last = info(&servers, "inner").await.last_end.unwrap_or_default();
    assert!(
        last.contains("killed by signal 9"),
        "status keeps why it ended: {last}"
    );
    let out = rt
        .call_json("mcp__inner__echo", echo("again"), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(out["text"], "again");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_hung_server_is_cancelled_killed_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    let mut config = inner_server(dir.path());
    config.timeout = Duration::from_millis(500);
    // Room for a loaded machine's probe: a grace of 500 ms once killed a healthy restarted
    // copy under a full CI run, and the second hang was then signalled to a dead pid.
    config.hang_grace = Duration::from_secs(2);
    servers.add("inner", config).await.unwrap();
    let pid = running(&servers, "inner", 1).await;

    // Stopped, it reads nothing and answers nothing: hung, as a deadlocked server is.
    signal(pid, "-STOP");
    let outcome = rt
        .call_json("mcp__inner__echo", echo("anyone?"), CallOptions::new())
        .await;
    assert!(
        matches!(outcome, Err(CallError::Timeout { .. })),
        "{outcome:?}"
    );

    // The probe after the cancelled call goes unanswered: killed, and started again.
    let new_pid = running(&servers, "inner", 2).await;
    assert_ne!(new_pid, pid);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z")),
        "the hung process is gone"
    );
    let out = rt
        .call_json("mcp__inner__echo", echo("back"), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(out["text"], "back");

    // The restarted process is watched the same way: its hang is noticed too.
    signal(new_pid, "-STOP");
    let outcome = rt
        .call_json("mcp__inner__echo", echo("again?"), CallOptions::new())
        .await;
    assert!(
        matches!(outcome, Err(CallError::Timeout { .. })),
        "{outcome:?}"
    );
    assert_ne!(running(&servers, "inner", 3).await, new_pid);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_opens_its_breaker_and_recovers_once_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    let inner = inner_server(dir.path());
    // Exits at once until `ready` exists, saying why on stderr.
    let script = format!(
        "test -f '{}' || {{ echo 'not ready yet' >&2; exit 3; }}; exec \"$0\" \"$@\"",
        ready.display()
    );
    let mut config = ServerConfig::command(
        "sh",
        ["-c".to_owned(), script, inner.command.clone()]
            .into_iter()
            .chain(inner.args.clone()),
    );
    config.env = inner.env.clone();
    let mut events = rt.governance().events();
    servers.add("flaky", config).await.unwrap();

    eventually(Duration::from_secs(20), || async {
        matches!(
            info(&servers, "flaky").await.breaker,
            BreakerStatus::Open { .. }
        )
    })
    .await;
    loop {
        match events.next().await.unwrap() {
            ToolEvent::CircuitOpened { tool } => break assert_eq!(&*tool, "flaky"),
            ToolEvent::CircuitClosed { .. } => panic!("closed before it opened"),
            _ => {}
        }
    }
    let down = info(&servers, "flaky").await;
    let reason = down.reason.unwrap_or_default();
    assert!(
        reason.contains("exited with status 3") && reason.contains("not ready yet"),
        "the reason names the exit and the server's own words: {reason}"
    );
    assert!(down.tools.is_empty());

    std::fs::write(&ready, "").unwrap();
    eventually(Duration::from_secs(90), || async {
        let info = info(&servers, "flaky").await;
        info.state == ServerState::Running && !info.tools.is_empty()
    })
    .await;
    assert!(matches!(
        info(&servers, "flaky").await.breaker,
        BreakerStatus::Closed { .. }
    ));
    let out = rt
        .call_json("mcp__flaky__echo", echo("fixed"), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(out["text"], "fixed");
    rt.shutdown().await;
}

#[tokio::test]
async fn servers_in_the_config_are_listed_added_and_removed_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let inner = inner_server(dir.path());
    let config = format!(
        "[servers.inner]\ncommand = {:?}\nargs = {:?}\nenv = {{ RUST_LOG = \"off\" }}\n",
        inner.command, inner.args
    );
    std::fs::write(dir.path().join("guildhall.toml"), config).unwrap();
    let tools = guildhall_ok(dir.path(), &["tools"]);
    assert!(
        tools.contains("mcp__inner__echo") && tools.contains("(from MCP server `inner`)"),
        "`guildhall tools` starts the servers to list their tools, with their origin: {tools}"
    );
    let _server = serve_in_background(dir.path());

    let listed = || -> Vec<Value> {
        guildhall_ok(dir.path(), &["servers", "list", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    crate::support::eventually_blocking(
        Duration::from_secs(30),
        "the configured server starts",
        || {
            listed()
                .iter()
                .any(|s| s["name"] == "inner" && s["state"] == "running")
                .then_some(())
        },
    );
    let status = guildhall_ok(dir.path(), &["status"]);
    assert!(
        status.contains("mcp servers") && status.contains("inner"),
        "{status}"
    );

    // Another, added at run time under another name.
    let mut args = vec![
        "servers",
        "add",
        "second",
        "--tool",
        "echo",
        "--env",
        "RUST_LOG=off",
        "--",
    ];
    let second_dir = dir.path().join("second").display().to_string();
    let second = inner_server(Path::new(&second_dir));
    args.push(&second.command);
    args.extend(second.args.iter().map(String::as_str));
    guildhall_ok(dir.path(), &args);
    let second = crate::support::eventually_blocking(
        Duration::from_secs(30),
        "the added server starts",
        || {
            listed()
                .into_iter()
                .find(|s| s["name"] == "second" && s["state"] == "running")
        },
    );
    assert_eq!(
        second["tools"],
        json!(["mcp__second__echo"]),
        "only the tools asked for"
    );

    let out = guildhall_ok(dir.path(), &["servers", "remove", "second"]);
    assert!(out.contains("removed"), "{out}");
    assert!(listed().iter().all(|s| s["name"] != "second"));
    let failed = crate::support::guildhall(dir.path())
        .args(["servers", "remove", "nope"])
        .output()
        .unwrap();
    assert!(!failed.status.success());
    assert!(String::from_utf8_lossy(&failed.stderr).contains("no server named `nope`"));
}

#[tokio::test]
async fn a_server_past_its_memory_limit_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    let mut config = inner_server(dir.path());
    // Any real process uses more than one MiB: the limit is passed at the first check.
    config.max_rss_mib = Some(1);
    servers.add("inner", config).await.unwrap();
    eventually(Duration::from_secs(30), || async {
        let info = info(&servers, "inner").await;
        info.starts >= 2
            && info
                .last_end
                .as_deref()
                .is_some_and(|r| r.contains("over max_rss_mib = 1"))
    })
    .await;
    rt.shutdown().await;
}

#[tokio::test]
async fn a_team_config_gives_each_role_its_external_tools_and_audit_names_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let inner = inner_server(dir.path());
    let config_file = dir.path().join("guildhall.toml");
    std::fs::write(
        &config_file,
        r#"
[roles.tl]
tools = ["mcp__inner__*", "send_message"]

[roles.pm]
tools = ["mcp__inner__check_*", "word_count"]

[roles.worker]
tools = ["send_message", "check_inbox", "context_*"]

[commands.word_count]
description = "Counts words"
command = ["wc", "-w"]
"#,
    )
    .unwrap();
    let config = guildhall::config::Config::load(&config_file, true).unwrap();
    let roles = config.role_tools().unwrap();
    let rt = Runtime::builder()
        .governance(config.governance())
        .build()
        .await
        .unwrap();
    let servers = Servers::start(&rt, dir.path().to_owned(), None)
        .await
        .unwrap();
    servers.add("inner", inner).await.unwrap();
    running(&servers, "inner", 1).await;
    let _commands = guildhall::commands::Commands::start(&rt, config_file)
        .await
        .unwrap();

    let server = guildhall::mcp::McpServer::new(rt.clone());
    let mut seen = std::collections::BTreeMap::new();
    for (agent, role) in [("lead", "tl"), ("planner", "pm"), ("w1", "worker")] {
        let (connection, _) = guildhall::mcp::local::bind(
            &server,
            &roles,
            agent.into(),
            Some(role.into()),
            None,
            None,
        )
        .await
        .unwrap();
        let names: Vec<String> = connection
            .visible_tools()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        seen.insert(role, names);
    }
    let tl = &seen["tl"];
    assert!(
        tl.contains(&"mcp__inner__echo".to_owned()) && tl.contains(&"send_message".to_owned()),
        "{tl:?}"
    );
    assert!(!tl.contains(&"word_count".to_owned()), "{tl:?}");
    assert_eq!(seen["pm"], ["mcp__inner__check_inbox", "word_count"]);
    assert!(
        seen["worker"]
            .iter()
            .all(|t| !t.starts_with("mcp__") && t != "word_count"),
        "{:?}",
        seen["worker"]
    );

    // The audit record of a proxied call names the server in the tool's name.
    let agent = rt.agent("lead").unwrap();
    rt.call_json(
        "mcp__inner__echo",
        echo("audited"),
        CallOptions::new().as_agent(&agent),
    )
    .await
    .unwrap();
    let records = audited(&rt, "lead").await;
    assert!(
        records.iter().any(|r| r.tool == "mcp__inner__echo"),
        "{records:#?}"
    );
    servers.remove("inner").await.unwrap();
    rt.shutdown().await;
}

#[tokio::test]
async fn a_server_at_a_url_is_proxied_over_streamable_http_with_its_headers() {
    let upstream = Runtime::builder()
        .tool(guildhall::bench::mcp::Echo)
        .build()
        .await
        .unwrap();
    let (url, stop) =
        crate::support::http_endpoint(&upstream, guildhall::mcp::http::HttpOptions::default())
            .await;
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;

    // Settings that do not fit together are refused, naming the field.
    let mut both = ServerConfig::http(&url);
    both.command = "node".into();
    let mut ftp = ServerConfig::http("ftp://127.0.0.1/mcp");
    ftp.headers.insert("X".into(), "y".into());
    let mut rss = ServerConfig::http(&url);
    rss.max_rss_mib = Some(10);
    for (config, says) in [(both, "not both"), (ftp, "http://"), (rss, "max_rss_mib")] {
        let refused = servers.add("bad", config).await.unwrap_err().to_string();
        assert!(refused.contains(says), "{refused}");
    }

    let mut config = ServerConfig::http(&url);
    config
        .headers
        .insert("Guildhall-Agent".into(), "proxy".into());
    config.timeout = Duration::from_secs(5);
    servers.add("up", config).await.unwrap();
    eventually(Duration::from_secs(30), || async {
        info(&servers, "up").await.state == ServerState::Running
    })
    .await;
    let listed = info(&servers, "up").await;
    assert_eq!((listed.command.as_str(), listed.pid), (url.as_str(), None));
    assert!(
        listed.tools.contains(&"mcp__up__echo".to_owned()),
        "{listed:?}"
    );

    let out = rt
        .call_json("mcp__up__echo", echo("over http"), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(out["text"], "over http", "{out}");
    assert!(
        upstream.lookup_agent("proxy").is_some(),
        "the configured header reached the server: it registered the agent it names"
    );

    // The server going away: a call answers (an error), never hangs.
    stop.cancel();
    upstream.shutdown().await;
    let gone = rt
        .call_json("mcp__up__echo", echo("anyone?"), CallOptions::new())
        .await;
    assert!(
        matches!(&gone, Err(CallError::Crashed { reason, .. }) if reason.contains("connection closed")),
        "{gone:?}"
    );
    // Its heartbeat finds it gone: shown down, saying why, and reconnected with backoff.
    eventually(Duration::from_secs(20), || async {
        let now = info(&servers, "up").await;
        now.state != ServerState::Running
            && now
                .last_end
                .is_some_and(|why| why.contains("did not answer a ping"))
    })
    .await;
    servers.remove("up").await.unwrap();
    rt.shutdown().await;
}

/// Calls `tool` `n` times at once (each call's `n` its number: no loop guard sees the same
/// call repeated); the answers' texts.
async fn at_once(rt: &Runtime, tool: &str, n: usize, input: Value) -> Vec<String> {
    let calls = (0..n).map(|i| {
        let mut input = input.clone();
        input["n"] = json!(i.to_string());
        rt.call_json(tool, input, CallOptions::new())
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|answer| answer.unwrap().as_str().unwrap().trim().to_owned())
        .collect()
}

#[tokio::test]
async fn instances_run_copies_that_each_take_one_call_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    // The inner server's command tool answers with its server's pid ($PPID), and notices
    // another call running on the same server at the same time (mkdir is atomic).
    let inner_config = dir.path().join("inner.toml");
    std::fs::write(
        &inner_config,
        r#"
# $PPID is the serving process only outside a sandbox (inside, the parent is not in the
# command's PID namespace).
[sandbox]
enabled = false
[commands.serving_pid]
description = "The serving process, and whether another call overlapped on it"
shell = true
command = ['mkdir "$1/$PPID" 2>/dev/null || echo overlap; sleep 0.3; echo "$PPID"; rmdir "$1/$PPID" 2>/dev/null; true', "{dir}", "{n}"]
"#,
    )
    .unwrap();
    let inner_config = inner_config.display().to_string();
    let server = |instances: usize| {
        let mut config = inner_serving(dir.path(), &["--config", &inner_config]);
        config.instances = instances;
        config
    };
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    servers.add("pooled", server(2)).await.unwrap();
    servers.add("shared", server(1)).await.unwrap();
    eventually(Duration::from_secs(30), || async {
        let list = servers.list().await;
        list.len() == 3
            && list.iter().all(|s| s.state == ServerState::Running)
            && rt.tool("mcp__pooled__serving_pid").is_some()
            && rt.tool("mcp__shared__serving_pid").is_some()
    })
    .await;
    let list = servers.list().await;
    let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["pooled", "pooled#2", "shared"]);
    let pooled: std::collections::BTreeSet<String> = list[..2]
        .iter()
        .map(|s| s.pid.unwrap().to_string())
        .collect();
    assert_eq!(pooled.len(), 2, "two processes");
    assert!(list[1].tools.is_empty(), "the first copy holds the tools");

    let scratch = json!({ "dir": dir.path() });
    let answers = at_once(&rt, "mcp__pooled__serving_pid", 4, scratch.clone()).await;
    assert!(
        answers.iter().all(|a| !a.contains("overlap")),
        "no copy ran two calls at once: {answers:?}"
    );
    let served: std::collections::BTreeSet<String> = answers.into_iter().collect();
    assert_eq!(served, pooled, "the calls were spread over both copies");

    // The control: one copy, no bound, the same calls do overlap.
    let answers = at_once(&rt, "mcp__shared__serving_pid", 4, scratch).await;
    assert!(answers.iter().any(|a| a.contains("overlap")), "{answers:?}");

    let too_many = servers.add("many", server(65)).await.unwrap_err();
    assert!(
        too_many.to_string().contains("`instances` is 65"),
        "{too_many}"
    );
    servers.remove("pooled").await.unwrap();
    servers.remove("shared").await.unwrap();
    assert!(servers.list().await.is_empty());
    rt.shutdown().await;
}

/// The calling client in a test: answers every question with `answer` and keeps what it
/// was asked.
struct AnsweringClient {
    answer: Value,
    asked: std::sync::Mutex<Vec<Value>>,
}

impl guildhall::CallObserver for AnsweringClient {
    fn elicit(&self, _: &guildhall::CallContext, request: Value) -> Option<guildhall::Elicitation> {
        self.asked.lock().unwrap().push(request);
        let answer = self.answer.clone();
        Some(Box::pin(async move { Ok(answer) }))
    }
}

#[tokio::test]
async fn a_server_s_question_reaches_the_calling_client_and_its_answer_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = inner_serving(dir.path(), &["--conformance-fixtures"]);
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    servers.add("asker", config).await.unwrap();
    eventually(Duration::from_secs(30), || async {
        rt.tool("mcp__asker__test_elicitation").is_some()
    })
    .await;

    let client = Arc::new(AnsweringClient {
        answer: json!({ "action": "accept", "content": { "name": "Ada" } }),
        asked: std::sync::Mutex::default(),
    });
    let out = rt
        .call_json(
            "mcp__asker__test_elicitation",
            json!({ "message": "Who are you?" }),
            CallOptions::new().observer(client.clone()),
        )
        .await
        .unwrap();
    let text = out.as_str().unwrap_or_default();
    assert!(text.contains("accept") && text.contains("Ada"), "{out}");
    let asked = client.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["message"], "Who are you?");
    assert_eq!(asked[0]["mode"], "form");

    // A caller whose client cannot be asked: the server hears why, and so does the caller.
    let refused = rt
        .call_json(
            "mcp__asker__test_elicitation",
            json!({ "message": "Anyone?" }),
            CallOptions::new(),
        )
        .await;
    let Err(CallError::Tool { message, .. }) = refused else {
        panic!("{refused:?}")
    };
    assert!(
        message.contains("cannot relay") && message.contains("does not support elicitation"),
        "{message}"
    );
    servers.remove("asker").await.unwrap();
    rt.shutdown().await;
}

#[tokio::test]
async fn a_proxied_server_s_flood_is_truncated_for_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let inner_config = dir.path().join("inner.toml");
    // The inner server keeps more than the outer lets a model see.
    std::fs::write(
        &inner_config,
        "[truncate]\nmax_lines = 100000\nmax_bytes = 10000000\n\n[commands.flood]\ndescription = \"Floods\"\ncommand = [\"seq\", \"1\", \"100000\"]\n",
    )
    .unwrap();
    let config = inner_serving(
        dir.path(),
        &["--config", &inner_config.display().to_string()],
    );
    let governance = GovernanceConfig {
        spill_dir: Some(dir.path().join("spill")),
        truncate: guildhall::governance::truncate::Limits {
            max_lines: 50,
            max_bytes: 50 * 1024,
        },
        ..GovernanceConfig::default()
    };
    let (rt, servers) = with_servers(governance).await;
    servers.add("inner", config).await.unwrap();
    eventually(Duration::from_secs(30), || async {
        rt.tool("mcp__inner__flood").is_some()
    })
    .await;
    let reply = rt
        .call_reply("mcp__inner__flood", json!({}), CallOptions::new())
        .await
        .unwrap();
    let cut = reply.truncated.expect("the flood is cut");
    assert!(
        cut.text.contains("showing lines 1-50 of 100000"),
        "{}",
        cut.text
    );
    let whole = std::fs::read_to_string(&cut.path).unwrap();
    assert!(whole.trim_end().ends_with("100000"), "kept whole on disk");
    servers.remove("inner").await.unwrap();
    rt.shutdown().await;
}

/// An inner command tool that starts a sleeper, writes its pid to `file` and waits: a call
/// that runs until it is cancelled, whose sleeper the test watches.
const LINGER: &str = r#"
[commands.linger]
description = "Starts a sleeper, writes its pid, and waits"
shell = true
command = ['sleep 600 & echo $! >> "$1"; wait', "{file}"]
timeout = "10min"
"#;

/// Calls the inner server's `linger` in a task of its own: the call, and the sleeper's pid
/// once its command runs.
async fn lingering(
    rt: &Runtime,
    pid_file: &Path,
) -> (tokio::task::JoinHandle<Result<Value, CallError>>, i32) {
    let call = tokio::spawn({
        let (rt, file) = (rt.clone(), pid_file.to_path_buf());
        async move {
            rt.call_json(
                "mcp__inner__linger",
                json!({ "file": file }),
                CallOptions::new(),
            )
            .await
        }
    });
    (call, crate::support::pids(pid_file, 1).await[0])
}

#[tokio::test]
async fn a_call_cancelled_here_is_cancelled_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let inner_config = dir.path().join("inner.toml");
    std::fs::write(
        &inner_config,
        format!("# The sleeper's pid as the test sees it: outside a PID namespace.\n[sandbox]\nenabled = false\n{LINGER}"),
    )
    .unwrap();
    let config = inner_serving(
        dir.path(),
        &["--config", &inner_config.display().to_string()],
    );
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    servers.add("inner", config).await.unwrap();
    // Serving (its tools are registered just before it shows as running).
    let server_pid = running(&servers, "inner", 1).await;
    assert!(rt.tool("mcp__inner__linger").is_some());

    let pid_file = dir.path().join("pids");
    // Dropped once its command runs (a deadline could pass before the command started on
    // a loaded machine, and the sleeper would never be written down).
    let (call, sleeper) = lingering(&rt, &pid_file).await;
    call.abort();
    assert!(
        call.await.is_err_and(|e| e.is_cancelled()),
        "the call was still running"
    );
    // The server heard `notifications/cancelled` and stopped its own call, killing the
    // command it ran; the server itself answered the probe and kept running.
    eventually(Duration::from_secs(10), || async move {
        crate::support::process_gone(sleeper)
    })
    .await;
    let after = info(&servers, "inner").await;
    assert_eq!(
        (after.state, after.pid, after.starts),
        (ServerState::Running, Some(server_pid), 1)
    );
    servers.remove("inner").await.unwrap();
    rt.shutdown().await;
}

#[tokio::test]
async fn a_call_the_server_runs_as_a_task_is_followed_to_its_end_and_cancelled_there() {
    let dir = tempfile::tempdir().unwrap();
    let inner_config = dir.path().join("inner.toml");
    // Long tools (a deadline of a minute or more) that run past a quarter second become
    // tasks of the inner guildhall, which its client (this one) declared it follows.
    std::fs::write(
        &inner_config,
        format!(
            r#"
[sandbox]
enabled = false
[commands.slow]
description = "Answers after a while"
shell = true
command = ['sleep 0.6; echo "slow $1"', "{{n}}"]
timeout = "10min"
{LINGER}"#
        ),
    )
    .unwrap();
    let config = inner_serving(
        dir.path(),
        &["--config", &inner_config.display().to_string()],
    );
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    servers.add("inner", config).await.unwrap();
    let server_pid = running(&servers, "inner", 1).await;

    let answer = rt
        .call_json(
            "mcp__inner__slow",
            json!({ "n": "one" }),
            CallOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(answer.as_str().map(str::trim), Some("slow one"), "{answer}");
    assert_eq!(info(&servers, "inner").await.tasks, 1, "it came as a task");

    // Cancelled once it is a task: `tasks/cancel` reaches the server, which kills the
    // command its task ran.
    let pid_file = dir.path().join("pids");
    let (call, sleeper) = lingering(&rt, &pid_file).await;
    eventually(Duration::from_secs(10), || async {
        info(&servers, "inner").await.tasks == 2
    })
    .await;
    call.abort();
    assert!(call.await.is_err_and(|e| e.is_cancelled()));
    eventually(Duration::from_secs(10), || async move {
        crate::support::process_gone(sleeper)
    })
    .await;
    let after = info(&servers, "inner").await;
    assert_eq!(
        (after.state, after.pid, after.in_flight),
        (ServerState::Running, Some(server_pid), 0)
    );
    servers.remove("inner").await.unwrap();
    rt.shutdown().await;
}

/// A hostile stdio server, in Python without an SDK: `big` answers 17 MiB on one line,
/// with its id last (as the TypeScript SDK writes it); `flood` sends 2,000
/// `tools/list_changed` before it answers; `small` answers after a tenth of a second. It
/// counts the `tools/list` it is sent in `lists` beside it.
const HOSTILE: &str = r#"
import json, os, sys, time
lists = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lists")
def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    request = json.loads(line)
    method, rid = request.get("method"), request.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "hostile", "version": "1"}}})
    elif method == "tools/list":
        with open(lists, "a") as f:
            f.write("x")
        tool = lambda name: {"name": name, "inputSchema": {"type": "object"}}
        send({"jsonrpc": "2.0", "id": rid,
              "result": {"tools": [tool("big"), tool("flood"), tool("small")]}})
    elif method == "tools/call":
        name = request["params"]["name"]
        if name == "big":
            text = "x" * (17 * 1024 * 1024)
            sys.stdout.write('{"result":{"content":[{"type":"text","text":"%s"}]},"jsonrpc":"2.0","id":%s}\n' % (text, json.dumps(rid)))
            sys.stdout.flush()
            continue
        if name == "small":
            time.sleep(0.1)
        if name == "flood":
            for _ in range(2000):
                sys.stdout.write('{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n')
            sys.stdout.flush()
        send({"jsonrpc": "2.0", "id": rid,
              "result": {"content": [{"type": "text", "text": name}]}})
    elif rid is not None:
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
"#;

/// An answer past rmcp's 16 MiB line limit was dropped, and its caller waited out the whole
/// timeout to hear "timed out"; 2,000 `tools/list_changed` queued 2,000 relists (42 → 830
/// MB). The oversized answer comes back at once as an error naming its size, the server
/// serves on, and the flood costs a relist or two.
#[tokio::test]
async fn a_hostile_server_s_huge_answer_and_notification_flood_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hostile.py");
    std::fs::write(&script, HOSTILE).unwrap();
    let mut config = ServerConfig::command("python3", [script.display().to_string()]);
    config.timeout = Duration::from_secs(120);
    let (rt, servers) = with_servers(GovernanceConfig::default()).await;
    servers.add("hostile", config).await.unwrap();
    running(&servers, "hostile", 1).await;

    let err = rt
        .call_json("mcp__hostile__big", json!({}), CallOptions::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("past the 16777215 bytes"), "{err}");
    assert!(!err.contains("timed out"), "{err}");
    let small = rt
        .call_json("mcp__hostile__small", json!({}), CallOptions::new())
        .await
        .unwrap();
    assert!(small.to_string().contains("small"), "{small}");

    let lists = dir.path().join("lists");
    let before = std::fs::read_to_string(&lists).unwrap().len();
    rt.call_json("mcp__hostile__flood", json!({}), CallOptions::new())
        .await
        .unwrap();
    eventually(Duration::from_secs(30), || async {
        std::fs::read_to_string(&lists).unwrap().len() > before
    })
    .await;
    // Half a second of the server's answers: one relist a notification went on relisting
    // through it (a round trip each), coalesced relists are done.
    for _ in 0..5 {
        rt.call_json("mcp__hostile__small", json!({}), CallOptions::new())
            .await
            .unwrap();
    }
    let relists = std::fs::read_to_string(&lists).unwrap().len() - before;
    assert!(relists <= 3, "{relists} relists for 2,000 notifications");
    servers.remove("hostile").await.unwrap();
    rt.shutdown().await;
}

/// `guildhall serve --stdio --in-memory --config FILE`, spoken to as an MCP client that
/// has made its handshake; its stderr (with `RUST_LOG=log`) goes to `stderr`.
struct Outer {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
    /// Notifications read while waiting for an answer, oldest first.
    notes: std::collections::VecDeque<Value>,
}

impl Outer {
    async fn start(data: &Path, config: &Path, log: &str, stderr: std::process::Stdio) -> Self {
        Self::start_as(data, config, log, stderr, &[]).await
    }

    /// As [`start`](Self::start), with `serve`'s further arguments `extra` (`--agent A`).
    async fn start_as(
        data: &Path,
        config: &Path,
        log: &str,
        stderr: std::process::Stdio,
        extra: &[&str],
    ) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_guildhall"))
            .arg("--data-dir")
            .arg(data)
            .args(["serve", "--stdio", "--in-memory", "--config"])
            .arg(config)
            .args(extra)
            .env("RUST_LOG", log)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut outer = Self {
            child,
            stdin,
            lines,
            next_id: 0,
            notes: std::collections::VecDeque::new(),
        };
        let init = outer
            .request(
                "initialize",
                json!({ "protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "lists-once", "version": "1"} }),
            )
            .await;
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        outer
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        outer
    }

    /// Writes `line` (one JSON-RPC message).
    async fn send(&mut self, line: Value) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }

    /// Sends request `method` and returns its answer, keeping the notifications read
    /// meanwhile for [`next_notification`](Self::next_notification) and skipping requests
    /// from the server.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let (lines, notes) = (&mut self.lines, &mut self.notes);
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the server answers");
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == id && message.get("method").is_none() {
                    return message;
                }
                if message.get("id").is_none() {
                    notes.push_back(message);
                }
            }
        })
        .await
        .expect("an answer in time")
    }

    /// The next notification from the server, waited for.
    async fn next_notification(&mut self) -> Value {
        if let Some(note) = self.notes.pop_front() {
            return note;
        }
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .unwrap()
                .expect("the server is running");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("id").is_none() {
                return message;
            }
        }
    }

    async fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.kill().await;
    }
}

#[tokio::test]
async fn the_first_listing_has_the_tools_of_a_server_that_takes_a_second_to_start() {
    let dir = tempfile::tempdir().unwrap();
    // `slow` answers its handshake a second after it is started (unsandboxed: the program
    // it runs is named inside a shell line, which the sandbox does not read); `stuck`
    // never does, and a listing waits for it one second at most.
    let inner = inner_server(dir.path());
    let slow = format!(
        "sleep 1; exec {}",
        std::iter::once(&inner.command)
            .chain(&inner.args)
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let config = format!(
        "[servers.slow]\ncommand = \"sh\"\nargs = [\"-c\", {slow:?}]\nenv = {{ RUST_LOG = \"off\" }}\n\
         sandbox = {{ enabled = false }}\n\n\
         [servers.stuck]\ncommand = \"sleep\"\nargs = [\"60\"]\nstartup_timeout = \"60s\"\nlisting_wait = \"1s\"\n"
    );
    let config_file = dir.path().join("guildhall.toml");
    std::fs::write(&config_file, config).unwrap();
    let mut outer = Outer::start(
        &dir.path().join("outer"),
        &config_file,
        "off",
        std::process::Stdio::null(),
    )
    .await;
    // Listed once, at once, as many clients do.
    let listed = outer.request("tools/list", json!({})).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"mcp__slow__echo"), "{names:?}");
    // The one still starting is not waited for past its listing_wait.
    assert!(
        !names.iter().any(|n| n.starts_with("mcp__stuck__")),
        "{names:?}"
    );
    assert!(names.contains(&"send_message"), "{names:?}");
    outer.stop().await;
}

/// A stdio MCP server with one tool, `shout`, that logs a 100 KB message and then 100
/// short ones (`notifications/message`) before it answers.
const CHATTY_SERVER: &str = r#"
import json, sys
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, rid = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}, "logging": {}},
                  "serverInfo": {"name": "chatty", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "shout", "description": "logs a lot",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "warning", "logger": "big", "data": "long-" + "x" * 100000}})
        for i in range(100):
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "logger": "disk", "data": "disk almost full %d" % i}})
        result = {"content": [{"type": "text", "text": "shouted"}]}
    else:
        result = {}
    send({"jsonrpc": "2.0", "id": rid, "result": result})
"#;

#[tokio::test]
async fn what_a_proxied_server_logs_reaches_the_log_cut_and_rate_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("chatty.py");
    std::fs::write(&script, CHATTY_SERVER).unwrap();
    let config_file = dir.path().join("guildhall.toml");
    std::fs::write(
        &config_file,
        format!(
            "[servers.chatty]\ncommand = \"/usr/bin/python3\"\nargs = [{:?}]\n",
            script.display().to_string()
        ),
    )
    .unwrap();
    let log_file = dir.path().join("outer.log");
    let mut outer = Outer::start(
        &dir.path().join("outer"),
        &config_file,
        "info",
        std::fs::File::create(&log_file).unwrap().into(),
    )
    .await;
    // The listing waits for the server's first start.
    let listed = outer.request("tools/list", json!({})).await.to_string();
    assert!(listed.contains("mcp__chatty__shout"), "{listed}");
    let answer = outer
        .request(
            "tools/call",
            json!({"name": "mcp__chatty__shout", "arguments": {}}),
        )
        .await
        .to_string();
    assert!(answer.contains("shouted"), "{answer}");
    let log = crate::support::eventually_some(
        Duration::from_secs(20),
        "the server's log messages are written",
        async || {
            let log = std::fs::read_to_string(&log_file).unwrap_or_default();
            log.contains("are dropped and counted").then_some(log)
        },
    )
    .await;
    // The long one cut; the short ones up to the rate, the rest counted.
    let long = log
        .lines()
        .find(|l| l.contains("long-xxx"))
        .expect("the long message");
    assert!(
        long.contains("more bytes cut") && long.len() < 4096,
        "{long}"
    );
    assert!(long.contains("chatty"), "{long}");
    let short = log
        .lines()
        .filter(|l| l.contains("disk almost full"))
        .count();
    assert!((1..=40).contains(&short), "{short} written:\n{log}");
    outer.stop().await;
}

/// A stdio MCP server with resources (two, a template, subscriptions), a prompt with a
/// completable argument, and a tool `publish` that adds a resource (`list_changed`) and
/// updates the first one (`resources/updated`, when subscribed).
const LIBRARY_SERVER: &str = r#"
import json, sys
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
books = {"lib://books/1": "Dune", "lib://books/2": "Emma"}
subscribed = set()
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, rid, params = msg.get("method"), msg["id"], msg.get("params") or {}
    error = None
    if method == "initialize":
        result = {"protocolVersion": params["protocolVersion"],
                  "capabilities": {"tools": {}, "resources": {"subscribe": True, "listChanged": True},
                                   "prompts": {"listChanged": True}, "completions": {}},
                  "serverInfo": {"name": "library", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "publish", "description": "adds a book",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        books["lib://books/%d" % (len(books) + 1)] = "New"
        send({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"})
        if "lib://books/1" in subscribed:
            send({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                  "params": {"uri": "lib://books/1"}})
        result = {"content": [{"type": "text", "text": "published"}]}
    elif method == "resources/list":
        result = {"resources": [{"uri": u, "name": t, "mimeType": "text/plain"} for u, t in books.items()]}
    elif method == "resources/templates/list":
        result = {"resourceTemplates": [{"uriTemplate": "lib://books/{id}", "name": "book"}]}
    elif method == "resources/read":
        uri = params["uri"]
        if uri in books:
            result = {"contents": [{"uri": uri, "mimeType": "text/plain", "text": books[uri]}]}
        else:
            error = {"code": -32002, "message": "no book " + uri}
    elif method == "resources/subscribe":
        subscribed.add(params["uri"]); result = {}
    elif method == "resources/unsubscribe":
        subscribed.discard(params["uri"]); result = {}
    elif method == "prompts/list":
        result = {"prompts": [{"name": "review", "arguments": [{"name": "title", "required": True}]}]}
    elif method == "prompts/get":
        result = {"messages": [{"role": "user", "content": {"type": "text",
                  "text": "Review " + params["arguments"]["title"]}}]}
    elif method == "completion/complete":
        typed = params["argument"]["value"]
        result = {"completion": {"values": [t for t in books.values() if t.startswith(typed)]}}
    else:
        result = {}
    if error:
        send({"jsonrpc": "2.0", "id": rid, "error": error})
    else:
        send({"jsonrpc": "2.0", "id": rid, "result": result})
"#;

/// `guildhall.toml` proxying the library server (as `lib`), with `extra` after it.
fn library_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let script = dir.join("library.py");
    std::fs::write(&script, LIBRARY_SERVER).unwrap();
    let config_file = dir.join("guildhall.toml");
    std::fs::write(
        &config_file,
        format!(
            "[servers.lib]\ncommand = \"/usr/bin/python3\"\nargs = [{:?}]\n{extra}",
            script.display().to_string()
        ),
    )
    .unwrap();
    config_file
}

#[tokio::test]
async fn a_proxied_server_s_resources_prompts_and_completions_are_served_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    // Its prompts are denied: a rule on the access tool holds for them as for a tool.
    let config_file = library_config(
        dir.path(),
        "\n[[rules]]\ntool = \"mcp__lib.get_prompt\"\naction = \"deny\"\n",
    );
    let mut outer = Outer::start_as(
        &dir.path().join("outer"),
        &config_file,
        "off",
        std::process::Stdio::null(),
        &["--agent", "reader"],
    )
    .await;
    // Listed the first time, beside guildhall's own, under guildhall's URIs.
    let listed = outer.request("resources/list", json!({})).await;
    let uris: Vec<&str> = listed["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert!(uris.contains(&"guildhall://agents"), "{uris:?}");
    assert!(
        uris.contains(&"guildhall://mcp/lib/lib://books/1")
            && uris.contains(&"guildhall://mcp/lib/lib://books/2"),
        "{uris:?}"
    );
    let templates = outer.request("resources/templates/list", json!({})).await;
    assert!(
        templates
            .to_string()
            .contains("guildhall://mcp/lib/lib://books/{id}"),
        "{templates}"
    );
    // A read answers what the server does, under the URI it was asked by.
    let read = outer
        .request(
            "resources/read",
            json!({"uri": "guildhall://mcp/lib/lib://books/1"}),
        )
        .await;
    assert_eq!(read["result"]["contents"][0]["text"], "Dune", "{read}");
    assert_eq!(
        read["result"]["contents"][0]["uri"], "guildhall://mcp/lib/lib://books/1",
        "{read}"
    );
    // The server's refusal is an error naming what it said.
    let missing = outer
        .request(
            "resources/read",
            json!({"uri": "guildhall://mcp/lib/lib://books/9"}),
        )
        .await;
    assert!(
        missing["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no book lib://books/9")),
        "{missing}"
    );
    // A URI of no server is refused by name.
    let unknown = outer
        .request(
            "resources/read",
            json!({"uri": "guildhall://mcp/nope/x://y"}),
        )
        .await;
    assert!(
        unknown["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`nope`")),
        "{unknown}"
    );
    // Its prompts: hidden from the listing and refused, as the rule says.
    let prompts = outer.request("prompts/list", json!({})).await;
    assert!(!prompts.to_string().contains("mcp__lib__"), "{prompts}");
    assert!(prompts.to_string().contains("tech-lead"), "{prompts}");
    let got = outer
        .request(
            "prompts/get",
            json!({"name": "mcp__lib__review", "arguments": {"title": "Emma"}}),
        )
        .await;
    assert!(
        got["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("may not") && m.contains("mcp__lib.get_prompt")),
        "{got}"
    );
    // A completion of a template's variable, by the server.
    let completed = outer
        .request(
            "completion/complete",
            json!({"ref": {"type": "ref/resource", "uri": "guildhall://mcp/lib/lib://books/{id}"},
                   "argument": {"name": "id", "value": "E"}}),
        )
        .await;
    assert_eq!(
        completed["result"]["completion"]["values"],
        json!(["Emma"]),
        "{completed}"
    );
    // Subscribed: the server's update and its list change both reach this client.
    let subscribed = outer
        .request(
            "resources/subscribe",
            json!({"uri": "guildhall://mcp/lib/lib://books/1"}),
        )
        .await;
    assert!(subscribed["result"].is_object(), "{subscribed}");
    // What was heard so far (the lists' first filling) is not what is tested below.
    outer.notes.clear();
    let published = outer
        .request(
            "tools/call",
            json!({"name": "mcp__lib__publish", "arguments": {}}),
        )
        .await;
    assert!(published.to_string().contains("published"), "{published}");
    let mut heard = std::collections::BTreeSet::new();
    while heard.len() < 2 {
        let note = tokio::time::timeout(Duration::from_secs(20), outer.next_notification())
            .await
            .expect("the server's notifications are relayed");
        match note["method"].as_str() {
            Some("notifications/resources/updated") => {
                assert_eq!(note["params"]["uri"], "guildhall://mcp/lib/lib://books/1");
                heard.insert("updated");
            }
            Some("notifications/resources/list_changed") => {
                heard.insert("list_changed");
            }
            _ => {}
        }
    }
    let relisted = outer.request("resources/list", json!({})).await;
    assert!(
        relisted
            .to_string()
            .contains("guildhall://mcp/lib/lib://books/3"),
        "{relisted}"
    );
    outer.stop().await;
}

#[tokio::test]
async fn a_read_of_a_proxied_resource_is_a_governed_audited_call_of_its_access_tool() {
    let dir = tempfile::tempdir().unwrap();
    let config_file = library_config(dir.path(), "");
    let config = guildhall::config::Config::load(&config_file, true).unwrap();
    let rt = Runtime::builder()
        .governance(config.governance())
        .build()
        .await
        .unwrap();
    let servers = Servers::start(&rt, dir.path().to_owned(), None)
        .await
        .unwrap();
    servers
        .add("lib", config.servers["lib"].clone())
        .await
        .unwrap();
    eventually(Duration::from_secs(30), || async {
        rt.tool("mcp__lib.read_resource").is_some()
    })
    .await;
    // Not among the tools a client lists, but a tool all the same.
    assert!(
        !rt.listed_tools()
            .iter()
            .any(|t| t.name.starts_with("mcp__lib.")),
        "the access tools are unlisted"
    );
    assert!(rt.tool("mcp__lib.get_prompt").is_some() && rt.tool("mcp__lib.complete").is_some());
    let agent = rt
        .register_agent(guildhall::AgentSpec::new("reader", "agent"))
        .await
        .unwrap();
    let read = rt
        .call_json(
            "mcp__lib.read_resource",
            json!({"uri": "lib://books/2"}),
            CallOptions::new().as_agent(&agent),
        )
        .await
        .unwrap();
    assert_eq!(read["contents"][0]["text"], "Emma", "{read}");
    let records = audited(&rt, "reader").await;
    assert!(
        records.iter().any(|r| r.tool == "mcp__lib.read_resource"),
        "{records:#?}"
    );
    // Removing the server removes its access tools.
    servers.remove("lib").await.unwrap();
    assert!(rt.tool("mcp__lib.read_resource").is_none());
    rt.shutdown().await;
}

#[tokio::test]
async fn a_crash_storm_leaves_no_process_behind_and_quarantines_a_server_that_cannot_start() {
    // Ten servers crashing on every call, fifty cycles in all, one server that exits as
    // it starts, and another agent checking its inbox throughout (its latency is the
    // bench's figure, not this test's).
    let report = guildhall::bench::storm(guildhall::bench::StormBenchConfig {
        floor: vec![
            env!("CARGO_BIN_EXE_guildhall").into(),
            "bench".into(),
            "mcp-floor".into(),
        ],
        servers: 10,
        cycles: 50,
        quiet_calls: 100,
        max_duration: Duration::from_secs(120),
    })
    .await
    .unwrap();
    assert!(report.cycles >= 50, "{report:?}");
    assert_eq!(report.orphans, 0, "{report:?}");
    assert!(
        report.storm_calls > 0,
        "the other agent was served: {report:?}"
    );
    assert!(
        report.start_breaker_open && report.failed_starts >= 3,
        "{report:?}"
    );
}

/// `[mcp] disclose_after` with 300 proxied tools: a connection lists guildhall's own tools
/// and `find_tools`; what its agent finds joins its listing, announced with
/// `tools/list_changed`, and stays its agent's (another agent still sees none). The search
/// never shows a tool governance denies the caller, and a tool not found yet is still
/// callable by name.
#[tokio::test]
async fn past_the_bound_an_agent_lists_the_proxied_tools_it_finds() {
    use crate::mcp::Wire;
    use guildhall::mcp::{McpServer, ToolFilter};

    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    let topics = [
        "weather", "invoice", "calendar", "ticket", "deploy", "billing",
    ];
    let manifest: String = (0..300)
        .map(|i| {
            let topic = topics[i % topics.len()];
            format!(
                "[commands.{topic}_{i}]\ndescription = \"Looks up {topic} record {i}\"\n\
                 command = [\"printf\", \"{topic} {i}\"]\n\n"
            )
        })
        .collect();
    std::fs::write(inner.join("guildhall.toml"), manifest).unwrap();
    let governance = GovernanceConfig {
        rules: vec![Rule::new("mcp__big__deploy_*", Action::Deny).unwrap()],
        ..GovernanceConfig::default()
    };
    let rt = Runtime::builder()
        .governance(governance)
        .tool_search()
        .build()
        .await
        .unwrap();
    let servers = Servers::start(&rt, std::env::temp_dir(), None)
        .await
        .unwrap();
    servers
        .add("big", inner_serving(dir.path(), &[]))
        .await
        .unwrap();
    let proxied = |rt: &Runtime| {
        rt.tools()
            .iter()
            .filter(|t| t.name.starts_with("mcp__big__"))
            .count()
    };
    eventually(Duration::from_secs(60), || async { proxied(&rt) >= 300 }).await;
    for agent in ["alice", "bob"] {
        rt.register_agent(guildhall::AgentSpec::new(agent, "dev"))
            .await
            .unwrap();
    }
    let server = McpServer::new(rt.clone()).with_disclosure(Some(100));
    let names = |listed: &Value| -> Vec<String> {
        listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let shown_proxied = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|n| n.starts_with("mcp__"))
            .cloned()
            .collect()
    };
    let mut alice =
        Wire::legacy(server.connection(Some(Arc::from("alice")), ToolFilter::all())).await;
    let listed = names(&alice.request(1, "tools/list", json!({})).await);
    assert!(shown_proxied(&listed).is_empty(), "{listed:?}");
    assert!(
        listed.contains(&"find_tools".to_owned()) && listed.contains(&"send_message".to_owned()),
        "{listed:?}"
    );

    let found = alice
        .request(
            2,
            "tools/call",
            json!({"name": "find_tools", "arguments": {"query": "invoice", "limit": 3}}),
        )
        .await;
    let result = &found["result"]["structuredContent"];
    let found_names: Vec<String> = result["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{found}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(found_names.len(), 3, "{found}");
    assert!(
        found_names
            .iter()
            .all(|n| n.starts_with("mcp__big__invoice_")),
        "{found_names:?}"
    );
    assert_eq!(
        result["more"],
        json!(47),
        "50 invoice tools in all: {found}"
    );
    assert_eq!(
        result["tools"][0]["input_schema"]["type"],
        json!("object"),
        "{found}"
    );
    alice
        .next_where(|m| m["method"] == "notifications/tools/list_changed")
        .await;
    let listed = names(&alice.request(3, "tools/list", json!({})).await);
    assert_eq!(
        shown_proxied(&listed),
        found_names,
        "the found tools, no others"
    );

    // An exact name comes first; a denied tool is never found.
    let exact = alice
        .request(
            4,
            "tools/call",
            json!({"name": "find_tools", "arguments": {"query": "mcp__big__weather_174"}}),
        )
        .await;
    assert_eq!(
        exact["result"]["structuredContent"]["tools"][0]["name"],
        json!("mcp__big__weather_174"),
        "{exact}"
    );
    let denied = alice
        .request(
            5,
            "tools/call",
            json!({"name": "find_tools", "arguments": {"query": "deploy", "limit": 50}}),
        )
        .await;
    assert!(
        !denied.to_string().contains("mcp__big__deploy_"),
        "governance denies them: {denied}"
    );
    let refused = alice
        .request(
            6,
            "tools/call",
            json!({"name": "find_tools", "arguments": {"query": " ,;. "}}),
        )
        .await;
    assert!(
        refused.to_string().contains("the query has no words"),
        "{refused}"
    );

    // Found tools are called as any; one not found yet too.
    let called = alice
        .request(
            7,
            "tools/call",
            json!({"name": found_names[0].clone(), "arguments": {}}),
        )
        .await;
    assert!(called.to_string().contains("invoice "), "{called}");
    let unlisted = alice
        .request(
            8,
            "tools/call",
            json!({"name": "mcp__big__calendar_2", "arguments": {}}),
        )
        .await;
    assert!(unlisted.to_string().contains("calendar 2"), "{unlisted}");

    // The agent's other connections (a stateless one too) list what it found; another
    // agent lists none of it.
    let mut stateless =
        Wire::stateless(server.connection(Some(Arc::from("alice")), ToolFilter::all())).await;
    let listed = names(&stateless.request(1, "tools/list", json!({})).await);
    let mut expected = found_names.clone();
    expected.push("mcp__big__weather_174".into());
    expected.sort();
    assert_eq!(shown_proxied(&listed), expected);
    let mut bob = Wire::legacy(server.connection(Some(Arc::from("bob")), ToolFilter::all())).await;
    let listed = names(&bob.request(1, "tools/list", json!({})).await);
    assert!(shown_proxied(&listed).is_empty(), "{listed:?}");

    // Below the bound, every tool is listed.
    let all = McpServer::new(rt.clone()).with_disclosure(Some(1_000));
    let mut carol = Wire::legacy(all.connection(Some(Arc::from("bob")), ToolFilter::all())).await;
    let page = carol.request(1, "tools/list", json!({})).await;
    assert!(
        page["result"]["nextCursor"].is_string() && shown_proxied(&names(&page)).len() > 30,
        "more than a page: {}",
        names(&page).len()
    );
    drop(servers);
    rt.shutdown().await;
}
