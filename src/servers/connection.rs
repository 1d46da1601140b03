//! The actor that runs one proxied server: it starts the process in its own group, does the
//! MCP handshake as a client, registers the server's tools, and fails (so its supervisor
//! restarts it, with backoff) when the process exits, hangs or outgrows its memory limit.
//!
//! Starting happens in a message after `pre_start`, not in it: a slow handshake then holds
//! only this actor, never the supervisor that starts and restarts every server.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use guildhall_actors::Annotations;
use guildhall_supervision::Restart;
use guildhall_supervision::breaker::{Ticket, Transition};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use rmcp::ErrorData as McpError;
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientConfig, ClientRequest, ElicitRequestParams, ElicitResult, ElicitationCapability,
    FormElicitationCapability, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient, RunningService};
use rmcp::{ClientHandler, Peer, ServiceExt};
use serde_json::Value;

use super::answer_limit::AnswerLimit;
use super::config::{RestartType, ServerConfig};
use super::federation::{
    self, AccessTool, Catalog, Complete, GetPrompt, ReadResource, Subscriptions,
};
use super::forward::Pool;
use super::link::{Link, Phase};
use super::proxy::ProxyTool;
use super::server_log::ServerLog;
use crate::events::ToolEvent;
use crate::governance::ToolReply;
use crate::options::ToolOptions;
use crate::output_log::OutputLog;
use crate::process_group::ProcessGroup;
use crate::runtime::WeakRuntime;
use crate::sandbox::Network;

/// Everything about one server that outlives its actor's restarts.
pub(crate) struct ServerSpec {
    /// The server's name, and with `instances = N` which copy this is (`fs#2`).
    pub(crate) name: Arc<str>,
    /// 1 for the first copy, which lists and registers the tools for all of them.
    pub(crate) instance: usize,
    /// Every copy's link, this one's included: where its tools send calls.
    pub(crate) pool: Pool,
    pub(crate) config: ServerConfig,
    /// Where a relative `cwd` is taken from.
    pub(crate) base_dir: PathBuf,
    pub(crate) link: Arc<Link>,
    pub(crate) runtime: WeakRuntime,
    pub(crate) stderr: Arc<OutputLog>,
    /// The server's tools registered now: its own name → (guildhall's name, what it was
    /// registered from, to tell a changed tool).
    pub(crate) registered: tokio::sync::Mutex<BTreeMap<String, (String, String)>>,
    /// What the server lists besides its tools (the first copy's, for all).
    pub(crate) catalog: std::sync::RwLock<Arc<Catalog>>,
    /// The access tools registered for its resources, prompts and completions.
    pub(crate) access: tokio::sync::Mutex<Vec<String>>,
    /// Its resources guildhall's clients are subscribed to.
    pub(crate) subscriptions: Subscriptions,
    /// Every server's catalogs' versions, bumped when this one's changes.
    pub(crate) lists: Arc<tokio::sync::watch::Sender<federation::Lists>>,
}

impl ServerSpec {
    pub(crate) fn restart(&self) -> Restart {
        match self.config.restart {
            RestartType::Permanent => Restart::Permanent,
            RestartType::Transient => Restart::Transient,
            RestartType::Temporary => Restart::Temporary,
        }
    }

    /// Removes every tool of the server from the runtime, and its catalog.
    pub(crate) async fn deregister_all(&self) {
        let registered = std::mem::take(&mut *self.registered.lock().await);
        let access = std::mem::take(&mut *self.access.lock().await);
        if let Some(runtime) = self.runtime.upgrade() {
            for name in registered.values().map(|(name, _)| name).chain(&access) {
                runtime.deregister(name).await;
            }
        }
        self.set_catalog(Catalog::default());
    }

    /// Keeps `catalog` as the server's, telling listeners of each list that changed.
    fn set_catalog(&self, catalog: Catalog) {
        let mut kept = self
            .catalog
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let resources = kept.resources != catalog.resources || kept.templates != catalog.templates;
        let prompts = kept.prompts != catalog.prompts;
        *kept = Arc::new(catalog);
        drop(kept);
        if resources || prompts {
            self.lists.send_modify(|lists| {
                lists.resources += u64::from(resources);
                lists.prompts += u64::from(prompts);
            });
        }
    }

