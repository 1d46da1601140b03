//! `guildhall mcp`: the stdio entry an MCP client launches for one agent of a project.
//!
//! It reaches the project's server through the local socket in the data directory, starting
//! one in the background when none answers, binds the connection to its agent with a hello,
//! and then only moves bytes: stdin to the socket, the socket to stdout.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Args;
use guildhall::mcp::local::{self, Connected, Hello, LocalError};
use tokio::io::AsyncWriteExt;

type CliResult = Result<(), Box<dyn std::error::Error>>;

/// How long a started server has to answer.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// The server log a background server writes, in the data directory.
const SERVER_LOG: &str = "server.log";

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    /// The agent this client acts as (registered on first use). Required: give it here or
    /// in GUILDHALL_AGENT.
    #[arg(long, env = "GUILDHALL_AGENT")]
    agent: Option<String>,
    /// Its role (`tl`, `pm`, `dev`, ...); a new agent without one gets `agent`.
    #[arg(long, env = "GUILDHALL_ROLE")]
    role: Option<String>,
    /// The agent it reports to.
    #[arg(long, env = "GUILDHALL_PARENT")]
    parent: Option<String>,
    /// Only these tools (names and globs, comma-separated: `send_message,context_*`).
    #[arg(long, value_name = "LIST")]
    tools: Option<String>,
    /// The model behind this client, for `[models."PATTERN"]` in guildhall.toml (before
    /// the agent's `[agents.X] model` and the client's name).
    #[arg(long, env = "GUILDHALL_MODEL", value_name = "MODEL")]
    model: Option<String>,
    /// Fail instead of starting a server when none is running.
    #[arg(long)]
    no_start: bool,
    /// Connect to this socket instead of the data directory's: a launched agent's own, in
    /// its sandbox (never starts a server).
    #[arg(long, env = "GUILDHALL_SOCKET", value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    /// A server this command starts exits after this long with no client connected
    /// (`0s`: never; stop it with `guildhall stop`).
    #[arg(long, env = "GUILDHALL_IDLE_EXIT", default_value = "5m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    idle_exit: Duration,
}

pub(crate) async fn run(args: McpArgs, data_dir: &Path) -> CliResult {
    // An MCP client shows only "failed to connect"; this line is what its MCP log holds.
    let agent = args.agent.clone().filter(|a| !a.is_empty()).ok_or(
        "guildhall mcp needs to know which agent this client is: pass `--agent ID` (e.g. \
         `guildhall mcp --agent tl --role tl`) or set GUILDHALL_AGENT in the client's MCP \
         server config (\"env\": {\"GUILDHALL_AGENT\": \"tl\"}); `guildhall init` writes one",
    )?;
    let hello = Hello::Mcp {
        agent,
        // An empty variable (`GUILDHALL_PARENT=`) means none, as a shell user expects.
        role: args.role.clone().filter(|r| !r.is_empty()),
        parent: args.parent.clone().filter(|p| !p.is_empty()),
        tools: args.tools.clone(),
        token: std::env::var(guildhall::agents::TOKEN_ENV).ok(),
        model: args.model.clone().filter(|m| !m.is_empty()),
    };
    let reached = match &args.socket {
        Some(socket) => local::connect_to(socket, &hello).await,
        None => local::connect(data_dir, &hello).await,
    };
    let connected = match reached {
        Ok(connected) => connected,
        // An agent's own socket (a launched agent's, in its sandbox) is its server's to
        // open: nothing to start from here.
        Err(LocalError::NotRunning { .. }) if !args.no_start && args.socket.is_none() => {
            start_server(data_dir, &hello, args.idle_exit).await?
        }
        Err(err) => return Err(err.into()),
    };
    tracing::info!(binding = %connected.value, "bound to the server");
    // For the client's hooks, which may not know the agent: its own socket's agent (in a
    // sandbox) has GUILDHALL_AGENT already.
    let _record = match (&hello, &args.socket) {
        (Hello::Mcp { agent, .. }, None) => super::clients::record(data_dir, agent),
        _ => None,
    };
    pump(connected).await
}

