use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use guildhall::{Annotations, CallContext, InitState, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Polls `check` every 5 ms (of tokio time) until it holds, failing after `limit`.
pub async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    eventually_some(limit, "the condition", async || check().await.then_some(())).await
}

/// Tries `attempt` every 5 ms (of tokio time) until it gives a value, failing after
/// `limit` with `what` (what was waited for). An async closure may hold the caller's
/// `&mut` state (a wire, a request counter) across its awaits.
pub async fn eventually_some<T>(
    limit: Duration,
    what: &str,
    mut attempt: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = tokio::time::Instant::now();
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// [`eventually_some`] for a test without a runtime, whose attempt runs a command: tries
/// every 50 ms of the clock.
pub fn eventually_blocking<T>(
    limit: Duration,
    what: &str,
    mut attempt: impl FnMut() -> Option<T>,
) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = attempt() {
            return value;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a [`Chaos`] call should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    /// Succeed.
    Ok,
    /// Return the tool's own error.
    Fail,
    /// Panic.
    Panic,
    /// Never finish and ignore cancellation.
    Hang,
    /// Wait until cancelled, then return.
    WaitForCancel,
    /// Panic the first time this tool sees it, succeed afterwards.
    PanicOnce,
}

/// Input of [`Chaos`].
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChaosInput {
    /// What to do.
    pub act: Act,
    /// A caller-chosen id, recorded when the call runs.
    #[serde(default)]
    pub id: u64,
}

/// Output of [`Chaos`].
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ChaosOutput {
    /// Calls this actor instance handled, including this one (resets on restart).
    pub calls_since_start: u64,
}

/// The error [`Chaos`] returns for [`Act::Fail`].
#[derive(Debug, thiserror::Error)]
#[error("asked to fail")]
pub struct AskedToFail;

/// Shared record of what a [`Chaos`] tool did.
#[derive(Debug, Default)]
pub struct Record {
    /// Calls that started running.
    pub runs: AtomicUsize,
    /// Times the state was built.
    pub inits: AtomicUsize,
    /// Calls that saw their cancellation token fire.
    pub cancelled: AtomicUsize,
    /// Ids of the calls that ran, in order.
    pub ids: std::sync::Mutex<Vec<u64>>,
    /// Whether [`Act::PanicOnce`] has panicked already.
    pub panicked_once: std::sync::atomic::AtomicBool,
}

/// A tool that does what each call asks: succeed, fail, panic or hang.
pub struct Chaos {
    pub name: String,
    pub record: Arc<Record>,
    pub actors: usize,
    pub idempotent: bool,
}

impl Chaos {
    pub fn new(name: &str) -> (Self, Arc<Record>) {
        let record = Arc::new(Record::default());
        (
            Self {
                name: name.into(),
                record: Arc::clone(&record),
                actors: 1,
                idempotent: false,
            },
            record,
        )
    }
}

impl Tool for Chaos {
    type Input = ChaosInput;
    type Output = ChaosOutput;
    type Error = AskedToFail;
    type State = u64;

    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        "Does what it is told."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default().idempotent(self.idempotent)
    }

    fn concurrency(&self) -> guildhall::Concurrency {
        guildhall::Concurrency::up_to(self.actors)
    }

    async fn call(
        &self,
        calls: &mut u64,
        input: ChaosInput,
        ctx: CallContext,
    ) -> Result<ChaosOutput, AskedToFail> {
        self.record.runs.fetch_add(1, Ordering::SeqCst);
        self.record.ids.lock().unwrap().push(input.id);
        *calls += 1;
        match input.act {
            Act::Ok => Ok(ChaosOutput {
                calls_since_start: *calls,
            }),
            Act::Fail => Err(AskedToFail),
            Act::Panic => panic!("asked to panic"),
            Act::Hang => std::future::pending().await,
            Act::PanicOnce => {
                assert!(
                    self.record.panicked_once.swap(true, Ordering::SeqCst),
                    "panicking once"
                );
                Ok(ChaosOutput {
                    calls_since_start: *calls,
                })
            }
            Act::WaitForCancel => {
                ctx.cancellation().cancelled().await;
                self.record.cancelled.fetch_add(1, Ordering::SeqCst);
                Ok(ChaosOutput {
                    calls_since_start: *calls,
                })
            }
        }
    }
}

