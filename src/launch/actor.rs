//! The actor that owns one launched agent's process.
//!
//! `pre_start` starts the process (or, past the profile's restart intensity, gives the agent
//! up); a task waits for the process and tells the actor how it ended; the actor mails the
//! parent and applies the restart type: ending normally (not restarted: the child spec is
//! transient) or failing (restarted by the `launched` supervisor, with its backoff).
//! `post_stop` kills the process group, whatever stopped the actor.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::json;

use super::launched::{Launch, LaunchState};
use crate::agents::{Outgoing, now_ms};
use crate::process_group::ProcessGroup;
use crate::servers::RestartType;

pub(crate) struct LaunchedActor(pub(crate) Arc<Launch>);

pub(crate) enum LaunchMsg {
    /// The process ended: its exit code, or the signal that killed it.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

pub(crate) struct LaunchedState {
    /// The process's group, killed when the actor stops (`None`: given up).
    group: Option<ProcessGroup>,
    waiter: Option<tokio::task::JoinHandle<()>>,
}

impl Actor for LaunchedActor {
    type Msg = LaunchMsg;
    type State = LaunchedState;
    type Arguments = ();

    /// Starts the process. A process that cannot be started fails the start, so the
    /// supervisor tries again with backoff, counted against the intensity like an exit.
    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (): (),
    ) -> Result<Self::State, ActorProcessingErr> {
        let launch = &self.0;
        if let Err(why) = count_start(launch) {
            tracing::warn!(agent = %launch.agent, "{why}");
            {
                let mut status = launch.status();
                status.state = LaunchState::GaveUp;
                status.pid = None;
            }
            tell_parent(launch, "gave up", &why, None).await;
            end_children(launch);
            myself.stop(Some(why));
            return Ok(LaunchedState {
                group: None,
                waiter: None,
            });
        }
        let spawned = command(launch).and_then(|mut command| {
            command.spawn().map_err(|err| {
                format!(
                    "could not run `{}`: {err}",
                    launch.argv().first().map_or("", String::as_str)
                )
            })
        });
        let child = match spawned {
            Ok(child) => child,
            Err(why) => {
                launch.status().last_exit = Some(why.clone());
                return Err(why.into());
            }
        };
        let pid = child.id();
        let group = pid
            .and_then(|p| i32::try_from(p).ok())
            .map(ProcessGroup::new);
        let waiter = wait_for_exit(launch, child, myself);
        {
            let mut status = launch.status();
            status.state = LaunchState::Running;
            status.pid = pid;
            status.started_ms = Some(now_ms());
        }
        tracing::info!(agent = %launch.agent, pid, "launched agent started");
        Ok(LaunchedState {
            group,
            waiter: Some(waiter),
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(group) = &mut state.group {
            group.terminate().await;
        }
        if let Some(waiter) = state.waiter.take() {
            waiter.abort();
        }
        self.0.status().pid = None;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let LaunchMsg::Exited { code, signal } = msg;
        let launch = &self.0;
        // Whatever it left running in its group goes with it.
        if let Some(group) = &mut state.group {
            group.terminate().await;
        }
        let how = match (code, signal) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(signal)) => format!("was killed by signal {signal}"),
            _ => "ended".to_owned(),
        };
        let stopped = launch.status().state == LaunchState::Ended;
        let again = !stopped
            && match launch.profile.restart {
                RestartType::Temporary => false,
                RestartType::Transient => code != Some(0),
                RestartType::Permanent => true,
            };
        let idle = !again && !stopped && launch.profile.wake_on_mail;
        {
            let mut status = launch.status();
            status.last_exit = Some(how.clone());
            status.pid = None;
            status.state = if again {
                LaunchState::Restarting
            } else if idle {
                LaunchState::Idle
            } else {
                LaunchState::Ended
            };
        }
        let next = if again {
            "it is restarted"
        } else if idle {
            "it is idle until mail wakes it"
        } else {
            "it is done"
        };
        // An agent that wakes on mail goes idle after each round: its parent hears of the
        // first, and of any failure, not of every round.
        let news = !(idle && code == Some(0) && launch.status().woken);
        if news {
            tell_parent(launch, "exited", &format!("{how}; {next}"), code).await;
        }
        if again {
            return Err(format!("agent `{}` {how}", launch.agent).into());
        }
        if idle {
            if let Some(family) = launch.family.upgrade() {
                family.idle(Arc::clone(launch));
            }
        } else {
            end_children(launch);
        }
        myself.stop(Some(how));
        Ok(())
    }
}

