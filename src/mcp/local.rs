//! The local socket: how processes on this machine reach a running server.
//!
//! `guildhall serve` listens on `<data dir>/guildhall.sock`. A client opens a connection and
//! writes one JSON line, its [`Hello`]; the server answers one JSON line, a [`Reply`]. After
//! a [`Hello::Mcp`] and an `ok` reply, the rest of the connection is plain MCP over
//! newline-delimited JSON-RPC, bound to the agent the hello named. The other hellos
//! (`status`, `call`) get their answer in the reply and the connection closes.
//!
//! The socket lives in the data directory, so its permissions are the directory's: whoever
//! may read the store may talk to the server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{McpServer, ToolFilter};
use crate::{AgentSpec, CallOptions};

/// The socket's file name in the data directory.
pub const SOCKET_FILE: &str = "guildhall.sock";

/// The longest hello line accepted.
const MAX_HELLO: u64 = 64 * 1024;
/// How long a client has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The socket path for a data directory.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_FILE)
}

pub use crate::agents::SOCKET_ENV;

/// The socket a client connects to: [`SOCKET_ENV`]'s when set, else `data_dir`'s.
pub fn client_socket(data_dir: &Path) -> PathBuf {
    match std::env::var_os(SOCKET_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => socket_path(data_dir),
    }
}

/// The first line a client sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "hello", rename_all = "snake_case", deny_unknown_fields)]
pub enum Hello {
    /// Serve MCP on the rest of the connection as `agent`, registering it (or updating its
    /// role and parent) first.
    Mcp {
        /// The agent's id.
        agent: String,
        /// Its role; a new agent without one is registered as `agent`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<String>,
        /// The agent it reports to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<String>,
        /// Tool names and globs, comma-separated, narrowing what the connection sees.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tools: Option<String>,
        /// The agent's token, when the config gives it one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// The model behind the client, for `[models."PATTERN"]`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// Answer with the server's status: its supervision tree, agents and tools.
    Status,
    /// Stop the server: it answers with its pid, then shuts down as on SIGTERM.
    Stop,
    /// Run an administrative command line (`agents …`, `context …`) inside the server,
    /// which holds the store; answers with what it printed.
    Admin {
        /// The command line without the program name.
        args: Vec<String>,
        /// The client's working directory, which relative paths in `args` are taken from.
        cwd: PathBuf,
        /// The token of the agent the command acts as (`--as`), when the config gives it
        /// one: acting as an agent through the socket takes its token, as through MCP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// Answer with the audit records the query selects (every call finished so far).
    Audit {
        /// Which records.
        #[serde(default)]
        query: crate::governance::AuditQuery,
    },
    /// Answer `ok`, then stream the runtime's events as JSON lines (each with `at_ms`), and
    /// `{"event": "missed", "count": N}` when this watcher fell behind and lost N, until the
    /// client leaves.
    Watch,
    /// Answer one of the agent's client hooks (`guildhall hook`) with what its model is to
    /// be told ([`crate::loop_hooks`]).
    Hook {
        /// The agent whose client runs the hook.
        agent: String,
        /// The agent's token, when the config gives it one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// The hook's point and session.
        event: crate::loop_hooks::HookEvent,
    },
    /// Call one tool, as `agent` when given, and answer with its result.
    Call {
        /// The calling agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
        /// The agent's token, when the config gives it one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// The tool.
        tool: String,
        /// Its arguments.
        #[serde(default)]
        arguments: Value,
    },
}

/// The server's one-line answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Accepted; the value depends on the hello.
    Ok(Value),
    /// Refused, and why.
    Error(String),
}

/// Default tool sets by role, from the config file.
pub type RoleTools = BTreeMap<String, ToolFilter>;

/// Why a client could not get through.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Nothing is listening on the socket.
    #[error("no guildhall server is running for {path}")]
    NotRunning {
        /// The socket path.
        path: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The server refused the hello.
    #[error("the server refused: {0}")]
    Refused(String),
    /// The conversation broke off.
    #[error("talking to the server at {path} failed")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// A connection that passed its hello.
pub struct Connected {
    /// The reply's value.
    pub value: Value,
    /// The server's side of the stream, with anything already buffered.
    pub reader: BufReader<OwnedReadHalf>,
    /// The client's side.
    pub writer: OwnedWriteHalf,
}

/// Connects to the server for `data_dir` and says `hello`.
///
/// # Errors
/// [`LocalError::NotRunning`] when nothing listens, [`LocalError::Refused`] with the
/// server's reason, [`LocalError::Io`] if the connection breaks.
///
/// # Cancel safety
/// Cancel safe: dropping it closes the socket.
pub async fn connect(data_dir: &Path, hello: &Hello) -> Result<Connected, LocalError> {
    connect_to(&client_socket(data_dir), hello).await
}

/// Connects to the socket at `path` and says `hello` ([`connect`] with the path given).
///
/// # Errors
/// As [`connect`].
///
/// # Cancel safety
/// Cancel safe: dropping it closes the socket.
pub async fn connect_to(path: &Path, hello: &Hello) -> Result<Connected, LocalError> {
    let path = path.to_path_buf();
    let stream = UnixStream::connect(&path)
        .await
        .map_err(|source| LocalError::NotRunning {
            path: path.clone(),
            source,
        })?;
    let io = |source| LocalError::Io {
        path: path.clone(),
        source,
    };
    let (read, mut writer) = stream.into_split();
    let mut line = serde_json::to_vec(hello).map_err(|e| io(std::io::Error::other(e)))?;
    line.push(b'\n');
    writer.write_all(&line).await.map_err(io)?;
    let mut reader = BufReader::new(read);
    let mut answer = String::new();
    (&mut reader)
        .take(MAX_HELLO)
        .read_line(&mut answer)
        .await
        .map_err(io)?;
    if answer.is_empty() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the server closed the connection before answering",
        )));
    }
    match serde_json::from_str::<Reply>(&answer) {
        Ok(Reply::Ok(value)) => Ok(Connected {
            value,
            reader,
            writer,
        }),
        Ok(Reply::Error(reason)) => Err(LocalError::Refused(reason)),
        Err(err) => Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unreadable answer from the server: {err}"),
        ))),
    }
}

