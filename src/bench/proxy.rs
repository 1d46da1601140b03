//! `guildhall bench proxy`: a tool call to a bare rmcp stdio server (the floor) made
//! directly by an rmcp client, against the same call through guildhall's proxy
//! (`mcp__floor__echo`, pipeline and governance included), in the same run; throughput
//! with many callers; and how long a killed server takes to serve again.

use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde::Serialize;
use serde_json::json;

use super::percentile;
use crate::CallOptions;
use crate::runtime::Runtime;
use crate::servers::{ServerConfig, ServerState, Servers};

/// What `bench proxy` does.
#[derive(Debug, Clone)]
pub struct ProxyBenchConfig {
    /// The server's command line: by default the `guildhall` binary's `bench mcp-floor`;
    /// any stdio server with an `echo` tool (`server-everything`, for a Node figure).
    pub floor: Vec<String>,
    /// The name of `echo`'s one text argument (`text` for the floor, `message` for
    /// `server-everything`).
    pub echo_arg: String,
    /// Sequential calls each way, alternating in rounds.
    pub calls: usize,
    /// Concurrent callers for the throughput figure.
    pub concurrency: usize,
    /// Kills of the proxied server, each timed until it serves again.
    pub restarts: usize,
    /// A tool taking no arguments that answers an image (`image` on the floor,
    /// `get-tiny-image` on server-everything), timed both ways; none: not measured.
    pub image_tool: Option<String>,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyReport {
    /// A direct call's median, in µs.
    pub direct_p50_us: f64,
    /// A proxied call's median, in µs.
    pub proxied_p50_us: f64,
    /// `proxied_p50_us / direct_p50_us`.
    pub proxy_ratio: f64,
    /// Calls per second through the proxy with `concurrency` callers.
    pub proxied_calls_per_sec: f64,
    /// The same, directly.
    pub direct_calls_per_sec: f64,
    /// The callers.
    pub concurrency: usize,
    /// From SIGKILL of the server process (an isolated crash) to a proxied call answering
    /// again, in ms.
    pub restart_p50_ms: f64,
    /// The same, 99th percentile.
    pub restart_p99_ms: f64,
    /// Of that, the new process's start and MCP handshake (guildhall's own share is the
    /// rest: noticing the exit, the backoff, relisting), median in ms.
    pub spawn_handshake_p50_ms: f64,
    /// The image tool's call directly, median in µs (0: not measured).
    pub image_direct_p50_us: f64,
    /// The same through the proxy, as an MCP client is answered (the server's result kept
    /// whole, not re-encoded), median in µs.
    pub image_proxied_p50_us: f64,
    /// `image_proxied_p50_us / image_direct_p50_us` (0: not measured).
    pub image_ratio: f64,
    /// The image's size in its base64 form, in bytes.
    pub image_bytes: usize,
}

/// Runs the measurement.
///
/// # Errors
/// A message naming what failed (the floor server did not start, a call failed).
pub async fn proxy(config: ProxyBenchConfig) -> Result<ProxyReport, String> {
    let (program, args) = config
        .floor
        .split_first()
        .ok_or("the floor server's command line is empty")?;
    let (direct, _direct_child) = connect(program, args).await?;
    let echo_input = json!({ config.echo_arg.as_str(): "x" });
    let echo_input = &echo_input;

    let runtime = Runtime::builder()
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let servers = Servers::start(&runtime, std::env::temp_dir(), None)
        .await
        .map_err(|e| e.to_string())?;
    let floor_config = ServerConfig::command(program.clone(), args.iter().cloned());
    servers
        .add("floor", floor_config.clone())
        .await
        .map_err(|e| e.to_string())?;
    let serving = Instant::now();
    while runtime.tool("mcp__floor__echo").is_none() {
        if serving.elapsed() > Duration::from_secs(30) {
            return Err("the proxied floor server did not serve within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let direct_call = || async {
        let params = CallToolRequestParams::new("echo")
            .with_arguments(echo_input.as_object().cloned().unwrap_or_default());
        direct
            .peer()
            .call_tool(params)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let proxied_call = || async {
        runtime
            .call_json("mcp__floor__echo", echo_input.clone(), CallOptions::new())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };

    // Warm both, then alternate rounds so drift on a shared machine hits both alike.
    for _ in 0..50 {
        direct_call().await?;
        proxied_call().await?;
    }
    let (mut direct_us, mut proxied_us) = (Vec::new(), Vec::new());
    let round = 100.min(config.calls.max(1));
    while direct_us.len() < config.calls {
        for _ in 0..round {
            let at = Instant::now();
            direct_call().await?;
            direct_us.push(at.elapsed().as_secs_f64() * 1e6);
        }
        for _ in 0..round {
            let at = Instant::now();
            proxied_call().await?;
            proxied_us.push(at.elapsed().as_secs_f64() * 1e6);
        }
    }
    direct_us.sort_by(f64::total_cmp);
    proxied_us.sort_by(f64::total_cmp);
    let direct_p50_us = percentile(&direct_us, 0.5);
    let proxied_p50_us = percentile(&proxied_us, 0.5);
    let image = match &config.image_tool {
        Some(tool) => images(&runtime, &direct, tool, config.calls.clamp(10, 500)).await?,
        None => Images::default(),
    };

    let per_caller = (config.calls / config.concurrency.max(1)).max(10);
    let throughput = |proxied: bool| {
        let callers = (0..config.concurrency.max(1)).map(move |_| async move {
            for _ in 0..per_caller {
                if proxied {
                    proxied_call().await?;
                } else {
                    direct_call().await?;
                }
            }
            Ok::<(), String>(())
        });
        async move {
            let at = Instant::now();
            for result in futures::future::join_all(callers).await {
                result?;
            }
            Ok::<f64, String>(
                (per_caller * config.concurrency.max(1)) as f64 / at.elapsed().as_secs_f64(),
            )
        }
    };
    let direct_calls_per_sec = throughput(false).await?;
    let proxied_calls_per_sec = throughput(true).await?;

    let (mut restarts_ms, mut spawns_ms) = (Vec::new(), Vec::new());
    for round in 0..config.restarts {
        // Each kill is an isolated crash: the server is added afresh first, so the restart
        // backoff that a crash loop earns (a restart within 10 s of the last) is not
        // measured as the cost of one restart.
        let name = format!("floor{round}");
        servers
            .add(&name, floor_config.clone())
            .await
            .map_err(|e| e.to_string())?;
        let tool = format!("mcp__{name}__echo");
        let call = || runtime.call_json(&tool, echo_input.clone(), CallOptions::new());
        let added = Instant::now();
        let pid = loop {
            let pid = servers
                .list()
                .await
                .into_iter()
                .find(|s| s.name == name && s.state == ServerState::Running)
                .and_then(|s| s.pid);
            if let Some(pid) = pid.filter(|_| runtime.tool(&tool).is_some()) {
                break pid;
            }
            if added.elapsed() > Duration::from_secs(30) {
                return Err("a proxied floor server did not serve within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let killed = Instant::now();
        kill(pid)?;
        // Answered by the restarted process: the first call may still see the old one die.
        loop {
            let restarted = servers
                .list()
                .await
                .iter()
                .any(|s| s.name == name && s.pid.is_some_and(|p| p != pid));
            if restarted && call().await.is_ok() {
                break;
            }
            if killed.elapsed() > Duration::from_secs(30) {
                return Err("the killed floor server did not serve again within 30 s".into());
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        restarts_ms.push(killed.elapsed().as_secs_f64() * 1e3);
        servers.remove(&name).await.map_err(|e| e.to_string())?;
        // The same start and handshake alone, as guildhall's share is measured against.
        let at = Instant::now();
        let (fresh, _child) = connect(program, args).await?;
        spawns_ms.push(at.elapsed().as_secs_f64() * 1e3);
        let _ = fresh.cancel().await;
    }
    restarts_ms.sort_by(f64::total_cmp);
    spawns_ms.sort_by(f64::total_cmp);

    let _ = direct.cancel().await;
    runtime.shutdown().await;
    Ok(ProxyReport {
        direct_p50_us,
        proxied_p50_us,
        proxy_ratio: proxied_p50_us / direct_p50_us,
        proxied_calls_per_sec,
        direct_calls_per_sec,
        concurrency: config.concurrency,
        restart_p50_ms: percentile(&restarts_ms, 0.5),
        restart_p99_ms: percentile(&restarts_ms, 0.99),
        spawn_handshake_p50_ms: percentile(&spawns_ms, 0.5),
        image_direct_p50_us: image.direct_p50_us,
        image_proxied_p50_us: image.proxied_p50_us,
        image_ratio: image.ratio(),
        image_bytes: image.bytes,
    })
}

/// The image tool's figures.
#[derive(Default)]
struct Images {
    direct_p50_us: f64,
    proxied_p50_us: f64,
    bytes: usize,
}

impl Images {
    fn ratio(&self) -> f64 {
        if self.direct_p50_us > 0.0 {
            self.proxied_p50_us / self.direct_p50_us
        } else {
            0.0
        }
    }
}

/// Times `calls` calls of the floor's image tool `tool` each way, alternating in rounds of
/// ten: directly, and through the proxy as an MCP client's call is made
/// (`Runtime::call_reply`, which hands the server's result on whole).
async fn images(
    runtime: &Runtime,
    direct: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    calls: usize,
) -> Result<Images, String> {
    let proxied_name = format!("mcp__floor__{tool}");
    let image_size = |result: &rmcp::model::CallToolResult| {
        result
            .content
            .iter()
            .find_map(|block| block.as_image().map(|image| image.data.len()))
            .ok_or_else(|| format!("`{tool}` answered no image"))
    };
    let direct_call = || async {
        let result = direct
            .peer()
            .call_tool(CallToolRequestParams::new(tool.to_owned()))
            .await
            .map_err(|e| e.to_string())?;
        image_size(&result)
    };
    let proxied_call = || async {
        let reply = runtime
            .call_reply(&proxied_name, json!({}), CallOptions::new())
            .await
            .map_err(|e| e.to_string())?;
        let result = reply
            .verbatim
            .as_deref()
            .ok_or("a proxied result is kept whole")?;
        image_size(result)
    };
    let bytes = direct_call().await?;
    if proxied_call().await? != bytes {
        return Err("the proxied image differs in size from the direct one".into());
    }
    let (mut direct_us, mut proxied_us) = (Vec::new(), Vec::new());
    while direct_us.len() < calls {
        for _ in 0..10 {
            let at = Instant::now();
            direct_call().await?;
            direct_us.push(at.elapsed().as_secs_f64() * 1e6);
        }
        for _ in 0..10 {
            let at = Instant::now();
            proxied_call().await?;
            proxied_us.push(at.elapsed().as_secs_f64() * 1e6);
        }
    }
    direct_us.sort_by(f64::total_cmp);
    proxied_us.sort_by(f64::total_cmp);
    Ok(Images {
        direct_p50_us: percentile(&direct_us, 0.5),
        proxied_p50_us: percentile(&proxied_us, 0.5),
        bytes,
    })
}

/// Starts `program args` and connects to it as an MCP client over its stdio.
async fn connect(
    program: &str,
    args: &[String],
) -> Result<
    (
        rmcp::service::RunningService<rmcp::RoleClient, ()>,
        tokio::process::Child,
    ),
    String,
> {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        // What a server says on stderr is not the bench's output.
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("the floor server did not start: {e}"))?;
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err("the floor server's stdio could not be opened".into());
    };
    let service = ()
        .serve((stdout, stdin))
        .await
        .map_err(|e| format!("the floor server's handshake failed: {e}"))?;
    Ok((service, child))
}

fn kill(pid: u32) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("could not kill {pid}"))
}
