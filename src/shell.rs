//! The built-in `bash` tool: a command run in its own session and process group, in a
//! directory inside the file tools' roots, with a filtered environment and resource limits,
//! its output streamed as progress while it runs. The whole group is killed when the
//! command ends (no background child outlives it), when it passes its timeout, when the call
//! is cancelled, and when the call's future is dropped for any other reason (the runtime
//! stopping, the pipeline cutting off a stuck call).
//!
//! Off unless configured: `[shell]` in `guildhall.toml`, or
//! [`RuntimeBuilder::shell`](crate::RuntimeBuilder::shell).

use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::files::Files;

/// Output kept per stream; past it, bytes are counted, not kept (governance's truncation
/// then cuts what the model sees).
const KEPT: usize = 1024 * 1024;
/// Progress messages sent per call at most (each one output line).
const PROGRESS_LINES: u64 = 1_000;
/// How long a group has between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(500);

/// Settings of the `bash` tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShellConfig {
    /// A command's time when the call names none, in seconds.
    pub timeout_secs: u64,
    /// The longest time a call may ask for, in seconds.
    pub max_timeout_secs: u64,
    /// CPU seconds per command (`RLIMIT_CPU`).
    pub cpu_secs: u64,
    /// Address space per process, in MiB (`RLIMIT_AS`).
    pub memory_mib: u64,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Processes of the user (`RLIMIT_NPROC`; the kernel does not hold root to it).
    pub processes: u64,
    /// Environment variables passed to commands besides the basic ones (`PATH`, `HOME`,
    /// `LANG`, `LC_*`, `TERM`, `USER`, `TMPDIR`). Nothing named `GUILDHALL_*` ever is.
    pub env: Vec<String>,
    /// Commands refused before they run: globs over the whole command line (`*` matches
    /// anything, spaces included).
    pub deny: Vec<String>,
}

