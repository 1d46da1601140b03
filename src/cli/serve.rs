//! `guildhall serve`, `guildhall tools` and `guildhall status`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use guildhall::commands::Commands;
use guildhall::config::{CONFIG_FILE, Config};
use guildhall::launch::Launcher;
use guildhall::mcp::http::{self, HttpOptions};
use guildhall::mcp::local::{self, Hello};
use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::runtime::AfterStart;
use guildhall::servers::{ServerState, Servers};
use guildhall::{BuildError, ChildSnapshot, ErrorChain, Runtime, RuntimeBuilder};
use tokio_util::sync::CancellationToken;

use super::tree::print_tree;

type CliResult = Result<(), Box<dyn std::error::Error>>;

/// The HTTP address `serve` binds when not told otherwise.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7077";

/// How often command tool manifests are looked at for changes (a stat per file).
const MANIFEST_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Serve one client over stdin/stdout instead (single-agent use, e.g. Claude Desktop).
    /// The runtime runs in this process; stdout carries only MCP messages.
    #[arg(long)]
    stdio: bool,
    /// The Streamable HTTP address (`/mcp`). Port 0 picks a free port; the URL is printed.
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "ADDR", conflicts_with = "stdio")]
    listen: SocketAddr,
    /// No HTTP endpoint: only the local socket `guildhall mcp` connects through.
    #[arg(long, conflicts_with = "stdio")]
    no_http: bool,
    /// Require `Authorization: Bearer <TOKEN>` on HTTP (mandatory off loopback).
    #[arg(
        long,
        env = "GUILDHALL_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Another `Host` header value to accept on HTTP (repeatable).
    #[arg(long, value_name = "HOST")]
    allow_host: Vec<String>,
    /// Another browser origin to accept on HTTP, e.g. `https://app.example:443` (repeatable).
    #[arg(long, value_name = "ORIGIN")]
    allow_origin: Vec<String>,
    /// The most HTTP sessions open at once; an `initialize` past it gets 503 + Retry-After.
    #[arg(
        long,
        default_value_t = 1000,
        value_name = "N",
        conflicts_with = "stdio"
    )]
    max_sessions: usize,
    /// Close an HTTP session after this long without a request (`90s`, `10m`).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration, value_name = "DURATION", conflicts_with = "stdio")]
    session_idle: std::time::Duration,
    /// Exit after this long with no `guildhall mcp` client connected (`5m`; `0s`: never).
    /// What servers started by `guildhall mcp` run with; needs --no-http, since HTTP clients
    /// come and go without a lasting connection.
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION", requires = "no_http")]
    idle_exit: Option<std::time::Duration>,
    /// With --stdio: the agent this client acts as.
    #[arg(long, default_value = "solo", requires = "stdio")]
    agent: String,
    /// With --stdio: its role.
    #[arg(long, requires = "stdio")]
    role: Option<String>,
    /// With --stdio: the agent it reports to.
    #[arg(long, requires = "stdio")]
    parent: Option<String>,
    /// Only these tools (names and globs, comma-separated: `send_message,context_*`).
    #[arg(long, value_name = "LIST")]
    tools: Option<String>,
    /// The config file (default: `guildhall.toml` in the data directory, if present).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Keep everything in memory: no store, nothing survives the process (tests, benches).
    #[arg(long)]
    in_memory: bool,
    /// Keep agents, mail, context and tasks in this PostgreSQL database
    /// (`postgres://user@host:port/db`), which other servers may share; overrides the
    /// config's `[store] url`.
    #[cfg(feature = "postgres")]
    #[arg(
        long,
        env = "GUILDHALL_STORE",
        value_name = "URL",
        conflicts_with = "in_memory",
        hide_env_values = true
    )]
    store: Option<String>,
    /// Also serve the official MCP conformance suite's fixture tools, resources and prompts.
    #[cfg(feature = "conformance")]
    #[arg(long)]
    conformance_fixtures: bool,
    /// Register the `echo` tool `bench mcp` calls.
    #[cfg(feature = "bench")]
    #[arg(long, hide = true)]
    bench_echo: bool,
    /// Register this many agents as a tree (a tech lead, managers, workers): a swarm to watch.
    #[cfg(feature = "bench")]
    #[arg(long, hide = true, default_value_t = 0)]
    bench_agents: usize,
    /// Keep the bench swarm busy: calls of `echo` as its workers at this many events per
    /// second (implies --bench-echo; needs --bench-agents).
    #[cfg(feature = "bench")]
    #[arg(long, hide = true, requires = "bench_agents")]
    bench_load: Option<u32>,
}