/// Starts `guildhall serve --no-http` for `data_dir`, detached from this process, and
/// connects once it answers. Two bridges starting at once each start one; the store's lock
/// lets only one of them run, and both connect to it.
async fn start_server(
    data_dir: &Path,
    hello: &Hello,
    idle_exit: Duration,
) -> Result<Connected, Box<dyn std::error::Error>> {
    guildhall::private_fs::create_dir_all(data_dir)?;
    // Absolute, so `ps` says which project a background server belongs to.
    let data_dir = &std::path::absolute(data_dir)?;
    let log_path = data_dir.join(SERVER_LOG);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    // What our server writes from here on is its own: shown if it fails to start.
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe()?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("--data-dir")
        .arg(data_dir)
        .args(["serve", "--no-http", "--idle-exit"])
        .arg(humantime::format_duration(idle_exit).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // Its own process group: the client's Ctrl-C or hang-up must not stop the server that
    // other agents share.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn()?;
    tracing::info!(pid = child.id(), log = %log_path.display(), "started a server");
    let started = Instant::now();
    let mut exited: Option<(Instant, std::process::ExitStatus)> = None;
    let mut pause = Duration::from_millis(5);
    loop {
        match local::connect(data_dir, hello).await {
            Ok(connected) => return Ok(connected),
            Err(LocalError::NotRunning { .. }) => {}
            Err(err) => return Err(err.into()),
        }
        if exited.is_none() {
            exited = child.try_wait()?.map(|status| (Instant::now(), status));
        }
        // Our server may have lost the race to another (the store lets one run), which then
        // answers soon: its exit is an error only when nobody answers shortly after it.
        let failed = exited.filter(|(at, _)| at.elapsed() > RACE_GRACE);
        if let Some((_, status)) = failed {
            return Err(format!(
                "the server started for {} exited ({status}) before it answered:\n{}\n(the \
                 whole log: {})",
                data_dir.display(),
                log_since(&log_path, log_start),
                log_path.display()
            )
            .into());
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(format!(
                "no server answered on {} within {START_TIMEOUT:?} (the started server is \
                 still starting); see {}",
                local::socket_path(data_dir).display(),
                log_path.display()
            )
            .into());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// How long after our started server exits another server may still come to answer.
const RACE_GRACE: Duration = Duration::from_secs(2);

/// The last lines written to the log at `path` from byte `start` on.
fn log_since(path: &Path, start: u64) -> String {
    const LINES: usize = 20;
    let text = std::fs::read(path)
        .map(|bytes| {
            let start = usize::try_from(start).unwrap_or(0).min(bytes.len());
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        })
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let shown = lines[lines.len().saturating_sub(LINES)..].join("\n");
    if shown.trim().is_empty() {
        "(it wrote nothing to its log)".to_owned()
    } else {
        shown
    }
}

/// Copies stdin to the server and the server to stdout until either side ends.
async fn pump(connected: Connected) -> CliResult {
    let Connected {
        mut reader,
        mut writer,
        ..
    } = connected;
    // Pipes from the client are driven by the I/O reactor (see `mcp::serve_stdio`).
    let (mut stdin, mut stdout) = rmcp::transport::stdio_pipes();
    let upstream = async {
        tokio::io::copy(&mut stdin, &mut writer).await?;
        // The client hung up: let the server see end-of-stream too.
        writer.shutdown().await
    };
    let downstream = async {
        tokio::io::copy_buf(&mut reader, &mut stdout).await?;
        stdout.flush().await
    };
    tokio::pin!(upstream, downstream);
    tokio::select! {
        up = &mut upstream => {
            up?;
            // Deliver the answers still in flight, then exit.
            let _ = tokio::time::timeout(Duration::from_secs(5), downstream).await;
            Ok(())
        }
        down = &mut downstream => {
            down?;
            Err("the server closed the connection".into())
        }
    }
}
