//! Command lines a running server runs for the CLI (`agents`, `context`, `tasks`,
//! `servers`), while it holds the store.

use clap::{Parser, Subcommand};

use super::{context, mail, servers, tasks};

/// A command line as the CLI sends it to the server: its whole argv, of which the server
/// runs only these commands (the global options were the client's).
#[derive(Debug, Parser)]
#[command(name = "guildhall")]
struct AdminLine {
    #[arg(long, global = true)]
    log: Option<String>,
    #[arg(long, global = true)]
    data_dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    Agents(mail::AgentsArgs),
    Context(context::ContextArgs),
    Tasks(tasks::TasksArgs),
    Servers(servers::ServersArgs),
}

/// Runs `agents` and `context` command lines inside a server ([`local::Hello::Admin`]), for
/// the CLI while the server holds the store.
pub(super) struct ServerAdmin {
    /// The server's proxied MCP servers, for `guildhall servers`.
    pub(super) servers: Option<std::sync::Arc<guildhall::servers::Servers>>,
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
            let line = std::iter::once("guildhall".to_owned()).chain(args);
            let line = AdminLine::try_parse_from(line).map_err(|err| {
                if err.kind() == clap::error::ErrorKind::InvalidSubcommand {
                    "only `agents`, `context`, `tasks` and `servers` commands run through a server"
                        .to_owned()
                } else {
                    err.to_string()
                }
            })?;
            let mut out = Vec::new();
            let result = match line.command {
                AdminCommand::Agents(args) => mail::agents_with(&runtime, args, &mut out).await,
                AdminCommand::Context(args) => match args.needs_own_stdin() {
                    Some(command) => Err(format!(
                        "`{command}` reads its own stdin, which cannot reach a running server: \
                         stop it first (`guildhall stop`), or give a file"
                    )
                    .into()),
                    None => context::run_with(&runtime, args, &mut out, &cwd).await,
                },
                AdminCommand::Tasks(args) => match args.needs_own_stdin() {
                    Some(command) => Err(format!(
                        "`{command}` reads its own stdin, which cannot reach a running server: \
                         stop it first (`guildhall stop`)"
                    )
                    .into()),
                    None => tasks::run_with(&runtime, args, &mut out).await,
                },
                AdminCommand::Servers(args) => match &servers {
                    Some(servers) => servers::run_with(servers, args, &mut out).await,
                    None => Err("this server proxies no MCP servers".into()),
                },
            };
            // Whatever failed, the client is told the whole chain.
            result.map_err(|err| guildhall::ErrorChain(&*err).to_string())?;
            String::from_utf8(out).map_err(|err| err.to_string())
        })
    }
}