impl InitState for Chaos {
    async fn init(&self) -> Result<u64, AskedToFail> {
        self.record.inits.fetch_add(1, Ordering::SeqCst);
        Ok(0)
    }
}

/// A runtime with one [`Chaos`] tool called `name`, a handle to it, and its record.
pub async fn one_chaos(
    name: &str,
    options: guildhall::ToolOptions,
) -> (
    guildhall::Runtime,
    guildhall::ToolHandle<Chaos>,
    Arc<Record>,
) {
    let (tool, record) = Chaos::new(name);
    let rt = guildhall::Runtime::builder()
        .tool_with(tool, options)
        .build()
        .await
        .unwrap();
    let handle = rt.handle::<Chaos>(name).unwrap();
    (rt, handle, record)
}

pub fn input(act: Act) -> ChaosInput {
    ChaosInput { act, id: 0 }
}

/// How many times agent `id`'s mailbox was restarted, wherever its partition is; `None` if it
/// is not running.
pub async fn mailbox_restarts(rt: &guildhall::Runtime, id: &str) -> Option<u32> {
    let tree = rt.tree().await.ok()?;
    tree.find(&["mailboxes"])?
        .children
        .iter()
        .find_map(|partition| partition.find(&[id]))
        .map(|node| node.restarts)
}

/// Every unread message of `agent`, taken (marked read).
pub async fn take_all(agent: &guildhall::Agent) -> guildhall::agents::Inbox {
    agent
        .check_inbox(guildhall::InboxQuery {
            limit: usize::MAX,
            mark_read: true,
            ..guildhall::InboxQuery::default()
        })
        .await
        .unwrap()
}

/// The subjects of every unread message of `agent`, in listing order.
pub async fn subjects(agent: &guildhall::Agent) -> Vec<String> {
    let inbox = agent
        .check_inbox(guildhall::InboxQuery {
            limit: usize::MAX,
            ..guildhall::InboxQuery::default()
        })
        .await
        .unwrap();
    inbox
        .messages
        .iter()
        .map(|m| m.subject.to_string())
        .collect()
}

/// The `guildhall` binary on data directory `dir`, with logs off.
pub fn guildhall(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_guildhall"));
    cmd.arg("--data-dir").arg(dir).env("RUST_LOG", "off");
    cmd
}