    /// Reads what the server lists besides its tools, and registers the access tools its
    /// capabilities call for (removing those it no longer has).
    async fn recatalog(&self, peer: &Peer<RoleClient>) {
        let catalog = Catalog::read(&self.name, peer).await;
        let capabilities = peer.peer_info().map(|info| info.capabilities.clone());
        let has =
            |f: fn(&rmcp::model::ServerCapabilities) -> bool| capabilities.as_ref().is_some_and(f);
        if let Some(runtime) = self.runtime.upgrade() {
            let mut access = self.access.lock().await;
            self.access_tool::<ReadResource>(&runtime, &mut access, has(|c| c.resources.is_some()))
                .await;
            self.access_tool::<GetPrompt>(&runtime, &mut access, has(|c| c.prompts.is_some()))
                .await;
            self.access_tool::<Complete>(&runtime, &mut access, has(|c| c.completions.is_some()))
                .await;
        }
        self.set_catalog(catalog);
    }

    /// Registers the access tool for `A` when the server is to have it (`want`) and it is not
    /// registered, or removes it when the server no longer has what it reaches.
    async fn access_tool<A: federation::Access>(
        &self,
        runtime: &crate::runtime::Runtime,
        access: &mut Vec<String>,
        want: bool,
    ) {
        let name = federation::access_tool::<A>(&self.name);
        let held = access.contains(&name);
        if want && !held {
            // Never retried (a read may have effects on its server); unlisted: clients
            // reach them as resources, prompts and completions.
            let options = ToolOptions::default()
                .timeout(self.config.timeout)
                .max_retries(0)
                .unlisted();
            let tool = AccessTool::<A>::new(self.pool.clone(), self.config.hang_grace);
            match runtime.register_with(tool, options).await {
                Ok(_) => access.push(name),
                Err(err) => {
                    tracing::warn!(server = %self.name, tool = %name, error = %guildhall_actors::ErrorChain(&err), "access tool not registered");
                }
            }
        } else if !want && held {
            runtime.deregister(&name).await;
            access.retain(|n| *n != name);
        }
    }

    /// After a (re)connection: subscribes upstream again to what guildhall's clients are
    /// subscribed to, and tells them their resources may have changed meanwhile.
    async fn resubscribe(&self, peer: &Peer<RoleClient>) {
        let uris = self.subscriptions.uris();
        if uris.is_empty() {
            return;
        }
        let changes = self.runtime.upgrade().map(|r| r.changes());
        for uri in uris {
            federation::send_subscription(&self.name, peer, &uri, true).await;
            if let Some(changes) = &changes {
                changes.changed(&crate::changes::Subject::Resource(Arc::from(
                    federation::resource_uri(&self.name, &uri),
                )));
            }
        }
    }

    /// Counts a subscription of a client of guildhall's to the server's resource `uri`,
    /// subscribing upstream when it is the first; its end is the returned guard's drop.
    pub(crate) async fn subscribe(self: &Arc<Self>, uri: &str) -> Result<Upstream, String> {
        let first = self.subscriptions.add(uri)?;
        // Made before the request is sent: a caller gone meanwhile uncounts it.
        let held = Upstream {
            spec: Arc::clone(self),
            uri: uri.to_owned(),
        };
        if first && let Phase::Up { peer, .. } = self.link.phase() {
            federation::send_subscription(&self.name, &peer, uri, true).await;
        }
        Ok(held)
    }

    /// Tells the runtime's event stream what happened to this server, under its name in
    /// the supervision tree.
    fn announce(&self, make: impl FnOnce(Arc<str>) -> ToolEvent) {
        if let Some(runtime) = self.runtime.upgrade() {
            runtime.governance().emit(|| make(Arc::clone(&self.name)));
        }
    }

    /// Records a start's outcome on the start breaker, announcing a change of its state.
    fn record_start(&self, ticket: Ticket, started: bool) {
        if let Some(transition) = self.link.breaker.record(ticket, started) {
            self.announce(|tool| match transition {
                Transition::Opened { .. } => ToolEvent::CircuitOpened { tool },
                Transition::Closed => ToolEvent::CircuitClosed { tool },
            });
        }
    }
}

/// A subscription of a client of guildhall's to a server's resource, counted until dropped;
/// the last one's drop unsubscribes upstream.
pub(crate) struct Upstream {
    spec: Arc<ServerSpec>,
    uri: String,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if !self.spec.subscriptions.remove(&self.uri) {
            return;
        }
        // Outside a runtime (dropped as the process ends) there is nobody to tell.
        if let Phase::Up { peer, .. } = self.spec.link.phase()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (server, uri) = (Arc::clone(&self.spec.name), std::mem::take(&mut self.uri));
            runtime.spawn(async move {
                federation::send_subscription(&server, &peer, &uri, false).await;
            });
        }
    }
}

pub(crate) struct ServerActor(pub(crate) Arc<ServerSpec>);