pub(crate) async fn serve(args: ServeArgs, data_dir: &Path) -> CliResult {
    let config_file = args
        .config
        .clone()
        .unwrap_or_else(|| data_dir.join(CONFIG_FILE));
    let config = Config::load(&config_file, args.config.is_some())?;
    let roles = config.role_tools()?;
    let filter = match &args.tools {
        Some(list) => ToolFilter::parse(list)?,
        None => ToolFilter::all(),
    };
    let mut builder = Runtime::builder()
        .governance(config.governance())
        .credentials(config.credentials()?)
        .task_config(config.task_config()?)
        .mailbox_config(guildhall::MailboxConfig {
            expected: config.agents.keys().cloned().collect(),
            ..Default::default()
        })
        .sections(config.subsystems.clone());
    #[cfg(feature = "bench")]
    if args.bench_echo || args.bench_load.is_some() {
        builder = builder.tool(guildhall::bench::mcp::Echo);
    }
    if !args.in_memory {
        builder = builder.data_dir(data_dir);
        if let Some(bytes) = config.store_cache_bytes()? {
            builder = builder.store_cache(bytes);
        }
    }
    #[cfg(feature = "postgres")]
    if let Some(url) = args.store.as_ref().or(config.store.url.as_ref())
        && !args.in_memory
    {
        builder = builder.store_url(url);
        if let Some(lease) = config.store.lease {
            builder = builder.store_lease(lease);
        }
    }
    builder = with_work_tools(builder, &config, &config_file, data_dir)?;
    if let Some(humans) = &config.humans {
        builder = builder.humans(humans.clone());
    }
    builder = with_late_subsystems(builder, &config, &config_file, &args, data_dir)?;
    let runtime = builder.build().await.map_err(|err| match err {
        // The store is the one thing another server on this directory holds.
        BuildError::Store(_) => format!(
            "{}\n(is a server already running for {}? `guildhall status` tells; \
             agents reach it with `guildhall mcp`)",
            ErrorChain(&err),
            data_dir.display()
        ),
        _ => ErrorChain(&err).to_string(),
    })?;
    let launcher = runtime
        .subsystem::<AfterStart<Arc<Launcher>>>()
        .and_then(AfterStart::get)
        .cloned();
    #[cfg(feature = "a2a")]
    if let Err(err) = add_a2a_remotes(&runtime, &config).await {
        runtime.shutdown().await;
        return Err(err);
    }
    // Every tool is registered now but proxied servers' (`mcp__…`, which come and go): the
    // names are checked before any server's process is started.
    let known: Vec<String> = runtime
        .tools()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    if let Err(err) = config.check_tool_names(&config_file, &known) {
        runtime.shutdown().await;
        return Err(err.into());
    }
    let servers = match add_servers(&runtime, &config).await {
        Ok(servers) => servers,
        Err(err) => {
            runtime.shutdown().await;
            return Err(err);
        }
    };
    // Held while serving: dropping it sends the last spans.
    #[cfg(feature = "otlp")]
    let traces = match guildhall::observe::Traces::start(&runtime, &config.telemetry) {
        Ok(traces) => traces,
        Err(err) => {
            runtime.shutdown().await;
            return Err(err.into());
        }
    };
    #[cfg(not(feature = "otlp"))]
    if config.telemetry.otlp_endpoint.is_some() {
        tracing::warn!("[telemetry] otlp_endpoint is set, but this build has no `otlp` feature");
    }
    // Held while serving: dropping it stops the load.
    #[cfg(feature = "bench")]
    let _load = match bench_swarm(&runtime, &args).await {
        Ok(load) => load,
        Err(err) => {
            runtime.shutdown().await;
            return Err(err.into());
        }
    };
    #[cfg_attr(not(feature = "conformance"), allow(unused_mut))]
    let mut server = McpServer::new(runtime.clone())
        .with_models(config.model_rules()?)
        .with_disclosure(config.mcp.disclose_after);
    #[cfg(feature = "conformance")]
    if args.conformance_fixtures {
        server = server.with_conformance_fixtures();
    }
    let serving = async {
        if args.stdio {
            serve_stdio(&args, &server, &roles, filter).await
        } else {
            let supervised = Supervised {
                servers,
                launcher,
                hooks: config.loop_hooks(),
            };
            serve_network(&args, &config, &server, roles, filter, data_dir, supervised).await
        }
    };
    // A shared database another server took over: this one steps down at once.
    let result = tokio::select! {
        result = serving => result,
        lost = store_lost(runtime.store()) => {
            tracing::error!(error = %guildhall_actors::ErrorChain(&lost), "stepping down");
            Err(format!("stepping down: {lost}").into())
        }
    };
    #[cfg(feature = "otlp")]
    if let Some(traces) = traces {
        traces.flush().await;
    }
    runtime.shutdown().await;
    result
}

/// The bench swarm and its load, when asked for (hidden flags, for the dashboard's test).
#[cfg(feature = "bench")]
async fn bench_swarm(
    runtime: &Runtime,
    args: &ServeArgs,
) -> Result<Option<tokio_util::sync::DropGuard>, String> {
    if args.bench_agents == 0 {
        return Ok(None);
    }
    let ids = guildhall::bench::load::register_swarm(runtime, args.bench_agents).await?;
    Ok(args
        .bench_load
        .map(|rate| guildhall::bench::load::load(runtime.clone(), ids, rate)))
}

