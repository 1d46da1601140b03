//! `bash`: one command, waited for, its output streamed as progress and returned whole.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::unix::pipe::Receiver;

use super::process::{self, TERM_GRACE};
use super::{Shell, ShellError};

/// Output kept per stream; past it, bytes are counted, not kept (governance's truncation
/// then cuts what the model sees).
const KEPT: usize = 1024 * 1024;
/// Progress messages sent per call at most (each one output line).
const PROGRESS_LINES: u64 = 1_000;
/// Bytes of one output line a progress message shows (a longer line is cut there).
const PROGRESS_LINE: usize = 4 * 1024;

/// `bash`.
pub struct Bash(pub(super) Arc<Shell>);

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
    /// When it failed with a refusal (permission denied, not permitted, read-only): what
    /// the sandbox lets a command reach, and where that is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
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
        let timeout = input.timeout_secs.unwrap_or(config.timeout_secs);
        if !(1..=config.max_timeout_secs).contains(&timeout) {
            return Err(ShellError::Invalid(format!(
                "timeout_secs is {timeout}; give 1 to {}",
                config.max_timeout_secs
            )));
        }
        let command = process::command(shell, ctx.agent(), &input.command, input.cwd.as_deref())?;
        let (stdout, stdout_writer) = std::io::pipe()?;
        let (stderr, stderr_writer) = std::io::pipe()?;
        let (mut child, mut group) =
            command.spawn(&shell.bash, stdout_writer.as_fd(), stderr_writer.as_fd())?;
        let hint = command.hint.clone();
        // Our copies of the writing ends go, so each pipe's end of file is the group's.
        drop((command, stdout_writer, stderr_writer));
        let reader = |pipe: std::io::PipeReader| {
            Receiver::from_owned_fd(OwnedFd::from(pipe)).map_err(ShellError::from)
        };
        let (stdout, stderr) = (reader(stdout)?, reader(stderr)?);
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
                Ok(status) => Some(status?),
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
        let failed = !status.is_some_and(|s| s.success());
        let sandbox = hint.and_then(|hint| shell.sandbox.explain(&hint, "bash", failed, &stderr));
        Ok(BashOutput {
            sandbox,
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

/// Reads `stream` to its end into `into`, each line reported as progress. Memory stays
/// bounded whatever the command writes: output is kept as it arrives (up to [`KEPT`]), and
/// a line is held only as far as its progress message shows it ([`PROGRESS_LINE`] bytes),
/// so a line of gigabytes without a newline costs its reader's buffer, not its length.
async fn collect(
    stream: impl AsyncRead + Unpin,
    progress: &Progress<'_>,
    name: &str,
    into: &Collected,
) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let mut cut = false;
    let report = |line: &mut Vec<u8>, cut: &mut bool| {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\n', '\r']);
        if *cut {
            progress.line(name, &format!("{text}…"));
        } else {
            progress.line(name, text);
        }
        line.clear();
        *cut = false;
    };
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk,
        };
        let (take, ended) = match chunk.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (chunk.len(), false),
        };
        into.add(&chunk[..take]);
        let room = PROGRESS_LINE.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..take.min(room)]);
        cut |= take > room;
        reader.consume(take);
        if ended {
            report(&mut line, &mut cut);
        }
    }
    if !line.is_empty() {
        report(&mut line, &mut cut);
    }
}