/// Runs administrative command lines inside the server ([`Hello::Admin`]): the store is the
/// server's while it runs, so commands that would open it come here instead. The binary,
/// which knows its commands, provides it.
pub trait Admin: Send + Sync + 'static {
    /// Runs `args` against `runtime`, with relative paths taken from `cwd`; answers what the
    /// command printed, or why it failed.
    fn run(
        &self,
        runtime: crate::Runtime,
        cwd: PathBuf,
        args: Vec<String>,
    ) -> futures::future::BoxFuture<'static, Result<String, String>>;
}

/// What the socket tells the process serving it: how many MCP connections are live (for an
/// idle exit) and whether a client asked the server to stop; and how it runs administrative
/// commands, if it does.
#[derive(Clone)]
pub struct Control {
    stop: CancellationToken,
    live: Arc<tokio::sync::watch::Sender<usize>>,
    admin: Option<Arc<dyn Admin>>,
    started: std::time::Instant,
    /// What `status` tells about how the server was started (data directory, HTTP URL).
    about: Value,
    /// The proxied MCP servers, listed by `status`.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    servers: Option<Arc<crate::servers::Servers>>,
    /// The launched agents, listed by `status`.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    launcher: Option<Arc<crate::launch::Launcher>>,
    /// What agents' client hooks are answered ([`Hello::Hook`]).
    loop_hooks: Arc<crate::loop_hooks::LoopHooks>,
}

impl Control {
    /// The number of live MCP connections (every transport), as it changes.
    pub fn connections(&self) -> tokio::sync::watch::Receiver<usize> {
        self.live.subscribe()
    }
}

