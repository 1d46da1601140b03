//! Background shells: `shell_start` runs a command and returns at once with an id;
//! `shell_output` reads what it wrote since the last read (waiting for more if asked);
//! `shell_kill` ends it.
//!
//! Each background command is an actor, a temporary child of the `shells` dynamic
//! supervisor (a command is not run twice, so a crashed one is not restarted: its job ends
//! `crashed`). The actor owns the process group: the group is killed whole when the command
//! exits (nothing it started in the background outlives it), passes its timeout, is killed
//! by its agent, when that agent's last connection ends, when the runtime stops (the
//! supervisor stops its children) and, with no grace, if the actor itself dies.
//!
//! Output (standard output and error, interleaved as written) goes to a [`Spool`]: memory
//! first, then an unnamed temporary file, bounded by `[shell] background_output_mib`.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use dashmap::DashMap;
use guildhall_actors::{Annotations, CallContext, Tool};
use guildhall_supervision::{ChildSpec, Restart, Supervisor};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use super::process::{self, Group, TERM_GRACE};
use super::spawn::Child;
use super::spool::Spool;
use super::{Shell, ShellError};
use crate::time::now_ms;

/// Finished jobs an agent can still read; past it, its oldest finished job is forgotten.
const KEEP_FINISHED: usize = 16;
/// The longest `shell_output` waits for new output.
pub(super) const MAX_WAIT_SECS: u64 = 60;
/// What `shell_output` returns at most per call.
const MAX_READ: usize = 1024 * 1024;
/// What `shell_output` returns per call when not told.
const DEFAULT_READ: usize = 64 * 1024;

/// How a background command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    /// It exited by itself (or a signal from elsewhere ended it).
    Exited,
    /// It ran past its timeout; its group was killed.
    TimedOut,
    /// `shell_kill` ended it.
    Killed,
    /// Its agent's last connection ended; its group was killed.
    AgentLeft,
    /// The runtime stopped; its group was killed.
    Stopped,
    /// Its actor failed; its group was killed.
    Crashed,
}

/// A job's end: how, and the exit status when there was one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct End {
    how: Ended,
    exit_code: Option<i32>,
    signal: Option<i32>,
}

/// What readers wait on: output kept so far, and the end once it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Mark {
    kept: u64,
    end: Option<End>,
}

/// One background command.
struct Job {
    id: Arc<str>,
    owner: Option<Arc<str>>,
    command: String,
    started_ms: u64,
    pid: Option<i32>,
    spool: Mutex<Spool>,
    /// Where the owner's next read starts.
    cursor: Mutex<u64>,
    mark: watch::Sender<Mark>,
    actor: OnceLock<ActorRef<JobMsg>>,
}

impl Job {
    fn spool(&self) -> std::sync::MutexGuard<'_, Spool> {
        self.spool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the end, unless one is recorded already (the first cause wins).
    fn end(&self, end: End) {
        self.mark.send_if_modified(|mark| {
            if mark.end.is_some() {
                return false;
            }
            mark.end = Some(end);
            true
        });
    }

    fn ended(&self) -> Option<End> {
        self.mark.borrow().end
    }

    fn info(&self) -> ShellInfo {
        let end = self.ended();
        ShellInfo {
            id: self.id.to_string(),
            agent: self.owner.as_deref().map(str::to_owned),
            command: self.command.clone(),
            pid: self.pid,
            started_ms: self.started_ms,
            running: end.is_none(),
            ended: end.map(|e| e.how),
            exit_code: end.and_then(|e| e.exit_code),
            output_bytes: self.spool().kept(),
        }
    }
}

/// A background shell as `status` lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ShellInfo {
    /// Its id.
    pub id: String,
    /// The agent that started it.
    pub agent: Option<String>,
    /// The command line.
    pub command: String,
    /// The process (and group) id.
    pub pid: Option<i32>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// Whether it is still running.
    pub running: bool,
    /// How it ended.
    pub ended: Option<Ended>,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Output kept so far.
    pub output_bytes: u64,
}

/// Every background job of a runtime, and the supervisor their actors run under.
#[derive(Default)]
pub(super) struct Jobs {
    jobs: DashMap<Arc<str>, Arc<Job>>,
    /// Start and forget are serialized, so the per-agent limits hold under racing starts.
    starting: tokio::sync::Mutex<()>,
    supervisor: RwLock<Option<Supervisor>>,
    next: AtomicU64,
}

/// The `shells` supervisor's id in the runtime's tree.
pub(super) const SHELLS: &str = "shells";

