//! The sandbox, tried as a hostile agent would: every attempt is an MCP call of agent
//! `mallory` to a real `guildhall serve` (HTTP on, a token file for `tl`, another agent's
//! roots beside its own), through `bash`, a background shell, a command tool and a proxied
//! stdio server. Each test names one escape and checks, from outside the sandbox, that it
//! did not happen (the file is not there, the secret never came back, the listener saw no
//! connection). Then the ordinary work that must still run inside, the fallback when the
//! kernel lacks a mechanism, and the same escapes with the server run by an unprivileged
//! user. docs/security.md maps each attack to the mechanism that stops it and its test.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::first_hour::Client;
use crate::support::{Background, guildhall_ok, serve_in_background_env};

/// What only the files outside the roots hold: never in an answer.
const SECRET: &str = "outside-secret-5f1c";
/// `tl`'s token, in a token file in the data directory.
const TOKEN: &str = "tl-token-9e27d3";
/// What another agent's root holds.
const BOBS: &str = "bobs-notes-41aa";

/// A server with `[files]`, `[shell]`, a command tool and (when asked) a proxied server,
/// and `mallory` connected.
struct Sandboxed {
    dir: tempfile::TempDir,
    data: PathBuf,
    server: Background,
    mallory: Client,
    http: String,
}

impl Sandboxed {
    fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }
    fn data(&self) -> PathBuf {
        self.data.clone()
    }
    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }
    fn other(&self) -> PathBuf {
        self.dir.path().join("other")
    }

    async fn start() -> Self {
        Self::start_with("", &[]).await
    }

    /// With `extra` appended to the config and `env` in the server's environment.
    async fn start_with(extra: &str, env: &[(&str, &str)]) -> Self {
        Self::start_laid_out(false, extra, env).await
    }

    /// [`start_with`](Self::start_with), the data directory in the project (`.guildhall`,
    /// as `guildhall init` makes it) when `inside`.
    async fn start_laid_out(inside: bool, extra: &str, env: &[(&str, &str)]) -> Self {
        Self::start_full(inside, extra, env, "127.0.0.1:0").await
    }

    /// [`start_laid_out`](Self::start_laid_out), its HTTP port on `listen`.
    async fn start_full(inside: bool, extra: &str, env: &[(&str, &str)], listen: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let data = if inside {
            root.join("project/.guildhall")
        } else {
            root.join("data")
        };
        for sub in ["project", "outside", "other", "probe"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(root.join("outside/secret.txt"), SECRET).unwrap();
        std::fs::write(root.join("other/notes.txt"), BOBS).unwrap();
        std::fs::write(data.join("tl.token"), TOKEN).unwrap();
        std::fs::write(root.join("probe/server.py"), PROBE_SERVER).unwrap();
        let config = format!(
            r#"[files]
roots = [{project:?}]
[files.agents]
bob = [{other:?}]
[shell]
[agents.tl]
token_file = "tl.token"
[commands.run]
description = "Runs a line of bash, as an agent's own tool might"
shell = true
command = ['eval "$1"; echo "rc=$?"', "{{line}}"]
input_schema = {{ type = "object", properties = {{ line = {{ type = "string" }} }}, required = ["line"] }}
[servers.probe]
command = "/usr/bin/python3"
args = [{script:?}]
[launch.profiles.probe]
command = ["bash", "-c", 'eval "$1"; echo "rc=$?"', "probe", "{{prompt}}"]
restart = "temporary"
{extra}
"#,
            project = root.join("project").display().to_string(),
            other = root.join("other").display().to_string(),
            script = root.join("probe/server.py").display().to_string(),
        );
        std::fs::write(data.join("guildhall.toml"), config).unwrap();
        let server = serve_in_background_env(&data, &["--listen", listen], env);
        let status: Value =
            serde_json::from_str(&guildhall_ok(&data, &["status", "--json"])).unwrap();
        let http = status["http"].as_str().unwrap_or_default().to_owned();
        let mallory = Client::start_wrapped(&data, &["--agent", "mallory"], &[], &[]).await;
        Self {
            dir,
            data,
            server,
            mallory,
            http,
        }
    }

    /// `bash` as mallory: stdout and stderr together, whatever the exit.
    async fn bash(&mut self, command: &str) -> String {
        let result = self.result("bash", json!({ "command": command })).await;
        let out = &result["structuredContent"];
        format!(
            "{}{}exit {}\n{}",
            out["stdout"].as_str().unwrap_or_default(),
            out["stderr"].as_str().unwrap_or_default(),
            out["exit_code"],
            out["sandbox"].as_str().unwrap_or_default(),
        )
    }

    /// The whole result of a call as mallory, error or not, as text.
    async fn result(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self
            .mallory
            .request(
                "tools/call",
                json!({ "name": tool, "arguments": arguments }),
            )
            .await;
        answer["result"].clone()
    }

    async fn text(&mut self, tool: &str, arguments: Value) -> String {
        self.result(tool, arguments).await.to_string()
    }

    /// A background shell's whole output.
    async fn background(&mut self, command: &str) -> String {
        let started = self
            .mallory
            .call("shell_start", json!({ "command": command }))
            .await;
        let id = started["id"].as_str().unwrap().to_owned();
        let mut all = String::new();
        for _ in 0..60 {
            let out = self
                .mallory
                .call("shell_output", json!({ "id": id, "wait_secs": 5 }))
                .await;
            all.push_str(out["output"].as_str().unwrap_or_default());
            if out["running"] == false {
                return all;
            }
        }
        panic!("the background shell did not end: {all}");
    }

    async fn command_tool(&mut self, line: &str) -> String {
        self.text("run", json!({ "line": line })).await
    }

    /// Calls the proxied server's `run` once its tools are registered (it starts with the
    /// server, in the background).
    async fn proxied(&mut self, line: &str) -> String {
        let mallory = &mut self.mallory;
        let what = "the proxied server's tools come";
        crate::support::eventually_some(std::time::Duration::from_secs(30), what, async || {
            let tools = mallory.request("tools/list", json!({})).await;
            tools.to_string().contains("mcp__probe__run").then_some(())
        })
        .await;
        self.text("mcp__probe__run", json!({ "line": line })).await
    }

    /// Launches agent `id` (a child of mallory's) whose process runs `line`, and answers
    /// what it wrote once it ended.
    async fn launched(&mut self, id: &str, line: &str) -> String {
        let spawned = self
            .text(
                "spawn_agent",
                json!({ "role": "dev", "id": id, "prompt": line, "profile": "probe" }),
            )
            .await;
        assert!(spawned.contains(id), "{spawned}");
        let log = self.data.join(format!("launched/{id}.log"));
        let what = "the launched agent ends";
        crate::support::eventually_some(std::time::Duration::from_secs(30), what, async || {
            let written = std::fs::read_to_string(&log).unwrap_or_default();
            written.contains("rc=").then_some(written)
        })
        .await
    }

    fn server_pid(&self) -> u32 {
        self.server.id()
    }
}