impl Default for Control {
    fn default() -> Self {
        Self {
            stop: CancellationToken::new(),
            live: Arc::default(),
            admin: None,
            started: std::time::Instant::now(),
            about: Value::Object(serde_json::Map::new()),
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            servers: None,
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            launcher: None,
            loop_hooks: Arc::default(),
        }
    }
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("about", &self.about)
            .finish_non_exhaustive()
    }
}

impl Control {
    /// Adds `about` (an object: data directory, HTTP URL, …) to what `status` answers.
    #[must_use]
    pub fn with_about(mut self, about: Value) -> Self {
        self.about = about;
        self
    }

    /// Lists `servers` in what `status` answers.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[must_use]
    pub fn with_servers(mut self, servers: Arc<crate::servers::Servers>) -> Self {
        self.servers = Some(servers);
        self
    }

    /// Lists the agents `launcher` started in what `status` answers.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[must_use]
    pub fn with_launcher(mut self, launcher: Arc<crate::launch::Launcher>) -> Self {
        self.launcher = Some(launcher);
        self
    }

    /// Answers [`Hello::Hook`] with `hooks`' settings (which roles keep going at a stop).
    #[must_use]
    pub fn with_loop_hooks(mut self, hooks: crate::loop_hooks::LoopHooks) -> Self {
        self.loop_hooks = Arc::new(hooks);
        self
    }

    /// Runs [`Hello::Admin`] command lines with `admin`.
    #[must_use]
    pub fn with_admin(mut self, admin: Arc<dyn Admin>) -> Self {
        self.admin = Some(admin);
        self
    }

    /// Fires when a client sent [`Hello::Stop`].
    pub fn stop_requested(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Resolves once no MCP connection has been live for `idle`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches.
    pub async fn idle_for(&self, idle: Duration) {
        let mut live = self.live.subscribe();
        loop {
            if live.wait_for(|n| *n == 0).await.is_err() {
                return std::future::pending().await;
            }
            tokio::select! {
                () = tokio::time::sleep(idle) => return,
                changed = live.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
            }
        }
    }

    /// Counts one live MCP connection until the guard is dropped.
    fn enter(&self) -> LiveConnection {
        self.live.send_modify(|n| *n += 1);
        LiveConnection(Arc::clone(&self.live))
    }
}

struct LiveConnection(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for LiveConnection {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Accepts local connections for `server` until `shutdown` fires.
///
/// # Cancel safety
/// Dropping the future stops accepting connections; those already accepted run on their own
/// tasks until their clients leave.
pub async fn serve(
    listener: UnixListener,
    server: McpServer,
    roles: Arc<RoleTools>,
    shutdown: CancellationToken,
    control: Control,
) {
    serve_as(listener, server, roles, shutdown, control, None).await;
}

/// Opens a socket at `path` that serves agent `agent` alone (owner only): MCP and tool
/// calls as that agent, no token asked (reaching the socket is the credential, as for the
/// data directory's), nothing else: no other agent, no status, stop, administration,
/// audit or watch. A launched agent's sandbox reaches this one and not the data
/// directory's. Served until the guard is dropped.
///
/// # Errors
/// The socket cannot be created or restricted.
pub fn open_for_agent(
    path: &Path,
    agent: &str,
    server: McpServer,
    roles: Arc<RoleTools>,
    control: Control,
) -> std::io::Result<DropGuard> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    let listener = UnixListener::bind(path)?;
    crate::private_fs::restrict(path)?;
    let stop = CancellationToken::new();
    tokio::spawn(serve_as(
        listener,
        server,
        roles,
        stop.clone(),
        control,
        Some(Arc::from(agent)),
    ));
    Ok(stop.drop_guard())
}

/// Opens launched agents' own sockets ([`open_for_agent`]) for a
/// [`Launcher`](crate::launch::Launcher) whose agents run in the sandbox.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub struct AgentSocketServer {
    server: McpServer,
    roles: Arc<RoleTools>,
    control: Control,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl AgentSocketServer {
    /// Serves `server` with the tool sets of `roles`; `control` counts the connections.
    pub fn new(server: McpServer, roles: Arc<RoleTools>, control: Control) -> Self {
        Self {
            server,
            roles,
            control,
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl crate::launch::AgentSockets for AgentSocketServer {
    fn open(&self, agent: &str, path: &Path) -> std::io::Result<Box<dyn Send + Sync>> {
        let guard = open_for_agent(
            path,
            agent,
            self.server.clone(),
            Arc::clone(&self.roles),
            self.control.clone(),
        )?;
        Ok(Box::new(guard))
    }
}

async fn serve_as(
    listener: UnixListener,
    server: McpServer,
    roles: Arc<RoleTools>,
    shutdown: CancellationToken,
    control: Control,
    bound: Option<Arc<str>>,
) {
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "local socket accept failed");
                    continue;
                }
            },
        };
        let server = server.clone();
        let roles = Arc::clone(&roles);
        let control = control.clone();
        let bound = bound.clone();
        tokio::spawn(async move {
            if let Err(err) = handle(stream, server, &roles, &control, bound.as_deref()).await {
                tracing::debug!(error = %guildhall_actors::ErrorChain(&err), "local connection ended with an error");
            }
        });
    }
}