impl Default for ShellConfig {
    fn default() -> Self {
        Self {
            timeout_secs: 120,
            max_timeout_secs: 600,
            cpu_secs: 600,
            memory_mib: 4096,
            open_files: 1024,
            processes: 512,
            env: Vec::new(),
            deny: [
                "rm -rf /",
                "rm -rf /[*]",
                "rm -rf ~",
                "rm -rf ~/",
                "mkfs*",
                "dd * of=/dev/*",
                ":(){*",
                "git push --force*",
                "git push -f*",
                "curl * | *sh",
                "wget * | *sh",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

/// Why a command was refused or could not run.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ShellError {
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
    /// The command matches a `[shell] deny` pattern.
    #[error("refused: the command matches the deny pattern `{pattern}` (`[shell] deny`)")]
    Denied {
        /// The pattern.
        pattern: String,
    },
    /// The working directory may not be used (see the file tools' confinement).
    #[error("{0}")]
    Directory(#[from] crate::files::FileError),
    /// The shell could not be started.
    #[error("could not start bash: {0}")]
    Spawn(String),
}

/// The shell's shared state: its settings and the roots commands run in.
pub struct Shell {
    config: ShellConfig,
    deny: Vec<(String, glob::Pattern)>,
    files: Arc<Files>,
}

impl Shell {
    /// The `bash` tool with `config`, running commands inside `files`' roots.
    ///
    /// # Errors
    /// [`ShellError::Invalid`] for an unusable setting (a deny glob that does not parse, a
    /// zero timeout or limit).
    pub fn new(config: ShellConfig, files: Arc<Files>) -> Result<Arc<Self>, ShellError> {
        let zero = [
            ("timeout_secs", config.timeout_secs),
            ("max_timeout_secs", config.max_timeout_secs),
            ("cpu_secs", config.cpu_secs),
            ("memory_mib", config.memory_mib),
            ("open_files", config.open_files),
            ("processes", config.processes),
        ]
        .into_iter()
        .find(|(_, v)| *v == 0);
        if let Some((name, _)) = zero {
            return Err(ShellError::Invalid(format!(
                "[shell] {name} is 0; give a positive number"
            )));
        }
        if config.timeout_secs > config.max_timeout_secs {
            return Err(ShellError::Invalid(format!(
                "[shell] timeout_secs ({}) is above max_timeout_secs ({})",
                config.timeout_secs, config.max_timeout_secs
            )));
        }
        let deny = config
            .deny
            .iter()
            .map(|p| {
                glob::Pattern::new(p)
                    .map(|g| (p.clone(), g))
                    .map_err(|err| ShellError::Invalid(format!("[shell] deny `{p}`: {err}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Arc::new(Self {
            config,
            deny,
            files,
        }))
    }

    /// The longest a call may take, kill included: what the tool's deadline allows for.
    pub fn max_call(&self) -> Duration {
        Duration::from_secs(self.config.max_timeout_secs) + TERM_GRACE + Duration::from_secs(5)
    }

    /// The tool.
    pub fn tool(self: &Arc<Self>) -> Bash {
        Bash(Arc::clone(self))
    }
}

/// `bash`.
pub struct Bash(Arc<Shell>);

/// Input of `bash`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashInput {
    /// The command line, run by `bash -c`.
    pub command: String,
    /// Seconds it may run before its whole process group is killed (default 120, at most
    /// the configured maximum, 600 by default).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// The directory it runs in: relative to the first root, or absolute inside a root
    /// (default: the first root).
    #[serde(default)]
    pub cwd: Option<String>,
}

/// How a command ended.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BashOutput {
    /// Its exit code, when it exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did (9 after a timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether it ran past its timeout and was killed.
    pub timed_out: bool,
    /// What it wrote to standard output (the first MiB).
    pub stdout: String,
    /// What it wrote to standard error (the first MiB).
    pub stderr: String,
    /// Bytes of output past the first MiB of each stream, not kept.
    pub dropped_bytes: u64,
}

impl Tool for Bash {
    type Input = BashInput;
    type Output = BashOutput;
    type Error = ShellError;
    type State = ();

    fn name(&self) -> &str {
        "bash"
    }

    fn description(&self) -> &str {
        "Runs a command with bash in the project (or `cwd`), with a timeout (default 120 s). \
         Output lines stream as progress while it runs; the answer has the exit code, \
         stdout and stderr. Background processes it starts are killed when it ends."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Run a command")
            .destructive(true)
    }

    fn detach(&self, _: &(), _: &BashInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: BashInput,
        ctx: CallContext,
    ) -> Result<BashOutput, ShellError> {
        let shell = &self.0;
        let config = &shell.config;
        if input.command.trim().is_empty() {
            return Err(ShellError::Invalid("command is empty".into()));
        }
        if input.command.contains('\0') {
            return Err(ShellError::Invalid("command contains a NUL byte".into()));
        }
        let timeout = input.timeout_secs.unwrap_or(config.timeout_secs);
        if !(1..=config.max_timeout_secs).contains(&timeout) {
            return Err(ShellError::Invalid(format!(
                "timeout_secs is {timeout}; give 1 to {}",
                config.max_timeout_secs
            )));
        }
        if let Some((pattern, _)) = shell
            .deny
            .iter()
            .find(|(_, g)| g.matches(input.command.trim()))
        {
            return Err(ShellError::Denied {
                pattern: pattern.clone(),
            });
        }
        let (dir, _) = shell.files.open_dir(input.cwd.as_deref())?;
        let mut command = tokio::process::Command::new("bash");
        command
            .arg("-c")
            .arg(&input.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            .envs(environment(&config.env))
            .kill_on_drop(true);
        before_exec(&mut command, dir.as_raw_fd(), Limits::of(config));
        let mut child = command
            .spawn()
            .map_err(|err| ShellError::Spawn(err.to_string()))?;
        drop(dir);
        // The child leads its own session and group: its pid is the group's id.
        let group = Group(child.id().and_then(|id| i32::try_from(id).ok()));
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ShellError::Spawn("its output could not be captured".into()));
        };
        let progress = Progress::new(&ctx);
        let (out, err) = (Collected::default(), Collected::default());
        let (status, timed_out) = {
            let reading = async {
                tokio::join!(
                    collect(stdout, &progress, "stdout", &out),
                    collect(stderr, &progress, "stderr", &err)
                )
            };
            let deadline = tokio::time::sleep(Duration::from_secs(timeout));
            tokio::pin!(reading, deadline);
            let mut read_all = false;
            // The output is read while the command runs (a full pipe would stop it), and the
            // command's end is its shell's exit: a background child holding the pipes does
            // not keep the call open.
            let stopped = loop {
                tokio::select! {
                    status = child.wait() => break Ok(status),
                    _ = &mut reading, if !read_all => read_all = true,
                    () = &mut deadline => break Err(true),
                    () = ctx.cancellation().cancelled() => break Err(false),
                }
            };
            // Whatever happened, nothing the command started outlives it; its pipes close
            // with it.
            group.terminate().await;
            if !read_all {
                let _ = tokio::time::timeout(TERM_GRACE, &mut reading).await;
            }
            let timed_out = matches!(stopped, Err(true));
            let status = match stopped {
                Ok(status) => Some(status.map_err(|err| ShellError::Spawn(err.to_string()))?),
                Err(_) => tokio::time::timeout(TERM_GRACE, child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok),
            };
            (status, timed_out)
        };
        let (stdout, out_dropped) = out.take();
        let (mut stderr, err_dropped) = err.take();
        if timed_out {
            stderr.push_str(&format!(
                "\n[guildhall: killed after {timeout} s with its whole process group]\n"
            ));
        }
        Ok(BashOutput {
            exit_code: status.and_then(|s| s.code()),
            signal: status
                .and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s))
                .or(timed_out.then_some(libc::SIGKILL)),
            timed_out,
            stdout,
            stderr,
            dropped_bytes: out_dropped + err_dropped,
        })
    }
}

/// One stream's output so far: kept text and the count of bytes past it.
#[derive(Default)]
struct Collected(std::sync::Mutex<(Vec<u8>, u64)>);

impl Collected {
    fn add(&self, line: &[u8]) {
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let room = KEPT.saturating_sub(kept.0.len());
        let take = line.len().min(room);
        kept.0.extend_from_slice(&line[..take]);
        kept.1 += (line.len() - take) as u64;
    }