async fn serve_stdio(
    args: &ServeArgs,
    server: &McpServer,
    roles: &local::RoleTools,
    filter: ToolFilter,
) -> CliResult {
    let (connection, _) = local::bind(
        &server.connection(None, filter),
        roles,
        args.agent.clone(),
        args.role.clone(),
        args.parent.clone(),
        None,
    )
    .await?;
    guildhall::mcp::serve_stdio(connection).await?;
    Ok(())
}

/// What a network server runs beside its listeners, and what its clients' hooks are
/// answered with.
struct Supervised {
    servers: Arc<Servers>,
    launcher: Option<Arc<Launcher>>,
    hooks: guildhall::loop_hooks::LoopHooks,
}

async fn serve_network(
    args: &ServeArgs,
    config: &Config,
    server: &McpServer,
    roles: local::RoleTools,
    filter: ToolFilter,
    data_dir: &Path,
    supervised: Supervised,
) -> CliResult {
    let Supervised {
        servers,
        launcher,
        hooks,
    } = supervised;
    let shutdown = CancellationToken::new();
    let store_handle = server.runtime().store();
    let store = store_handle.describe();
    let server = server.connection(None, filter);
    // The port first: when it is taken, nothing else has been set up (no socket left behind).
    let http_listener = if args.no_http {
        None
    } else {
        Some(
            tokio::net::TcpListener::bind(args.listen)
                .await
                .map_err(|err| listen_error(args.listen, &err))?,
        )
    };
    if let (Some(cluster), Some(listener)) = (store_handle.cluster(), &http_listener)
        && let Ok(address) = listener.local_addr()
    {
        cluster.announce(&format!("http://{address}"));
    }
    // No sandbox's egress proxy ever connects to guildhall's own port.
    if let (Some(sandbox), Some(Ok(address))) = (
        server.runtime().sandbox(),
        http_listener
            .as_ref()
            .map(tokio::net::TcpListener::local_addr),
    ) {
        sandbox.guard_port(address.port());
    }
    let (listener, socket_guard) = bind_socket(data_dir)?;
    let socket = socket_guard.0.clone();
    let http_url = match &http_listener {
        Some(listener) => Some(format!("http://{}{}", listener.local_addr()?, http::PATH)),
        None => None,
    };
    let mut control = local::Control::default();
    if let Some(launcher) = &launcher {
        control = control.with_launcher(Arc::clone(launcher));
    }
    let control = control
        .with_loop_hooks(hooks)
        .with_servers(Arc::clone(&servers))
        .with_admin(Arc::new(super::admin::ServerAdmin {
            servers: Some(servers),
        }))
        .with_about(serde_json::json!({
            "data_dir": std::path::absolute(data_dir)?,
            "http": http_url,
            "store": store,
        }));
    let roles = Arc::new(roles);
    if let Some(launcher) = &launcher {
        // A sandboxed agent reaches guildhall through a socket of its own.
        launcher.serve_agents_with(Arc::new(local::AgentSocketServer::new(
            server.clone(),
            Arc::clone(&roles),
            control.clone(),
        )));
    }
    let local_task = tokio::spawn(local::serve(
        listener,
        server.clone(),
        roles,
        shutdown.clone(),
        control.clone(),
    ));
    let mut out = std::io::stdout().lock();
    writeln!(out, "local socket: {}", socket.display())?;
    let http_task = match http_listener {
        None => None,
        Some(listener) => Some(serve_http(
            args, config, listener, &server, &control, &shutdown, &mut out,
        )?),
    };
    out.flush()?;
    drop(out);
    tracing::info!(data_dir = %data_dir.display(), "serving");
    until_asked_to_stop(args, &control).await;
    shutdown.cancel();
    let _ = local_task.await;
    if let Some(task) = http_task {
        task.await??;
    }
    drop(socket_guard);
    Ok(())
}

/// Listens on the data directory's local socket (owner only: reaching it is acting as any
/// agent without a token), removing a stale one first; the guard removes it again.
fn bind_socket(
    data_dir: &Path,
) -> Result<(tokio::net::UnixListener, RemoveOnDrop), Box<dyn std::error::Error>> {
    guildhall::private_fs::create_dir_all(data_dir)?;
    // The store is ours (its lock is held), so a socket file left here is stale.
    let socket = local::socket_path(data_dir);
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(format!("cannot remove stale {}: {err}", socket.display()).into()),
    }
    let listener = tokio::net::UnixListener::bind(&socket)
        .map_err(|err| format!("cannot listen on {}: {err}", socket.display()))?;
    guildhall::private_fs::restrict(&socket)?;
    // From here on every way out removes the socket.
    Ok((listener, RemoveOnDrop(socket)))
}

