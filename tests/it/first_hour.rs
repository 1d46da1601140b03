//! What a new user meets in the first hour: `guildhall mcp` clients started in any order,
//! told who they are, and errors that say what to do.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

const LIMIT: Duration = Duration::from_secs(20);

/// One `guildhall mcp` process, spoken to over its stdio as an MCP client would.
pub(crate) struct Client {
    /// Held so the process is killed when the client is dropped.
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
    /// The answer to `initialize`.
    init: Value,
}

/// `guildhall mcp <args>` on `data`, its stdio piped, logs off, killed when dropped; run
/// by `wrapper` (a program and its arguments, such as `prlimit --as=N --`) when given.
fn mcp_process(data: &Path, args: &[&str], env: &[(&str, &str)], wrapper: &[&str]) -> Child {
    mcp_process_of(
        Path::new(env!("CARGO_BIN_EXE_guildhall")),
        data,
        args,
        env,
        wrapper,
    )
}

/// [`mcp_process`] of the `guildhall` binary at `binary`.
fn mcp_process_of(
    binary: &Path,
    data: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    wrapper: &[&str],
) -> Child {
    let mut command = match wrapper.split_first() {
        Some((program, wrapper_args)) => {
            let mut command = tokio::process::Command::new(program);
            command.args(wrapper_args).arg(binary);
            command
        }
        None => tokio::process::Command::new(binary),
    };
    command
        .envs(env.iter().copied())
        .arg("--data-dir")
        .arg(data)
        .arg("mcp")
        .args(args)
        .env("RUST_LOG", "off")
        // A server left behind by a failing test goes away by itself.
        .env("GUILDHALL_IDLE_EXIT", "60s")
        .env_remove("GUILDHALL_AGENT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

impl Client {
    /// Starts a client and makes the handshake; its answer is kept in `init`.
    async fn start(data: &Path, args: &[&str]) -> Self {
        Self::start_with(data, args, &[]).await
    }

    /// [`Client::start`] with `env` added to the client's (and so the server's) environment.
    async fn start_with(data: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_wrapped(data, args, env, &[]).await
    }

    /// [`Client::start_with`], run by `wrapper`: what it sets (rlimits) holds for the server
    /// the client starts too.
    pub(crate) async fn start_wrapped(
        data: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Self {
        Self::start_binary(
            Path::new(env!("CARGO_BIN_EXE_guildhall")),
            data,
            args,
            env,
            wrapper,
        )
        .await
    }

    /// [`Client::start_wrapped`] of the `guildhall` binary at `binary` (a copy another user
    /// can run).
    pub(crate) async fn start_binary(
        binary: &Path,
        data: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Self {
        let mut child = mcp_process_of(binary, data, args, env, wrapper);
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = Self {
            _child: child,
            stdin,
            lines,
            next_id: 1,
            init: Value::Null,
        };
        client.init = client
            .request(
                "initialize",
                json!({ "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": { "name": "first-hour", "version": "1" } }),
            )
            .await;
        client
            .send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await;
        client
    }

    async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
    }

    pub(crate) async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        loop {
            let line = tokio::time::timeout(LIMIT, self.lines.next_line())
                .await
                .expect("the server answers in time")
                .unwrap()
                .expect("the bridge keeps stdout open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                return message;
            }
        }
    }

    pub(crate) async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let response = self
            .request(
                "tools/call",
                json!({ "name": tool, "arguments": arguments }),
            )
            .await;
        assert_eq!(response["result"]["isError"], false, "{response}");
        response["result"]["structuredContent"].clone()
    }
}

/// Stops the server `guildhall mcp` started in the background for `data`, as a user would.
pub(crate) fn stop_server(data: &Path) {
    let said = crate::support::guildhall_ok(data, &["stop"]);
    assert!(said.starts_with("stopped the server (pid "), "{said}");
    assert!(!data.join("guildhall.sock").exists(), "the socket is gone");
    let again = crate::support::guildhall_ok(data, &["stop"]);
    assert!(
        again.starts_with("no guildhall server is running"),
        "{again}"
    );
}

#[tokio::test]
async fn clients_start_in_any_order_and_each_hears_who_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The subagent's client first: its parent is not registered yet.
    let mut pm = Client::start(
        &data,
        &["--agent", "pm-7", "--role", "pm", "--parent", "tl"],
    )
    .await;
    let me = pm.call("whoami", json!({})).await;
    assert_eq!(me["agent"], "pm-7");
    assert_eq!(me["role"], "pm");
    assert_eq!(me["parent"], "tl");
    assert_eq!(me["parent_registered"], false);
    assert_eq!(me["connections"], 1);
    assert!(me.get("warning").is_none(), "{me}");

    let mut tl = Client::start(&data, &["--agent", "tl", "--role", "tl"]).await;
    let me = tl.call("whoami", json!({})).await;
    assert_eq!(me["children"], json!(["pm-7"]));
    pm.call("send_message", json!({"to": "parent", "body": "ready"}))
        .await;
    let agents = tl.call("list_agents", json!({})).await;
    assert_eq!(agents["total"], 2, "{agents}");
    let rows = agents["agents"].as_array().unwrap();
    let tl_row = rows.iter().find(|a| a["id"] == "tl").unwrap();
    assert_eq!(tl_row["unread"], 1, "{agents}");
    assert_eq!(tl_row["connections"], 1, "{agents}");
    let pm_row = rows.iter().find(|a| a["id"] == "pm-7").unwrap();
    assert_eq!(pm_row["parent"], "tl");
    assert!(pm_row["last_seen"].is_string(), "{agents}");
    let pms = tl.call("list_agents", json!({"role": "pm"})).await;
    assert_eq!(pms["total"], 1, "{pms}");

    // A second client bound to the same agent is warned about.
    let mut twin = Client::start(&data, &["--agent", "pm-7"]).await;
    let me = twin.call("whoami", json!({})).await;
    assert_eq!(me["connections"], 2, "{me}");
    assert!(
        me["warning"].as_str().unwrap().contains("share one inbox"),
        "{me}"
    );
    drop((pm, tl, twin));
    stop_server(&data);
}