    fn take(self) -> (String, u64) {
        let (kept, dropped) = self
            .0
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (String::from_utf8_lossy(&kept).into_owned(), dropped)
    }
}

/// Makes the child its own session and process group, moves it into the directory `dir`
/// (opened through the confined walk, so no path is resolved again), and sets its limits.
#[allow(unsafe_code)]
fn before_exec(command: &mut tokio::process::Command, dir: i32, limits: Limits) {
    // SAFETY: between fork and exec the closure makes only async-signal-safe calls
    // (setsid, fchdir, setrlimit) on values prepared before the fork, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fchdir(dir) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            limits.apply()
        });
    }
}

/// Sends `signal` to every process of group `pgid`; `false` when the group has none left.
#[allow(unsafe_code)]
fn signal_group(pgid: i32, signal: i32) -> bool {
    // SAFETY: kill with a negative pid signals a process group; no memory is involved.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// The environment a command gets: the basic variables and the configured ones, never a
/// `GUILDHALL_*` one (tokens live there).
fn environment(extra: &[String]) -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(name, _)| !name.starts_with("GUILDHALL_"))
        .filter(|(name, _)| {
            matches!(
                name.as_str(),
                "PATH" | "HOME" | "LANG" | "TERM" | "USER" | "LOGNAME" | "TMPDIR" | "SHELL" | "TZ"
            ) || name.starts_with("LC_")
                || extra.iter().any(|e| e == name)
        })
        .collect()
}

/// Resource limits set in the child before it runs the command.
#[derive(Clone, Copy)]
struct Limits {
    cpu: libc::rlim_t,
    memory: libc::rlim_t,
    files: libc::rlim_t,
    processes: libc::rlim_t,
}

impl Limits {
    fn of(config: &ShellConfig) -> Self {
        Self {
            cpu: config.cpu_secs,
            memory: config.memory_mib.saturating_mul(1024 * 1024),
            files: config.open_files,
            processes: config.processes,
        }
    }

    /// Sets the limits in this process (called in the child, after fork).
    #[allow(unsafe_code)]
    fn apply(self) -> std::io::Result<()> {
        for (resource, value) in [
            (libc::RLIMIT_CPU, self.cpu),
            (libc::RLIMIT_AS, self.memory),
            (libc::RLIMIT_NOFILE, self.files),
            (libc::RLIMIT_NPROC, self.processes),
        ] {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit with a valid pointer to a stack value.
            if unsafe { libc::setrlimit(resource, &raw const limit) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// A command's process group, killed whole.
struct Group(Option<i32>);

impl Group {
    /// SIGTERM to the group, then SIGKILL to what is left after a grace period.
    async fn terminate(&self) {
        let Some(pgid) = self.0 else { return };
        if !signal_group(pgid, libc::SIGTERM) {
            return; // The group is gone already.
        }
        let deadline = tokio::time::Instant::now() + TERM_GRACE;
        // Signal 0 only asks whether the group still has members.
        while signal_group(pgid, 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.kill();
    }

    fn kill(&self) {
        if let Some(pgid) = self.0 {
            signal_group(pgid, libc::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // The call's future dropped midway (cancelled by the pipeline, the runtime
        // stopping): no grace, nothing survives.
        self.kill();
    }
}

/// Output lines reported as progress, numbered across both streams.
struct Progress<'a> {
    ctx: &'a CallContext,
    sent: std::sync::atomic::AtomicU64,
}

impl<'a> Progress<'a> {
    fn new(ctx: &'a CallContext) -> Self {
        Self {
            ctx,
            sent: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn line(&self, stream: &str, line: &str) {
        let n = self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n <= PROGRESS_LINES {
            #[allow(clippy::cast_precision_loss)]
            self.ctx
                .progress(n as f64, None, Some(&format!("{stream}: {line}")));
        }
    }
}

/// Reads `stream` to its end into `into`, each line reported as progress.
async fn collect(
    stream: impl AsyncRead + Unpin,
    progress: &Progress<'_>,
    name: &str,
    into: &Collected,
) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                into.add(&line);
                let text = String::from_utf8_lossy(&line);
                progress.line(name, text.trim_end_matches(['\n', '\r']));
            }
        }
    }
}
