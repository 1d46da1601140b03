//! A command tool as a guildhall tool: each call checks its input against the schema, fills
//! the argument template, and runs the program in a process group of its own, which is
//! killed whole when the program ends, when the call passes its timeout, is cancelled, or
//! is dropped for any other reason.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::manifest::{CommandSpec, Manifest, Output, Stdin};
use super::template;
use crate::process_group::ProcessGroup;
use crate::sandbox::Confinement;

/// Standard output kept per call; past it, bytes are counted (governance's truncation then
/// cuts what the model sees).
const STDOUT_KEPT: usize = 1024 * 1024;
/// Standard error kept per call, for the error a failed command reports.
const STDERR_KEPT: usize = 64 * 1024;
/// How much of standard error a failure message quotes (its end, where errors are).
const STDERR_QUOTED: usize = 4 * 1024;
/// After the program exits, how long what its group wrote may take to drain.
const DRAIN: Duration = Duration::from_millis(500);

/// A command tool's input: a JSON object, checked against the manifest's schema.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct CommandInput(pub Map<String, Value>);

/// Why a command tool call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The input does not match the tool's schema, or a value cannot be an argument.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The program could not be started.
    #[error("`{program}` could not be started")]
    Spawn {
        /// The program.
        program: String,
        /// The system's error.
        #[source]
        error: std::io::Error,
    },
    /// The program started, but its exit could not be waited for.
    #[error("`{program}` could not be waited for")]
    Wait {
        /// The program.
        program: String,
        /// The system's error.
        #[source]
        error: std::io::Error,
    },
    /// The program ended with an exit code (or signal) the manifest does not count as
    /// success.
    #[error("{0}")]
    Failed(String),
    /// It ran past the manifest's timeout, and its process group was killed.
    #[error("ran past its timeout of {0:?}; its process group was killed")]
    TimedOut(Duration),
    /// `output = "json"`, and standard output is not JSON.
    #[error("its output is not JSON: {0}")]
    NotJson(String),
    /// Its sandbox could not be set up (or `[sandbox] require` refused it).
    #[error(transparent)]
    Sandbox(crate::sandbox::SandboxError),
    /// The call was cancelled (its deadline, its caller gone); the group was killed.
    #[error("cancelled; its process group was killed")]
    Cancelled,
}

/// One command tool, confined when the runtime has a sandbox.
pub(crate) struct CommandTool(
    pub(crate) Manifest,
    pub(crate) Option<crate::sandbox::Confiner>,
);

impl Tool for CommandTool {
    type Input = CommandInput;
    type Output = Value;
    type Error = CommandError;
    type State = ();

    fn name(&self) -> &str {
        &self.0.spec.name
    }

    fn description(&self) -> &str {
        &self.0.spec.description
    }

    fn annotations(&self) -> Annotations {
        self.0.spec.annotations.clone()
    }

    fn input_schema(&self) -> Option<Arc<Value>> {
        Some(Arc::clone(&self.0.spec.input_schema))
    }