pub(crate) enum ServerMsg {
    /// Start the process and connect.
    Connect,
    /// The connection of `generation` ended: the process exited (`clean`: with status 0)
    /// or the transport closed.
    Lost {
        generation: u64,
        reason: String,
        clean: bool,
    },
    /// The connection of `generation` did not answer a probe after a cancelled call.
    Hung { generation: u64 },
    /// The server said its tool list changed. The flag is its connection's "a relist is
    /// pending", cleared as the relist starts: however many notifications the server sends,
    /// at most one relist waits in the mailbox (a flood of 2,000 a call once queued a
    /// relist each, 42 → 830 MB).
    Relist(Arc<AtomicBool>),
    /// The server said its resource or prompt list changed; the flag as `Relist`'s.
    Recatalog(Arc<AtomicBool>),
}

/// A live connection. Dropping it (the actor stopping, failing or being killed) kills the
/// process group and tells waiting calls.
pub(crate) struct Running {
    generation: u64,
    peer: Peer<RoleClient>,
    pid: Option<u32>,
    monitor: tokio::task::JoinHandle<()>,
    group: Option<ProcessGroup>,
    link: Arc<Link>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.monitor.abort();
        if let Some(group) = &self.group {
            group.kill();
        }
        self.link.dropped(self.generation);
    }
}

impl Actor for ServerActor {
    type Msg = ServerMsg;
    type State = Option<Running>;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<ServerMsg>,
        (): (),
    ) -> Result<Option<Running>, ActorProcessingErr> {
        let restarts = self.0.link.starting();
        if restarts > 0 {
            self.0
                .announce(|tool| ToolEvent::Restarted { tool, restarts });
        }
        // The tools registered by an earlier start report to this actor from now on.
        let actor = myself.clone();
        self.0.link.report_hangs_to(move |generation| {
            let _ = actor.send_message(ServerMsg::Hung { generation });
        });
        myself.send_message(ServerMsg::Connect)?;
        Ok(None)
    }

    async fn handle(
        &self,
        myself: ActorRef<ServerMsg>,
        msg: ServerMsg,
        state: &mut Option<Running>,
    ) -> Result<(), ActorProcessingErr> {
        let spec = &self.0;
        let current = state.as_ref().map(|r| r.generation);
        match msg {
            ServerMsg::Connect => {
                let running = Box::pin(self.connect(&myself)).await?;
                let (peer, generation, pid) =
                    (running.peer.clone(), running.generation, running.pid);
                *state = Some(running);
                // Listed before the connection is published: once the server shows as
                // running, its tools, resources and prompts are there. The first copy lists
                // them for all, within the start's own bound: a server that answers the
                // handshake but never its listing holds no caller forever.
                if spec.instance == 1 {
                    let listing = async {
                        if let Err(err) = reconcile(spec, &peer).await {
                            tracing::warn!(server = %spec.name, %err, "could not list the server's tools");
                        }
                        spec.recatalog(&peer).await;
                    };
                    if tokio::time::timeout(spec.config.startup_timeout, listing)
                        .await
                        .is_err()
                    {
                        let reason = format!(
                            "did not list its tools, resources and prompts within {:?} (startup_timeout)",
                            spec.config.startup_timeout
                        );
                        tracing::warn!(server = %spec.name, %reason, "server failed to start");
                        spec.link.down(reason.clone());
                        *state = None;
                        return Err(reason.into());
                    }
                }
                spec.link.up(peer.clone(), pid, generation);
                if spec.instance == 1 {
                    spec.resubscribe(&peer).await;
                }
            }
            ServerMsg::Lost {
                generation,
                reason,
                clean,
            } if current == Some(generation) => {
                let reason = with_stderr(&reason, &spec.stderr);
                tracing::warn!(server = %spec.name, %reason, "server connection lost");
                spec.link.down(reason.clone());
                *state = None;
                match spec.config.restart {
                    RestartType::Permanent => return Err(reason.into()),
                    RestartType::Transient if !clean => return Err(reason.into()),
                    RestartType::Transient | RestartType::Temporary => {
                        spec.link.stopped(format!(
                            "{reason}; it is not restarted (restart = \"{}\")",
                            spec.config.restart.as_str()
                        ));
                        myself.stop(Some(reason));
                    }
                }
            }
            ServerMsg::Hung { generation } if current == Some(generation) => {
                let reason = format!(
                    "did not answer within {:?} after a call was cancelled: taken for hung and killed",
                    spec.config.hang_grace
                );
                spec.link.down(reason.clone());
                *state = None;
                return Err(reason.into());
            }
            ServerMsg::Relist(pending) => {
                pending.store(false, Ordering::Release);
                if let Some(running) = state.as_ref().filter(|_| spec.instance == 1) {
                    let peer = running.peer.clone();
                    // Bounded as the listing at connection is (see `Recatalog`).
                    match tokio::time::timeout(spec.config.startup_timeout, reconcile(spec, &peer))
                        .await
                    {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => {
                            tracing::warn!(server = %spec.name, %err, "could not list the server's tools");
                        }
                        Err(_) => {
                            tracing::warn!(server = %spec.name, "did not list its tools within {:?} (startup_timeout); the last listing is kept", spec.config.startup_timeout);
                        }
                    }
                }
            }
            ServerMsg::Recatalog(pending) => {
                pending.store(false, Ordering::Release);
                if let Some(running) = state.as_ref().filter(|_| spec.instance == 1) {
                    let peer = running.peer.clone();
                    // As bounded as the listing at connection: a server that says its list
                    // changed and then never lists it holds this actor no longer.
                    let reading = spec.recatalog(&peer);
                    if tokio::time::timeout(spec.config.startup_timeout, reading)
                        .await
                        .is_err()
                    {
                        tracing::warn!(server = %spec.name, "did not list its resources and prompts within {:?} (startup_timeout); the last listing is kept", spec.config.startup_timeout);
                    }
                }
            }
            // About a connection already replaced.
            ServerMsg::Lost { .. } | ServerMsg::Hung { .. } => {}
        }
        Ok(())
    }
}