/// `tr '\0' '\n' < /proc/$PPID/environ` in `bash` once printed a `token_env` token, which
/// then sent mail as its agent. The server wipes its environment's values from what the
/// kernel shows, and is non-dumpable: as root (CI) the command reads the names and no
/// value; as another user it cannot read the file at all.
#[tokio::test]
async fn a_command_cannot_read_an_agents_token_from_the_servers_environment() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("guildhall.toml"),
        format!(
            "[files]\nroots = [{:?}]\n[shell]\n[agents.tl]\ntoken_env = \"GUILDHALL_TL_TOKEN\"\n",
            dir.path().display().to_string()
        ),
    )
    .unwrap();
    let secret = "tl-secret-5a1b9c";
    let mut dev = Client::start_with(
        &data,
        &["--agent", "dev"],
        &[("GUILDHALL_TL_TOKEN", secret)],
    )
    .await;
    // Inside the sandbox the server is not even in /proc.
    let out = dev
        .call(
            "bash",
            json!({ "command": "id -u; cat /proc/*/environ | tr '\\0' '\\n'" }),
        )
        .await;
    let stdout = out["stdout"].as_str().unwrap();
    assert!(!stdout.contains(secret), "{stdout}");
    // Outside it (a sandbox turned off, another process of the user), the values are
    // wiped: root reads the names and no value; another user cannot read the file at all.
    let status: Value =
        serde_json::from_str(&crate::support::guildhall_ok(&data, &["status", "--json"])).unwrap();
    let pid = status["pid"].as_u64().unwrap();
    // Each subsystem's section, by name: the shell's counts its background shells.
    assert_eq!(
        status["subsystems"]["shell"],
        json!({"running": 0, "finished": 0}),
        "{status}"
    );
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(environ) => {
            let environ = String::from_utf8_lossy(&environ);
            assert!(!environ.contains(secret), "{environ}");
            assert!(
                environ.split('\0').any(|l| l == "GUILDHALL_TL_TOKEN="),
                "root reads the names, wiped: {environ}"
            );
        }
        Err(err) => assert_eq!(
            err.kind(),
            std::io::ErrorKind::PermissionDenied,
            "non-dumpable"
        ),
    }
    drop(dev);
    stop_server(&data);
}

