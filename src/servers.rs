//! Other MCP servers as supervised, governed guildhall tools.
//!
//! Each configured server runs under the `servers` supervisor as one actor
//! ([`connection`]) that owns the server's process (in a process group of its own, its
//! stderr in a rotating log) and its MCP client connection. Its tools are registered with
//! the runtime as `mcp__{server}__{tool}` ([`proxy`]), so they pass through the same
//! pipeline (deadline, breaker, in-flight bound) and governance (permissions, hooks, loop
//! guard, truncation, audit, rate limits) as every tool.
//!
//! ```text
//! root
//! └── servers          (one-for-one; never escalates)
//!     └── <server>     (the connection actor: restarted per the server's restart type)
//! ```
//!
//! The contract every tool has holds here too: a process dying mid-call ends that call
//! `crashed` and is restarted (with backoff); calls made while it restarts wait for it up
//! to their deadline, or fail at once while failed starts hold its breaker open; a call past
//! its deadline is cancelled on the server (`notifications/cancelled`), and a server that
//! then does not answer a probe is killed and restarted.

mod answer_limit;
pub mod config;
mod connection;
pub mod federation;
mod forward;
mod link;
pub mod proxy;
mod server_log;
mod upstream_task;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use guildhall_supervision::{BreakerStatus, ChildSpec, Supervisor};
use serde::Serialize;

use crate::output_log::OutputLog;
pub use config::{RestartType, ServerConfig, validate_server_name};
pub(crate) use connection::Upstream;
use connection::{ServerActor, ServerSpec};
use federation::Catalog;
pub use federation::Lists;
use link::{Link, Phase};

use crate::runtime::{Runtime, WeakRuntime};

/// The supervisor's id under the root.
const SERVERS: &str = "servers";
/// A server's stderr log is rotated at this size.
const LOG_BYTES: u64 = 1 << 20;

/// Why a server could not be added, removed or restarted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The name breaks the naming rule.
    #[error("{0}")]
    InvalidName(String),
    /// The server's settings do not fit together.
    #[error("server `{name}`: {reason}")]
    Invalid {
        /// The server.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A server of that name is already running.
    #[error("a server named `{0}` is already configured; remove it first")]
    Duplicate(String),
    /// No server has that name.
    #[error("no server named `{0}`; `guildhall servers list` shows them")]
    Unknown(String),
    /// The runtime has stopped.
    #[error("{0}")]
    Unavailable(String),
    /// The `servers` supervisor refused to start or stop a server's actor.
    #[error("the `servers` supervisor refused")]
    Supervisor(#[from] guildhall_supervision::SupervisorError),
}

/// The proxied servers of one runtime: add, remove, restart and list them.
pub struct Servers {
    runtime: WeakRuntime,
    /// Where a server's relative `cwd` is taken from.
    base_dir: PathBuf,
    /// Where stderr logs go (`None`: kept in memory only).
    log_dir: Option<PathBuf>,
    /// Each server's copies (one unless `instances = N`), the first one first.
    servers: tokio::sync::Mutex<BTreeMap<String, Vec<Arc<ServerSpec>>>>,
    /// The `servers` supervisor as it is now (republished by its restarts).
    supervisor: Arc<RwLock<Option<Supervisor>>>,
    /// The versions of the servers' resource and prompt lists.
    lists: Arc<tokio::sync::watch::Sender<Lists>>,
}

/// Whether a server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    /// Its process is starting and doing the handshake.
    Starting,
    /// It serves its tools.
    Running,
    /// Its process ended or failed to start; it is restarted (see `reason`).
    Down,
    /// It will not be restarted (removed, or a temporary or transient server that ended).
    Stopped,
}

impl ServerState {
    /// The state as `status` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Down => "down",
            Self::Stopped => "stopped",
        }
    }
}