impl ServerActor {
    /// Starts the process and does the handshake, when the start breaker lets a start
    /// through (waiting for it otherwise). A failure is returned, failing the actor.
    async fn connect(&self, myself: &ActorRef<ServerMsg>) -> Result<Running, ActorProcessingErr> {
        let spec = &self.0;
        let ticket = loop {
            match spec.link.breaker.try_acquire(None) {
                Ok(ticket) => break ticket,
                Err(open) => tokio::time::sleep(open.retry_after).await,
            }
        };
        match tokio::time::timeout(spec.config.startup_timeout, self.start(myself)).await {
            Ok(Ok(running)) => {
                spec.record_start(ticket, true);
                Ok(running)
            }
            outcome => {
                spec.record_start(ticket, false);
                let reason = match outcome {
                    Ok(Err(reason)) => reason,
                    _ => format!(
                        "did not finish the MCP handshake within {:?} (startup_timeout)",
                        spec.config.startup_timeout
                    ),
                };
                let reason = with_stderr(&format!("failed to start: {reason}"), &spec.stderr);
                tracing::warn!(server = %spec.name, %reason, "server failed to start");
                spec.link.down(reason.clone());
                Err(reason.into())
            }
        }
    }

    async fn start(&self, myself: &ActorRef<ServerMsg>) -> Result<Running, String> {
        let client = Client {
            link: Arc::clone(&self.0.link),
            actor: myself.clone(),
            relist_pending: Arc::new(AtomicBool::new(false)),
            recatalog_pending: Arc::new(AtomicBool::new(false)),
            log: ServerLog::new(Arc::clone(&self.0.name)),
            runtime: self.0.runtime.clone(),
        };
        match &self.0.config.url {
            Some(url) => self.start_http(myself, client, url).await,
            None => self.start_stdio(myself, client).await,
        }
    }

