//! `guildhall hook`: Claude Code's hooks answered by the running server, with the inputs
//! Claude Code sends (`tests/data/claude-hooks/`).

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use serde_json::Value;

use crate::support::{guildhall, guildhall_ok, serve_in_background};

/// A hook input in Claude Code's shape, from `tests/data/claude-hooks/`.
fn input(event: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/claude-hooks")
        .join(format!("{event}.json"));
    std::fs::read_to_string(path).unwrap()
}

/// Runs `guildhall hook` as `agent` (none: no GUILDHALL_AGENT) with `stdin`, and `extra`
/// arguments; asserts it exited 0 and returns its stdout.
fn hook(dir: &Path, agent: Option<&str>, stdin: &str, extra: &[&str]) -> String {
    let mut command = guildhall(dir);
    command
        .arg("hook")
        .args(extra)
        .env_remove("GUILDHALL_AGENT")
        .env_remove("GUILDHALL_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(agent) = agent {
        command.env("GUILDHALL_AGENT", agent);
    }
    let mut child = command.spawn().unwrap();
    // A hook that answers before reading all of its input closes the pipe: not an error.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "a hook always exits 0: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The context a Claude-format answer adds for `event`, if it adds one.
fn context(out: &str, event: &str) -> Option<String> {
    if out.is_empty() {
        return None;
    }
    let answer: Value = serde_json::from_str(out).unwrap();
    assert_eq!(
        answer["hookSpecificOutput"]["hookEventName"], event,
        "{answer}"
    );
    Some(
        answer["hookSpecificOutput"]["additionalContext"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

fn send(dir: &Path, to: &str, subject: &str, priority: &str) {
    guildhall_ok(
        dir,
        &[
            "send",
            "--from",
            "pm",
            "--to",
            to,
            "--subject",
            subject,
            "--body",
            &format!("about {subject}"),
            "--priority",
            priority,
        ],
    );
}

#[test]
fn each_message_is_announced_once_urgent_first_even_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let server = serve_in_background(data);
    guildhall_ok(data, &["agents", "register", "pm", "--role", "pm"]);
    guildhall_ok(
        data,
        &[
            "agents", "register", "dev", "--role", "dev", "--parent", "pm",
        ],
    );
    send(data, "dev", "write the parser", "normal");
    send(data, "dev", "the build is red", "urgent");

    // Session start: who it is, its unread mail (urgent first), which is then announced.
    let start = context(
        &hook(data, Some("dev"), &input("SessionStart"), &[]),
        "SessionStart",
    )
    .expect("a session start is always told who it is");
    assert!(
        start.contains("You are agent `dev` (role dev)") && start.contains("reporting to `pm`"),
        "{start}"
    );
    assert!(start.contains("2 unread message(s)"), "{start}");
    let urgent = start
        .find("[urgent] from `pm`: \"the build is red\"")
        .unwrap();
    assert!(urgent < start.find("write the parser").unwrap(), "{start}");
    assert_eq!(
        hook(data, Some("dev"), &input("UserPromptSubmit"), &[]),
        "",
        "announced already"
    );

    // New mail is told once, at the next prompt or tool result, whichever comes first.
    send(data, "dev", "also the docs", "high");
    let told = context(
        &hook(data, Some("dev"), &input("PostToolUse"), &[]),
        "PostToolUse",
    )
    .unwrap();
    assert!(
        told.starts_with("New mail for you (1)")
            && told.contains("[high] from `pm`: \"also the docs\""),
        "{told}"
    );
    assert!(
        told.contains("3 unread in all") && told.contains("check_inbox"),
        "{told}"
    );
    for event in ["PostToolUse", "UserPromptSubmit"] {
        assert_eq!(hook(data, Some("dev"), &input(event), &[]), "", "{event}");
    }

    // What was announced stays announced after a restart: the cursor is in the store.
    guildhall_ok(data, &["stop"]);
    drop(server);
    let _server = serve_in_background(data);
    assert_eq!(hook(data, Some("dev"), &input("UserPromptSubmit"), &[]), "");
    send(data, "dev", "after the restart", "normal");
    let told = hook(data, Some("dev"), &input("UserPromptSubmit"), &[]);
    let told = context(&told, "UserPromptSubmit").unwrap();
    assert!(
        told.contains("\"after the restart\"") && !told.contains("also the docs"),
        "{told}"
    );

    // Plain text for simpler hooks; nothing to say, nothing printed.
    send(data, "dev", "in plain text", "low");
    let plain = hook(
        data,
        Some("dev"),
        "",
        &["--format", "text", "--event", "user-prompt-submit"],
    );
    assert!(
        plain.starts_with("New mail for you (1):\n- from `pm`: \"in plain text\""),
        "{plain}"
    );
    assert_eq!(
        hook(
            data,
            Some("dev"),
            "",
            &["--format", "text", "--event", "post-tool-use"]
        ),
        ""
    );
    // Events guildhall has nothing to say at are let through.
    assert_eq!(hook(data, Some("dev"), &input("Notification"), &[]), "");
}

#[test]
fn a_stop_is_held_while_urgent_work_waits_a_bounded_number_of_times() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    std::fs::write(
        data.join("guildhall.toml"),
        "[roles.dev]\nkeep_going = true\n",
    )
    .unwrap();
    let _server = serve_in_background(data);
    guildhall_ok(data, &["agents", "register", "pm", "--role", "pm"]);
    guildhall_ok(data, &["agents", "register", "dev", "--role", "dev"]);
    guildhall_ok(data, &["agents", "register", "ops", "--role", "ops"]);
    let stop = input("Stop");
    // Nothing waiting: the stop goes through.
    assert_eq!(hook(data, Some("dev"), &stop, &[]), "");

    send(data, "dev", "prod is down", "urgent");
    send(data, "ops", "prod is down", "urgent");
    let held = |out: &str| -> Option<String> {
        (!out.is_empty()).then(|| {
            let answer: Value = serde_json::from_str(out).unwrap();
            assert_eq!(answer["decision"], "block", "{answer}");
            answer["reason"].as_str().unwrap().to_owned()
        })
    };
    let reason = held(&hook(data, Some("dev"), &stop, &[])).expect("held");
    assert!(
        reason.contains("1 unread urgent message(s) (\"prod is down\")"),
        "{reason}"
    );
    // A role that does not keep going stops; so does a turn a stop hook already continued.
    assert_eq!(hook(data, Some("ops"), &stop, &[]), "");
    let continued = stop.replace("\"stop_hook_active\":false", "\"stop_hook_active\":true");
    assert_eq!(hook(data, Some("dev"), &continued, &[]), "");
    // A claimed task still in progress holds the stop too, named with its title.
    guildhall_ok(data, &["inbox", "--agent", "dev", "--take"]);
    assert_eq!(hook(data, Some("dev"), &stop, &[]), "", "nothing waits now");
    let claimed = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let call = |tool: &str, arguments: Value| guildhall::mcp::local::Hello::Call {
            agent: Some("dev".into()),
            token: None,
            tool: tool.into(),
            arguments,
        };
        let create = call(
            "task_create",
            serde_json::json!({"title": "fix the parser"}),
        );
        guildhall::mcp::local::connect(data, &create).await.unwrap();
        let claim = call("task_claim", serde_json::json!({}));
        guildhall::mcp::local::connect(data, &claim)
            .await
            .unwrap()
            .value
    });
    assert_eq!(claimed["task"]["status"], "in_progress", "{claimed}");
    let reason = held(&hook(data, Some("dev"), &stop, &[])).expect("held for the task");
    assert!(
        reason
            .contains("task(s) you claimed still in_progress: #1 \"fix the parser\" (in_progress)"),
        "{reason}"
    );
    assert_eq!(hook(data, Some("dev"), &continued, &[]), "");
    // Never trapped: at most three continuations in a row, then the stop goes through, and
    // the count starts again.
    let subagent = input("SubagentStop");
    let outcomes: Vec<bool> = (0..5)
        .map(|_| held(&hook(data, Some("dev"), &subagent, &[])).is_some())
        .collect();
    assert_eq!(outcomes, [true, true, true, false, true]);
}