/// Runs `guildhall <args>` on `dir`, asserts that it succeeded, and returns its stdout.
pub fn guildhall_ok(dir: &Path, args: &[&str]) -> String {
    let out = guildhall(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "guildhall {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The ripgrep binary the `grep` baseline runs: the one on `PATH`, else Debian's package,
/// installed here (the test machine is a fresh Debian one; installing needs root).
pub fn ripgrep() -> std::path::PathBuf {
    let found = |name: &str| {
        std::process::Command::new(name)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !found("rg") {
        let install = |args: &[&str]| {
            std::process::Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let _ = install(&["install", "-y", "-q", "ripgrep"])
            || (install(&["update", "-q"]) && install(&["install", "-y", "-q", "ripgrep"]));
    }
    assert!(
        found("rg"),
        "ripgrep (`rg`) is needed as the grep baseline and could not be installed: \
         apt-get install ripgrep"
    );
    "rg".into()
}

/// Serves `rt` over Streamable HTTP on a free loopback port: the endpoint's URL, and the
/// token that stops the server.
pub async fn http_endpoint(
    rt: &guildhall::Runtime,
    options: guildhall::mcp::http::HttpOptions,
) -> (String, tokio_util::sync::CancellationToken) {
    use guildhall::mcp::http;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let router = http::router(
        guildhall::mcp::McpServer::new(rt.clone()),
        addr,
        options,
        stop.clone(),
    )
    .unwrap();
    tokio::spawn(http::serve(listener, router, stop.clone()));
    (format!("http://{addr}{}", http::PATH), stop)
}

/// Options for a call made as the registered agent `id`.
pub fn as_agent(rt: &guildhall::Runtime, id: impl AsRef<str>) -> guildhall::CallOptions {
    let id = id.as_ref();
    let agent = rt
        .agent(id)
        .unwrap_or_else(|err| panic!("{id} is registered: {err}"));
    guildhall::CallOptions::new().as_agent(&agent)
}

/// A `guildhall serve` started by a test; killed when dropped, so a failing test leaves no
/// server behind.
pub struct Background(std::process::Child);

impl Background {
    /// The server's pid.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Waits for the server to exit (after `guildhall stop` or a signal).
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `guildhall serve --no-http` on `dir` and returns once it answers `status`.
pub fn serve_in_background(dir: &Path) -> Background {
    serve_in_background_with(dir, &["--no-http"])
}

/// Starts `guildhall serve` with `args` on `dir` and returns once it answers `status`.
pub fn serve_in_background_with(dir: &Path, args: &[&str]) -> Background {
    serve_in_background_env(dir, args, &[])
}

/// [`serve_in_background_with`], `env` added to the server's environment.
pub fn serve_in_background_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Background {
    let server = Background(
        Command::new(env!("CARGO_BIN_EXE_guildhall"))
            .arg("--data-dir")
            .arg(dir)
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "off")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    eventually_blocking(Duration::from_secs(20), "the server answers", || {
        guildhall(dir)
            .args(["status", "--json"])
            .output()
            .is_ok_and(|o| o.status.success())
            .then_some(())
    });
    server
}

/// Whether process `pid` is gone (a zombie waiting for a reaper counts as gone: it runs
/// nothing and holds nothing).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// An HTTP client for the tests: reqwest's TLS here has no built-in provider (guildhall
/// chooses ring), so the tests choose it too before building one.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// The pids a command wrote to `file` (whitespace-separated), once it has written `count`
/// of them.
pub async fn pids(file: &Path, count: usize) -> Vec<i32> {
    let mut found = Vec::new();
    eventually(Duration::from_secs(20), || {
        found = std::fs::read_to_string(file)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let ready = found.len() >= count;
        async move { ready }
    })
    .await;
    found
}

/// Adds 1 to the entry `counter` of `ctx`, `times` times, each a read and then an update
/// that expects the version read, tried again on a conflict; returns the conflicts met.
pub async fn increment_counter(ctx: &guildhall::context::Context, times: u64) -> u64 {
    use guildhall::context::{Change, ContextError, Strategy};
    let (mut done, mut conflicts) = (0, 0);
    while done < times {
        let (count, version) = match ctx.get("counter").await.unwrap() {
            Some(e) => (e.value.as_u64().unwrap(), e.version),
            None => (0, 0),
        };
        let change = Change::new("counter", Strategy::Replace, (count + 1).into()).expect(version);
        match ctx.update(vec![change]).await {
            Ok(_) => done += 1,
            Err(ContextError::Conflict { .. }) => conflicts += 1,
            Err(other) => panic!("{other}"),
        }
        tokio::task::yield_now().await;
    }
    conflicts
}

/// Every `.rs` file under `dir`, in a stable order (the source checks read them).
pub fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("a source directory is readable")
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}

/// The path of example `name`, built by `cargo test` beside the binary (not run by it).
pub fn example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_BIN_EXE_guildhall"))
        .parent()
        .map(|dir| dir.join("examples").join(name))
        .filter(|example| example.exists())
        .expect("the examples are built: run `cargo test --workspace` or `cargo build --examples`")
}