#[tokio::test]
async fn the_handshake_tells_the_model_its_agent_role_and_parent() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let client = Client::start(
        &data,
        &["--agent", "dev-1", "--role", "dev", "--parent", "pm-2"],
    )
    .await;
    let instructions = client.init["result"]["instructions"].as_str().unwrap();
    assert!(
        instructions.contains("You are agent `dev-1` in role `dev`, reporting to `pm-2`"),
        "{instructions}"
    );
    drop(client);
    stop_server(&data);
}

#[test]
fn a_client_that_names_no_agent_is_told_how_to_name_one() {
    let dir = tempfile::tempdir().unwrap();
    // Unset, or set empty as a shell leaves it.
    for agent in [None, Some("")] {
        let mut command = crate::support::guildhall(dir.path());
        command.arg("mcp").env_remove("GUILDHALL_AGENT");
        if let Some(agent) = agent {
            command.env("GUILDHALL_AGENT", agent);
        }
        let out = command.stdin(Stdio::null()).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--agent ID") && err.contains("GUILDHALL_AGENT"),
            "{agent:?}: {err}"
        );
    }
}

#[test]
fn a_server_that_cannot_start_is_reported_at_once_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("guildhall.toml"), "[governance\nbroken = \n").unwrap();
    let out = crate::support::guildhall(&data)
        .args(["mcp", "--agent", "tl"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The started server's own error, not "no server answered within 20 s".
    assert!(err.contains("exited"), "{err}");
    assert!(err.contains("guildhall.toml"), "{err}");
    assert!(!err.contains("within"), "{err}");
}

#[tokio::test]
async fn a_started_server_exits_once_its_last_client_has_been_gone_for_the_idle_time() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = mcp_process(&data, &["--agent", "tl", "--idle-exit", "1s"], &[], &[]);
    // Connected once the bridge's server answers status.
    crate::support::eventually(LIMIT, || async {
        crate::support::guildhall(&data)
            .args(["status", "--json"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
    .await;
    let status: Value =
        serde_json::from_str(&crate::support::guildhall_ok(&data, &["status", "--json"])).unwrap();
    let pid = status["pid"].as_u64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains(&format!("--data-dir {}", data.display())) && data.is_absolute(),
        "the server names its data directory in full: {cmdline}"
    );
    // The client leaves; the server follows after the idle time.
    drop(child.stdin.take());
    let _ = child.wait().await;
    crate::support::eventually(LIMIT, || async {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.contains(") Z "))
    })
    .await;
    assert!(!data.join("guildhall.sock").exists(), "no stale socket");
}

#[test]
fn a_port_in_use_is_named_with_the_way_out_and_leaves_no_socket() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = crate::support::guildhall(&data)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("port {port} is in use"))
            && err.contains("--listen 127.0.0.1:0")
            && err.contains("--no-http"),
        "{err}"
    );
    assert!(
        !data.join("guildhall.sock").exists(),
        "no socket left behind"
    );
}

