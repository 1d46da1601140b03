//! The measurements behind `guildhall bench tools`: the file tools against what they
//! replace. `grep` over a generated tree against ripgrep (`rg`, run on the same tree in
//! the same rounds); `read_file` and `edit_file` through the whole runtime (governance,
//! pipeline, actor, blocking pool) against the same read and write done directly; `bash`
//! running `true` against a bare `tokio::process::Command`, and sandboxed against the same
//! tool with its sandbox off; an HTTP request through the sandbox's egress proxy against
//! the same request made directly, to a loopback origin.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use super::{Stage, median, percentile};
use crate::files::{Files, FilesConfig};
use crate::{AgentSpec, CallOptions, Runtime};

/// Settings of `guildhall bench tools`.
#[derive(Debug, Clone)]
pub struct ToolsBenchConfig {
    /// Files in the generated tree.
    pub files: usize,
    /// Their total size, in MiB.
    pub mebibytes: usize,
    /// Rounds of `grep` and `rg` each, alternating; figures are medians.
    pub rounds: usize,
    /// Calls of `read_file` and `edit_file` each (and as many direct ones).
    pub io_calls: usize,
    /// The ripgrep binary.
    pub rg: PathBuf,
}

impl Default for ToolsBenchConfig {
    fn default() -> Self {
        Self {
            files: 10_000,
            mebibytes: 200,
            rounds: 5,
            io_calls: 2_000,
            rg: PathBuf::from("rg"),
        }
    }
}

/// What `guildhall bench tools` measured.
#[derive(Debug, Clone, Serialize)]
pub struct ToolsReport {
    /// Files in the tree searched.
    pub files: usize,
    /// Bytes in it.
    pub bytes: u64,
    /// `grep` (files with matches) over the tree, median ms.
    pub grep_ms: f64,
    /// `rg -l` over the same tree, median ms.
    pub rg_ms: f64,
    /// `grep_ms / rg_ms`.
    pub grep_ratio: f64,
    /// Files `grep` found, and `rg` (they must agree).
    pub grep_files_found: usize,
    /// Files `rg` found.
    pub rg_files_found: usize,
    /// `read_file` of a 20 KB file through the runtime, p50 µs.
    pub read_p50_us: f64,
    /// The same read with `std::fs`, p50 µs.
    pub read_direct_p50_us: f64,
    /// `read_p50_us / read_direct_p50_us`.
    pub read_ratio: f64,
    /// `edit_file` of that file through the runtime (read check, atomic replace), p50 µs.
    pub edit_p50_us: f64,
    /// The same edit with `std::fs` (read, replace, write in place), p50 µs.
    pub edit_direct_p50_us: f64,
    /// `edit_p50_us / edit_direct_p50_us`.
    pub edit_ratio: f64,
    /// `bash {command: "true"}` through the runtime, p50 µs (Linux).
    pub bash_p50_us: f64,
    /// `bash -c true` with a bare `tokio::process::Command`, p50 µs.
    pub bash_direct_p50_us: f64,
    /// `bash_p50_us / bash_direct_p50_us`.
    pub bash_ratio: f64,
    /// `bash {command: "true"}` through the runtime with the sandbox off, p50 µs.
    pub bash_unsandboxed_p50_us: f64,
    /// `bash_p50_us / bash_unsandboxed_p50_us`: what confinement costs a command.
    pub sandboxed_bash_ratio: f64,
    /// `bash_p50_us - bash_unsandboxed_p50_us`: the sandbox's own cost per command, µs.
    pub sandbox_cost_us: f64,
    /// The mechanisms the sandboxed `bash` ran under.
    pub sandbox: String,
    /// A plain HTTP GET to a loopback origin, connection included, p50 µs.
    pub fetch_direct_p50_us: f64,
    /// The same GET through an agent's egress proxy (`network = "proxy"`), p50 µs.
    pub fetch_proxied_p50_us: f64,
    /// `fetch_proxied_p50_us - fetch_direct_p50_us`: what the proxy adds to a request, µs.
    pub proxy_added_us: f64,
}