async fn handle(
    stream: UnixStream,
    server: McpServer,
    roles: &RoleTools,
    control: &Control,
    bound: Option<&str>,
) -> std::io::Result<()> {
    let (read, mut writer) = stream.into_split();
    let mut reader = BufReader::new(read);
    let hello = match read_hello(&mut reader, bound).await? {
        Ok(hello) => hello,
        Err(reason) => return answer(&mut writer, Reply::Error(reason)).await,
    };
    // On an agent's own socket, reaching it proved who the caller is.
    let prove = |server: &McpServer, agent: &str, token: Option<&str>| match bound {
        Some(_) => Ok(()),
        None => prove(server, agent, token),
    };
    match hello {
        Hello::Mcp {
            agent,
            role,
            parent,
            tools,
            token,
            model,
        } => match prove(&server, &agent, token.as_deref())
            // Who launched it set its role and parent; its own socket cannot change them.
            .and(
                bind(
                    &server,
                    roles,
                    agent,
                    role.filter(|_| bound.is_none()),
                    parent.filter(|_| bound.is_none()),
                    tools.as_deref(),
                )
                .await,
            ) {
            Ok((connection, record)) => {
                let connection = connection.with_model(model.map(Arc::from));
                let _live = control.enter();
                answer(&mut writer, Reply::Ok(record)).await?;
                super::serve_stream(connection, (reader, writer)).await
            }
            Err(reason) => answer(&mut writer, Reply::Error(reason)).await,
        },
        Hello::Status => {
            let reply = match status(&server, control, STATUS_AGENTS).await {
                Ok(value) => Reply::Ok(value),
                Err(reason) => Reply::Error(reason),
            };
            answer(&mut writer, reply).await
        }
        Hello::Stop => {
            tracing::info!("asked to stop through the local socket");
            let reply = Reply::Ok(serde_json::json!({ "pid": std::process::id() }));
            let answered = answer(&mut writer, reply).await;
            control.stop.cancel();
            answered
        }
        Hello::Admin { args, cwd, token } => {
            let refused =
                acting_as(&args).find_map(|agent| prove(&server, agent, token.as_deref()).err());
            let reply = match refused {
                Some(reason) => Reply::Error(reason),
                None => run_admin(&server, control, cwd, args).await,
            };
            answer(&mut writer, reply).await
        }
        Hello::Audit { query } => answer(&mut writer, read_audit(&server, &query).await).await,
        Hello::Watch => {
            // Subscribed before the answer: what happens after `ok` is seen.
            let watching = server.feeds().operator().watch();
            answer(&mut writer, Reply::Ok(Value::Null)).await?;
            watch(watching, reader, writer).await
        }
        Hello::Hook {
            agent,
            token,
            event,
        } => {
            let answered = match prove(&server, &agent, token.as_deref()) {
                Ok(()) => {
                    control
                        .loop_hooks
                        .answer(server.runtime(), &agent, &event)
                        .await
                }
                Err(reason) => Err(reason),
            };
            let reply = match answered {
                Ok(hook) => Reply::Ok(serde_json::to_value(hook).unwrap_or_default()),
                Err(reason) => {
                    // The hook prints nothing its model sees: this line is where it shows.
                    tracing::warn!(%agent, point = ?event.point, %reason, "a client hook was not answered");
                    Reply::Error(reason)
                }
            };
            answer(&mut writer, reply).await
        }
        Hello::Call {
            agent,
            token,
            tool,
            arguments,
        } => {
            let mut options = CallOptions::new();
            if let Some(agent) = agent {
                if let Err(reason) = prove(&server, &agent, token.as_deref()) {
                    return answer(&mut writer, Reply::Error(reason)).await;
                }
                options = options.agent_id(agent);
            }
            let reply = match server.runtime().call_json(&tool, arguments, options).await {
                Ok(value) => Reply::Ok(value),
                Err(err) => Reply::Error(err.to_string()),
            };
            answer(&mut writer, reply).await
        }
    }
}