/// Registers `[a2a.remote.NAME]`'s tools, `a2a__NAME__send` and `a2a__NAME__task`, with
/// its call budget.
#[cfg(feature = "a2a")]
async fn add_a2a_remotes(runtime: &Runtime, config: &Config) -> CliResult {
    let Some(a2a) = &config.a2a else {
        return Ok(());
    };
    for (name, remote) in &a2a.remote {
        let (send, task) = guildhall::a2a::remote_tools(name, remote)
            .await
            .map_err(|err| ErrorChain(&err).to_string())?;
        let options = guildhall::ToolOptions {
            timeout: remote
                .timeout
                .unwrap_or(guildhall::a2a::DEFAULT_REMOTE_TIMEOUT),
            ..guildhall::ToolOptions::default()
        };
        let refused =
            |err: guildhall::BuildError| format!("[a2a.remote.{name}]: {}", ErrorChain(&err));
        runtime
            .register_with(send, options.clone())
            .await
            .map_err(refused)?;
        runtime
            .register_with(task, options)
            .await
            .map_err(refused)?;
        tracing::info!(remote = %name, url = %remote.url, "remote A2A agent on");
    }
    Ok(())
}

/// Serves Streamable HTTP, the metrics and the dashboard on `listener` until `shutdown`,
/// writing their addresses to `out`.
fn serve_http(
    args: &ServeArgs,
    #[cfg_attr(not(feature = "a2a"), allow(unused_variables))] config: &Config,
    listener: tokio::net::TcpListener,
    server: &McpServer,
    control: &local::Control,
    shutdown: &CancellationToken,
    out: &mut impl Write,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, Box<dyn std::error::Error>> {
    let options = HttpOptions {
        token: args.token.clone(),
        allowed_hosts: args.allow_host.clone(),
        allowed_origins: args.allow_origin.clone(),
        max_sessions: args.max_sessions,
        session_idle: args.session_idle,
        metrics: Some({
            let metrics = guildhall::observe::Metrics::start(server.runtime());
            metrics.count_connections(control.connections());
            metrics
        }),
        dashboard: Some(control.clone()),
        edge: None,
    };
    let addr = listener.local_addr()?;
    #[cfg(feature = "a2a")]
    let options = match &config.a2a {
        Some(a2a) if !a2a.expose.is_empty() => {
            let routes = guildhall::a2a::routes(
                server.runtime(),
                a2a,
                &format!("http://{addr}"),
                args.token.is_some(),
                shutdown.clone(),
            )?;
            writeln!(
                out,
                "a2a agent card: http://{addr}/.well-known/agent-card.json"
            )?;
            HttpOptions {
                edge: Some(routes),
                ..options
            }
        }
        _ => options,
    };
    let router = http::router(server.clone(), addr, options, shutdown.clone())?;
    writeln!(out, "mcp endpoint: http://{addr}{}", http::PATH)?;
    writeln!(out, "metrics: http://{addr}{}", http::METRICS_PATH)?;
    writeln!(out, "dashboard: http://{addr}{}", http::DASHBOARD_PATH)?;
    Ok(tokio::spawn(http::serve(
        listener,
        router,
        shutdown.clone(),
    )))
}

/// Waits for a signal, `guildhall stop`, or (with `--idle-exit`) no client for that long.
async fn until_asked_to_stop(args: &ServeArgs, control: &local::Control) {
    let idle_exit = args.idle_exit.filter(|d| !d.is_zero());
    let stop_requested = control.stop_requested();
    tokio::select! {
        () = wait_for_stop_signal() => tracing::info!("stopping on a signal"),
        () = stop_requested.cancelled() => tracing::info!("stopping: `guildhall stop`"),
        () = async {
            match idle_exit {
                Some(idle) => control.idle_for(idle).await,
                None => std::future::pending().await,
            }
        } => tracing::info!(?idle_exit, "stopping: no client connected for the idle time"),
    }
}

/// Returns once `store` can no longer be used (checked every 200 ms).
async fn store_lost(store: Arc<dyn guildhall::store::Store>) -> guildhall::store::StoreError {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    loop {
        tick.tick().await;
        if let Some(lost) = store.lost() {
            return lost;
        }
    }
}

/// Removes a socket file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Why the HTTP address cannot be had, with what to do about it.
fn listen_error(addr: SocketAddr, err: &std::io::Error) -> String {
    if err.kind() == std::io::ErrorKind::AddrInUse {
        format!(
            "port {} is in use on {} (another guildhall server, or another program): pick a \
             free one with `--listen 127.0.0.1:0`, or serve without HTTP with `--no-http`",
            addr.port(),
            addr.ip()
        )
    } else {
        format!("cannot listen on {addr}: {err}")
    }
}

/// Until Ctrl-C or SIGTERM.
pub(crate) async fn wait_for_stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct ToolsArgs {
    /// Print the MCP tool list (schemas and annotations) as JSON.
    #[arg(long)]
    json: bool,
    /// Only these tools (names and globs, comma-separated).
    #[arg(long, value_name = "LIST")]
    tools: Option<String>,
    /// The config file whose `[files]`, `[shell]`, `[fetch]`, `[servers.*]` and
    /// `[commands.*]` (and `tools/*.toml` beside it) add tools
    /// (default: `guildhall.toml` in the data directory, if present). The servers are
    /// started to list their tools, and stopped again.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Starts the launcher of `[launch]`, when `config` has one, with `spawn_agent` and
/// Adds what needs the tree running, last: the command tools (reloaded when a manifest
/// changes), the launcher, and the supervisor of the proxied servers, which are added once
/// every other tool's name is known.
fn with_late_subsystems(
    mut builder: RuntimeBuilder,
    config: &Config,
    config_file: &Path,
    args: &ServeArgs,
    data_dir: &Path,
) -> Result<RuntimeBuilder, Box<dyn std::error::Error>> {
    builder = builder.subsystem(AfterStart::new("commands", {
        let config_file = config_file.to_owned();
        move |runtime| async move { start_commands(&runtime, config_file).await }
    }));
    if let Some(skills) = &config.skills {
        let base = config_dir(config)?;
        let dirs: Vec<PathBuf> = skills.dirs.iter().map(|d| base.join(d)).collect();
        let roles: std::collections::BTreeMap<String, Vec<String>> = config
            .roles
            .iter()
            .filter_map(|(role, c)| c.skills.clone().map(|s| (role.clone(), s)))
            .collect();
        builder = builder.subsystem(AfterStart::new("skills", move |runtime| async move {
            let skills = guildhall::skills::Skills::start(&runtime, dirs, roles).await?;
            tracing::info!(skills = skills.catalog().len(), "skill on");
            Ok(skills)
        }));
    }
    if config.mcp.disclose_after.is_some() {
        builder = builder.tool_search();
    }
    if !config.pipelines.is_empty() {
        // After the command tools, whose names and schemas the pipelines are checked with.
        let pipelines = config.pipelines.clone();
        let config_file = config_file.to_owned();
        builder = builder.subsystem(AfterStart::new("pipelines", move |runtime| async move {
            let served = guildhall::compose::pipelines::serve(&runtime, &pipelines)
                .await
                .map_err(|(name, reason)| {
                    Config::pipeline_error_at(&config_file, &name, &reason).to_string()
                })?;
            tracing::info!(?served, "pipelines served");
            Ok(served)
        }));
    }
    if let Some(launch) = &config.launch {
        let (launch, base_dir) = (launch.clone(), config_dir(config)?);
        let program = std::env::current_exe()?;
        let data_dir = (!args.in_memory)
            .then(|| std::path::absolute(data_dir))
            .transpose()?;
        builder = builder.subsystem(AfterStart::new("launch", move |runtime| async move {
            let launcher = Launcher::start(&runtime, launch, base_dir, data_dir, program)
                .await
                .map_err(|err| ErrorChain(&err).to_string())?;
            tracing::info!(profiles = ?launcher.profiles(), "spawn_agent on");
            Ok(launcher)
        }));
    }
    builder = builder.subsystem(
        AfterStart::new("servers", {
            let (base_dir, logs) = (
                config_dir(config)?,
                (!args.in_memory).then(|| data_dir.join("servers")),
            );
            move |runtime| async move {
                Servers::start(&runtime, base_dir, logs)
                    .await
                    .map_err(|err| ErrorChain(&err).to_string())
            }
        })
        // A listing of tools waits for each server's first start (its `listing_wait`).
        .settling(|servers: &Arc<Servers>| {
            let servers = Arc::clone(servers);
            async move { servers.first_starts().await }
        }),
    );
    Ok(builder)
}

/// Adds the `[servers.*]` of `config` to the `servers` supervisor (their tools appear as
/// each finishes its handshake), which `guildhall servers add` adds to at run time.
async fn add_servers(
    runtime: &Runtime,
    config: &Config,
) -> Result<Arc<Servers>, Box<dyn std::error::Error>> {
    let servers = runtime
        .subsystem::<AfterStart<Arc<Servers>>>()
        .and_then(AfterStart::get)
        .cloned()
        .ok_or("the `servers` subsystem did not start")?;
    for (name, server) in &config.servers {
        servers.add(name, server.clone()).await?;
        tracing::info!(server = %name, "MCP server proxied");
    }
    Ok(servers)
}

/// Serves the command tools of `config_file` (its `[commands.*]` and `tools/*.toml`), and
/// reloads them when a manifest changes.
async fn start_commands(runtime: &Runtime, config_file: PathBuf) -> Result<Arc<Commands>, String> {
    let error = |err: guildhall::commands::CommandsError| ErrorChain(&err).to_string();
    let commands = Commands::start(runtime, config_file).await.map_err(error)?;
    commands.watch(MANIFEST_CHECK).await.map_err(error)?;
    for tool in commands.list().await {
        tracing::info!(tool = %tool.name, at = %tool.defined_at, "command tool served");
    }
    Ok(commands)
}

/// Where relative paths in `[servers.*]` are taken from: the config file's directory, or the
/// working directory when there is no file.
fn config_dir(config: &Config) -> std::io::Result<PathBuf> {
    if config.dir.as_os_str().is_empty() {
        std::env::current_dir()
    } else {
        std::path::absolute(&config.dir)
    }
}

/// Adds the built-in work tools whose sections `config` has: `[files]`, `[shell]`,
/// `[fetch]`.
fn with_work_tools(
    mut builder: RuntimeBuilder,
    config: &Config,
    config_file: &Path,
    data_dir: &Path,
) -> Result<RuntimeBuilder, Box<dyn std::error::Error>> {
    // Opened once: the shell runs in the file tools' roots when they are on.
    let files = config
        .files
        .as_ref()
        .map(guildhall::files::Files::open)
        .transpose()?;
    if let Some(files) = &files {
        tracing::info!(roots = ?files.roots(), "file tools on");
        builder = builder.files(files);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // One sandbox for every process started for an agent: commands of the shell,
        // command tools, proxied servers.
        let sandbox = sandbox(config, config_file, data_dir)?;
        builder = builder.sandbox(&sandbox, files.as_ref());
        if let Some(shell) = &config.shell {
            let files = match files {
                Some(files) => files,
                None => guildhall::files::Files::open(&Default::default())?,
            };
            let shell = guildhall::shell::Shell::with_sandbox(shell.clone(), files, sandbox)?;
            tracing::info!("shell tools on");
            builder = builder.shell(&shell);
        }
    }
    #[cfg(feature = "fetch")]
    if let Some(fetch) = &config.fetch {
        let fetch = guildhall::fetch::Fetch::new(fetch.clone())?;
        tracing::info!("web_fetch on");
        builder = builder.fetch(&fetch);
    }
    Ok(builder)
}

/// The sandbox of every process started for an agent: `[sandbox]`, hiding the data
/// directory, the config file and the token files. Its level goes to the log.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn sandbox(
    config: &Config,
    config_file: &Path,
    data_dir: &Path,
) -> Result<Arc<guildhall::sandbox::Sandbox>, Box<dyn std::error::Error>> {
    let sandbox = guildhall::sandbox::Sandbox::new(
        config.sandbox.clone(),
        config.protected(config_file, data_dir),
    )?;
    match sandbox.level().missing() {
        _ if !sandbox.config().enabled => tracing::warn!(
            "sandbox off ([sandbox] enabled = false): commands run with the server's rights"
        ),
        None => tracing::info!(applied = %sandbox.describe(), "sandbox on"),
        Some(missing) => tracing::warn!(
            applied = %sandbox.describe(),
            "sandbox partial: the kernel lacks {missing}"
        ),
    }
    Ok(sandbox)
}

pub(crate) async fn tools(args: ToolsArgs, data_dir: &Path) -> CliResult {
    let config_file = args
        .config
        .clone()
        .unwrap_or_else(|| data_dir.join(CONFIG_FILE));
    let config = Config::load(&config_file, args.config.is_some())?;
    let config_file_shown = config_file.clone();
    let mut builder = with_work_tools(
        Runtime::builder().sections(config.subsystems.clone()),
        &config,
        &config_file,
        data_dir,
    )?;
    if let Some(humans) = &config.humans {
        builder = builder.humans(humans.clone());
    }
    let runtime = builder.build().await?;
    let servers = Servers::start(&runtime, config_dir(&config)?, None).await?;
    let mut origin = std::collections::BTreeMap::new();
    if !config.servers.is_empty() {
        for (name, server) in &config.servers {
            servers.add(name, server.clone()).await?;
        }
        let longest = config.servers.values().map(|s| s.startup_timeout).max();
        servers.settled(longest.unwrap_or_default()).await;
        for server in servers.list().await {
            if server.state != ServerState::Running {
                let reason = server
                    .reason
                    .as_deref()
                    .unwrap_or("it did not start in time");
                tracing::warn!(server = %server.name, "its tools are not listed: {reason}");
            }
            for tool in server.tools {
                origin.insert(tool, format!("(from MCP server `{}`)", server.name));
            }
        }
    }
    if let Some(launch) = &config.launch {
        let program = std::env::current_exe()?;
        Launcher::start(
            &runtime,
            launch.clone(),
            config_dir(&config)?,
            None,
            program,
        )
        .await?;
    }
    let commands = match Commands::start(&runtime, config_file).await {
        Ok(commands) => commands,
        Err(err) => {
            runtime.shutdown().await;
            return Err(err.into());
        }
    };
    for tool in commands.list().await {
        origin.insert(
            tool.name,
            format!("(command `{}`, {})", tool.program, tool.defined_at),
        );
    }
    // Skills and pipelines last, as `serve` adds them: a pipeline's steps may be any tool.
    let mut _skills = None;
    if let Some(skills) = &config.skills {
        let base = config_dir(&config)?;
        let dirs = skills.dirs.iter().map(|d| base.join(d)).collect();
        _skills = Some(guildhall::skills::Skills::start(&runtime, dirs, Default::default()).await?);
    }
    for name in guildhall::compose::pipelines::serve(&runtime, &config.pipelines)
        .await
        .map_err(|(name, reason)| Config::pipeline_error_at(&config_file_shown, &name, &reason))?
    {
        origin.insert(name, "(pipeline, [pipelines] in guildhall.toml)".to_owned());
    }
    let filter = match &args.tools {
        Some(list) => ToolFilter::parse(list)?,
        None => ToolFilter::all(),
    };
    let listed = McpServer::new(runtime.clone())
        .connection(None, filter)
        .visible_tools();
    runtime.shutdown().await;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&listed)?)?;
        return Ok(());
    }
    for tool in &listed {
        let hints = tool
            .annotations
            .as_ref()
            .map(|a| {
                let mut hints = Vec::new();
                if a.read_only_hint == Some(true) {
                    hints.push("read-only");
                }
                if a.destructive_hint == Some(true) {
                    hints.push("destructive");
                }
                if a.idempotent_hint == Some(true) {
                    hints.push("idempotent");
                }
                hints.join(", ")
            })
            .unwrap_or_default();
        writeln!(
            out,
            "{:<16} {}",
            tool.name,
            tool.description.as_deref().unwrap_or("")
        )?;
        if let Some(origin) = origin.get(tool.name.as_ref()) {
            writeln!(out, "{:<16} {origin}", "")?;
        }
        if !hints.is_empty() {
            writeln!(out, "{:<16} ({hints})", "")?;
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct StopArgs {}

/// Asks the server for the data directory to stop, and waits until its socket is gone.
pub(crate) async fn stop(_: StopArgs, data_dir: &Path) -> CliResult {
    let answer = match local::connect(data_dir, &Hello::Stop).await {
        Ok(connected) => connected.value,
        Err(local::LocalError::NotRunning { .. }) => {
            writeln!(
                std::io::stdout(),
                "no guildhall server is running for {}",
                data_dir.display()
            )?;
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    let socket = local::socket_path(data_dir);
    // It finishes the calls in flight first; bounded, as every wait here.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while socket.exists() {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the server (pid {}) was asked to stop but still runs after 30 s",
                answer["pid"]
            )
            .into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    writeln!(
        std::io::stdout(),
        "stopped the server (pid {}) for {}",
        answer["pid"],
        data_dir.display()
    )?;
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn status(args: StatusArgs, data_dir: &Path) -> CliResult {
    let connected = local::connect(data_dir, &Hello::Status).await?;
    let value = connected.value;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    let text = |key: &str| value[key].as_str().unwrap_or("-").to_owned();
    writeln!(
        out,
        "server       pid {}, up {}",
        value["pid"],
        humantime::format_duration(std::time::Duration::from_secs(
            value["uptime_secs"].as_u64().unwrap_or(0)
        ))
    )?;
    writeln!(out, "data dir     {}", text("data_dir"))?;
    writeln!(out, "store        {}", text("store"))?;
    write_cluster(&mut out, &value)?;
    writeln!(
        out,
        "http         {}",
        value["http"].as_str().unwrap_or("off (--no-http)")
    )?;
    writeln!(
        out,
        "mcp clients  {} connected through the socket",
        value["mcp_connections"]
    )?;
    writeln!(
        out,
        "tools        {}",
        value["tools"]
            .as_array()
            .map(|t| t
                .iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    )?;
    write_agents(&mut out, &value)?;
    write_shells(&mut out, &value)?;
    write_servers(&mut out, &value)?;
    write_launched(&mut out, &value)?;
    write_subsystems(&mut out, &value)?;
    writeln!(out, "supervision tree")?;
    let tree: ChildSnapshot = serde_json::from_value(value["tree"].clone())?;
    print_tree(&mut out, &tree, 0)?;
    Ok(())
}

/// `status`: the servers sharing the database, when there are.
fn write_cluster(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    if let Some(members) = value["cluster"].as_array() {
        writeln!(
            out,
            "cluster      {} servers share the database",
            members.len()
        )?;
        for m in members {
            writeln!(
                out,
                "  {:<10} {:<5} {:<22} {:<24} leases {:<5} heartbeat {} ms ago{}",
                m["node"]
                    .as_str()
                    .unwrap_or_default()
                    .get(..8)
                    .unwrap_or_default(),
                if m["live"].as_bool().unwrap_or(false) {
                    "up"
                } else {
                    "down"
                },
                format!(
                    "{} pid {}",
                    m["host"].as_str().unwrap_or_default(),
                    m["pid"]
                ),
                m["address"]
                    .as_str()
                    .filter(|a| !a.is_empty())
                    .unwrap_or("-"),
                m["leases"],
                m["heartbeat_age_ms"],
                if m["this"].as_bool().unwrap_or(false) {
                    "  (this server)"
                } else {
                    ""
                },
            )?;
        }
    }
    Ok(())
}

/// `status`: the agents, with the first of them listed.
fn write_agents(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    writeln!(
        out,
        "agents       {} registered, {} mailboxes active",
        value["agents"], value["active_mailboxes"]
    )?;
    for agent in value["agent_list"].as_array().into_iter().flatten() {
        let unread = agent["unread"]
            .as_u64()
            .map_or_else(|| "?".to_owned(), |n| n.to_string());
        writeln!(
            out,
            "  {:<24} {:<12} parent {:<16} unread {unread}",
            agent["id"].as_str().unwrap_or_default(),
            agent["role"].as_str().unwrap_or_default(),
            agent["parent"].as_str().unwrap_or("-"),
        )?;
    }
    let listed = value["agent_list"].as_array().map_or(0, Vec::len);
    if value["agents"].as_u64().unwrap_or(0) > listed as u64 {
        writeln!(out, "  … `guildhall agents list` shows them all")?;
    }
    Ok(())
}

/// `status`: the background shells, when there are.
fn write_shells(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    if let Some(shells) = value["shells"].as_array().filter(|s| !s.is_empty()) {
        writeln!(out, "background shells")?;
        for shell in shells {
            let state = if shell["running"].as_bool().unwrap_or(false) {
                format!("running, pid {}", shell["pid"])
            } else {
                shell["ended"].as_str().unwrap_or("ended").replace('_', " ")
            };
            writeln!(
                out,
                "  {:<8} {:<24} {:<22} {}",
                shell["id"].as_str().unwrap_or_default(),
                shell["agent"].as_str().unwrap_or("-"),
                state,
                shell["command"].as_str().unwrap_or_default(),
            )?;
        }
    }
    Ok(())
}

/// `status`: each subsystem's section on one line (`tasks`, `shell`, an embedder's own):
/// its numbers and words as they are, a list or a table by its length.
fn write_subsystems(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    let Some(sections) = value["subsystems"].as_object().filter(|s| !s.is_empty()) else {
        return Ok(());
    };
    writeln!(out, "subsystems")?;
    for (name, section) in sections {
        writeln!(out, "  {name:<16} {}", one_line(section))?;
    }
    Ok(())
}

/// `value` in a few words: an object as `key value, …`, a list or an object inside it by
/// its length.
fn one_line(value: &serde_json::Value) -> String {
    use serde_json::Value;
    let short = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => format!("{} listed", items.len()),
        Value::Object(fields) => format!("{} entries", fields.len()),
        other => other.to_string(),
    };
    match value {
        Value::Object(fields) => fields
            .iter()
            .map(|(k, v)| format!("{} {}", k.replace('_', " "), short(v)))
            .collect::<Vec<_>>()
            .join(", "),
        other => short(other),
    }
}

/// `status`: the proxied MCP servers, when there are.
fn write_servers(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    if let Some(servers) = value["servers"].as_array().filter(|s| !s.is_empty()) {
        writeln!(out, "mcp servers")?;
        for server in servers {
            let breaker = serde_json::from_value(server["breaker"].clone())
                .map(|b| super::servers::breaker_text(&b))
                .unwrap_or_default();
            writeln!(
                out,
                "  {:<16} {:<9} {:<10} starts {:<3} breaker {:<24} {} tools",
                server["name"].as_str().unwrap_or_default(),
                server["state"].as_str().unwrap_or_default(),
                server["pid"]
                    .as_u64()
                    .map_or_else(|| "-".to_owned(), |pid| format!("pid {pid}")),
                server["starts"],
                breaker,
                server["tools"].as_array().map_or(0, Vec::len),
            )?;
            if let Some(reason) = server["reason"].as_str() {
                writeln!(out, "  {:<16} {reason}", "")?;
            } else if let Some(last) = server["last_end"].as_str() {
                writeln!(out, "  {:<16} last ended: {last}", "")?;
            }
        }
    }
    Ok(())
}

/// `status`: the launched agents, when there are.
fn write_launched(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    if let Some(launched) = value["launched"].as_array().filter(|l| !l.is_empty()) {
        writeln!(out, "launched agents")?;
        let now = guildhall::time::now_ms();
        for agent in launched {
            let uptime = agent["started_ms"]
                .as_u64()
                .filter(|_| agent["pid"].is_u64())
                .map_or_else(String::new, |at| {
                    let secs = now.saturating_sub(at) / 1000;
                    let up = std::time::Duration::from_secs(secs);
                    format!("up {}", humantime::format_duration(up))
                });
            writeln!(
                out,
                "  {:<16} {:<10} {:<10} {:<10} restarts {:<3} {uptime}",
                agent["agent"].as_str().unwrap_or_default(),
                agent["profile"].as_str().unwrap_or_default(),
                agent["state"].as_str().unwrap_or_default(),
                agent["pid"]
                    .as_u64()
                    .map_or_else(|| "-".to_owned(), |pid| format!("pid {pid}")),
                agent["restarts"],
            )?;
            if let Some(last) = agent["last_exit"].as_str() {
                writeln!(out, "  {:<16} last exit: {last}", "")?;
            }
        }
    }
    Ok(())
}