    /// Connects to a server at `url` (Streamable HTTP, rmcp's client over reqwest).
    #[cfg(feature = "http-servers")]
    async fn start_http(
        &self,
        myself: &ActorRef<ServerMsg>,
        client: Client,
        url: &str,
    ) -> Result<Running, String> {
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

        let spec = &self.0;
        crate::tls::install();
        let mut config = StreamableHttpClientTransportConfig::with_uri(url);
        // A broken response stream is resumed a few times (0.5 s doubling, about 8 s in
        // all), then given up: its call fails instead of waiting out its deadline on a
        // server that restarted and forgot the session (rmcp's default retries forever).
        let mut resume = rmcp::transport::common::client_side_sse::ExponentialBackoff::default();
        resume.max_times = Some(4);
        resume.base_duration = Duration::from_millis(500);
        resume.max_delay = Some(Duration::from_secs(4));
        config.retry_config = Arc::new(resume);
        // A server that forgot the session (HTTP 404: it restarted) gets a new one from
        // rmcp, which repeats only the requests the 404 refused (never processed, so never
        // a blind replay); a call in flight when it went away ends at its deadline.
        for (name, value) in &spec.config.headers {
            let value = expand_env(value).map_err(|err| format!("header `{name}`: {err}"))?;
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|err| format!("header `{name}`: {err}"))?;
            let value = reqwest::header::HeaderValue::from_str(&value)
                .map_err(|err| format!("header `{name}`: {err}"))?;
            config.custom_headers.insert(name, value);
        }
        let service: RunningService<RoleClient, Client> = client
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .map_err(|err| format!("the MCP handshake with {url} failed: {err}"))?;
        let peer = service.peer().clone();
        let generation = spec.link.next_generation();
        let monitor = tokio::spawn(monitor(
            None,
            service,
            myself.clone(),
            generation,
            None,
            None,
        ));
        tracing::info!(server = %spec.name, %url, "server connected");
        Ok(Running {
            generation,
            peer,
            pid: None,
            monitor,
            group: None,
            link: Arc::clone(&spec.link),
        })
    }

    /// Without the `http-servers` feature, a server at a URL cannot be reached.
    #[cfg(not(feature = "http-servers"))]
    async fn start_http(
        &self,
        _: &ActorRef<ServerMsg>,
        _: Client,
        url: &str,
    ) -> Result<Running, String> {
        Err(format!(
            "{url}: this build of guildhall has no Streamable HTTP client (feature `http-servers`)"
        ))
    }

    /// Starts the server's process and connects over its stdin and stdout.
    async fn start_stdio(
        &self,
        myself: &ActorRef<ServerMsg>,
        client: Client,
    ) -> Result<Running, String> {
        let spec = &self.0;
        let config = &spec.config;
        let (mut command, confined) = self.stdio_command()?;
        let mut child = command
            .spawn()
            .map_err(|err| format!("could not run `{}`: {err}", config.command))?;
        let pid = child.id();
        let group = pid
            .and_then(|p| i32::try_from(p).ok())
            .map(ProcessGroup::new);
        let stderr = child.stderr.take().map(|stderr| {
            spec.stderr.clear_tail();
            spec.stderr.follow(stderr)
        });
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("its standard input and output could not be opened".into());
        };
        let service: RunningService<RoleClient, Client> =
            match client.serve((AnswerLimit::new(stdout), stdin)).await {
                Ok(service) => service,
                Err(err) => return Err(self.why_no_handshake(&err, child, stderr, confined).await),
            };
        let peer = service.peer().clone();
        let generation = spec.link.next_generation();
        let monitor = tokio::spawn(monitor(
            Some(child),
            service,
            myself.clone(),
            generation,
            config.max_rss_mib,
            pid,
        ));
        tracing::info!(server = %spec.name, pid, "server started");
        Ok(Running {
            generation,
            peer,
            pid,
            monitor,
            group,
            link: Arc::clone(&spec.link),
        })
    }

    /// The server's process, ready to start: its command in its directory, the server's
    /// environment without `GUILDHALL_*` plus its own, in its sandbox when it has one (and
    /// that sandbox's network, for the error if it fails), in a process group of its own.
    fn stdio_command(&self) -> Result<(tokio::process::Command, Option<Network>), String> {
        let spec = &self.0;
        let config = &spec.config;
        let cwd = match &config.cwd {
            Some(dir) => spec.base_dir.join(dir),
            None => spec.base_dir.clone(),
        };
        let confiner = config
            .sandbox
            .enabled
            .then(|| spec.runtime.upgrade())
            .flatten()
            .and_then(|runtime| runtime.confiner().cloned());
        let confinement = match &confiner {
            Some(confiner) => {
                let reach = config.sandbox.reach(
                    &confiner.sandbox,
                    &spec.base_dir,
                    &cwd,
                    &[&config.command],
                    &config.args,
                    false,
                )?;
                confiner
                    .confine(None, &cwd, &reach)
                    .map_err(|err| format!("its sandbox: {err}"))?
            }
            None => None,
        };
        let confined = confinement.as_ref().map(|c| c.network());
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(name, _)| !name.starts_with("GUILDHALL_"))
            .collect();
        let env = match &confiner {
            Some(confiner) => confiner.sandbox.environment(confinement.as_deref(), env),
            None => env,
        };
        let mut command = tokio::process::Command::new(&config.command);
        if let Some(confinement) = confinement {
            // SAFETY: the hook makes only system calls on what was prepared before the
            // fork (see sandbox::child).
            #[allow(unsafe_code)]
            unsafe {
                command.pre_exec(confinement.pre_exec());
            }
        }
        command
            .args(&config.args)
            .env_clear()
            .envs(env)
            .envs(&config.env)
            .current_dir(&cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so whatever it starts (npx → node, uv → python) dies with it.
            .process_group(0)
            .kill_on_drop(true);
        Ok((command, confined))
    }

    /// Why the handshake failed: most often the process exited before answering, so how,
    /// after reading what it said (bounded: something it started may hold its stderr open),
    /// and what its sandbox let it reach.
    async fn why_no_handshake(
        &self,
        err: &impl std::fmt::Display,
        mut child: tokio::process::Child,
        stderr: Option<tokio::task::JoinHandle<()>>,
        confined: Option<Network>,
    ) -> String {
        let status = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
        if let Some(reading) = stderr {
            let _ = tokio::time::timeout(Duration::from_millis(500), reading).await;
        }
        let why = match status {
            Ok(Ok(status)) => format!("it {} before the handshake ({err})", exit_text(status)),
            _ => format!("the MCP handshake failed: {err}"),
        };
        match confined {
            Some(network) => format!(
                "{why}; it ran in its sandbox (network = \"{network}\", reading its program \
                 and its arguments' directories): if it needs more, give [servers.{}] sandbox \
                 = {{ read = [...], network = \"proxy\" }}, or enabled = false",
                self.0.name
            ),
            None => why,
        }
    }
}