/// A server as `status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ServerInfo {
    /// Its name.
    pub name: String,
    /// Its command line, or its URL.
    pub command: String,
    /// Whether it serves.
    pub state: ServerState,
    /// Why it is down or stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its process, while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Times its process was started.
    pub starts: u64,
    /// Why its last process or connection ended (or failed to start), if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_end: Option<String>,
    /// Calls sent to it and not answered yet.
    pub in_flight: usize,
    /// Calls it ran as tasks (MCP tasks, either era), each followed to its end inside the
    /// call.
    pub tasks: u64,
    /// The start breaker: open after repeated failed starts.
    pub breaker: BreakerStatus,
    /// Its tools, as guildhall names them.
    pub tools: Vec<String>,
    /// Its stderr log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    /// The last lines it wrote to stderr.
    pub stderr_tail: Vec<String>,
}

impl Servers {
    /// Starts the `servers` supervisor under `runtime`'s root. Relative `cwd`s are taken from
    /// `base_dir`; stderr logs go to `log_dir` when given.
    ///
    /// # Errors
    /// [`ServerError::Supervisor`] when the runtime's root refuses the supervisor (it has
    /// stopped).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the `servers` supervisor started, with no servers.
    pub async fn start(
        runtime: &Runtime,
        base_dir: PathBuf,
        log_dir: Option<PathBuf>,
    ) -> Result<Arc<Self>, ServerError> {
        // A server's crash loop must never escalate to the root; its breaker and its
        // backoff bound it instead.
        let supervisor = runtime.supervise_subsystem(SERVERS).await?;
        Ok(Arc::new(Self {
            runtime: runtime.downgrade(),
            base_dir,
            log_dir,
            servers: tokio::sync::Mutex::default(),
            supervisor,
            lists: Arc::new(tokio::sync::watch::Sender::new(Lists::default())),
        }))
    }

    /// Starts server `name`. It returns once the server's actor runs; its process starts and
    /// its tools appear (with `tools/list_changed`) as soon as its handshake is done.
    ///
    /// # Errors
    /// [`ServerError::InvalidName`], [`ServerError::Duplicate`], or
    /// [`ServerError::Unavailable`] or [`ServerError::Supervisor`] when the runtime stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: the server is added on a task of its own, to its end, whether or not
    /// the caller waits (stopped halfway, copies already started would run unlisted, out of
    /// reach of `remove`).
    pub async fn add(
        self: &Arc<Self>,
        name: &str,
        config: ServerConfig,
    ) -> Result<(), ServerError> {
        let name = name.to_owned();
        self.to_end(|this| async move { this.add_now(&name, config).await })
            .await
    }

    /// Runs `work` to its end on a task of its own, whether or not the caller waits.
    async fn to_end<F>(
        self: &Arc<Self>,
        work: impl FnOnce(Arc<Self>) -> F,
    ) -> Result<(), ServerError>
    where
        F: std::future::Future<Output = Result<(), ServerError>> + Send + 'static,
    {
        crate::detached::run_to_end(work(Arc::clone(self)))
            .await
            .unwrap_or_else(|| Err(ServerError::Unavailable("the runtime stopped".into())))
    }