#[test]
fn admin_commands_run_through_a_running_server() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let cli = |args: &[&str]| {
        let out = crate::support::guildhall(&data)
            .args(args)
            .current_dir(&cwd)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mut server = crate::support::serve_in_background(&data);
    for args in [
        &["agents", "register", "pm", "--role", "pm"][..],
        &[
            "agents", "register", "dev", "--role", "dev", "--parent", "pm",
        ],
    ] {
        let (ok, _, err) = cli(args);
        assert!(ok, "{args:?}: {err}");
    }
    let (ok, listed, err) = cli(&["agents", "list"]);
    assert!(ok, "{err}");
    assert!(
        listed.contains("dev") && listed.contains("parent: pm"),
        "{listed}"
    );
    let (ok, _, err) = cli(&[
        "context", "update", "sprint", "--key", "goal", "--value", "\"ship\"",
    ]);
    assert!(ok, "{err}");
    // A relative path is the caller's, not the server's.
    let (ok, _, err) = cli(&["context", "export", "sprint", "--out", "sprint.json"]);
    assert!(ok, "{err}");
    let export = std::fs::read_to_string(cwd.join("sprint.json")).unwrap();
    assert!(export.contains("ship"), "{export}");
    // `send --jsonl` goes through the server line by line.
    let mut send = crate::support::guildhall(&data)
        .args(["send", "--from", "pm", "--jsonl"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    send.stdin
        .take()
        .unwrap()
        .write_all(
            b"{\"to\": \"dev\", \"subject\": \"a\"}\n{\"to\": \"dev\", \"subject\": \"b\"}\n",
        )
        .unwrap();
    let sent = send.wait_with_output().unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&sent.stdout).lines().count(), 2);
    let (ok, inbox, err) = cli(&["inbox", "--agent", "dev", "--json"]);
    assert!(ok, "{err}");
    // Lines are sent concurrently: no order between them.
    let mut subjects: Vec<String> = inbox
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|m| m["subject"].as_str().map(str::to_owned))
        .collect();
    subjects.sort();
    assert_eq!(subjects, ["a", "b"], "{inbox}");
    // Status for people: where, how long, who, and a tree without raw states.
    let (ok, status, err) = cli(&["status"]);
    assert!(ok, "{err}");
    assert!(
        status.contains(&format!("data dir     {}", data.display())),
        "{status}"
    );
    assert!(
        status.contains(&format!(
            "store        redb file {}",
            data.join("guildhall.redb").display()
        )),
        "{status}"
    );
    assert!(status.contains("http         off"), "{status}");
    // Each subsystem's section, in a line.
    assert!(
        status
            .lines()
            .any(|l| l.trim_start().starts_with("tasks") && l.contains("actor ")),
        "{status}"
    );
    let dev_line = status
        .lines()
        .find(|l| l.trim_start().starts_with("dev "))
        .unwrap();
    assert!(
        dev_line.contains("parent pm") && dev_line.contains("unread 2"),
        "{status}"
    );
    assert!(
        !status.contains("Running") && !status.contains("\"state\""),
        "{status}"
    );
    // A reader that goes away early is no error.
    let mut piped = crate::support::guildhall(&data)
        .arg("status")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(piped.stdout.take());
    let ended = piped.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&ended.stderr);
    assert!(
        ended.status.success() && !err.contains("Broken pipe"),
        "{err}"
    );
    // What needs this process's stdin says so.
    let (ok, _, err) = cli(&["context", "update", "sprint", "--jsonl"]);
    assert!(!ok && err.contains("guildhall stop"), "{err}");
    let stopped = crate::support::guildhall_ok(&data, &["stop"]);
    assert!(stopped.starts_with("stopped"), "{stopped}");
    server.wait();
}

#[test]
fn read_only_commands_never_create_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("data-typo");
    for args in [
        &["agents", "list"][..],
        &["inbox", "--agent", "tl"],
        &["context", "list"],
        &["audit"],
    ] {
        let out = crate::support::guildhall(&typo)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no guildhall store in"), "{args:?}: {err}");
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }
}

