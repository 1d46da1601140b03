//! Argument parsing and the subcommands.

mod audit;
#[cfg(feature = "bench")]
mod bench;
mod bridge;
mod context;
mod demo;
mod doctor;
mod init;
mod mail;
mod serve;
mod servers;
mod tasks;
mod tree;
mod watch;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use tracing_subscriber::EnvFilter;

/// guildhall: an actor-based runtime for swarms of AI agents.
///
/// Every tool runs as a supervised actor: a crash restarts only that tool, a stuck call is
/// cancelled and its tool restarted, and a failing tool's circuit opens so callers fail fast.
/// Agents talk through durable mailboxes and share session context, both kept in an embedded
/// store (`--data-dir`).
#[derive(Debug, Parser)]
#[command(name = "guildhall", version, about, long_about)]
struct Cli {
    /// Log filter (e.g. `info`, `guildhall=debug`); `RUST_LOG` is used when not given. Logs
    /// go to stderr.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,

    /// Where the store lives (created if missing).
    #[arg(
        long,
        global = true,
        env = "GUILDHALL_DATA_DIR",
        default_value = ".guildhall",
        value_name = "DIR"
    )]
    data_dir: std::path::PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Set this project up for Claude Code and other MCP clients: `.mcp.json`, a commented
    /// `guildhall.toml` in the data directory, the data directory in `.gitignore`.
    Init(init::InitArgs),
    /// Run the runtime and its store as a long-lived MCP server: Streamable HTTP on
    /// 127.0.0.1:7077/mcp and the local socket `guildhall mcp` uses (or one client over
    /// stdio with --stdio).
    Serve(serve::ServeArgs),
    /// The stdio entry an MCP client launches for one agent: connects to the project's
    /// server (starting one if none runs) and acts as `--agent`.
    Mcp(bridge::McpArgs),
    /// List the tools an MCP client sees, with their schemas (--json).
    Tools(serve::ToolsArgs),
    /// Show a running server's supervision tree, restarts and breaker states.
    Status(serve::StatusArgs),
    /// Stop the server running for the data directory (it finishes the calls in flight).
    Stop(serve::StopArgs),
    /// List audited calls: who called what, the permission decision and the rule behind
    /// it, how long it took and how it ended (--json for JSON lines).
    Audit(audit::AuditArgs),
    /// Follow a running server's events live: calls and how they end, denials, restarts,
    /// breakers, messages sent, agents joining and leaving (--json for JSON lines).
    Watch(watch::WatchArgs),
    /// Run a short demonstration: tool calls, a crash and its restart, a stuck call cancelled
    /// and replaced, two agents talking through mailboxes in the store, and the supervision
    /// tree.
    Demo(demo::DemoArgs),
    /// Measure the runtime against baselines run in the same process.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Register, list and remove agents.
    Agents(mail::AgentsArgs),
    /// Send a message as an agent (or many, as JSON lines on stdin).
    Send(mail::SendArgs),
    /// List an agent's inbox (`--human`: the questions agents asked a person).
    Inbox(mail::InboxArgs),
    /// Answer a question an agent asked with `ask_human` or `confirm`, as a human.
    Answer(mail::AnswerArgs),
    /// Sessions and their shared context: list, show, update, history, export, import.
    Context(context::ContextArgs),
    /// The task board: list (a table, `--tree`, `--json`), show, add, update.
    Tasks(tasks::TasksArgs),
    /// The MCP servers a running server proxies: list, add, remove, restart.
    Servers(servers::ServersArgs),
    /// Check the store: redb's page checksums, every value's encoding, every inbox and
    /// session; `--repair` copies what is intact into a new store, keeping the original.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script: `guildhall completions bash > ~/.local/share/bash-completion/completions/guildhall`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

