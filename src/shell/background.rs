//! Background shells: `shell_start` runs a command and returns at once with an id;
//! `shell_output` reads what it wrote since the last read (waiting for more if asked);
//! `shell_kill` ends it. Each command is a job ([`super::jobs`]): an actor holding its
//! process group and its output.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::config::ShellError;
use super::jobs::{End, Ended, Launched, Limits};
use super::process;
use super::state::Shell;

/// The longest `shell_output` waits for new output.
pub(super) const MAX_WAIT_SECS: u64 = 60;
/// What `shell_output` returns at most per call.
const MAX_READ: usize = 1024 * 1024;
/// What `shell_output` returns per call when not told.
const DEFAULT_READ: usize = 64 * 1024;

/// `shell_start`.
pub struct ShellStart(pub(super) Arc<Shell>);
/// `shell_output`.
pub struct ShellOutput(pub(super) Arc<Shell>);
/// `shell_kill`.
pub struct ShellKill(pub(super) Arc<Shell>);

/// Input of `shell_start`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartInput {
    /// The command line, run by `bash -c` in the background.
    pub command: String,
    /// Seconds it may run before its whole process group is killed (default: until it
    /// ends, is killed, or its agent disconnects).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// The directory it runs in: relative to the first root, or absolute inside a root
    /// (default: the first root).
    #[serde(default)]
    pub cwd: Option<String>,
}

/// A started background shell.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Started {
    /// Its id, for `shell_output` and `shell_kill`.
    pub id: String,
    /// Its process (and process group) id.
    pub pid: Option<i32>,
}

/// Input of `shell_output`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputInput {
    /// The id `shell_start` returned.
    pub id: String,
    /// Seconds to wait for new output (or the end) when there is none yet (0 to 60,
    /// default 0).
    #[serde(default)]
    pub wait_secs: u64,
    /// Bytes returned at most (default 65536, at most 1 MiB); the rest comes with the next
    /// read.
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

/// Output since the last read, and the command's state.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct JobOutput {
    /// The id.
    pub id: String,
    /// What it wrote (standard output and error as they interleaved) since the last read.
    pub output: String,
    /// Whether more output is waiting past `max_bytes`.
    pub more: bool,
    /// Whether it is still running.
    pub running: bool,
    /// How it ended, once it has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<Ended>,
    /// Its exit code, when it exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Output not kept (past `[shell] background_output_mib`), in bytes.
    pub dropped_bytes: u64,
}

/// Input of `shell_kill`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillInput {
    /// The id `shell_start` returned.
    pub id: String,
}

/// A killed (or already ended) background shell, now forgotten.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Killed {
    /// The id.
    pub id: String,
    /// How it ended (`killed`, unless it had ended before).
    pub ended: Ended,
    /// Its exit code, when it exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Output it wrote that was never read.
    pub unread_output: String,
}

impl Tool for ShellStart {
    type Input = StartInput;
    type Output = Started;
    type Error = ShellError;
    type State = ();

    fn name(&self) -> &str {
        "shell_start"
    }

    fn description(&self) -> &str {
        "Starts a command with bash in the background (a server, a watcher, a long build) \
         and returns its id at once. Read its output with shell_output, end it with \
         shell_kill; it is killed with everything it started when it ends, at its timeout, \
         or when this agent disconnects."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Start a background command")
            .destructive(true)
    }

    fn detach(&self, _: &(), _: &StartInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: StartInput,
        ctx: CallContext,
    ) -> Result<Started, ShellError> {
        let shell = &self.0;
        let config = &shell.config;
        if input.timeout_secs == Some(0) {
            return Err(ShellError::Invalid(
                "timeout_secs is 0; give at least 1".into(),
            ));
        }
        let limits = Limits {
            running: config.background_per_agent,
            output_bytes: config.background_output_mib.saturating_mul(1024 * 1024),
            timeout: input.timeout_secs.map(Duration::from_secs),
        };
        let owner = ctx.agent_shared().cloned();
        let job = shell
            .jobs
            .start(owner, input.command.clone(), limits, || {
                let command =
                    process::command(shell, ctx.agent(), &input.command, input.cwd.as_deref())?;
                let (reader, writer) = std::io::pipe()?;
                let (child, group) = command.spawn(&shell.bash, writer.as_fd(), writer.as_fd())?;
                // Our copy of the pipe's writing end goes, so its end of file is the group's.
                drop((command, writer));
                let output =
                    tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
                Ok(Launched {
                    child,
                    group,
                    output,
                })
            })
            .await?;
        Ok(Started {
            id: job.id.to_string(),
            pid: job.pid,
        })
    }
}