    /// Every call is its own process, run from the caller's task (it needs nothing of the
    /// actor): calls run side by side, up to the manifest's `concurrency` (the pipeline's
    /// in-flight bound).
    fn apart(&self, _: &CommandInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: CommandInput,
        ctx: CallContext,
    ) -> Result<Value, CommandError> {
        let spec = &self.0.spec;
        let confinement = match &self.1 {
            Some(confiner) => confiner
                .confine(ctx.agent(), &spec.cwd, &spec.sandbox)
                .map_err(CommandError::Sandbox)?,
            None => None,
        };
        let input = Value::Object(input.0);
        self.0
            .validator
            .check(&input)
            .map_err(CommandError::Invalid)?;
        let Value::Object(fields) = &input else {
            unreachable!("built from an object above")
        };
        let args = template::render(&spec.args, fields).map_err(CommandError::Invalid)?;

        let mut command = self.command(&args, confinement);
        let mut child = command.spawn().map_err(|error| CommandError::Spawn {
            program: if spec.shell {
                "/bin/sh".into()
            } else {
                spec.program.clone()
            },
            error,
        })?;
        // Killed whole when this call ends in any way but the program's own exit.
        let group = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(ProcessGroup::new);
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (mut out, mut err) = (Captured::new(STDOUT_KEPT), Captured::new(STDERR_KEPT));
        let run = async {
            let (exited, exited_seen) = tokio::sync::oneshot::channel::<()>();
            let waiting = async {
                let feeding = async {
                    if let Some(mut stdin) = stdin {
                        // A program that does not read its input closes the pipe: no error.
                        let _ = stdin.write_all(input.to_string().as_bytes()).await;
                    }
                };
                let (status, ()) = tokio::join!(child.wait(), feeding);
                // What the program left running goes with it; what it wrote stays in the
                // pipes to be read.
                if let Some(group) = &group {
                    group.kill();
                }
                let _ = exited.send(());
                status
            };
            let reading = async {
                let both = async { tokio::join!(out.read(stdout), err.read(stderr)) };
                // Something outside the group (a daemon that left it) may hold the pipes
                // open: what arrived shortly after the exit is all there is.
                let drained = async {
                    let _ = exited_seen.await;
                    tokio::time::sleep(DRAIN).await;
                };
                tokio::select! {
                    _ = both => {}
                    () = drained => {}
                }
            };
            tokio::join!(waiting, reading).0
        };
        // The call's deadline is the manifest's timeout unless the caller set its own: a
        // longer one is held to the manifest's (the pipeline's deadline covers the rest).
        let capped = async {
            if ctx.budget() > spec.timeout {
                tokio::time::sleep_until(ctx.started() + spec.timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let status = tokio::select! {
            biased;
            () = ctx.cancellation().cancelled() => return Err(CommandError::Cancelled),
            () = capped => return Err(CommandError::TimedOut(spec.timeout)),
            status = run => status,
        };
        let (out, out_dropped, err) = (out.kept, out.dropped, err.kept);
        let status = status.map_err(|error| CommandError::Wait {
            program: spec.program.clone(),
            error,
        })?;
        if !status
            .code()
            .is_some_and(|code| spec.ok_exit_codes.contains(&code))
        {
            return Err(CommandError::Failed(failure(&spec.name, status, &err)));
        }
        answer(spec, &out, out_dropped)
    }
}

impl CommandTool {
    /// The program's command: `args` after its program (or the script, with `sh -c`), the
    /// environment the sandbox allows, its own process group, its pipes, and the
    /// sandbox's confinement applied between fork and exec.
    fn command(
        &self,
        args: &[String],
        confinement: Option<Arc<Confinement>>,
    ) -> tokio::process::Command {
        let spec = &self.0.spec;
        let mut command = if spec.shell {
            let mut command = tokio::process::Command::new("/bin/sh");
            // `$0` is the tool's name (what the shell puts in its messages); the values
            // are `$1`, `$2`, …, never part of the script.
            command.arg("-c").arg(&spec.program).arg(&spec.name);
            command
        } else {
            tokio::process::Command::new(&spec.program)
        };
        let env = match &self.1 {
            Some(confiner) => confiner
                .sandbox
                .environment(confinement.as_deref(), crate::shell::environment(&[])),
            None => crate::shell::environment(&[]),
        };
        command
            .args(args)
            .env_clear()
            .envs(env)
            .envs(&spec.env)
            .current_dir(&spec.cwd)
            .process_group(0)
            .stdin(match spec.stdin {
                Stdin::None => Stdio::null(),
                Stdin::Json => Stdio::piped(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(confinement) = confinement {
            // SAFETY: the hook makes only system calls on what was prepared before the
            // fork (see sandbox::child).
            #[allow(unsafe_code)]
            unsafe {
                command.pre_exec(confinement.pre_exec());
            }
        }
        command
    }
}

/// A finished program's answer: its stdout as text (saying what was not kept) or as JSON.
fn answer(spec: &CommandSpec, out: &[u8], out_dropped: u64) -> Result<Value, CommandError> {
    match spec.output {
        Output::Text => {
            let mut text = String::from_utf8_lossy(out).into_owned();
            if out_dropped > 0 {
                text.push_str(&format!(
                    "\n[{out_dropped} more bytes of output were not kept]"
                ));
            }
            Ok(Value::String(text))
        }
        Output::Json if out_dropped > 0 => Err(CommandError::NotJson(format!(
            "it is longer than {STDOUT_KEPT} bytes, the most kept"
        ))),
        Output::Json => serde_json::from_slice(out).map_err(|parse| {
            let start = String::from_utf8_lossy(&out[..out.len().min(200)]).into_owned();
            CommandError::NotJson(format!("{parse}; it begins: {start:?}"))
        }),
    }
}

/// The message of a command that did not succeed: how it ended and the end of its stderr.
fn failure(tool: &str, status: ExitStatus, stderr: &[u8]) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".to_owned(),
    };
    let start = stderr.len().saturating_sub(STDERR_QUOTED);
    let tail = String::from_utf8_lossy(&stderr[start..]);
    let tail = tail.trim();
    if tail.is_empty() {
        format!("`{tool}` {how}")
    } else {
        format!("`{tool}` {how}: {tail}")
    }
}

/// What one output stream wrote: the first bytes, up to a cap, and a count of the rest.
struct Captured {
    kept: Vec<u8>,
    cap: usize,
    dropped: u64,
}

impl Captured {
    fn new(cap: usize) -> Self {
        Self {
            kept: Vec::new(),
            cap,
            dropped: 0,
        }
    }

    /// Reads `pipe` to its end. What was read stays here when the read is abandoned.
    async fn read(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        let Some(mut pipe) = pipe else { return };
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.kept.len()).min(n);
                    self.kept.extend_from_slice(&buf[..room]);
                    self.dropped += (n - room) as u64;
                }
            }
        }
    }
}