/// Waits for the process to exit or the connection to close (or the process to pass its
/// memory limit), and tells the actor. An HTTP server has no process here: only its
/// connection is watched.
async fn monitor(
    mut child: Option<tokio::process::Child>,
    service: RunningService<RoleClient, Client>,
    actor: ActorRef<ServerMsg>,
    generation: u64,
    max_rss_mib: Option<u64>,
    pid: Option<u32>,
) {
    let over_limit = async {
        let (Some(limit), Some(pid)) = (max_rss_mib, pid) else {
            return std::future::pending::<String>().await;
        };
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            every.tick().await;
            let rss = group_rss_kib(pid) / 1024;
            if rss > limit {
                return format!(
                    "its processes use {rss} MiB of memory, over max_rss_mib = {limit}: restarted"
                );
            }
        }
    };
    let has_process = child.is_some();
    let exited = async {
        match &mut child {
            Some(child) => child.wait().await,
            None => std::future::pending().await,
        }
    };
    // A server with no process here (HTTP) is pinged: one that went away fails the ping
    // at once, and the connection is taken for lost (its calls in flight end `crashed`, the
    // actor reconnects with backoff). A ping that is only slow is not a loss (a hung server
    // is found by the probe after a cancelled call).
    let peer = service.peer().clone();
    let unreachable = async {
        if has_process {
            return std::future::pending::<String>().await;
        }
        let mut every = tokio::time::interval(HEARTBEAT);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let ping = ClientRequest::PingRequest(rmcp::model::PingRequest::default());
            match tokio::time::timeout(HEARTBEAT, peer.send_request(ping)).await {
                Ok(Err(err)) => {
                    return format!("it did not answer a ping ({err}): it went away");
                }
                Ok(Ok(_)) => {}
                Err(_) => tracing::debug!("a ping took longer than {HEARTBEAT:?}"),
            }
        }
    };
    let (reason, clean) = tokio::select! {
        status = exited => match status {
            Ok(status) => (format!("its process {}", exit_text(status)), status.success()),
            Err(err) => (format!("its process could not be waited for: {err}"), false),
        },
        quit = service.waiting() => {
            // The process usually ends with its connection: report how, when it does.
            let status = match &mut child {
                Some(child) => tokio::time::timeout(Duration::from_secs(3), child.wait()).await.ok(),
                None => None,
            };
            match status {
                Some(Ok(status)) => (format!("its process {}", exit_text(status)), status.success()),
                _ => (format!("its connection closed ({quit:?})"), false),
            }
        }
        reason = over_limit => (reason, false),
        reason = unreachable => (reason, false),
    };
    let _ = actor.send_message(ServerMsg::Lost {
        generation,
        reason,
        clean,
    });
}

fn exit_text(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "ended".into(),
    }
}

/// How often a server at a URL is pinged, and how long a ping may take before it counts as
/// merely slow.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// The resident memory of every process in group `pgid`, in KiB.
fn group_rss_kib(pgid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // Fields after the command (which may hold spaces) start after its `)`.
            let rest = &stat[stat.rfind(')')? + 2..];
            let group: u32 = rest.split(' ').nth(2)?.parse().ok()?;
            (group == pgid).then_some(())?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .sum()
}