impl Tool for ShellOutput {
    type Input = OutputInput;
    type Output = JobOutput;
    type Error = ShellError;
    type State = ();

    fn name(&self) -> &str {
        "shell_output"
    }

    fn description(&self) -> &str {
        "Reads what a background shell wrote since the last read, waiting up to wait_secs \
         for more, and tells whether it still runs or how it ended."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Read a background command's output")
    }

    fn detach(&self, _: &(), _: &OutputInput) -> Option<()> {
        Some(())
    }

    fn polls(_: &OutputInput) -> bool {
        true
    }

    async fn call(
        &self,
        _: &mut (),
        input: OutputInput,
        ctx: CallContext,
    ) -> Result<JobOutput, ShellError> {
        if input.wait_secs > MAX_WAIT_SECS {
            return Err(ShellError::Invalid(format!(
                "wait_secs is {}; give 0 to {MAX_WAIT_SECS}",
                input.wait_secs
            )));
        }
        let max = input.max_bytes.unwrap_or(DEFAULT_READ);
        if !(1..=MAX_READ).contains(&max) {
            return Err(ShellError::Invalid(format!(
                "max_bytes is {max}; give 1 to {MAX_READ}"
            )));
        }
        let job = self.0.jobs.get(&input.id, ctx.agent())?;
        let mut marks = job.mark.subscribe();
        let start = *job.cursor.lock().unwrap_or_else(PoisonError::into_inner);
        let waiting = async {
            let _ = marks
                .wait_for(|mark| mark.kept > start || mark.end.is_some())
                .await;
        };
        if input.wait_secs > 0 {
            tokio::select! {
                () = waiting => {}
                () = tokio::time::sleep(Duration::from_secs(input.wait_secs)) => {}
                () = ctx.cancellation().cancelled() => {}
            }
        }
        // The end is read before the output, so output written before the end is in this
        // read (or flagged `more`).
        let end = job.ended();
        let mut cursor = job.cursor.lock().unwrap_or_else(PoisonError::into_inner);
        let (bytes, kept, dropped) = {
            let spool = job.spool();
            (spool.read(*cursor, max), spool.kept(), spool.dropped())
        };
        let (text, consumed) = utf8_prefix(&bytes);
        *cursor += consumed as u64;
        Ok(JobOutput {
            id: input.id,
            output: text.into_owned(),
            more: *cursor < kept,
            running: end.is_none(),
            ended: end.map(|e| e.how),
            exit_code: end.and_then(|e| e.exit_code),
            signal: end.and_then(|e| e.signal),
            dropped_bytes: dropped,
        })
    }
}

/// `bytes` as text and how many of them it took: a character cut at the end by the read
/// limit is left for the next read (unless nothing else is there); invalid bytes are
/// replaced (then a cut character is too).
fn utf8_prefix(bytes: &[u8]) -> (std::borrow::Cow<'_, str>, usize) {
    let cut = match std::str::from_utf8(bytes) {
        Err(err) if err.error_len().is_none() && err.valid_up_to() > 0 => err.valid_up_to(),
        _ => bytes.len(),
    };
    (String::from_utf8_lossy(&bytes[..cut]), cut)
}

impl Tool for ShellKill {
    type Input = KillInput;
    type Output = Killed;
    type Error = ShellError;
    type State = ();

    fn name(&self) -> &str {
        "shell_kill"
    }

    fn description(&self) -> &str {
        "Ends a background shell (its whole process group) and forgets it, returning the \
         output it wrote that was not read yet."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("End a background command")
            .destructive(true)
    }

    fn detach(&self, _: &(), _: &KillInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: KillInput,
        ctx: CallContext,
    ) -> Result<Killed, ShellError> {
        let jobs = &self.0.jobs;
        let job = jobs.get(&input.id, ctx.agent())?;
        job.kill().await;
        jobs.forget(&job.id);
        let end = job.ended().unwrap_or(End {
            how: Ended::Killed,
            exit_code: None,
            signal: None,
        });
        let cursor = *job.cursor.lock().unwrap_or_else(PoisonError::into_inner);
        let unread = job.spool().read(cursor, MAX_READ);
        Ok(Killed {
            id: input.id,
            ended: end.how,
            exit_code: end.exit_code,
            unread_output: String::from_utf8_lossy(&unread).into_owned(),
        })
    }
}