    /// [`add`](Self::add)'s work.
    async fn add_now(&self, name: &str, config: ServerConfig) -> Result<(), ServerError> {
        validate_server_name(name).map_err(ServerError::InvalidName)?;
        config.validate().map_err(|reason| ServerError::Invalid {
            name: name.to_owned(),
            reason,
        })?;
        let mut servers = self.servers.lock().await;
        if servers.contains_key(name) {
            return Err(ServerError::Duplicate(name.to_owned()));
        }
        // Made with the first server, so a runtime that proxies none leaves no trace.
        let log_dir = self.log_dir.as_ref().filter(|dir| match std::fs::create_dir_all(dir) {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&err), dir = %dir.display(), "no directory for server logs; keeping the stderr of `{name}` in memory");
                false
            }
        });
        let copies = config.instances;
        let names: Vec<Arc<str>> = (1..=copies)
            .map(|i| match i {
                1 => Arc::from(name),
                i => Arc::from(format!("{name}#{i}")),
            })
            .collect();
        // Copies of a server not safe to call concurrently take one call each, unless told.
        let per_copy = config.concurrency.or((copies > 1).then_some(1));
        let links: Arc<[Arc<Link>]> = names
            .iter()
            .map(|n| {
                let wait = config.listing_wait.min(config.startup_timeout);
                Arc::new(Link::new(Arc::clone(n), per_copy, wait))
            })
            .collect();
        let pool = forward::Pool::new(Arc::clone(&links));
        let specs: Vec<Arc<ServerSpec>> = names
            .into_iter()
            .zip(links.iter())
            .enumerate()
            .map(|(i, (copy, link))| {
                let log = log_dir.map(|dir| match i {
                    0 => dir.join(format!("{name}.log")),
                    i => dir.join(format!("{name}.{}.log", i + 1)),
                });
                Arc::new(ServerSpec {
                    name: copy,
                    instance: i + 1,
                    pool: pool.clone(),
                    link: Arc::clone(link),
                    config: config.clone(),
                    base_dir: self.base_dir.clone(),
                    runtime: self.runtime.clone(),
                    stderr: Arc::new(OutputLog::new(log, LOG_BYTES)),
                    registered: tokio::sync::Mutex::default(),
                    catalog: std::sync::RwLock::default(),
                    access: tokio::sync::Mutex::default(),
                    subscriptions: federation::Subscriptions::default(),
                    lists: Arc::clone(&self.lists),
                })
            })
            .collect();
        let supervisor = self.supervisor()?;
        for (started, spec) in specs.iter().enumerate() {
            if let Err(err) = supervisor.start_child(child_spec(spec)).await {
                for spec in &specs[..started] {
                    let _ = supervisor.terminate_child(&*spec.name).await;
                }
                return Err(err.into());
            }
        }
        servers.insert(name.to_owned(), specs);
        Ok(())
    }

    /// Stops server `name`, kills its process group and removes its tools.
    ///
    /// # Errors
    /// [`ServerError::Unknown`].
    ///
    /// # Cancel safety
    /// Cancel safe: the server is removed on a task of its own, to its end, whether or not
    /// the caller waits.
    pub async fn remove(self: &Arc<Self>, name: &str) -> Result<(), ServerError> {
        let name = name.to_owned();
        self.to_end(|this| async move { this.remove_now(&name).await })
            .await
    }

    /// [`remove`](Self::remove)'s work.
    async fn remove_now(&self, name: &str) -> Result<(), ServerError> {
        let specs = self
            .servers
            .lock()
            .await
            .remove(name)
            .ok_or_else(|| ServerError::Unknown(name.to_owned()))?;
        for spec in &specs {
            if let Ok(supervisor) = self.supervisor()
                && let Err(err) = supervisor.terminate_child(&*spec.name).await
            {
                tracing::debug!(error = %guildhall_actors::ErrorChain(&err), server = %spec.name, "server actor already gone");
            }
            spec.link.stopped("the server was removed");
            spec.deregister_all().await;
        }
        Ok(())
    }

    /// Restarts server `name` now: a new process and connection (calls in flight on the old
    /// one end `crashed`), whatever its restart type.
    ///
    /// # Errors
    /// [`ServerError::Unknown`], or [`ServerError::Unavailable`] or
    /// [`ServerError::Supervisor`] when the runtime stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: the restart runs on a task of its own, to its end, whether or not the
    /// caller waits (stopped halfway, a copy could be stopped and not started again).
    pub async fn restart(self: &Arc<Self>, name: &str) -> Result<(), ServerError> {
        let name = name.to_owned();
        self.to_end(|this| async move { this.restart_now(&name).await })
            .await
    }

    /// [`restart`](Self::restart)'s work.
    async fn restart_now(&self, name: &str) -> Result<(), ServerError> {
        let servers = self.servers.lock().await;
        let specs = servers
            .get(name)
            .ok_or_else(|| ServerError::Unknown(name.to_owned()))?;
        let supervisor = self.supervisor()?;
        for spec in specs {
            let _ = supervisor.terminate_child(&*spec.name).await;
            spec.link.down("restarted by request");
            supervisor.start_child(child_spec(spec)).await?;
        }
        Ok(())
    }

    /// Waits until no server is still starting (each serves, or has failed and says why),
    /// or `limit` passes.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn settled(&self, limit: Duration) {
        let all = async {
            for link in self.links().await {
                link.started_once().await;
            }
        };
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// Waits until each server's first start ended (it serves, or failed and says why), each
    /// at most its `listing_wait` after it was added: what a listing of tools waits for.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn first_starts(&self) {
        for link in self.links().await {
            link.first_start().await;
        }
    }

    /// What each server lists besides its tools (its resources, templates and prompts,
    /// named as guildhall serves them), by server name.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn catalogs(&self) -> Vec<(Arc<str>, Arc<Catalog>)> {
        self.servers
            .lock()
            .await
            .values()
            .filter_map(|specs| specs.first())
            .map(|spec| {
                let catalog = spec.catalog.read().unwrap_or_else(PoisonError::into_inner);
                (Arc::clone(&spec.name), Arc::clone(&catalog))
            })
            .filter(|(_, catalog)| !catalog.is_empty())
            .collect()
    }

    /// The versions of the servers' resource and prompt lists, to hear of their changes.
    pub fn list_changes(&self) -> tokio::sync::watch::Receiver<Lists> {
        self.lists.subscribe()
    }

    /// Subscribes to server `server`'s resource `uri` (its own URI) for a client of
    /// guildhall's until the returned guard is dropped: updates the server reports are
    /// reported to [`Changes`](crate::changes::Changes) as
    /// [`Subject::Resource`](crate::changes::Subject::Resource).
    ///
    /// # Errors
    /// An unknown server, or one with too many subscriptions held already.
    ///
    /// # Cancel safety
    /// Cancel safe: a subscription whose future is dropped is not counted.
    pub(crate) async fn subscribe(&self, server: &str, uri: &str) -> Result<Upstream, String> {
        let spec = self
            .servers
            .lock()
            .await
            .get(server)
            .and_then(|specs| specs.first().cloned())
            .ok_or_else(|| format!("no server named `{server}`"))?;
        spec.subscribe(uri).await
    }

    /// The links of every server and copy, as they are now.
    async fn links(&self) -> Vec<Arc<Link>> {
        self.servers
            .lock()
            .await
            .values()
            .flatten()
            .map(|spec| Arc::clone(&spec.link))
            .collect()
    }

    /// Every server, by name; with `instances = N` each copy after the first is listed
    /// after it as `NAME#i` (the first holds the tools).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list(&self) -> Vec<ServerInfo> {
        let servers = self.servers.lock().await;
        let mut infos = Vec::with_capacity(servers.len());
        for spec in servers.values().flatten() {
            let (state, reason, pid) = match spec.link.phase() {
                Phase::Starting { after } => {
                    (ServerState::Starting, after.map(|r| r.to_string()), None)
                }
                Phase::Up { pid, .. } => (ServerState::Running, None, pid),
                Phase::Down { reason } => (ServerState::Down, Some(reason.to_string()), None),
                Phase::Stopped { reason } => (ServerState::Stopped, Some(reason.to_string()), None),
            };
            let tools = spec
                .registered
                .lock()
                .await
                .values()
                .map(|(name, _)| name.clone())
                .collect();
            infos.push(ServerInfo {
                name: spec.name.to_string(),
                command: spec.config.describe(),
                state,
                reason,
                pid,
                starts: spec.link.starts.load(std::sync::atomic::Ordering::Relaxed),
                in_flight: spec.link.in_flight(),
                tasks: spec.link.tasks(),
                last_end: spec.link.last_end().map(|r| r.to_string()),
                breaker: spec.link.start_breaker(),
                tools,
                log: spec.stderr.path().cloned(),
                stderr_tail: spec.stderr.tail(5),
            });
        }
        infos
    }

    fn supervisor(&self) -> Result<Supervisor, ServerError> {
        self.supervisor
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                ServerError::Unavailable("the `servers` supervisor is not running".into())
            })
    }
}

/// How the `servers` supervisor starts (and restarts) one server's actor.
fn child_spec(spec: &Arc<ServerSpec>) -> ChildSpec {
    let actor_spec = Arc::clone(spec);
    ChildSpec::actor(spec.name.to_string(), move || {
        (ServerActor(Arc::clone(&actor_spec)), ())
    })
    .restart(spec.restart())
    .breaker(Arc::clone(&spec.link.breaker))
}