/// Mails the agent's parent, from the agent, that it `event` (`exited`, `gave up`).
async fn tell_parent(launch: &Launch, event: &str, detail: &str, code: Option<i32>) {
    let Some(parent) = &launch.parent else {
        return;
    };
    let Some(runtime) = launch.runtime.upgrade() else {
        return;
    };
    let Ok(agent) = runtime.agent(&launch.agent) else {
        return;
    };
    let tail = launch.log.tail(5);
    let mut body = format!("Launched agent `{}` {detail}.", launch.agent);
    if !tail.is_empty() {
        body.push_str(&format!("\nIts last output:\n{}", tail.join("\n")));
    }
    let message = Outgoing::to(parent.clone())
        .subject(format!("agent {} {event}", launch.agent))
        .body(body)
        .payload(json!({ "agent": launch.agent, "event": event, "exit_code": code }));
    if let Err(err) = agent.send(message).await {
        tracing::warn!(agent = %launch.agent, %parent, error = %guildhall_actors::ErrorChain(&err), "could not tell the parent");
    }
}

/// Counts a start: one after the first is a restart, against the profile's intensity. Past
/// it, why the agent is given up.
fn count_start(launch: &Launch) -> Result<(), String> {
    let mut status = launch.status();
    if status.starts > 0
        && let Err(exceeded) = status.restarts.record(Instant::now())
    {
        return Err(format!(
            "gave up: restarted {} times within {}",
            exceeded.restarts,
            humantime::format_duration(exceeded.period)
        ));
    }
    status.starts += 1;
    Ok(())
}

/// The agent's process, ready to start: its argv in its directory, the server's
/// environment without `GUILDHALL_*` plus its own, in its sandbox when it has one, in a
/// process group of its own (whatever it starts dies with it), its output piped to the log.
fn command(launch: &Launch) -> Result<tokio::process::Command, String> {
    let argv = launch.argv();
    let Some((program, args)) = argv.split_first() else {
        return Err("its command line is empty".into());
    };
    let mut command = tokio::process::Command::new(program);
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| !name.starts_with("GUILDHALL_"))
        .chain(launch.env.iter().cloned())
        .collect();
    let env = match &launch.confined {
        Some(confined) => {
            let confinement = confined
                .confiner
                .confine(Some(&launch.agent), &launch.cwd, &confined.extra)
                .map_err(|err| format!("its sandbox: {err}"))?;
            let env = confined
                .confiner
                .sandbox
                .environment(confinement.as_deref(), env);
            if let Some(confinement) = confinement {
                // SAFETY: the hook makes only system calls on what was prepared before
                // the fork (see sandbox::child).
                #[allow(unsafe_code)]
                unsafe {
                    command.pre_exec(confinement.pre_exec());
                }
            }
            env
        }
        None => env,
    };
    command
        .args(args)
        .env_clear()
        .envs(env)
        .current_dir(&launch.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    Ok(command)
}

/// Follows `child`'s output into the log and tells the actor how it ended.
fn wait_for_exit(
    launch: &Launch,
    mut child: tokio::process::Child,
    myself: ActorRef<LaunchMsg>,
) -> tokio::task::JoinHandle<()> {
    launch.log.clear_tail();
    let outputs = [
        child.stdout.take().map(|out| launch.log.follow(out)),
        child.stderr.take().map(|err| launch.log.follow(err)),
    ];
    tokio::spawn(async move {
        let status = child.wait().await;
        // What it wrote last is in the log before anyone is told it ended (bounded: a
        // process it left behind may hold the pipes open).
        for reading in outputs.into_iter().flatten() {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(200), reading).await;
        }
        let (code, signal) = match status {
            Ok(status) => (status.code(), status.signal()),
            Err(_) => (None, None),
        };
        let _ = myself.cast(LaunchMsg::Exited { code, signal });
    })
}

/// For an agent that ended for good: its family (the launcher) ends the agents it launched
/// that stop with it and drops its spec.
fn end_children(launch: &Arc<Launch>) {
    if let Some(family) = launch.family.upgrade() {
        family.ended(&launch.agent);
    }
}