impl Jobs {
    /// Publishes the (re)started `shells` supervisor.
    pub(super) fn publish(&self, supervisor: Supervisor) {
        *self
            .supervisor
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(supervisor);
    }

    fn supervisor(&self) -> Option<Supervisor> {
        self.supervisor
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every job, by start.
    pub(super) fn list(&self) -> Vec<ShellInfo> {
        let mut all: Vec<ShellInfo> = self.jobs.iter().map(|j| j.info()).collect();
        all.sort_by_key(|j| j.started_ms);
        all
    }

    /// The job `id` if `caller` may see it. A job is its starter's alone (the embedding
    /// program, calling with no agent, sees all); another agent is told it does not exist.
    fn get(&self, id: &str, caller: Option<&str>) -> Result<Arc<Job>, ShellError> {
        self.jobs
            .get(id)
            .map(|j| Arc::clone(&j))
            .filter(|job| caller.is_none() || job.owner.as_deref() == caller)
            .ok_or_else(|| ShellError::UnknownShell(id.to_owned()))
    }

    /// Kills the running jobs of `agent` (its last connection ended) and forgets them.
    pub(super) fn agent_left(&self, agent: &str) {
        let theirs: Vec<Arc<Job>> = self
            .jobs
            .iter()
            .filter(|j| j.owner.as_deref() == Some(agent))
            .map(|j| Arc::clone(&j))
            .collect();
        for job in theirs {
            if let Some(actor) = job.actor.get() {
                let _ = actor.cast(JobMsg::Kill(Ended::AgentLeft, None));
            }
            self.jobs.remove(&job.id);
        }
    }
}

/// A spawned command handed to its actor.
struct Launched {
    child: Child,
    group: Group,
    output: tokio::net::unix::pipe::Receiver,
}

enum JobMsg {
    /// The command passed its timeout.
    TimedOut,
    /// The command's shell exited (with this status, if it could be read).
    Exited(Option<std::process::ExitStatus>),
    /// End it for this reason; reply once its group is gone.
    Kill(Ended, Option<ractor::RpcReplyPort<()>>),
}

struct JobActor;

struct JobState {
    job: Arc<Job>,
    group: Group,
    /// Set by a kill, so the exit that follows is reported as the kill.
    cause: Option<Ended>,
    reader: tokio::task::JoinHandle<()>,
    waiter: tokio::task::AbortHandle,
}

impl Drop for JobState {
    fn drop(&mut self) {
        // Reached with no end recorded only if the actor died abnormally: its group dies
        // with it (Group's drop) and readers are told.
        self.job.end(End {
            how: Ended::Crashed,
            exit_code: None,
            signal: None,
        });
        self.reader.abort();
        self.waiter.abort();
    }
}

impl Actor for JobActor {
    type Msg = JobMsg;
    type State = JobState;
    type Arguments = (Arc<Job>, Arc<Mutex<Option<Launched>>>, Option<Duration>);