/// `text` with each `${NAME}` replaced by guildhall's environment variable `NAME` (so a
/// token stays out of the config file).
#[cfg_attr(not(feature = "http-servers"), allow(dead_code))]
fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "a `${` is not closed by `}`".to_owned())?;
        let name = &after[..end];
        if name.starts_with("GUILDHALL_") {
            return Err(format!(
                "`${{{name}}}`: guildhall's own variables (its agents' tokens) are never sent to a server"
            ));
        }
        let value = std::env::var(name)
            .map_err(|_| format!("the environment variable `{name}` is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `reason`, with the last lines the server wrote to stderr when it wrote any.
fn with_stderr(reason: &str, stderr: &OutputLog) -> String {
    let tail = stderr.tail(5);
    if tail.is_empty() {
        reason.to_owned()
    } else {
        format!("{reason}; its last stderr lines: {}", tail.join(" | "))
    }
}

/// guildhall's side of the connection: relays progress to the calling client, relists the
/// tools when the server says they changed, and writes what it logs to guildhall's log.
struct Client {
    link: Arc<Link>,
    actor: ActorRef<ServerMsg>,
    /// A relist is in the actor's mailbox and has not started.
    relist_pending: Arc<AtomicBool>,
    /// Likewise, a reading of its resources and prompts.
    recatalog_pending: Arc<AtomicBool>,
    log: ServerLog,
    /// Where a resource's update is reported.
    runtime: WeakRuntime,
}

impl Client {
    fn recatalog(&self) {
        if !self.recatalog_pending.swap(true, Ordering::AcqRel) {
            let _ = self
                .actor
                .send_message(ServerMsg::Recatalog(Arc::clone(&self.recatalog_pending)));
        }
    }
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.client_info.name = "guildhall".into();
        info.client_info.version = env!("CARGO_PKG_VERSION").into();
        // Questions are relayed to the calling agent's client (below).
        let mut asks = ElicitationCapability::new();
        asks.form = Some(FormElicitationCapability::default());
        info.capabilities.elicitation = Some(asks);
        // A server may then run a long call as a task, which the call follows to its end
        // (`upstream_task`).
        info.capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(
                rmcp::model::TASKS_EXTENSION_ID.to_owned(),
                Default::default(),
            );
        info
    }

    /// Relays the server's question to the client of the agent whose call it is about, and
    /// its answer back. When that caller cannot be told apart, or its client does not
    /// answer questions, the server gets an error saying why (a plain decline would read as
    /// the user's choice).
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let refuse = |why: String| {
            McpError::invalid_request(format!("guildhall cannot relay this question: {why}"), None)
        };
        let call = self.link.sole_call().map_err(refuse)?;
        let request = serde_json::to_value(request).map_err(|err| refuse(err.to_string()))?;
        let asking = call.elicit(request).ok_or_else(|| {
            refuse(format!(
                "the calling agent{}'s client does not support elicitation",
                call.agent().map(|a| format!(" `{a}`")).unwrap_or_default()
            ))
        })?;
        let answer = asking.await.map_err(refuse)?;
        serde_json::from_value(answer)
            .map_err(|err| refuse(format!("its answer is not an elicitation result: {err}")))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.link.progress(
            &params.progress_token,
            params.progress,
            params.total,
            params.message.as_deref(),
        );
    }

    // Deprecated from MCP's 2026 revision on (SEP-2577); 2025 servers still log.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.log.write(&params);
    }

    /// Reported to whoever watches the resource under guildhall's URI for it (a report
    /// nobody watches costs one atomic load).
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        if let Some(runtime) = self.runtime.upgrade() {
            let changes = runtime.changes();
            if changes.is_watched() {
                let uri = federation::resource_uri(&self.link.server, &params.uri);
                changes.changed(&crate::changes::Subject::Resource(Arc::from(uri)));
            }
        }
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.recatalog();
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.recatalog();
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        if !self.relist_pending.swap(true, Ordering::AcqRel) {
            let _ = self
                .actor
                .send_message(ServerMsg::Relist(Arc::clone(&self.relist_pending)));
        }
    }
}

/// Registers the server's (exposed) tools that are not registered yet and removes those it
/// no longer has, or has changed; `tools/list_changed` reaches connected clients through
/// the runtime's tool-set version.
async fn reconcile(spec: &ServerSpec, peer: &Peer<RoleClient>) -> Result<(), String> {
    let tools = peer.list_all_tools().await.map_err(|err| err.to_string())?;
    let Some(runtime) = spec.runtime.upgrade() else {
        return Ok(());
    };
    let mut registered = spec.registered.lock().await;
    let mut wanted: BTreeMap<String, (rmcp::model::Tool, String)> = BTreeMap::new();
    for tool in tools {
        if spec.config.exposes(&tool.name) {
            let fingerprint = serde_json::to_string(&tool).unwrap_or_default();
            wanted.insert(tool.name.to_string(), (tool, fingerprint));
        }
    }
    let stale: Vec<String> = registered
        .iter()
        .filter(|(remote, (_, fingerprint))| {
            wanted.get(*remote).is_none_or(|(_, f)| f != fingerprint)
        })
        .map(|(remote, _)| remote.clone())
        .collect();
    for remote in stale {
        if let Some((name, _)) = registered.remove(&remote) {
            runtime.deregister(&name).await;
        }
    }
    let mut taken: std::collections::BTreeSet<String> =
        registered.values().map(|(name, _)| name.clone()).collect();
    for (remote, (tool, fingerprint)) in wanted {
        if registered.contains_key(&remote) {
            continue;
        }
        let name = unique_name(&spec.name, &remote, &taken);
        let proxy = ProxyTool {
            name: name.clone(),
            remote: Arc::from(remote.as_str()),
            description: tool.description.as_deref().unwrap_or_default().to_owned(),
            input: Arc::new(object_schema(Value::Object((*tool.input_schema).clone()))),
            output: tool
                .output_schema
                .as_ref()
                .map(|schema| Arc::new(Value::Object((**schema).clone()))),
            annotations: annotations(&tool),
            pool: spec.pool.clone(),
            hang_grace: spec.config.hang_grace,
            as_task: std::sync::atomic::AtomicBool::new(false),
        };
        // Never retried: a server's idempotent hint is its own claim, and a call repeated on
        // a false one repeats its side effect; the caller sees `crashed` and decides.
        let options = ToolOptions::default()
            .timeout(spec.config.timeout)
            .max_retries(0);
        let verbatim = |result, _: &str| Ok(ToolReply::verbatim(result));
        match runtime.register_encoded(proxy, options, verbatim).await {
            Ok(_) => {
                taken.insert(name.clone());
                registered.insert(remote, (name, fingerprint));
            }
            Err(err) => {
                tracing::warn!(server = %spec.name, tool = %remote, error = %guildhall_actors::ErrorChain(&err), "server tool not registered");
            }
        }
    }
    Ok(())
}

