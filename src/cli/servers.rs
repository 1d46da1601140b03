//! `guildhall servers`: the MCP servers a running server proxies.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use clap::{Args, Subcommand};
use guildhall::servers::{RestartType, ServerConfig, Servers};

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Args)]
pub(crate) struct ServersArgs {
    #[command(subcommand)]
    which: ServersCommand,
}

#[derive(Debug, Subcommand)]
enum ServersCommand {
    /// List the servers: state, process, starts, breaker and tools.
    List {
        /// One JSON object per server, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Start proxying a server run over stdio (`-- CMD ARGS`) or reached over Streamable
    /// HTTP (`--url`); its tools appear as `mcp__NAME__tool`. Not written to guildhall.toml:
    /// add a `[servers.NAME]` section to keep it.
    Add {
        /// Its name (letters, digits, `_`, `-`).
        name: String,
        /// The command and its arguments, after `--`: `guildhall servers add fs -- npx -y
        /// @modelcontextprotocol/server-filesystem /srv`.
        #[arg(last = true, num_args = 1.., required_unless_present = "url")]
        command: Vec<String>,
        /// The server's Streamable HTTP endpoint, instead of a command.
        #[arg(long, conflicts_with = "command")]
        url: Option<String>,
        /// A header sent to `--url` with every request (repeatable; `${NAME}` in the value
        /// reads guildhall's environment when it connects).
        #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_env)]
        headers: Vec<(String, String)>,
        /// Only these of its tools (globs on its own names; repeatable).
        #[arg(long = "tool", value_name = "GLOB")]
        tools: Vec<String>,
        /// An environment variable for it (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
        env: Vec<(String, String)>,
        /// The default time budget of a call to its tools.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        timeout: Duration,
        /// When it is restarted: permanent, transient or temporary.
        #[arg(long, value_parser = parse_restart, default_value = "permanent")]
        restart: RestartType,
    },
    /// Stop a server, kill its processes and remove its tools.
    Remove {
        /// Its name.
        name: String,
    },
    /// Restart a server's process now.
    Restart {
        /// Its name.
        name: String,
    },
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{s}` is not NAME=VALUE"))
}

fn parse_restart(s: &str) -> Result<RestartType, String> {
    match s {
        "permanent" => Ok(RestartType::Permanent),
        "transient" => Ok(RestartType::Transient),
        "temporary" => Ok(RestartType::Temporary),
        _ => Err(format!(
            "`{s}` is not a restart type: permanent, transient or temporary"
        )),
    }
}

/// Runs inside the server that holds the servers (through its local socket).
pub(crate) async fn run(_: ServersArgs, data_dir: &Path) -> CliResult {
    match super::mail::through_server(data_dir).await {
        Some(done) => done,
        None => Err(format!(
            "no guildhall server is running for {}; the servers it proxies live in it \
             (`guildhall serve`, or `[servers.NAME]` in guildhall.toml)",
            data_dir.display()
        )
        .into()),
    }
}

pub(crate) async fn run_with(
    servers: &std::sync::Arc<Servers>,
    args: ServersArgs,
    out: &mut impl Write,
) -> CliResult {
    match args.which {
        ServersCommand::List { json } => {
            for server in servers.list().await {
                if json {
                    writeln!(out, "{}", serde_json::to_string(&server)?)?;
                    continue;
                }
                let process = server
                    .pid
                    .map_or_else(|| "-".to_owned(), |pid| format!("pid {pid}"));
                writeln!(
                    out,
                    "{:<16} {:<9} {:<10} starts {:<3} breaker {}  {}",
                    server.name,
                    server.state.as_str(),
                    process,
                    server.starts,
                    breaker_text(&server.breaker),
                    server.command
                )?;
                if let Some(reason) = &server.reason {
                    writeln!(out, "{:<16} {reason}", "")?;
                } else if let Some(last) = &server.last_end {
                    writeln!(out, "{:<16} last ended: {last}", "")?;
                }
                for tool in &server.tools {
                    writeln!(out, "{:<16} {tool}", "")?;
                }
            }
        }
        ServersCommand::Add {
            name,
            command,
            url,
            headers,
            tools,
            env,
            timeout,
            restart,
        } => {
            let mut config = match url {
                Some(url) => ServerConfig::http(url),
                None => {
                    let mut parts = command.into_iter();
                    let program = parts.next().unwrap_or_default();
                    ServerConfig::command(program, parts)
                }
            };
            config.headers = headers.into_iter().collect();
            config.env = env.into_iter().collect();
            config.timeout = timeout;
            config.restart = restart;
            if !tools.is_empty() {
                config.tools = Some(
                    tools
                        .iter()
                        .map(|t| guildhall::governance::Glob::new(t))
                        .collect::<Result<_, _>>()?,
                );
            }
            servers.add(&name, config).await?;
            writeln!(
                out,
                "added `{name}`; its tools appear as mcp__{name}__* once it has started \
                 (`guildhall servers list`)"
            )?;
        }
        ServersCommand::Remove { name } => {
            servers.remove(&name).await?;
            writeln!(out, "removed `{name}` and its tools")?;
        }
        ServersCommand::Restart { name } => {
            servers.restart(&name).await?;
            writeln!(out, "restarting `{name}`")?;
        }
    }
    Ok(())
}

pub(crate) fn breaker_text(status: &guildhall::BreakerStatus) -> String {
    match status {
        guildhall::BreakerStatus::Closed { .. } => "closed".into(),
        guildhall::BreakerStatus::Open { retry_after, .. } => {
            format!("open (next start in {} ms)", retry_after.as_millis())
        }
        guildhall::BreakerStatus::HalfOpen => "half-open".into(),
    }
}