#[test]
fn a_hook_fails_open_and_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    // No server: nothing printed, exit 0, and none started.
    assert_eq!(hook(data, Some("dev"), &input("UserPromptSubmit"), &[]), "");
    assert!(
        !data.join("guildhall.sock").exists(),
        "no server was started"
    );

    let _server = serve_in_background(data);
    guildhall_ok(data, &["agents", "register", "dev", "--role", "dev"]);
    for (agent, stdin) in [
        (None, input("SessionStart")),
        (Some("nobody"), input("SessionStart")),
        (Some("dev"), "not json".to_owned()),
        (Some("dev"), "{\"hook_event_name\": 5}".to_owned()),
        (Some("dev"), "{}".to_owned()),
    ] {
        assert_eq!(hook(data, agent, &stdin, &[]), "", "{agent:?} {stdin}");
    }
    // A tool result far larger than a hook needs is read past, not kept.
    let big = input("PostToolUse").replace(
        "\"success\":true",
        &format!("\"success\":true,\"stdout\":\"{}\"", "x".repeat(8 << 20)),
    );
    assert_eq!(hook(data, Some("dev"), &big, &[]), "");
}

#[test]
fn a_hook_whose_stdin_never_closes_gives_up_in_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = guildhall(dir.path())
        .args(["hook", "--timeout", "300ms"])
        .env("GUILDHALL_AGENT", "dev")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The input's writer keeps its end open and writes nothing.
    let _held_open = child.stdin.take().unwrap();
    let status = crate::support::eventually_blocking(
        std::time::Duration::from_secs(20),
        "the hook exits",
        || child.try_wait().unwrap(),
    );
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(out, "");
}

