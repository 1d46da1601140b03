//! Argument parsing and the subcommands.

mod admin;
mod args;
mod audit;
#[cfg(feature = "bench")]
mod bench;
mod bridge;
mod clients;
mod clock;
mod context;
mod demo;
mod doctor;
mod hook;
mod init;
mod mail;
mod offline;
mod serve;
mod servers;
mod tasks;
mod tree;
mod watch;

use std::io::IsTerminal;
use std::process::ExitCode;

use args::{Cli, Command};
use tracing_subscriber::EnvFilter;

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
    let mut filter = cli.log.as_deref().map(EnvFilter::new).unwrap_or_else(|| {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"))
    });
    // rmcp writes every message it receives at `info`, the peer's content whole: a proxied
    // server (or a client) could fill the log through it. Its own warnings still show, and
    // a filter that names rmcp gets what it asks for.
    let named = cli.log.clone().or_else(|| std::env::var("RUST_LOG").ok());
    if !named.is_some_and(|spec| spec.contains("rmcp"))
        && let Ok(quiet) = "rmcp=warn".parse()
    {
        filter = filter.add_directive(quiet);
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    log_panics_through_tracing();
    // The bridge only moves bytes between two streams, and a hook asks one question: one
    // thread and no cross-thread wake-ups keep their latency lowest.
    let mut builder = if matches!(cli.command, Command::Mcp(_) | Command::Hook(_)) {
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
            Command::Hook(args) => hook::run(args, &cli.data_dir).await,
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
            Command::Sent(args) => mail::sent(args, &cli.data_dir).await,
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

/// Tool panics are supervision events, not program failures: log them as one line through
/// tracing instead of the default hook's raw stderr output.
fn log_panics_through_tracing() {
    std::panic::set_hook(Box::new(|info| {
        let message = guildhall::actors::worker::panic_message(info.payload());
        let location = info.location().map(ToString::to_string).unwrap_or_default();
        tracing::error!(%location, "panic: {message}");
    }));
}
