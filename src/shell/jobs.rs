//! The background shells' jobs. Each background command is an actor, a temporary child of
//! the `shells` dynamic supervisor (a command is not run twice, so a crashed one is not
//! restarted: its job ends `crashed`). The actor owns the process group: the group is
//! killed whole when the command exits (nothing it started in the background outlives it),
//! passes its timeout, is killed by its agent, when that agent's last connection ends, when
//! the runtime stops (the supervisor stops its children) and, with no grace, if the actor
//! itself dies.
//!
//! Output (standard output and error, interleaved as written) goes to a [`Spool`]: memory
//! first, then an unnamed temporary file, bounded by `[shell] background_output_mib`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use dashmap::DashMap;
use guildhall_supervision::{ChildSpec, Restart, Supervisor};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use super::config::ShellError;
use super::spawn::Child;
use super::spool::Spool;
use crate::process_group::{ProcessGroup as Group, TERM_GRACE};
use crate::time::now_ms;

/// Finished jobs an agent can still read; past it, its oldest finished job is forgotten.
const KEEP_FINISHED: usize = 16;

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
pub(super) struct End {
    pub(super) how: Ended,
    pub(super) exit_code: Option<i32>,
    pub(super) signal: Option<i32>,
}

/// What readers wait on: output kept so far, and the end once it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Mark {
    pub(super) kept: u64,
    pub(super) end: Option<End>,
}

/// One background command.
pub(super) struct Job {
    pub(super) id: Arc<str>,
    owner: Option<Arc<str>>,
    command: String,
    started_ms: u64,
    pub(super) pid: Option<i32>,
    spool: Mutex<Spool>,
    /// Where the owner's next read starts.
    pub(super) cursor: Mutex<u64>,
    pub(super) mark: watch::Sender<Mark>,
    actor: OnceLock<ActorRef<JobMsg>>,
}

impl Job {
    pub(super) fn spool(&self) -> std::sync::MutexGuard<'_, Spool> {
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

    pub(super) fn ended(&self) -> Option<End> {
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
    pub(super) fn get(&self, id: &str, caller: Option<&str>) -> Result<Arc<Job>, ShellError> {
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

/// What bounds one agent's background shells and each one's run.
pub(super) struct Limits {
    /// Its jobs running at once (`[shell] background_per_agent`).
    pub(super) running: usize,
    /// Output kept per job.
    pub(super) output_bytes: u64,
    /// How long this one may run.
    pub(super) timeout: Option<Duration>,
}

impl Jobs {
    /// Starts a job of `owner` running `command`, spawned by `spawn` once there is room:
    /// below `limits.running` of its jobs running (starts are serialized, so racing starts
    /// hold to it), its oldest finished job forgotten past [`KEEP_FINISHED`].
    ///
    /// # Errors
    /// [`ShellError::Stopping`] without a supervisor, [`ShellError::Invalid`] at the
    /// limit, what `spawn` returns, and [`ShellError::Supervisor`] if the actor cannot
    /// start (its group then dies unstarted).
    pub(super) async fn start(
        &self,
        owner: Option<Arc<str>>,
        command: String,
        limits: Limits,
        spawn: impl FnOnce() -> Result<Launched, ShellError>,
    ) -> Result<Arc<Job>, ShellError> {
        let supervisor = self.supervisor().ok_or(ShellError::Stopping)?;
        let _starting = self.starting.lock().await;
        let (running, finished) = self.counts(owner.as_deref());
        if running >= limits.running {
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
                self.jobs.remove(&oldest);
            }
        }
        let launched = spawn()?;
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let id: Arc<str> = Arc::from(format!("sh{n}"));
        let job = Arc::new(Job {
            id: Arc::clone(&id),
            owner,
            command,
            started_ms: now_ms(),
            pid: launched.group.id(),
            spool: Mutex::new(Spool::new(limits.output_bytes)),
            cursor: Mutex::new(0),
            mark: watch::Sender::new(Mark::default()),
            actor: OnceLock::new(),
        });
        let launched = Arc::new(Mutex::new(Some(launched)));
        let timeout = limits.timeout;
        let spec = ChildSpec::actor(format!("shell/{id}"), {
            let job = Arc::clone(&job);
            move || (JobActor, (Arc::clone(&job), Arc::clone(&launched), timeout))
        })
        .restart(Restart::Temporary);
        self.jobs.insert(Arc::clone(&id), Arc::clone(&job));
        if let Err(err) = supervisor.start_child(spec).await {
            // Its launch (and group) died with the spec, unstarted.
            self.jobs.remove(&id);
            return Err(ShellError::Supervisor(Arc::new(err)));
        }
        // The agent left while this call was starting it: it goes the way of its others.
        if !self.jobs.contains_key(&id)
            && let Some(actor) = job.actor.get()
        {
            let _ = actor.cast(JobMsg::Kill(Ended::AgentLeft, None));
        }
        Ok(job)
    }

    /// Forgets job `id` (killed, or read to its end by its owner).
    pub(super) fn forget(&self, id: &str) {
        self.jobs.remove(id);
    }
}

impl Job {
    /// Kills its group, unless it has ended, and waits (a bounded time) for the end to be
    /// recorded.
    pub(super) async fn kill(&self) {
        if self.ended().is_some() {
            return;
        }
        if let Some(actor) = self.actor.get() {
            // The actor answers once the group is gone; an actor already stopping has
            // recorded (or is recording) the end.
            let _ = ractor::call!(actor, |reply| JobMsg::Kill(Ended::Killed, Some(reply)));
        }
        let mut marks = self.mark.subscribe();
        let _ =
            tokio::time::timeout(TERM_GRACE * 4, marks.wait_for(|mark| mark.end.is_some())).await;
    }
}

/// A spawned command handed to its actor.
pub(super) struct Launched {
    pub(super) child: Child,
    pub(super) group: Group,
    pub(super) output: tokio::net::unix::pipe::Receiver,
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