/// `mcp__{server}__{tool}`, with characters MCP does not allow in a name replaced by `_`,
/// shortened to 128 characters (with a hash of the whole to keep it unique), and numbered
/// when it collides with another of the server's tools.
pub(crate) fn unique_name(
    server: &str,
    tool: &str,
    taken: &std::collections::BTreeSet<String>,
) -> String {
    let clean: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut name = format!("mcp__{server}__{clean}");
    if name.len() > 128 {
        let hash = xxhash_rust::xxh3::xxh3_64(tool.as_bytes());
        name.truncate(111);
        name = format!("{name}_{hash:016x}");
    }
    let base = name.clone();
    let mut n = 2;
    while taken.contains(&name) {
        let suffix = format!("_{n}");
        let keep = base.len().min(128 - suffix.len());
        name = format!("{}{suffix}", &base[..keep]);
        n += 1;
    }
    name
}

/// A server's input schema as MCP requires it: an object schema. A schema that says
/// nothing of its type (`{}`, or properties alone) gets `"type": "object"`.
fn object_schema(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema
        && !map.contains_key("type")
        && !map.contains_key("oneOf")
        && !map.contains_key("anyOf")
    {
        map.insert("type".into(), Value::from("object"));
    }
    schema
}

/// The server's hints, with MCP's defaults where it gives none.
fn annotations(tool: &rmcp::model::Tool) -> Annotations {
    let given = tool.annotations.as_ref();
    let defaults = Annotations::default();
    Annotations {
        title: tool
            .title
            .clone()
            .or_else(|| given.and_then(|a| a.title.clone())),
        read_only_hint: given
            .and_then(|a| a.read_only_hint)
            .unwrap_or(defaults.read_only_hint),
        destructive_hint: given
            .and_then(|a| a.destructive_hint)
            .unwrap_or(defaults.destructive_hint),
        idempotent_hint: given
            .and_then(|a| a.idempotent_hint)
            .unwrap_or(defaults.idempotent_hint),
        open_world_hint: given
            .and_then(|a| a.open_world_hint)
            .unwrap_or(defaults.open_world_hint),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_read_the_environment_but_never_guildhall_s_own() {
        let path = std::env::var("PATH").unwrap();
        assert_eq!(expand_env("a ${PATH} b").unwrap(), format!("a {path} b"));
        assert_eq!(expand_env("no variables").unwrap(), "no variables");
        let unset = expand_env("Bearer ${SURELY_UNSET_VARIABLE_42}").unwrap_err();
        assert!(
            unset.contains("SURELY_UNSET_VARIABLE_42` is not set"),
            "{unset}"
        );
        assert!(
            expand_env("${GUILDHALL_TOKEN}")
                .unwrap_err()
                .contains("never sent")
        );
        assert!(expand_env("${PATH").unwrap_err().contains("not closed"));
    }

    #[test]
    fn names_are_valid_and_unique() {
        let mut taken = std::collections::BTreeSet::new();
        let a = unique_name("fs", "read file", &taken);
        assert_eq!(a, "mcp__fs__read_file");
        taken.insert(a);
        assert_eq!(
            unique_name("fs", "read_file", &taken),
            "mcp__fs__read_file_2"
        );
        let long = unique_name("fs", &"x".repeat(300), &taken);
        assert_eq!(long.len(), 128);
        assert!(guildhall_actors::spec::validate_name(&long).is_ok());
        assert!(
            guildhall_actors::spec::validate_name(&unique_name("fs", "naïve/tool", &taken)).is_ok()
        );
    }
}