pub(crate) fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    // Whether the user chose the data directory (flag or environment), or it is the default.
    let data_dir_chosen = !matches!(
        matches.value_source("data_dir"),
        None | Some(clap::parser::ValueSource::DefaultValue)
    );
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    let filter = cli.log.as_deref().map(EnvFilter::new).unwrap_or_else(|| {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    log_panics_through_tracing();
    // The bridge only moves bytes between two streams: one thread and no cross-thread
    // wake-ups keep its added latency lowest.
    let mut builder = if matches!(cli.command, Command::Mcp(_)) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Init(args) => init::run(args, &cli.data_dir),
            Command::Serve(args) => serve::serve(args, &cli.data_dir).await,
            Command::Mcp(args) => bridge::run(args, &cli.data_dir).await,
            Command::Tools(args) => serve::tools(args, &cli.data_dir).await,
            Command::Status(args) => serve::status(args, &cli.data_dir).await,
            Command::Stop(args) => serve::stop(args, &cli.data_dir).await,
            Command::Audit(args) => audit::run(args, &cli.data_dir).await,
            Command::Watch(args) => watch::run(args, &cli.data_dir).await,
            Command::Demo(args) => demo::run(args, data_dir_chosen.then_some(&*cli.data_dir)).await,
            Command::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut command, "guildhall", &mut std::io::stdout());
                Ok(())
            }
            #[cfg(feature = "bench")]
            Command::Bench(args) => bench::run(args, &cli.data_dir).await,
            Command::Agents(args) => mail::agents(args, &cli.data_dir).await,
            Command::Send(args) => mail::send(args, &cli.data_dir).await,
            Command::Inbox(args) => mail::inbox(args, &cli.data_dir).await,
            Command::Answer(args) => mail::answer(args, &cli.data_dir).await,
            Command::Context(args) => context::run(args, &cli.data_dir).await,
            Command::Tasks(args) => tasks::run(args, &cli.data_dir).await,
            Command::Doctor(args) => doctor::run(args, &cli.data_dir).await,
            Command::Servers(args) => servers::run(args, &cli.data_dir).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`guildhall status | head`): nothing more to say to it.
        Err(err)
            if err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {}", guildhall::ErrorChain(&*err));
            ExitCode::FAILURE
        }
    }
}

/// `ms` (Unix milliseconds) in the local time zone, as people read it:
/// `2026-11-24 17:09:40 +01:00`. (JSON output keeps RFC 3339 in UTC.)
pub(crate) fn local_time(ms: u64) -> String {
    let ms = ms.min(guildhall::time::MAX_RFC3339_MS);
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|at| {
            at.to_zoned(jiff::tz::TimeZone::system())
                .strftime("%Y-%m-%d %H:%M:%S %:z")
                .to_string()
        })
        .unwrap_or_else(|| guildhall::time::rfc3339(ms))
}

/// Read-only commands never create a store: a mistyped `--data-dir` gets an error instead
/// of a new, empty store.
pub(crate) fn require_store(data_dir: &std::path::Path, reads_only: bool) -> Result<(), String> {
    let in_database = store_section(data_dir).is_ok_and(|store| store.url.is_some());
    if reads_only && !in_database {
        require_embedded_store(data_dir)?;
    }
    Ok(())
}

/// An error naming `data_dir` unless it holds an embedded store.
fn require_embedded_store(data_dir: &std::path::Path) -> Result<(), String> {
    if data_dir.join(guildhall::store::FILE_NAME).exists() {
        return Ok(());
    }
    Err(format!(
        "no guildhall store in {} (is --data-dir right? `guildhall serve`, `guildhall mcp` \
         and commands that write create one)",
        data_dir.display()
    ))
}

/// The `[store]` section of the data directory's config file (the default when there is
/// no file).
pub(crate) fn store_section(
    data_dir: &std::path::Path,
) -> Result<guildhall::config::StoreSection, guildhall::config::ConfigError> {
    let file = data_dir.join(guildhall::config::CONFIG_FILE);
    Ok(guildhall::config::Config::load(&file, false)?.store)
}