/// A stdio MCP server with one tool, `run`, that runs a line of bash: what a community
/// server that shells out can be made to do.
const PROBE_SERVER: &str = r#"
import json, subprocess, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, rid = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "probe", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "run", "description": "runs a line",
                             "inputSchema": {"type": "object", "properties": {"line": {"type": "string"}}}}]}
    elif method == "tools/call":
        done = subprocess.run(["bash", "-c", msg["params"]["arguments"]["line"]], capture_output=True, text=True)
        result = {"content": [{"type": "text", "text": done.stdout + done.stderr + "rc=%d" % done.returncode}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

fn absent(path: &Path) {
    assert!(!path.exists(), "{} was written from inside", path.display());
}

// ---- files outside the roots ----

#[tokio::test]
async fn reading_outside_the_roots_by_absolute_path_is_refused() {
    let mut s = Sandboxed::start().await;
    let path = s.outside().join("secret.txt");
    let out = s.bash(&format!("cat {}", path.display())).await;
    assert!(!out.contains(SECRET), "{out}");
    assert!(out.contains("Permission denied"), "{out}");
    // The command's own error stays, and the line naming the policy follows.
    assert!(out.contains("[sandbox] in guildhall.toml"), "{out}");
    assert!(out.contains(&s.project().display().to_string()), "{out}");
}

#[tokio::test]
async fn reading_outside_the_roots_through_dotdot_is_refused() {
    let mut s = Sandboxed::start().await;
    let out = s
        .bash("cat ../outside/secret.txt; cat ../../*/outside/secret.txt")
        .await;
    assert!(!out.contains(SECRET), "{out}");
}

#[tokio::test]
async fn writing_outside_the_roots_is_refused() {
    let mut s = Sandboxed::start().await;
    let planted = s.outside().join("planted");
    let out = s
        .bash(&format!(
            "echo x > {p}; touch ../outside/planted2; mkdir {p}.d",
            p = planted.display()
        ))
        .await;
    absent(&planted);
    absent(&s.outside().join("planted2"));
    absent(&s.outside().join("planted.d"));
    assert!(out.contains("Permission denied"), "{out}");
}

#[tokio::test]
async fn a_symlink_planted_in_the_root_does_not_lead_out() {
    let mut s = Sandboxed::start().await;
    let secret = s.outside().join("secret.txt");
    let out = s
        .bash(&format!(
            "ln -s {} link && cat link; ln -s {} dirlink && cat dirlink/secret.txt",
            secret.display(),
            s.outside().display()
        ))
        .await;
    assert!(!out.contains(SECRET), "{out}");
}

#[tokio::test]
async fn a_hard_link_planted_in_the_root_does_not_lead_out() {
    let mut s = Sandboxed::start().await;
    let secret = s.outside().join("secret.txt");
    let out = s
        .bash(&format!("ln {} hard; cat hard", secret.display()))
        .await;
    assert!(!out.contains(SECRET), "{out}");
    absent(&s.project().join("hard"));
}

#[tokio::test]
async fn proc_self_root_does_not_lead_out() {
    let mut s = Sandboxed::start().await;
    let secret = s.outside().join("secret.txt");
    let out = s
        .bash(&format!("cat /proc/self/root{}", secret.display()))
        .await;
    assert!(!out.contains(SECRET), "{out}");
}

#[tokio::test]
async fn the_servers_proc_root_and_environ_are_out_of_reach() {
    let mut s = Sandboxed::start_with("", &[("GUILDHALL_PROBE_VALUE", TOKEN)]).await;
    let pid = s.server_pid();
    let secret = s.outside().join("secret.txt");
    let out = s
        .bash(&format!(
            "cat /proc/{pid}/root{}; cat /proc/{pid}/environ; ls /proc/{pid}/fd; \
             ls /proc | grep -c '^[0-9]'",
            secret.display()
        ))
        .await;
    assert!(!out.contains(SECRET), "{out}");
    assert!(!out.contains(TOKEN), "{out}");
    assert!(!out.contains("guildhall.sock"), "{out}");
}

#[tokio::test]
async fn the_servers_home_directory_is_out_of_reach() {
    let mut s = Sandboxed::start().await;
    let home = std::env::var("HOME").unwrap();
    let out = s
        .bash(&format!("ls -a {home}; echo x > {home}/.planted"))
        .await;
    assert!(out.contains("Permission denied"), "{out}");
    absent(&Path::new(&home).join(".planted"));
}

#[tokio::test]
async fn the_shared_tmp_is_out_of_reach_and_each_agent_has_its_own() {
    let mut s = Sandboxed::start().await;
    let out = s
        .bash("echo x > /tmp/guildhall-planted; echo mine > $TMPDIR/note; cat $TMPDIR/note; echo $TMPDIR")
        .await;
    absent(Path::new("/tmp/guildhall-planted"));
    assert!(out.contains("mine"), "{out}");
    let mallorys = out
        .lines()
        .find(|l| l.contains("guildhall-sandbox-"))
        .unwrap()
        .to_owned();
    let mut bob = Client::start_wrapped(&s.data(), &["--agent", "bob"], &[], &[]).await;
    let answer = bob
        .request(
            "tools/call",
            json!({ "name": "bash", "arguments": { "command": format!("cat {mallorys}/note; echo $TMPDIR") } }),
        )
        .await;
    let text = answer["result"].to_string();
    assert!(!text.contains("mine"), "{text}");
}

/// A server killed with SIGKILL cannot remove its agents' private directories, nor what
/// they left there; the next server to start removes them, and not those of a server
/// still running.
#[tokio::test]
async fn a_killed_servers_private_directories_go_at_the_next_start() {
    let tmp = tempfile::tempdir().unwrap();
    let tmpdir = tmp.path().to_str().unwrap().to_owned();
    let env = [("TMPDIR", tmpdir.as_str())];
    let private_dir = |out: &str| {
        let line = out.lines().find(|l| l.contains("guildhall-sandbox-"));
        PathBuf::from(line.unwrap_or_else(|| panic!("{out}")).trim())
    };
    let mut killed = Sandboxed::start_with("", &env).await;
    let out = killed
        .bash("echo private > $TMPDIR/notes; echo $TMPDIR")
        .await;
    let left = private_dir(&out);
    assert!(left.starts_with(tmp.path()), "{out}");
    let mut running = Sandboxed::start_with("", &env).await;
    let kept = private_dir(&running.bash("echo $TMPDIR").await);
    // Dropped, the server is killed (SIGKILL) and cannot clean up.
    drop(killed);
    assert_eq!(
        std::fs::read_to_string(left.join("notes")).unwrap(),
        "private\n"
    );

    let _next = Sandboxed::start_with("", &env).await;
    assert!(!left.exists(), "{} is still there", left.display());
    assert!(
        !left.parent().unwrap().exists(),
        "the killed server's base is gone whole"
    );
    assert!(kept.exists(), "a running server's directory is kept");
    assert!(
        running
            .bash("echo still > $TMPDIR/n; cat $TMPDIR/n")
            .await
            .contains("still")
    );
}

#[tokio::test]
async fn etc_shadow_is_covered_when_the_server_is_root() {
    let mut s = Sandboxed::start().await;
    // Root reads it outside (the check can fail); not root, it is unreadable anyway.
    let out = s.bash("cat /etc/shadow | wc -c").await;
    assert!(out.starts_with("0\n"), "{out}");
}

// ---- the data directory and another agent's roots ----

#[tokio::test]
async fn the_store_config_and_socket_in_the_data_directory_are_hidden() {
    let mut s = Sandboxed::start().await;
    let data = s.data();
    let out = s
        .bash(&format!(
            "ls -A {d} | sed 's/^/entry:/'; cat {d}/guildhall.toml; cat {d}/*.redb | wc -c; \
             cp -r {d} copy",
            d = data.display()
        ))
        .await;
    assert!(!out.contains("entry:"), "{out}");
    assert!(!out.contains("[files]"), "{out}");
    assert!(
        std::fs::read_dir(s.project().join("copy"))
            .map(|d| d.count())
            .unwrap_or(0)
            == 0,
        "nothing of the data directory was copied"
    );
}

#[tokio::test]
async fn the_data_directory_inside_a_root_is_covered() {
    // The default layout: `.guildhall` in the project, which is the agent's root.
    let mut s = Sandboxed::start_laid_out(true, "", &[]).await;
    let data = s.data();
    assert!(data.starts_with(s.project()));
    let out = s
        .bash(&format!(
            "ls -A {d} | sed 's/^/entry:/'; cat {d}/tl.token {d}/guildhall.toml; \
             echo x > {d}/planted; rm -f {d}/guildhall.toml; cd {d} && ls -A",
            d = data.display()
        ))
        .await;
    assert!(!out.contains("entry:"), "{out}");
    assert!(!out.contains(TOKEN) && !out.contains("[files]"), "{out}");
    absent(&data.join("planted"));
    assert!(data.join("guildhall.toml").exists(), "{out}");
}

#[tokio::test]
async fn the_token_file_is_not_readable() {
    let mut s = Sandboxed::start().await;
    let token = s.data().join("tl.token");
    let out = s
        .bash(&format!(
            "cat {}; grep -r tl-token {}",
            token.display(),
            s.data().display()
        ))
        .await;
    assert!(!out.contains(TOKEN), "{out}");
}

#[tokio::test]
async fn the_config_cannot_be_rewritten_from_inside() {
    let mut s = Sandboxed::start().await;
    let config = s.data().join("guildhall.toml");
    let before = std::fs::read_to_string(&config).unwrap();
    let out = s
        .bash(&format!(
            "echo '[sandbox]' >> {c}; printf 'enabled = false' > {c}.new && mv {c}.new {c}",
            c = config.display()
        ))
        .await;
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before, "{out}");
}

#[tokio::test]
async fn another_agents_roots_are_out_of_reach() {
    let mut s = Sandboxed::start().await;
    let other = s.other();
    let out = s
        .bash(&format!(
            "cat {o}/notes.txt; echo x > {o}/planted; ls {o}",
            o = other.display()
        ))
        .await;
    assert!(!out.contains(BOBS), "{out}");
    absent(&other.join("planted"));
}

// ---- the network ----

#[tokio::test]
async fn tcp_to_a_loopback_service_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut s = Sandboxed::start().await;
    let out = s
        .bash(&format!(
            "echo hi > /dev/tcp/127.0.0.1/{port}; /usr/bin/python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))'"
        ))
        .await;
    assert!(listener.accept().is_err(), "a connection arrived: {out}");
    assert!(out.contains("not permitted"), "{out}");
}

