//! `spawn_agent` and `stop_agent`: launching and stopping agents from an agent.
//!
//! Both act for the calling agent: a spawned agent reports to the caller unless another
//! parent is named, and only an agent above a launched one may stop it. Calls are detached
//! from the tool actors: the launcher orders them.

use std::sync::Arc;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{LaunchError, LaunchInfo, Launcher, SpawnRequest};
use crate::tasks::TaskId;

/// `spawn_agent`.
pub struct SpawnAgent(pub Arc<Launcher>);

/// Input of `spawn_agent`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnInput {
    /// Its role (`dev`, `pm`, …).
    pub role: String,
    /// Its id; made from the role when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Who it reports to and who hears when it exits; you, when absent.
    #[serde(default)]
    pub parent: Option<String>,
    /// What to tell it to do.
    #[serde(default)]
    pub prompt: Option<String>,
    /// A task of the board to give it: assigned to it, and its prompt if none is given.
    #[serde(default)]
    pub task: Option<TaskId>,
    /// Which launch profile of guildhall.toml; the only one when there is one.
    #[serde(default)]
    pub profile: Option<String>,
}

/// A launched agent.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LaunchView {
    /// Its id.
    pub agent: String,
    /// Its role.
    pub role: String,
    /// Who it reports to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Its profile.
    pub profile: String,
    /// `running`, `restarting`, `idle` (waits for mail to wake it), `ended` or `gave_up`.
    pub state: String,
    /// Its process, while one runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Times it was started again.
    pub restarts: u64,
    /// How its last process ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
}

impl From<LaunchInfo> for LaunchView {
    fn from(info: LaunchInfo) -> Self {
        Self {
            agent: info.agent,
            role: info.role,
            parent: info.parent,
            profile: info.profile,
            state: info.state.as_str().to_owned(),
            pid: info.pid,
            restarts: info.restarts,
            last_exit: info.last_exit,
        }
    }
}

impl Tool for SpawnAgent {
    type Input = SpawnInput;
    type Output = LaunchView;
    type Error = LaunchError;
    type State = ();

    fn name(&self) -> &str {
        "spawn_agent"
    }

    fn description(&self) -> &str {
        "Start a new agent (a process of a launch profile, e.g. Claude Code) that works for \
         you: it is registered with `role` and reports to you, connects back to this swarm \
         as itself, and is supervised: you are mailed when it exits (with its exit code), \
         and it is restarted if it crashes. Give it a `prompt` or a board `task`."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Launch an agent")
            .destructive(false)
            .open_world(true)
    }

    fn detach(&self, _: &(), _: &SpawnInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: SpawnInput,
        ctx: CallContext,
    ) -> Result<LaunchView, LaunchError> {
        let request = SpawnRequest {
            id: input.id,
            role: input.role,
            parent: input.parent,
            prompt: input.prompt,
            task: input.task,
            profile: input.profile,
        };
        Ok(self.0.spawn(ctx.agent(), request).await?.into())
    }
}

/// `stop_agent`.
pub struct StopAgent(pub Arc<Launcher>);

/// Input of `stop_agent`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopInput {
    /// The launched agent to stop (one you, or an agent below you, started).
    pub id: String,
}

impl Tool for StopAgent {
    type Input = StopInput;
    type Output = LaunchView;
    type Error = LaunchError;
    type State = ();

    fn name(&self) -> &str {
        "stop_agent"
    }

    fn description(&self) -> &str {
        "Stop an agent you launched (or one below you): its process and everything it \
         started are killed, and so are the agents it launched. It is not restarted."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Stop a launched agent")
            .destructive(true)
            .idempotent(true)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &StopInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: StopInput,
        ctx: CallContext,
    ) -> Result<LaunchView, LaunchError> {
        Ok(self.0.stop(ctx.agent(), &input.id).await?.into())
    }
}