/// The client's first line, its hello: read within [`HELLO_TIMEOUT`] and [`MAX_HELLO`]
/// bytes, and on an agent's own socket (`bound`) only one acting as that agent. The inner
/// error is what the client is answered.
async fn read_hello(
    reader: &mut BufReader<OwnedReadHalf>,
    bound: Option<&str>,
) -> std::io::Result<Result<Hello, String>> {
    let mut line = String::new();
    let mut limited = reader.take(MAX_HELLO);
    match tokio::time::timeout(HELLO_TIMEOUT, limited.read_line(&mut line)).await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => return Err(err),
        Err(_) => return Ok(Err("no hello within 10 s".into())),
    }
    let hello = match serde_json::from_str::<Hello>(&line) {
        Ok(hello) => hello,
        Err(err) => return Ok(Err(format!("the first line must be a JSON hello: {err}"))),
    };
    if let Some(bound) = bound {
        let theirs = match &hello {
            Hello::Mcp { agent, .. } | Hello::Hook { agent, .. } => Some(agent.as_str()),
            Hello::Call { agent, .. } => agent.as_deref(),
            _ => None,
        };
        if theirs != Some(bound) {
            return Ok(Err(format!(
                "this socket is agent `{bound}`'s: it serves MCP and tool calls as `{bound}` only"
            )));
        }
    }
    Ok(Ok(hello))
}

/// An administrative command run by the binary's `ServerAdmin`, when it gave one.
async fn run_admin(
    server: &McpServer,
    control: &Control,
    cwd: PathBuf,
    args: Vec<String>,
) -> Reply {
    match &control.admin {
        None => Reply::Error("this server runs no administrative commands".into()),
        Some(admin) => match admin.run(server.runtime().clone(), cwd, args).await {
            Ok(printed) => Reply::Ok(Value::String(printed)),
            Err(reason) => Reply::Error(reason),
        },
    }
}

/// The audit records `query` asks for, once what is buffered is written.
async fn read_audit(server: &McpServer, query: &crate::governance::AuditQuery) -> Reply {
    match server.runtime().governance().audit() {
        None => Reply::Error("auditing is off in this server's config".into()),
        Some(audit) => match audit.flush().await.and_then(|()| audit.query(query)) {
            Ok(records) => Reply::Ok(serde_json::to_value(records).unwrap_or_default()),
            Err(err) => Reply::Error(err.to_string()),
        },
    }
}

/// Writes `watching`'s lines to a watching client until it leaves (closes its end) or the
/// runtime stops.
async fn watch(
    mut watching: crate::observe::Watching,
    mut reader: BufReader<OwnedReadHalf>,
    mut writer: OwnedWriteHalf,
) -> std::io::Result<()> {
    let mut scratch = [0u8; 64];
    let mut out = Vec::new();
    loop {
        let lines = tokio::select! {
            lines = watching.next() => lines,
            // A watcher sends nothing after its hello: a read that ends means it left.
            read = reader.read(&mut scratch) => match read {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => continue,
            },
        };
        let Some(lines) = lines else {
            return Ok(());
        };
        out.clear();
        out.extend_from_slice(lines.as_bytes());
        out.push(b'\n');
        writer.write_all(&out).await?;
    }
}