#[tokio::test]
async fn udp_to_a_loopback_service_is_refused() {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let port = socket.local_addr().unwrap().port();
    let mut s = Sandboxed::start().await;
    let out = s
        .bash(&format!(
            "echo hi > /dev/udp/127.0.0.1/{port}; /usr/bin/python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"x\", (\"127.0.0.1\", {port}))'"
        ))
        .await;
    let mut buf = [0u8; 16];
    assert!(
        socket.recv_from(&mut buf).is_err(),
        "a datagram arrived: {out}"
    );
}

#[tokio::test]
async fn dns_lookups_do_not_leave() {
    // A resolver on loopback, asked directly (the system's may not be reachable here).
    let resolver = UdpSocket::bind("127.0.0.1:0").unwrap();
    resolver.set_nonblocking(true).unwrap();
    let port = resolver.local_addr().unwrap().port();
    let mut s = Sandboxed::start().await;
    let query = "\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07example\\x03com\\x00\\x00\\x01\\x00\\x01";
    let out = s
        .bash(&format!(
            "getent hosts guildhall-sandbox-test.example; echo looked=$?; getent hosts localhost; \
             /usr/bin/python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"{query}\", (\"127.0.0.1\", {port}))'"
        ))
        .await;
    assert!(out.contains("looked=2"), "{out}");
    assert!(out.contains("localhost"), "/etc/hosts still answers: {out}");
    let mut buf = [0u8; 512];
    assert!(
        resolver.recv_from(&mut buf).is_err(),
        "a query arrived: {out}"
    );
}