#[test]
fn the_demo_runs_in_a_temporary_store_and_shows_a_readable_tree() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_guildhall"))
        .arg("demo")
        .current_dir(dir.path())
        .env("RUST_LOG", "off")
        .env_remove("GUILDHALL_DATA_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dir.path().join(".guildhall").exists(),
        "the demo's agents do not join the project"
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    // The tests build the binary with fault injection (the dev-dependency on this crate):
    // a shipped binary says only what the inbox holds.
    assert!(
        shown.contains("demo-pm mailbox crashed and restarted; inbox still holds 1 unread"),
        "{shown}"
    );
    let tree = &shown[shown.find("supervision tree:").unwrap()..];
    assert!(tree.contains("tally  (restarts 2)"), "{tree}");
    assert!(!tree.contains("Running") && !tree.contains('{'), "{tree}");
}

#[test]
fn init_sets_a_project_up_once_and_never_overwrites_without_force() {
    let project = tempfile::tempdir().unwrap();
    let init = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_guildhall"))
            .arg("init")
            .args(args)
            .current_dir(project.path())
            .env("RUST_LOG", "off")
            .env_remove("GUILDHALL_DATA_DIR")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    std::fs::write(project.path().join(".gitignore"), "target/").unwrap();
    // Claude Code settings of the user's own: kept, guildhall's merged in.
    let settings_path = project.path().join(".claude/settings.json");
    std::fs::create_dir_all(settings_path.parent().unwrap()).unwrap();
    std::fs::write(
        &settings_path,
        r#"{"model": "opus", "permissions": {"deny": ["Bash(rm -rf *)"]},
            "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "./notify.sh"}]}]}}"#,
    )
    .unwrap();
    let (ok, said, err) = init(&[]);
    assert!(ok, "{err}");
    assert!(said.contains("wrote .mcp.json"), "{said}");
    assert!(
        said.contains("merged guildhall's hooks and deny rules into .claude/settings.json"),
        "{said}"
    );
    let settings: Value =
        serde_json::from_str(&std::fs::read_to_string(&settings_path).unwrap()).unwrap();
    assert_eq!(settings["model"], "opus");
    assert_eq!(
        settings["permissions"]["deny"],
        json!([
            "Bash(rm -rf *)",
            "Read(./.guildhall/**)",
            "Edit(./.guildhall/**)",
            "Write(./.guildhall/**)"
        ])
    );
    assert_eq!(
        settings["sandbox"]["filesystem"],
        json!({"denyRead": ["./.guildhall"], "denyWrite": ["./.guildhall"]})
    );
    let ours = json!([{"hooks": [{"type": "command", "command": "guildhall hook", "timeout": 5}]}]);
    for event in [
        "SessionStart",
        "UserPromptSubmit",
        "PostToolUse",
        "SubagentStop",
    ] {
        assert_eq!(settings["hooks"][event], ours, "{event}");
    }
    assert_eq!(
        settings["hooks"]["Stop"][0]["hooks"][0]["command"],
        "./notify.sh"
    );
    assert_eq!(settings["hooks"]["Stop"][1], ours[0]);
    let mcp: Value =
        serde_json::from_str(&std::fs::read_to_string(project.path().join(".mcp.json")).unwrap())
            .unwrap();
    assert_eq!(mcp["mcpServers"]["guildhall"]["args"], json!(["mcp"]));
    let config = project.path().join(".guildhall/guildhall.toml");
    guildhall::config::Config::load(&config, true).expect("the written config loads");
    let ignored = std::fs::read_to_string(project.path().join(".gitignore")).unwrap();
    assert_eq!(ignored, "target/\n.guildhall/\n");

    // Again: nothing changes.
    let (ok, said, err) = init(&[]);
    assert!(ok, "{err}");
    assert!(said.contains(".mcp.json is up to date"), "{said}");
    assert!(
        said.contains(".claude/settings.json is up to date"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(project.path().join(".gitignore")).unwrap(),
        ignored
    );

    // A file the user changed is kept unless forced.
    std::fs::write(project.path().join(".mcp.json"), "{}").unwrap();
    let (ok, _, err) = init(&["--agent", "tl", "--role", "tl"]);
    assert!(!ok && err.contains("--force"), "{err}");
    assert_eq!(
        std::fs::read_to_string(project.path().join(".mcp.json")).unwrap(),
        "{}"
    );
    let (ok, _, err) = init(&["--agent", "tl", "--role", "tl", "--force"]);
    assert!(ok, "{err}");
    // Settings Claude Code could not read are kept too, unless forced.
    std::fs::write(&settings_path, "{ not json").unwrap();
    let (ok, _, err) = init(&["--agent", "tl", "--role", "tl"]);
    assert!(
        !ok && err.contains("not valid JSON") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&settings_path).unwrap(),
        "{ not json"
    );
    let mcp: Value =
        serde_json::from_str(&std::fs::read_to_string(project.path().join(".mcp.json")).unwrap())
            .unwrap();
    assert_eq!(
        mcp["mcpServers"]["guildhall"]["args"],
        json!(["mcp", "--agent", "tl", "--role", "tl"])
    );
}