/// Opens the socket of `data_dir` (owner only: reaching it is acting as any agent without a
/// token) and serves `server` on it, with every tool for every role, until the returned
/// guard is dropped. For an embedder whose launched agents connect back (`guildhall serve`
/// opens its own, beside HTTP).
///
/// # Errors
/// The socket cannot be created (one exists: remove a stale one first), or restricted.
pub fn open(data_dir: &Path, server: McpServer, control: Control) -> std::io::Result<DropGuard> {
    let path = socket_path(data_dir);
    let listener = UnixListener::bind(&path)?;
    crate::private_fs::restrict(&path)?;
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        server,
        Arc::new(RoleTools::default()),
        stop.clone(),
        control,
    ));
    Ok(stop.drop_guard())
}

/// The agents an administrative command line acts as: every value of `--as` (`--as tl`,
/// `--as=tl`), the one flag by which the commands act as an agent.
fn acting_as(args: &[String]) -> impl Iterator<Item = &str> {
    args.iter()
        .enumerate()
        .filter_map(|(i, arg)| match arg.strip_prefix("--as") {
            Some("") => args.get(i + 1).map(String::as_str),
            Some(value) => value.strip_prefix('='),
            None => None,
        })
}

/// Checks that a socket client may act as `agent` (its token, when it has one).
fn prove(server: &McpServer, agent: &str, token: Option<&str>) -> Result<(), String> {
    server
        .runtime()
        .credentials()
        .check(agent, token)
        .map_err(|err| err.to_string())
}

async fn answer(writer: &mut OwnedWriteHalf, reply: Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    writer.write_all(&line).await?;
    writer.flush().await
}

/// Registers `agent` (or updates its role and parent when given) and makes its connection:
/// bound to the agent, seeing the tools its role's set and `tools` both allow. Returns the
/// connection and a summary of the binding.
///
/// # Errors
/// Why the agent cannot be registered, or an invalid `tools` pattern.
///
/// # Cancel safety
/// Dropping the future may leave the agent registered (or its role and parent updated) without
/// a connection.
pub async fn bind(
    server: &McpServer,
    roles: &RoleTools,
    agent: String,
    role: Option<String>,
    parent: Option<String>,
    tools: Option<&str>,
) -> Result<(McpServer, Value), String> {
    let runtime = server.runtime();
    let given = runtime.governance().given_role(&agent);
    let role = crate::agents::checked_role(&agent, role, given)?;
    let existing = runtime.lookup_agent(&agent);
    if let (Some(record), Some(role)) = (&existing, &role)
        && record.role != *role
    {
        return Err(format!(
            "agent `{agent}` is registered with role `{}`, and this connection asks for \
             role `{role}`: connect without a role to act as it, or change its role with \
             `guildhall agents register {agent} --role {role}` while no server runs",
            record.role
        ));
    }
    let record = match existing {
        Some(record) if role.is_none() && parent.is_none() => record,
        existing => {
            let role = role
                .or_else(|| existing.as_ref().map(|r| r.role.clone()))
                .or_else(|| given.map(str::to_owned))
                .unwrap_or_else(|| "agent".to_owned());
            let parent = parent.or_else(|| {
                existing
                    .as_ref()
                    .and_then(|r| r.parent.as_ref().map(ToString::to_string))
            });
            let mut spec = AgentSpec::new(&agent, role);
            if let Some(parent) = parent {
                spec = spec.parent(parent);
            }
            if let Some(record) = &existing {
                spec = spec.metadata(record.metadata.clone());
            }
            runtime
                .register_agent(spec)
                .await
                .map_err(|err| format!("cannot register agent `{agent}`: {err}"))?
                .record()
        }
    };
    let mut filter = roles.get(&record.role).cloned().unwrap_or_default();
    if let Some(tools) = tools {
        filter = filter.and(ToolFilter::parse(tools).map_err(|err| err.to_string())?);
    }
    let value = serde_json::json!({
        "agent": record.id.as_str(),
        "role": record.role,
        "parent": record.parent.as_ref().map(ToString::to_string),
        "tools": filter.to_string(),
    });
    Ok((server.connection(Some(Arc::from(agent)), filter), value))
}