/// Runs every measurement of `guildhall bench tools` in a tree generated under `dir`
/// (removed afterwards).
///
/// # Errors
/// When `rg` cannot be run, the tree cannot be written, or a tool call fails.
///
/// # Cancel safety
/// Not cancel safe: dropped midway, it leaves the generated tree behind.
pub async fn tools(
    config: &ToolsBenchConfig,
    dir: &Path,
    stage: &dyn Stage,
) -> Result<ToolsReport, String> {
    let rg_version = Command::new(&config.rg).arg("--version").output();
    if !rg_version.is_ok_and(|o| o.status.success()) {
        return Err(format!(
            "ripgrep (`{}`) cannot be run: install it (Debian: apt install ripgrep) or give \
             --rg PATH",
            config.rg.display()
        ));
    }
    let root = dir.join(format!("guildhall-bench-tools-{}", std::process::id()));
    stage.phase("writing the tree", config.files as u64);
    let bytes = generate(&root, config, stage).map_err(|e| format!("writing the tree: {e}"))?;
    let result = measure(config, &root, bytes, stage).await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn measure(
    config: &ToolsBenchConfig,
    root: &Path,
    bytes: u64,
    stage: &dyn Stage,
) -> Result<ToolsReport, String> {
    let files = Files::open(&FilesConfig {
        roots: vec![root.to_owned()],
        ..FilesConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let shell = crate::shell::Shell::new(crate::shell::ShellConfig::default(), files.clone())
        .map_err(|e| e.to_string())?;
    // The same shell with its sandbox off, in a runtime of its own (both serve `bash`).
    let unconfined = crate::sandbox::Sandbox::new(
        crate::sandbox::SandboxConfig {
            enabled: false,
            ..Default::default()
        },
        crate::sandbox::Protected::default(),
    )
    .map_err(|e| e.to_string())?;
    let plain_shell = crate::shell::Shell::with_sandbox(
        crate::shell::ShellConfig::default(),
        files.clone(),
        unconfined,
    )
    .map_err(|e| e.to_string())?;
    let plain = Runtime::builder()
        .shell(&plain_shell)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let plain_agent = plain
        .register_agent(AgentSpec::new("bench", "bench"))
        .await
        .map_err(|e| e.to_string())?;
    let sandbox_level = shell.sandbox().describe();
    let rt = Runtime::builder()
        .files(&files)
        .shell(&shell)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let agent = rt
        .register_agent(AgentSpec::new("bench", "bench"))
        .await
        .map_err(|e| e.to_string())?;
    let as_agent = || CallOptions::new().as_agent(&agent);
    let call = |tool: &'static str, args: serde_json::Value| {
        let rt = rt.clone();
        let options = as_agent();
        async move {
            rt.call_json(tool, args, options)
                .await
                .map_err(|e| format!("{tool}: {e}"))
        }
    };

    stage.phase("grep against rg", config.rounds as u64 + 1);
    // The limit (far above what is found) differs per call, as a working agent's arguments
    // do: the loop guard would stop identical calls in a row.
    let grep_args = |round: usize| json!({ "pattern": NEEDLE_PATTERN, "limit": 5_000 - round });
    // One warm-up each: both then read from the page cache.
    let warm = call("grep", grep_args(config.rounds)).await?;
    let grep_found = warm["results"].as_array().map_or(0, Vec::len);
    let rg_found = rg(&config.rg, root)?.1;
    stage.step();
    let (mut grep_ms, mut rg_ms) = (Vec::new(), Vec::new());
    for round in 0..config.rounds {
        let started = Instant::now();
        call("grep", grep_args(round)).await?;
        grep_ms.push(started.elapsed().as_secs_f64() * 1e3);
        rg_ms.push(rg(&config.rg, root)?.0);
        stage.step();
    }

    stage.phase("read, edit and bash", 6);
    let file = root.join("d000/f00000.txt");
    let path = file.display().to_string();
    let mut read = Vec::with_capacity(config.io_calls);
    for i in 0..config.io_calls {
        // Any limit past the file's 400-odd lines reads it whole.
        let args = json!({ "path": path, "limit": 1_000 + i % 9_000 });
        let started = Instant::now();
        call("read_file", args).await?;
        read.push(started.elapsed().as_secs_f64() * 1e6);
    }
    stage.step();
    let mut read_direct = Vec::with_capacity(config.io_calls);
    for _ in 0..config.io_calls {
        let started = Instant::now();
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        std::hint::black_box(text);
        read_direct.push(started.elapsed().as_secs_f64() * 1e6);
    }
    stage.step();
    let mut edit = Vec::with_capacity(config.io_calls);
    for i in 0..config.io_calls {
        let (old, new) = toggle(i);
        let started = Instant::now();
        call(
            "edit_file",
            json!({ "path": path, "old_string": old, "new_string": new }),
        )
        .await?;
        edit.push(started.elapsed().as_secs_f64() * 1e6);
    }
    stage.step();
    let mut edit_direct = Vec::with_capacity(config.io_calls);
    for i in 0..config.io_calls {
        let (old, new) = toggle(i);
        let started = Instant::now();
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        std::fs::write(&file, text.replacen(old, new, 1)).map_err(|e| e.to_string())?;
        edit_direct.push(started.elapsed().as_secs_f64() * 1e6);
    }
    stage.step();
    let shell_calls = (config.io_calls / 4).max(1);
    let mut bash = Vec::with_capacity(shell_calls);
    let mut bash_plain = Vec::with_capacity(shell_calls);
    let mut bash_direct = Vec::with_capacity(shell_calls);
    for i in 0..shell_calls {
        // Alternating, so all three see the same machine; the timeout varies only so that
        // the loop guard sees different calls.
        let args = json!({ "command": "true", "timeout_secs": 60 + i % 60 });
        let started = Instant::now();
        call("bash", args.clone()).await?;
        bash.push(started.elapsed().as_secs_f64() * 1e6);
        let started = Instant::now();
        plain
            .call_json("bash", args, CallOptions::new().as_agent(&plain_agent))
            .await
            .map_err(|e| format!("bash unsandboxed: {e}"))?;
        bash_plain.push(started.elapsed().as_secs_f64() * 1e6);
        let started = Instant::now();
        tokio::process::Command::new("bash")
            .args(["-c", "true"])
            .output()
            .await
            .map_err(|e| e.to_string())?;
        bash_direct.push(started.elapsed().as_secs_f64() * 1e6);
    }
    stage.step();
    let (mut fetch_direct, mut fetch_proxied) = fetches(shell_calls.max(50)).await?;
    stage.step();
    rt.shutdown().await;
    plain.shutdown().await;

    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(v, 0.5)
    };
    let (grep_ms, rg_ms) = (median(&mut grep_ms), median(&mut rg_ms));
    let (read_p50_us, read_direct_p50_us) = (p50(&mut read), p50(&mut read_direct));
    let (edit_p50_us, edit_direct_p50_us) = (p50(&mut edit), p50(&mut edit_direct));
    let (bash_p50_us, bash_direct_p50_us) = (p50(&mut bash), p50(&mut bash_direct));
    let bash_unsandboxed_p50_us = p50(&mut bash_plain);
    Ok(ToolsReport {
        files: config.files,
        bytes,
        grep_ms,
        rg_ms,
        grep_ratio: grep_ms / rg_ms,
        grep_files_found: grep_found,
        rg_files_found: rg_found,
        read_p50_us,
        read_direct_p50_us,
        read_ratio: read_p50_us / read_direct_p50_us,
        edit_p50_us,
        edit_direct_p50_us,
        edit_ratio: edit_p50_us / edit_direct_p50_us,
        bash_p50_us,
        bash_direct_p50_us,
        bash_ratio: bash_p50_us / bash_direct_p50_us,
        bash_unsandboxed_p50_us,
        sandboxed_bash_ratio: bash_p50_us / bash_unsandboxed_p50_us,
        sandbox_cost_us: bash_p50_us - bash_unsandboxed_p50_us,
        sandbox: sandbox_level,
        fetch_direct_p50_us: p50(&mut fetch_direct),
        fetch_proxied_p50_us: p50(&mut fetch_proxied),
        proxy_added_us: p50(&mut fetch_proxied) - p50(&mut fetch_direct),
    })
}

/// `calls` GETs to a loopback origin, alternating direct and through an egress proxy that
/// allows it by name: each one's time in µs, connection to the last byte.
async fn fetches(calls: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("the origin: {e}"))?;
    let port = origin.local_addr().map_err(|e| e.to_string())?.port();
    let serving = tokio::spawn(async move {
        while let Ok((mut stream, _)) = origin.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    let sandbox = crate::sandbox::Sandbox::new(
        crate::sandbox::SandboxConfig {
            network: crate::sandbox::Network::Proxy,
            proxy: crate::sandbox::ProxyConfig {
                allow: vec![format!("127.0.0.1:{port}")],
                deny: Vec::new(),
            },
            ..crate::sandbox::SandboxConfig::default()
        },
        crate::sandbox::Protected::default(),
    )
    .map_err(|e| e.to_string())?;
    let proxy = sandbox
        .egress_port(Some("bench"))
        .map_err(|e| e.to_string())?;
    let get = |to: u16, request: String| async move {
        let started = Instant::now();
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", to))
            .await
            .map_err(|e| format!("connecting to {to}: {e}"))?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        if !answer.ends_with(b"ok") {
            return Err(format!(
                "unexpected answer: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        Ok::<f64, String>(started.elapsed().as_secs_f64() * 1e6)
    };
    let (mut direct, mut proxied) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    for _ in 0..calls {
        direct.push(get(port, "GET / HTTP/1.1\r\nHost: origin\r\n\r\n".into()).await?);
        proxied.push(
            get(
                proxy,
                format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: origin\r\n\r\n"),
            )
            .await?,
        );
    }
    serving.abort();
    Ok((direct, proxied))
}

/// What the searches look for: planted in about one file in a hundred.
const NEEDLE_PATTERN: &str = "guildhall_needle_[0-9]+";

/// The edit of round `i`: a marker the first file holds once, turned back and forth.
fn toggle(i: usize) -> (&'static str, &'static str) {
    if i.is_multiple_of(2) {
        ("MARKER_A", "MARKER_B")
    } else {
        ("MARKER_B", "MARKER_A")
    }
}

/// Runs `rg -l` over `root`: its time in ms and the files it listed.
fn rg(rg: &Path, root: &Path) -> Result<(f64, usize), String> {
    let started = Instant::now();
    let out = Command::new(rg)
        .args(["--no-config", "-l", NEEDLE_PATTERN])
        .arg(root)
        .output()
        .map_err(|e| format!("rg: {e}"))?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    // rg exits 1 when nothing matched; anything else is a failure.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(format!(
            "rg: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok((
        ms,
        out.stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
    ))
}

/// Writes `config.files` text files of about equal size (100 per directory) under `root`,
/// a needle planted in every hundredth; answers the bytes written.
fn generate(root: &Path, config: &ToolsBenchConfig, stage: &dyn Stage) -> std::io::Result<u64> {
    const WORDS: &[&str] = &[
        "actor",
        "mailbox",
        "supervisor",
        "restart",
        "breaker",
        "context",
        "session",
        "agent",
        "message",
        "reply",
        "tool",
        "call",
        "deadline",
        "store",
        "commit",
        "batch",
        "lease",
        "epoch",
        "shard",
        "route",
        "fn",
        "let",
        "match",
        "struct",
        "impl",
        "async",
        "await",
    ];
    let per_file = config.mebibytes * 1024 * 1024 / config.files.max(1);
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        // xorshift: deterministic words, no dependency.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut total = 0u64;
    for f in 0..config.files {
        let dir = root.join(format!("d{:03}", f / 100));
        if f % 100 == 0 {
            std::fs::create_dir_all(&dir)?;
        }
        let mut text = String::with_capacity(per_file + 100);
        if f == 0 {
            text.push_str("MARKER_A\n");
        }
        let needle_line = (f % 100 == 0).then(|| next() as usize % 100);
        let mut line = 0;
        while text.len() < per_file {
            if needle_line == Some(line) {
                text.push_str(&format!("// guildhall_needle_{f}\n"));
            }
            for w in 0..8 {
                if w > 0 {
                    text.push(' ');
                }
                #[allow(clippy::cast_possible_truncation)]
                text.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
            }
            text.push('\n');
            line += 1;
        }
        total += text.len() as u64;
        std::fs::write(dir.join(format!("f{f:05}.txt")), text)?;
        stage.step();
    }
    Ok(total)
}