#[tokio::test]
async fn guildhalls_own_http_port_is_refused() {
    let mut s = Sandboxed::start().await;
    let url = s.http.clone();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let port = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let out = s
        .bash(&format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET /mcp HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
        ))
        .await;
    assert!(!out.contains("HTTP/1"), "{out}");
}

#[tokio::test]
async fn guildhalls_local_socket_is_refused() {
    let mut s = Sandboxed::start().await;
    let socket = s.data().join("guildhall.sock");
    assert!(socket.exists());
    let out = s
        .bash(&format!(
            "/usr/bin/python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{}\"); print(\"connected\")'",
            socket.display()
        ))
        .await;
    assert!(!out.contains("connected"), "{out}");
}

// ---- the egress proxy ----

/// An HTTP origin on loopback that answers every request with `body` and counts the
/// connections it took.
struct Origin {
    port: u16,
    taken: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Origin {
    fn start(body: &'static str) -> Self {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&taken);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { port, taken }
    }

    fn connections(&self) -> usize {
        self.taken.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `network = "proxy"` for every agent, `allow` as given.
fn proxied(allow: &[String]) -> String {
    format!("[sandbox]\nnetwork = \"proxy\"\n[sandbox.proxy]\nallow = {allow:?}\n")
}

#[tokio::test]
async fn a_fetch_through_the_proxy_reaches_an_allowed_host_plain_and_tunnelled() {
    let origin = Origin::start("hello-through-the-proxy");
    let allowed = format!("127.0.0.1:{}", origin.port);
    let mut s = Sandboxed::start_with(&proxied(std::slice::from_ref(&allowed)), &[]).await;
    let out = s
        .bash(&format!(
            "curl -sS http://{allowed}/a; echo; curl -sS --proxytunnel http://{allowed}/b; echo; env | grep -c '^HTTPS_PROXY=http://127.0.0.1:'"
        ))
        .await;
    assert_eq!(
        out.matches("hello-through-the-proxy").count(),
        2,
        "plain and through CONNECT: {out}"
    );
    assert_eq!(origin.connections(), 2, "{out}");
}

#[tokio::test]
async fn a_refused_host_is_named_in_the_result_an_event_and_the_audit() {
    let allowed = Origin::start("allowed");
    let refused = Origin::start("never");
    let mut s =
        Sandboxed::start_with(&proxied(&[format!("127.0.0.1:{}", allowed.port)]), &[]).await;
    let out = s
        .bash(&format!("curl -sS http://127.0.0.1:{}/", refused.port))
        .await;
    assert_eq!(refused.connections(), 0, "{out}");
    let named = format!(
        "refused 127.0.0.1:{}: not in [sandbox.proxy] allow",
        refused.port
    );
    assert!(out.contains(&named), "the result names the host: {out}");
    let audit = guildhall_ok(
        &s.data(),
        &[
            "audit",
            "--tool",
            "sandbox.*",
            "--agent",
            "mallory",
            "--json",
        ],
    );
    assert!(audit.contains("\"sandbox.egress\""), "{audit}");
    assert!(audit.contains("\"deny\""), "{audit}");
    assert!(audit.contains("\"sandbox.refusal\""), "{audit}");
    // Counted from the same event the watchers see.
    let metrics = crate::support::http_client()
        .get(s.http.replace("/mcp", "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("guildhall_sandbox_egress_refused_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn behind_the_proxy_nothing_else_is_reached() {
    let origin = Origin::start("direct");
    let resolver = UdpSocket::bind("127.0.0.1:0").unwrap();
    resolver.set_nonblocking(true).unwrap();
    // guildhall's own port, allowed by name: still never reached.
    let own = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let allow = [
        format!("127.0.0.1:{}", origin.port),
        format!("127.0.0.1:{own}"),
    ];
    let mut s =
        Sandboxed::start_full(false, &proxied(&allow), &[], &format!("127.0.0.1:{own}")).await;
    assert!(s.http.contains(&format!(":{own}/")), "{}", s.http);
    let out = s
        .bash(&format!(
            "echo hi > /dev/tcp/127.0.0.1/{port}; echo direct=$?; \
             curl -sS --noproxy '*' http://127.0.0.1:{port}/; echo bypass=$?; \
             echo q > /dev/udp/127.0.0.1/{udp}; \
             curl -sS http://127.0.0.1:{own}/mcp; echo own=$?",
            port = origin.port,
            udp = resolver.local_addr().unwrap().port(),
        ))
        .await;
    assert_eq!(origin.connections(), 0, "{out}");
    let mut buf = [0u8; 16];
    assert!(resolver.recv_from(&mut buf).is_err(), "{out}");
    assert!(out.contains("one of guildhall's own listeners"), "{out}");
    assert!(!out.contains("jsonrpc"), "{out}");
}

#[tokio::test]
async fn a_wildcard_never_reaches_loopback() {
    let origin = Origin::start("loopback");
    let mut s = Sandboxed::start_with(&proxied(&["*".into()]), &[]).await;
    let out = s
        .bash(&format!("curl -sS http://localhost:{}/", origin.port))
        .await;
    assert_eq!(origin.connections(), 0, "{out}");
    // A bare `*` allows the web's ports only: another port is refused before any address.
    assert!(out.contains("not in [sandbox.proxy] allow"), "{out}");
    let out = s.bash("curl -sS -o /dev/null http://localhost/").await;
    assert!(out.contains("a loopback address"), "{out}");
}

// ---- processes ----

/// A process the test owns, outside every sandbox.
struct Bystander(std::process::Child);

impl Bystander {
    fn start() -> Self {
        Self(
            std::process::Command::new("sleep")
                .arg("300")
                .spawn()
                .unwrap(),
        )
    }
    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap();
        let (_, rest) = stat.rsplit_once(')').unwrap();
        rest.trim_start().chars().next().unwrap()
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_signal_to_a_process_outside_is_refused() {
    let bystander = Bystander::start();
    let mut s = Sandboxed::start().await;
    let pid = bystander.0.id();
    let server = s.server_pid();
    let out = s
        .bash(&format!(
            "kill -STOP {pid}; kill -STOP {server}; echo sent=$?"
        ))
        .await;
    assert_eq!(bystander.state(), 'S', "{out}");
    // The server answers: it was not stopped.
    s.mallory.call("whoami", json!({})).await;
}

#[tokio::test]
async fn a_ptrace_attach_to_a_process_outside_is_refused() {
    let bystander = Bystander::start();
    let mut s = Sandboxed::start().await;
    let pid = bystander.0.id();
    let out = s
        .bash(&format!(
            "/usr/bin/python3 -c 'import ctypes; print(\"attach\", ctypes.CDLL(None).ptrace(16, {pid}, 0, 0))'; \
             strace -p {pid} -o /dev/null; echo strace=$?"
        ))
        .await;
    assert!(out.contains("attach -1"), "{out}");
    assert_ne!(bystander.state(), 't', "{out}");
}

#[tokio::test]
async fn new_namespaces_and_mounts_are_refused() {
    let mut s = Sandboxed::start().await;
    let out = s
        .bash("unshare -U true; echo u=$?; unshare -rm true; echo m=$?; mkdir m; mount -t tmpfs none m; echo mount=$?; grep NoNewPrivs /proc/self/status")
        .await;
    assert!(out.contains("u=1"), "{out}");
    assert!(out.contains("m=1"), "{out}");
    assert!(!out.contains("mount=0"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
}

#[tokio::test]
async fn a_fork_bomb_is_bounded_even_as_root() {
    let mut s = Sandboxed::start().await;
    let out = s
        .bash(
            "/usr/bin/python3 -c '
import os, time
n = 0
for _ in range(5000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30); os._exit(0)
    n += 1
print(\"forked\", n)
'",
        )
        .await;
    let forked: usize = out
        .split("forked ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(forked <= 512, "{forked} processes: {out}");
    // Another agent is served after it (the bomb's processes died with its process 1).
    let mut bob = Client::start_wrapped(&s.data(), &["--agent", "bob"], &[], &[]).await;
    bob.call("whoami", json!({})).await;
}

#[tokio::test]
async fn nothing_a_sandboxed_command_started_outlives_it() {
    let mut s = Sandboxed::start().await;
    // `setsid` leaves the process group; the PID namespace still holds it.
    let marker = "guildhall-outlive-7c31";
    // The command ends only once both run as the marker: a check before they exist could
    // not fail.
    let out = s
        .bash(&format!(
            "setsid bash -c 'exec -a {marker} sleep 600' & nohup bash -c 'exec -a {marker} sleep 600' & \
             for _ in $(seq 200); do [ \"$(pgrep -c -f '^{marker}')\" -ge 2 ] && break; sleep 0.05; done; \
             echo started $(pgrep -c -f '^{marker}')"
        ))
        .await;
    assert!(out.contains("started 2"), "{out}");
    let left = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .filter_map(|e| {
                let pid = e.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                String::from_utf8_lossy(&cmdline)
                    .starts_with(marker)
                    .then_some(pid)
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !left().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let survivors = left();
    for pid in &survivors {
        // Ours (started by this test's server): not left behind when the check fails.
        #[allow(unsafe_code)]
        // SAFETY: kill touches no memory.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    assert!(survivors.is_empty(), "outlived its command: {survivors:?}");
}

// ---- the same escapes through the other ways in ----

/// The escapes every way in is tried with: read outside, read the token, write outside,
/// connect out; `done` at the end.
fn escapes(s: &Sandboxed, planted: &Path) -> String {
    format!(
        "cat {} {}; echo x > {}; echo > /dev/tcp/127.0.0.1/9; echo done",
        s.outside().join("secret.txt").display(),
        s.data().join("tl.token").display(),
        planted.display()
    )
}

fn held(out: &str, planted: &Path) {
    assert!(out.contains("done"), "the line ran to its end: {out}");
    assert!(!out.contains(SECRET) && !out.contains(TOKEN), "{out}");
    absent(planted);
}

#[tokio::test]
async fn a_background_shell_is_confined_too() {
    let mut s = Sandboxed::start().await;
    let planted = s.outside().join("from-background");
    let out = s.background(&escapes(&s, &planted)).await;
    held(&out, &planted);
}

#[tokio::test]
async fn a_command_tool_is_confined_too() {
    let mut s = Sandboxed::start().await;
    let planted = s.outside().join("from-command");
    let out = s.command_tool(&escapes(&s, &planted)).await;
    held(&out, &planted);
}

#[tokio::test]
async fn a_proxied_stdio_server_is_confined_too() {
    let mut s = Sandboxed::start().await;
    let planted = s.outside().join("from-server");
    let out = s.proxied(&escapes(&s, &planted)).await;
    held(&out, &planted);
}

#[tokio::test]
async fn a_launched_agent_is_confined_too() {
    let mut s = Sandboxed::start().await;
    let planted = s.outside().join("from-launched");
    let out = s.launched("dev-1", &escapes(&s, &planted)).await;
    held(&out, &planted);
}

#[tokio::test]
async fn a_launched_agent_reaches_guildhall_as_itself_only() {
    let mut s = Sandboxed::start().await;
    let guildhall = env!("CARGO_BIN_EXE_guildhall");
    let data = s.data();
    let out = s
        .launched(
            "dev-2",
            &format!(
                "{guildhall} --data-dir /nowhere inbox --agent dev-2 && echo own-ok; \
                 {guildhall} --data-dir /nowhere inbox --agent tl; echo other=$?; \
                 {guildhall} --data-dir /nowhere status; echo status=$?; \
                 ls {data} | wc -l; \
                 cat \"$(dirname \"$GUILDHALL_SOCKET\")/guildhall.mcp.json\"",
                data = data.display()
            ),
        )
        .await;
    assert!(
        out.contains("own-ok"),
        "its own inbox, through its socket: {out}"
    );
    assert!(out.contains("this socket is agent `dev-2`'s"), "{out}");
    assert!(
        !out.contains("other=0") && !out.contains("status=0"),
        "{out}"
    );
    assert!(
        !out.contains("tl.token"),
        "the data directory is out of reach: {out}"
    );
    assert!(
        out.contains("GUILDHALL_SOCKET"),
        "its MCP config names its socket: {out}"
    );
}

#[tokio::test]
async fn a_launched_agents_unix_sockets_do_not_reach_the_systems() {
    // A service's socket where the system keeps them.
    let path = PathBuf::from(format!("/run/guildhall-test-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut s = Sandboxed::start().await;
    let out = s
        .launched(
            "dev-3",
            &format!(
                "/usr/bin/python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{}\"); print(\"connected\")'",
                path.display()
            ),
        )
        .await;
    let accepted = listener.accept();
    let _ = std::fs::remove_file(&path);
    assert!(accepted.is_err(), "a connection arrived: {out}");
    assert!(!out.contains("connected"), "{out}");
}

// ---- ordinary work inside ----

#[tokio::test]
async fn git_init_add_and_commit_work_in_a_root() {
    let mut s = Sandboxed::start().await;
    let out = s
        .bash("git init -q repo && cd repo && echo a > a && git add a && git -c user.email=a@example.com -c user.name=a commit -qm first && git log --oneline | wc -l")
        .await;
    assert!(out.starts_with("1\n"), "{out}");
    assert!(s.project().join("repo/.git/HEAD").exists());
}

#[tokio::test]
async fn git_read_keeps_a_roots_history_read_only() {
    let mut s = Sandboxed::start_with("[sandbox]\ngit = \"read\"\n", &[]).await;
    let project = s.project();
    let git = |args: &[&str]| {
        let done = std::process::Command::new("git")
            .args(["-c", "user.email=a@example.com", "-c", "user.name=a"])
            .args(args)
            .current_dir(&project)
            .output()
            .unwrap();
        assert!(done.status.success(), "git {args:?}: {done:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(project.join("a"), "a").unwrap();
    git(&["add", "a"]);
    git(&["commit", "-qm", "first"]);
    let head = std::fs::read_to_string(project.join(".git/HEAD")).unwrap();
    let out = s
        .bash("git log --oneline | wc -l; echo b > a && echo edited; git -c user.email=a@example.com -c user.name=a commit -qam second; echo commit=$?; echo x > .git/HEAD; echo head=$?")
        .await;
    assert!(out.starts_with("1\n"), "history is readable: {out}");
    assert!(
        out.contains("edited"),
        "the work tree stays writable: {out}"
    );
    assert!(
        !out.contains("commit=0") && !out.contains("head=0"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join(".git/HEAD")).unwrap(),
        head
    );
}

#[tokio::test]
async fn scripts_read_system_files_and_builds_write_their_target() {
    let mut s = Sandboxed::start().await;
    let out = s
        .bash(
            "grep -c . /etc/os-release > /dev/null && echo os-ok; \
             /usr/bin/python3 -c 'import json, sys; print(\"py-ok\")'; \
             mkdir -p target && printf 'int main(void){return 7;}' > main.c && \
             cc -o target/main main.c && ./target/main; echo built=$?",
        )
        .await;
    assert!(out.contains("os-ok"), "{out}");
    assert!(out.contains("py-ok"), "{out}");
    assert!(out.contains("built=7"), "{out}");
    assert!(s.project().join("target/main").exists());
}

#[tokio::test]
async fn status_whoami_and_doctor_report_the_level_applied() {
    let mut s = Sandboxed::start().await;
    let me = s.mallory.call("whoami", json!({})).await;
    assert_eq!(me["sandbox"]["network"], "none", "{me}");
    assert!(
        me["sandbox"]["applied"]
            .as_str()
            .is_some_and(|a| a.contains("Landlock ABI")),
        "{me}"
    );
    let status: Value =
        serde_json::from_str(&guildhall_ok(&s.data(), &["status", "--json"])).unwrap();
    let applied = status["sandbox"]["applied"].as_str().unwrap_or_default();
    assert!(applied.contains("Landlock ABI"), "{status}");
    assert!(applied.contains("seccomp"), "{status}");
    assert_eq!(status["sandbox"]["network"], "none", "{status}");
    // The doctor needs the store to itself; in another data directory it reports the
    // kernel's level alone.
    let elsewhere = s.dir.path().join("doctor");
    guildhall::Runtime::builder()
        .data_dir(&elsewhere)
        .build()
        .await
        .unwrap()
        .shutdown()
        .await;
    let out = crate::support::guildhall(&elsewhere)
        .args(["doctor"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("sandbox: Landlock ABI"), "{said}");
}

#[tokio::test]
async fn network_host_for_a_role_lets_its_commands_connect() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut s = Sandboxed::start_with("[sandbox.agents]\nmallory = \"host\"\n", &[]).await;
    let out = s
        .bash(&format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo sent"))
        .await;
    assert!(out.contains("sent"), "{out}");
    assert!(listener.accept().is_ok());
}

// ---- the fallback ----

#[tokio::test]
async fn require_refuses_what_the_kernel_cannot_confine() {
    let mut s = Sandboxed::start_with(
        "[sandbox]\nrequire = true\n",
        &[("GUILDHALL_SANDBOX_WITHOUT", "landlock")],
    )
    .await;
    let planted = s.outside().join("unconfined");
    let out = s
        .text(
            "bash",
            json!({ "command": format!("echo x > {}", planted.display()) }),
        )
        .await;
    absent(&planted);
    assert!(
        out.contains("refused to start a process unconfined"),
        "{out}"
    );
    assert!(out.contains("Landlock"), "{out}");
}

#[tokio::test]
async fn without_require_a_partial_sandbox_runs_and_says_so() {
    let mut s = Sandboxed::start_with("", &[("GUILDHALL_SANDBOX_WITHOUT", "landlock")]).await;
    let out = s.bash("echo ran").await;
    assert!(out.contains("ran"), "{out}");
    let status: Value =
        serde_json::from_str(&guildhall_ok(&s.data(), &["status", "--json"])).unwrap();
    let applied = status["sandbox"]["applied"].as_str().unwrap_or_default();
    assert!(applied.contains("missing: Landlock"), "{status}");
    // What the namespaces still hold: the token file.
    let out = s
        .bash(&format!("cat {}", s.data().join("tl.token").display()))
        .await;
    assert!(!out.contains(TOKEN), "{out}");
}

// ---- the same, the server run by an unprivileged user ----

/// The user the server runs as when the tests run as root.
const NOBODY: u32 = 65534;
/// A file in the data directory whose name only a listing of it shows.
const LISTED: &str = "listed-only-3b9e";

/// A server run by `nobody` (when the tests run as root; as themselves otherwise) from a
/// copy of the binary that user can run, `[files]` and `[shell]` on a project, a secret
/// beside it and `tl`'s token in the data directory, what `extra` makes of the test's
/// directory appended to the config, and mallory connected.
struct Unprivileged {
    dir: tempfile::TempDir,
    /// Where the binary's copy is: apart from `dir`, so the directory a launched agent may
    /// read its program from is not above the data directory (refused where no namespace
    /// covers the data directory, as for a server that `setpriv` made unprivileged).
    _bin: tempfile::TempDir,
    binary: PathBuf,
    as_root: bool,
    mallory: Client,
}

impl Unprivileged {
    async fn start(extra: &dyn Fn(&Path) -> String) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let extra = extra(root);
        #[allow(unsafe_code)]
        // SAFETY: getuid cannot fail.
        let as_root = unsafe { libc::getuid() } == 0;
        let chown = |path: &Path| {
            if as_root {
                std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
            }
        };
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        for d in ["project", "data", "outside", "probe"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            chown(&root.join(d));
        }
        let (project, data) = (root.join("project"), root.join("data"));
        let files = [
            (root.join("outside/secret.txt"), SECRET.to_owned()),
            (data.join("tl.token"), TOKEN.to_owned()),
            // Named only by a listing of the data directory.
            (data.join(LISTED), String::new()),
            (root.join("probe/server.py"), PROBE_SERVER.to_owned()),
            (
                data.join("guildhall.toml"),
                format!(
                    "[files]\nroots = [{:?}]\n[shell]\n[agents.tl]\ntoken_file = \"tl.token\"\n{extra}\n",
                    project.display().to_string()
                ),
            ),
        ];
        for (path, text) in &files {
            std::fs::write(path, text).unwrap();
            chown(path);
        }
        // A copy of the binary the other user can run (the build tree may be private).
        let bin = tempfile::tempdir_in("/var/tmp").unwrap();
        std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let binary = bin.path().join("guildhall");
        std::fs::copy(env!("CARGO_BIN_EXE_guildhall"), &binary).unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        let wrapper: &[&str] = if as_root {
            &[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--",
            ]
        } else {
            &[]
        };
        let mallory =
            Client::start_binary(&binary, &data, &["--agent", "mallory"], &[], wrapper).await;
        Self {
            dir,
            _bin: bin,
            binary,
            as_root,
            mallory,
        }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    /// A line that reads what must stay out of reach: the secret, the token, the data
    /// directory's listing, and who it runs as.
    fn prying(&self) -> String {
        format!(
            "id -u; cat {} {}; ls {}",
            self.path("outside/secret.txt").display(),
            self.path("data/tl.token").display(),
            self.path("data").display(),
        )
    }

    fn stop(&self) {
        let status = std::process::Command::new(&self.binary)
            .arg("--data-dir")
            .arg(self.path("data"))
            .arg("stop")
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert!(status.status.success(), "{status:?}");
    }
}

#[tokio::test]
async fn run_by_an_unprivileged_user_the_sandbox_holds_and_setuid_does_not_raise() {
    use std::os::unix::fs::PermissionsExt;
    let mut s = Unprivileged::start(&|_| String::new()).await;
    // A setuid-root program in the agent's root: `id` that would print euid 0.
    let setuid = s.path("project/id-setuid");
    if s.as_root {
        std::fs::copy("/usr/bin/id", &setuid).unwrap();
        std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    }
    let command = format!(
        "{}; [ -x ./id-setuid ] && ./id-setuid -u; grep NoNewPrivs /proc/self/status",
        s.prying()
    );
    let answer = s
        .mallory
        .request(
            "tools/call",
            json!({ "name": "bash", "arguments": { "command": command } }),
        )
        .await;
    let out = answer["result"]["structuredContent"].to_string();
    assert!(!out.contains(SECRET) && !out.contains(TOKEN), "{out}");
    // The data directory's listing never comes back.
    assert!(!out.contains(LISTED), "{out}");
    assert!(out.contains("NoNewPrivs:\\t1"), "{out}");
    if s.as_root {
        // Outside the sandbox the copy raises: the check below can fail.
        let raised = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&setuid)
            .arg("-u")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&raised.stdout).trim(), "0");
        let stdout = answer["result"]["structuredContent"]["stdout"]
            .as_str()
            .unwrap();
        let ids: Vec<&str> = stdout.lines().take(2).collect();
        assert_eq!(ids, ["65534", "65534"], "{out}");
    }
    s.stop();
}

#[tokio::test]
async fn run_by_an_unprivileged_user_a_proxied_server_and_a_launched_agent_stay_confined() {
    let mut s = Unprivileged::start(&|root| {
        format!(
            "[servers.probe]\ncommand = \"/usr/bin/python3\"\nargs = [{:?}]\n\
             [launch.profiles.probe]\n\
             command = [\"bash\", \"-c\", 'eval \"$1\"; echo \"rc=$?\"', \"probe\", \"{{prompt}}\"]\n\
             restart = \"temporary\"\n",
            root.join("probe/server.py").display().to_string()
        )
    })
    .await;
    let prying = s.prying();
    // The proxied stdio server, started by the unprivileged server, in its sandbox.
    let mallory = &mut s.mallory;
    let what = "the proxied server's tools come";
    crate::support::eventually_some(std::time::Duration::from_secs(30), what, async || {
        let tools = mallory.request("tools/list", json!({})).await;
        tools.to_string().contains("mcp__probe__run").then_some(())
    })
    .await;
    let proxied = s
        .mallory
        .request(
            "tools/call",
            json!({ "name": "mcp__probe__run", "arguments": { "line": prying } }),
        )
        .await
        .to_string();
    assert!(
        proxied.contains("rc="),
        "the server ran the line: {proxied}"
    );
    assert!(
        !proxied.contains(SECRET) && !proxied.contains(TOKEN),
        "{proxied}"
    );
    assert!(!proxied.contains(LISTED), "{proxied}");
    // A launched agent's process, in its sandbox.
    let spawned = s
        .mallory
        .request(
            "tools/call",
            json!({ "name": "spawn_agent", "arguments": {
                "role": "dev", "id": "dev-9", "prompt": prying, "profile": "probe" } }),
        )
        .await
        .to_string();
    assert!(
        spawned.contains("dev-9") && !spawned.contains("isError\":true"),
        "{spawned}"
    );
    let log = s.path("data/launched/dev-9.log");
    let what = "the launched agent ends";
    let written =
        crate::support::eventually_some(std::time::Duration::from_secs(30), what, async || {
            let written = std::fs::read_to_string(&log).unwrap_or_default();
            written.contains("rc=").then_some(written)
        })
        .await;
    assert!(
        !written.contains(SECRET) && !written.contains(TOKEN),
        "{written}"
    );
    assert!(!written.contains(LISTED), "{written}");
    if s.as_root {
        assert!(proxied.contains("65534"), "{proxied}");
        assert!(written.starts_with("65534"), "{written}");
    }
    s.stop();
}