/// Agents `status` lists with their unread counts (the count of all is always given).
const STATUS_AGENTS: usize = 50;

/// The server's status: its supervision tree, up to `max_agents` agents (with their unread
/// mail and live connections), tools, shells, servers and launched agents.
pub(super) async fn status(
    server: &McpServer,
    control: &Control,
    max_agents: usize,
) -> Result<Value, String> {
    let runtime = server.runtime();
    let tree = runtime.tree().await.map_err(|err| err.to_string())?;
    let records = runtime.agents();
    let store = runtime.store();
    // Which server runs each agent's mailbox, when servers share the store.
    let servers: std::collections::HashMap<String, String> = match store.cluster() {
        Some(cluster) => cluster
            .holders("mail:")
            .map_err(|err| err.to_string())?
            .into_iter()
            .map(|(subject, node)| (subject["mail:".len()..].to_owned(), node))
            .collect(),
        None => std::collections::HashMap::new(),
    };
    let mut agents = Vec::new();
    for record in records.iter().take(max_agents) {
        let unread = match runtime.agent(record.id.as_str()) {
            Ok(agent) => agent.unread().await.ok(),
            Err(_) => None,
        };
        agents.push(serde_json::json!({
            "id": record.id.as_str(),
            "role": record.role,
            "parent": record.parent.as_ref().map(ToString::to_string),
            "unread": unread,
            "connections": runtime.connections_of(record.id.as_str()),
            "server": servers.get(record.id.as_str()),
        }));
    }
    let mut value = serde_json::json!({
        "pid": std::process::id(),
        "uptime_secs": control.started.elapsed().as_secs(),
        "mcp_connections": *control.live.borrow(),
        "tree": tree,
        "agents": records.len(),
        "agent_list": agents,
        "active_mailboxes": runtime.active_mailboxes(),
        "tools": runtime.tools().iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
    });
    let sections = runtime.subsystem_status();
    if let Some(value) = value.as_object_mut()
        && !sections.is_empty()
    {
        // What each subsystem adds, by name (an embedder's own among them).
        let sections: serde_json::Map<String, Value> = sections
            .into_iter()
            .map(|(name, section)| (name.to_owned(), section))
            .collect();
        value.insert("subsystems".into(), Value::Object(sections));
    }
    if let (Some(value), Some(cluster)) = (value.as_object_mut(), store.cluster()) {
        let members = cluster.members().map_err(|err| err.to_string())?;
        value.insert(
            "cluster".into(),
            serde_json::to_value(members).unwrap_or_default(),
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Some(value) = value.as_object_mut() {
        value.insert(
            "shells".into(),
            serde_json::to_value(runtime.background_shells()).unwrap_or_default(),
        );
        if let Some(sandbox) = runtime.sandbox() {
            value.insert(
                "sandbox".into(),
                serde_json::json!({
                    "applied": sandbox.describe(),
                    "level": sandbox.level(),
                    "network": sandbox.config().network,
                }),
            );
        }
        if let Some(servers) = &control.servers {
            value.insert(
                "servers".into(),
                serde_json::to_value(servers.list().await).unwrap_or_default(),
            );
        }
        if let Some(launcher) = &control.launcher {
            value.insert(
                "launched".into(),
                serde_json::to_value(launcher.list().await).unwrap_or_default(),
            );
        }
    }
    if let (Some(value), Some(about)) = (value.as_object_mut(), control.about.as_object()) {
        value.extend(about.clone());
    }
    Ok(value)
}