/// A person's Claude Code names its agent only in `.mcp.json`: its hooks run without
/// `GUILDHALL_AGENT`, and find the agent `guildhall mcp` recorded for that client. The
/// client is a shell here, starting both as Claude Code does.
#[test]
fn a_hook_knows_its_agent_from_the_client_s_mcp_bridge() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let _server = serve_in_background(data);
    guildhall_ok(data, &["agents", "register", "pm", "--role", "pm"]);
    let start = dir.path().join("SessionStart.json");
    std::fs::write(&start, input("SessionStart")).unwrap();
    // The bridge reads a pipe the shell holds open (the client's stdin to it); the shell
    // waits (bounded) for its record, runs the hook as its child, then closes the pipe,
    // which ends the bridge as a client ends its MCP server.
    let client = r#"
        mkfifo "$DATA/to-bridge"
        "$GH" --data-dir "$DATA" mcp --agent dev --role dev --parent pm < "$DATA/to-bridge" > /dev/null &
        bridge=$!
        exec 3> "$DATA/to-bridge"
        for _ in $(seq 400); do
            [ -n "$(ls "$DATA/clients" 2>/dev/null)" ] && break
            sleep 0.05
        done
        "$GH" --data-dir "$DATA" hook < "$START"
        exec 3>&-
        wait $bridge
        ls "$DATA/clients"
    "#;
    let out = std::process::Command::new("bash")
        .args(["-c", client])
        .env("GH", env!("CARGO_BIN_EXE_guildhall"))
        .env("DATA", data)
        .env("START", &start)
        .env("RUST_LOG", "off")
        .env_remove("GUILDHALL_AGENT")
        .env_remove("GUILDHALL_SOCKET")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let told = context(stdout.lines().next().unwrap_or_default(), "SessionStart")
        .unwrap_or_else(|| panic!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        told.contains("You are agent `dev` (role dev)") && told.contains("reporting to `pm`"),
        "{told}"
    );
    // The bridge's record went with it.
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
}