    async fn pre_start(
        &self,
        myself: ActorRef<JobMsg>,
        (job, launched, timeout): Self::Arguments,
    ) -> Result<JobState, ActorProcessingErr> {
        // Temporary: started once; a second start has nothing to run.
        let Some(Launched {
            mut child,
            group,
            mut output,
        }) = launched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return Err("the command was started already".into());
        };
        let _ = job.actor.set(myself.clone());
        let reader = tokio::spawn({
            let job = Arc::clone(&job);
            async move {
                let mut buf = vec![0; 16 * 1024];
                while let Ok(n @ 1..) = output.read(&mut buf).await {
                    let kept = {
                        let mut spool = job.spool();
                        spool.push(&buf[..n]);
                        spool.kept()
                    };
                    job.mark.send_if_modified(|mark| {
                        let grew = mark.kept != kept;
                        mark.kept = kept;
                        grew
                    });
                }
            }
        });
        let waiter = tokio::spawn(async move {
            let status = match timeout {
                None => child.wait().await,
                Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                    Ok(status) => status,
                    Err(_) => {
                        let _ = myself.cast(JobMsg::TimedOut);
                        child.wait().await
                    }
                },
            };
            let _ = myself.cast(JobMsg::Exited(status.ok()));
        })
        .abort_handle();
        Ok(JobState {
            job,
            group,
            cause: None,
            reader,
            waiter,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<JobMsg>,
        msg: JobMsg,
        state: &mut JobState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JobMsg::TimedOut => {
                state.cause.get_or_insert(Ended::TimedOut);
                state.group.terminate().await;
            }
            JobMsg::Kill(why, reply) => {
                state.cause.get_or_insert(why);
                state.group.terminate().await;
                if let Some(reply) = reply {
                    let _ = reply.send(());
                }
            }
            JobMsg::Exited(status) => {
                // Nothing the command started outlives it; its pipe closes with it.
                state.group.terminate().await;
                let _ = tokio::time::timeout(TERM_GRACE, &mut state.reader).await;
                state.job.end(End {
                    how: state.cause.unwrap_or(Ended::Exited),
                    exit_code: status.and_then(|s| s.code()),
                    signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
                });
                myself.stop(None);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<JobMsg>,
        state: &mut JobState,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped before its command ended: the runtime is stopping.
        if state.job.ended().is_none() {
            state.group.terminate().await;
            state.job.end(End {
                how: state.cause.unwrap_or(Ended::Stopped),
                exit_code: None,
                signal: None,
            });
        }
        Ok(())
    }
}

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
        let jobs = &shell.jobs;
        let supervisor = jobs.supervisor().ok_or(ShellError::Stopping)?;
        let owner = ctx.agent_shared().cloned();
        let _starting = jobs.starting.lock().await;
        let (running, finished) = jobs.counts(owner.as_deref());
        if running >= config.background_per_agent {
            return Err(ShellError::Invalid(format!(
                "this agent has {running} background shells running, the most allowed \
                 (`[shell] background_per_agent`); end one with shell_kill first"
            )));
        }
        if finished.len() >= KEEP_FINISHED {
            let oldest = finished
                .iter()
                .min_by_key(|j| j.started_ms)
                .map(|j| Arc::clone(&j.id));
            if let Some(oldest) = oldest {
                jobs.jobs.remove(&oldest);
            }
        }
        let command = process::command(shell, ctx.agent(), &input.command, input.cwd.as_deref())?;
        let (reader, writer) = std::io::pipe()?;
        let (child, group) = command.spawn(&shell.bash, writer.as_fd(), writer.as_fd())?;
        // Our copy of the pipe's writing end goes, so its end of file is the group's.
        drop((command, writer));
        let output = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
        let n = jobs.next.fetch_add(1, Ordering::Relaxed) + 1;
        let id: Arc<str> = Arc::from(format!("sh{n}"));
        let job = Arc::new(Job {
            id: Arc::clone(&id),
            owner,
            command: input.command,
            started_ms: now_ms(),
            pid: group.id(),
            spool: Mutex::new(Spool::new(
                config.background_output_mib.saturating_mul(1024 * 1024),
            )),
            cursor: Mutex::new(0),
            mark: watch::Sender::new(Mark::default()),
            actor: OnceLock::new(),
        });
        let launched = Arc::new(Mutex::new(Some(Launched {
            child,
            group,
            output,
        })));
        let timeout = input.timeout_secs.map(Duration::from_secs);
        let spec = ChildSpec::actor(format!("shell/{id}"), {
            let job = Arc::clone(&job);
            move || (JobActor, (Arc::clone(&job), Arc::clone(&launched), timeout))
        })
        .restart(Restart::Temporary);
        jobs.jobs.insert(Arc::clone(&id), Arc::clone(&job));
        if let Err(err) = supervisor.start_child(spec).await {
            // Its launch (and group) died with the spec, unstarted.
            jobs.jobs.remove(&id);
            return Err(ShellError::Supervisor(Arc::new(err)));
        }
        // The agent left while this call was starting it: it goes the way of its others.
        if !jobs.jobs.contains_key(&id)
            && let Some(actor) = job.actor.get()
        {
            let _ = actor.cast(JobMsg::Kill(Ended::AgentLeft, None));
        }
        Ok(Started {
            id: id.to_string(),
            pid: job.pid,
        })
    }
}

impl Jobs {
    /// How many of `owner`'s jobs run, and its finished ones.
    fn counts(&self, owner: Option<&str>) -> (usize, Vec<Arc<Job>>) {
        let mut running = 0;
        let mut finished = Vec::new();
        for job in &self.jobs {
            if job.owner.as_deref() != owner {
                continue;
            }
            if job.ended().is_some() {
                finished.push(Arc::clone(&job));
            } else {
                running += 1;
            }
        }
        (running, finished)
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
        if job.ended().is_none() {
            if let Some(actor) = job.actor.get() {
                // The actor answers once the group is gone; an actor already stopping has
                // recorded (or is recording) the end.
                let _ = ractor::call!(actor, |reply| JobMsg::Kill(Ended::Killed, Some(reply)));
            }
            let mut marks = job.mark.subscribe();
            let _ = tokio::time::timeout(TERM_GRACE * 4, marks.wait_for(|mark| mark.end.is_some()))
                .await;
        }
        jobs.jobs.remove(&job.id);
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