#[test]
fn commands_print_the_same_with_a_server_or_without() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ok = |args: &[&str]| crate::support::guildhall_ok(&data, args);
    ok(&["agents", "register", "pm", "--role", "pm"]);
    ok(&[
        "agents", "register", "dev", "--role", "dev", "--parent", "pm",
    ]);
    let mut receipts = Vec::new();
    for subject in ["first", "second"] {
        receipts.push(ok(&[
            "send",
            "--from",
            "pm",
            "--to",
            "dev",
            "--subject",
            subject,
            "--body",
            "details",
        ]));
    }
    let first: Value = serde_json::from_str(receipts[0].trim()).unwrap();
    let first = first["id"].as_str().unwrap().to_owned();
    let alone = (
        ok(&["inbox", "--agent", "dev"]),
        ok(&["inbox", "--agent", "dev", "--json"]),
        ok(&["agents", "list"]),
        ok(&["sent", &first, "--from", "pm"]),
    );
    assert!(
        alone.3.contains("\"first\"")
            && alone.3.contains("  dev ")
            && alone.3.ends_with("1 unread, 0 read, 0 acknowledged\n"),
        "{}",
        alone.3
    );
    assert!(
        alone.0.contains("[normal] pm → dev: first — details"),
        "{}",
        alone.0
    );
    let mut server = crate::support::serve_in_background(&data);
    let served = (
        ok(&["inbox", "--agent", "dev"]),
        ok(&["inbox", "--agent", "dev", "--json"]),
        ok(&["agents", "list"]),
        ok(&["sent", &first, "--from", "pm"]),
    );
    assert_eq!(alone, served);
    // Taking ends with what is left unread.
    let taken = ok(&["inbox", "--agent", "dev", "--take", "--limit", "1"]);
    assert_eq!(taken.lines().last(), Some("1 unread"), "{taken}");
    // Text where JSON is expected says how to quote it.
    let out = crate::support::guildhall(&data)
        .args([
            "context", "update", "s", "--key", "goal", "--value", "ship it",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(r#"--value '"ship it"'"#),
        "{err}"
    );
    ok(&["stop"]);
    server.wait();
}

#[test]
fn completions_are_printed_for_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let script = crate::support::guildhall_ok(dir.path(), &["completions", "bash"]);
    assert!(
        script.contains("_guildhall"),
        "a bash completion script for guildhall"
    );
    assert!(
        script.contains("init") && script.contains("stop"),
        "{script}"
    );
}