/// The runtime of a command run without a server: on the database the data directory's
/// config names (`[store] url`), else on the embedded store in the data directory.
///
/// # Errors
/// The config file's error, when it cannot be read.
pub(crate) fn offline_runtime(
    data_dir: &std::path::Path,
) -> Result<guildhall::RuntimeBuilder, guildhall::config::ConfigError> {
    let store = store_section(data_dir)?;
    #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
    let mut builder = guildhall::Runtime::builder().data_dir(data_dir);
    #[cfg(feature = "postgres")]
    if let Some(url) = store.url {
        builder = builder.store_url(url);
        if let Some(lease) = store.lease {
            builder = builder.store_lease(lease);
        }
    }
    #[cfg(not(feature = "postgres"))]
    let _ = store;
    Ok(builder)
}

/// The store of a command that only reads it, without a server: the database the data
/// directory's config names (`[store] url`), else the embedded store in the directory,
/// which must be there already ([`require_store`]).
///
/// # Errors
/// The config file's error, a directory without a store, or the store's error when it
/// cannot be opened.
pub(crate) fn offline_store(
    data_dir: &std::path::Path,
) -> Result<std::sync::Arc<dyn guildhall::store::Store>, Box<dyn std::error::Error>> {
    let store = store_section(data_dir)?;
    if store.url.is_none() {
        require_embedded_store(data_dir)?;
    }
    #[cfg(feature = "postgres")]
    if let Some(url) = store.url {
        let lease = store.lease.unwrap_or(guildhall::store::DEFAULT_LEASE);
        return Ok(std::sync::Arc::new(
            guildhall::store::PostgresStore::open_url(&url, lease)?,
        ));
    }
    #[cfg(not(feature = "postgres"))]
    let _ = store;
    Ok(guildhall::store::open(data_dir)?)
}

/// Runs `agents` and `context` command lines inside a server ([`local::Hello::Admin`]), for
/// the CLI while the server holds the store.
pub(crate) struct ServerAdmin {
    /// The server's proxied MCP servers, for `guildhall servers`.
    pub(crate) servers: Option<std::sync::Arc<guildhall::servers::Servers>>,
}

impl guildhall::mcp::local::Admin for ServerAdmin {
    fn run(
        &self,
        runtime: guildhall::Runtime,
        cwd: std::path::PathBuf,
        args: Vec<String>,
    ) -> futures::future::BoxFuture<'static, Result<String, String>> {
        let servers = self.servers.clone();
        Box::pin(async move {
            let cli = Cli::try_parse_from(std::iter::once("guildhall".to_owned()).chain(args))
                .map_err(|err| err.to_string())?;
            let mut out = Vec::new();
            let result = match cli.command {
                Command::Agents(args) => mail::agents_with(&runtime, args, &mut out).await,
                Command::Context(args) => match args.needs_own_stdin() {
                    Some(command) => Err(format!(
                        "`{command}` reads its own stdin, which cannot reach a running server: \
                         stop it first (`guildhall stop`), or give a file"
                    )
                    .into()),
                    None => context::run_with(&runtime, args, &mut out, &cwd).await,
                },
                Command::Tasks(args) => match args.needs_own_stdin() {
                    Some(command) => Err(format!(
                        "`{command}` reads its own stdin, which cannot reach a running server: \
                         stop it first (`guildhall stop`)"
                    )
                    .into()),
                    None => tasks::run_with(&runtime, args, &mut out).await,
                },
                Command::Servers(args) => match &servers {
                    Some(servers) => servers::run_with(servers, args, &mut out).await,
                    None => Err("this server proxies no MCP servers".into()),
                },
                _ => Err(
                    "only `agents`, `context`, `tasks` and `servers` commands run through a server"
                        .into(),
                ),
            };
            // Whatever failed, the client is told the whole chain.
            result.map_err(|err| guildhall::ErrorChain(&*err).to_string())?;
            String::from_utf8(out).map_err(|err| err.to_string())
        })
    }
}

/// Tool panics are supervision events, not program failures: log them as one line through
/// tracing instead of the default hook's raw stderr output.
fn log_panics_through_tracing() {
    std::panic::set_hook(Box::new(|info| {
        let message = guildhall::actors::worker::panic_message(info.payload());
        let location = info.location().map(ToString::to_string).unwrap_or_default();
        tracing::error!(%location, "panic: {message}");
    }));
}