#[test]
fn tools_lists_the_work_tools_the_config_turns_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let names = |data: &Path| -> Vec<String> {
        let listed: Value =
            serde_json::from_str(&crate::support::guildhall_ok(data, &["tools", "--json"]))
                .unwrap();
        listed
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let plain = names(&data);
    assert!(plain.contains(&"send_message".to_owned()), "{plain:?}");
    assert!(!plain.contains(&"read_file".to_owned()), "{plain:?}");
    std::fs::write(
        data.join("guildhall.toml"),
        format!(
            "[files]\nroots = [{:?}]\n[shell]\n[fetch]\n",
            dir.path().display().to_string()
        ),
    )
    .unwrap();
    let all = names(&data);
    for tool in [
        "read_file",
        "grep",
        "bash",
        "shell_start",
        "shell_output",
        "web_fetch",
    ] {
        assert!(all.contains(&tool.to_owned()), "{tool} missing: {all:?}");
    }
}

/// `guildhall watch --json` follows a running server: a message sent through the command
/// line shows as the call, the message (from, to, subject) and the call's end, in order.
#[test]
fn watch_shows_a_servers_calls_and_messages_as_they_happen() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let _server = crate::support::serve_in_background(dir.path());
    for (agent, role) in [("pm", "pm"), ("dev", "dev")] {
        crate::support::guildhall_ok(dir.path(), &["agents", "register", agent, "--role", role]);
    }
    let mut watch = crate::support::guildhall(dir.path())
        .args(["watch", "--json", "--count", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufReader::new(watch.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert!(said.starts_with("watching the server of"), "{said}");
    crate::support::guildhall_ok(
        dir.path(),
        &[
            "send",
            "--from",
            "pm",
            "--to",
            "dev",
            "--subject",
            "parse",
            "--body",
            "go",
        ],
    );
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let events: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["invoked", "mailed", "completed"], "{events:?}");
    assert_eq!(events[0]["tool"], "send_message");
    assert_eq!(events[0]["agent"], "pm");
    assert_eq!(
        (&events[1]["from"], &events[1]["to"], &events[1]["subject"]),
        (&json!("pm"), &json!("dev"), &json!("parse"))
    );
    assert!(events.iter().all(|e| e["at_ms"].as_u64().unwrap() > 0));
}

/// `guildhall tasks add --as tl` through a running server once acted as a token-protected
/// `tl` without its token (`mail send --as` already asked for it). Acting as an agent
/// through the socket takes its token, from `GUILDHALL_AGENT_TOKEN`, as through MCP.
#[test]
fn an_admin_command_acting_as_a_protected_agent_needs_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("tl.token"), "tl-secret\n").unwrap();
    std::fs::write(
        data.join("guildhall.toml"),
        "[agents.tl]\ntoken_file = \"tl.token\"\n",
    )
    .unwrap();
    let _server = crate::support::serve_in_background(&data);
    crate::support::guildhall_ok(&data, &["agents", "register", "tl", "--role", "tl"]);
    let add = |token: Option<&str>, by: &[&str]| {
        let mut cmd = crate::support::guildhall(&data);
        cmd.args(["tasks", "add", "review the plan"]).args(by);
        match token {
            Some(token) => cmd.env("GUILDHALL_AGENT_TOKEN", token),
            None => cmd.env_remove("GUILDHALL_AGENT_TOKEN"),
        };
        cmd.output().unwrap()
    };
    for by in [&["--as", "tl"][..], &["--as=tl"]] {
        let refused = add(None, by);
        assert!(!refused.status.success(), "{by:?}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("token"), "{by:?}: {err}");
        assert!(!add(Some("wrong"), by).status.success(), "{by:?}");
    }
    let made = add(Some("tl-secret"), &["--as", "tl"]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert!(String::from_utf8_lossy(&made.stdout).starts_with("created task"));
    // Acting as no one, or as an agent without a token, is as before.
    assert!(add(None, &[]).status.success());
    stop_server(&data);
}

/// `guildhall watch --tasks`: the unfinished tasks first, then each task as a commit
/// changes it.
#[test]
fn watch_tasks_shows_the_board_then_each_task_as_it_changes() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let _server = crate::support::serve_in_background(dir.path());
    crate::support::guildhall_ok(dir.path(), &["agents", "register", "pm", "--role", "pm"]);
    crate::support::guildhall_ok(dir.path(), &["tasks", "add", "schema", "--as", "pm"]);
    let mut watch = crate::support::guildhall(dir.path())
        .args(["watch", "--tasks", "--count", "2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufReader::new(watch.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert!(said.starts_with("watching the server of"), "{said}");
    crate::support::guildhall_ok(
        dir.path(),
        &["tasks", "add", "api", "--as", "pm", "--blocked-by", "1"],
    );
    crate::support::guildhall_ok(
        dir.path(),
        &[
            "tasks",
            "update",
            "1",
            "--status",
            "in_progress",
            "--as",
            "pm",
        ],
    );
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("board") && lines[0].contains("task #1     open        schema"),
        "{text}"
    );
    assert!(
        lines[1].contains("task #2     blocked     api  after #1"),
        "{text}"
    );
    assert!(
        lines[2].contains("task #1     in_progress schema"),
        "{text}"
    );
}

/// `guildhall watch --agent A`: A's calls only, a pipeline's steps nested under the
/// pipeline's call, each with its outcome.
#[test]
fn watch_agent_shows_its_calls_with_a_pipelines_steps_nested() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("guildhall.toml"),
        "[pipelines.look]\ndescription = \"Who I am, then who else is here\"\n\
         steps = [\n  { tool = \"whoami\", set = {} },\n  { tool = \"list_agents\", set = {} },\n]\n",
    )
    .unwrap();
    let _server = crate::support::serve_in_background(dir.path());
    for agent in ["pm", "dev"] {
        crate::support::guildhall_ok(dir.path(), &["agents", "register", agent, "--role", agent]);
    }
    let mut watch = crate::support::guildhall(dir.path())
        .args(["watch", "--agent", "pm", "--count", "5"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufReader::new(watch.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    // Another agent's mail is not pm's; pm's pipeline call is.
    crate::support::guildhall_ok(
        dir.path(),
        &[
            "send",
            "--from",
            "dev",
            "--to",
            "dev",
            "--subject",
            "note",
            "--body",
            "x",
        ],
    );
    let mut client = crate::support::guildhall(dir.path())
        .args(["mcp", "--agent", "pm", "--no-start"])
        .env_remove("GUILDHALL_AGENT")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = client.stdin.take().unwrap();
    for request in [
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"look","arguments":{}}}"#,
    ] {
        writeln!(stdin, "{request}").unwrap();
    }
    let mut answered = false;
    for line in std::io::BufReader::new(client.stdout.take().unwrap()).lines() {
        let message: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if message["id"] == 1 {
            assert!(message.get("result").is_some(), "{message}");
            answered = true;
            break;
        }
    }
    assert!(answered);
    drop(stdin);
    let _ = client.wait();
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let shown: Vec<String> = text
        .lines()
        .map(|l| l.split_once("  ").map_or(l, |(_, rest)| rest).to_owned())
        .collect();
    assert!(shown[0] == "joined" || shown[0] == "▸ look", "{text}");
    let calls: Vec<String> = shown
        .iter()
        .filter(|l| l.trim_start().starts_with('▸') || l.trim_start().starts_with('✓'))
        .map(|l| {
            l.split(" ms")
                .next()
                .unwrap()
                .trim_end_matches(|c: char| c.is_ascii_digit() || c == '.')
                .trim_end()
                .to_owned()
        })
        .collect();
    assert_eq!(
        calls[..4],
        ["▸ look", "  ▸ whoami", "  ✓ whoami", "  ▸ list_agents"],
        "{text}"
    );
    assert!(!text.contains("note"), "dev's mail is not pm's: {text}");
}
