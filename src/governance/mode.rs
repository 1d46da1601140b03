//! Working modes: what an agent may do right now. `build` is normal work; `plan` and
//! `explore` allow only the tools that declare themselves read-only (`readOnlyHint`), and
//! `explore` never waits on a person either (a rule's `ask` is a denial there).
//!
//! A mode starts from the config (`mode` of the agent, else of its role, else `build`) and
//! is switched with `set_mode`, an ordinary tool: a rule can make switching ask first
//! (`[[rules]] tool = "set_mode" action = "ask"`). Switching bumps the decision cache's
//! generation, so a call costs nothing more for modes existing.

use std::sync::Arc;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Governance;

/// The tool that switches modes; allowed in every mode.
pub const SET_MODE: &str = "set_mode";

/// What an agent may do right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Normal work: the rules decide.
    #[default]
    Build,
    /// Thinking it through: read-only tools only.
    Plan,
    /// Looking around quickly: read-only tools only, and nothing waits on a person.
    Explore,
}

impl Mode {
    /// The mode's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Build => "build",
            Self::Plan => "plan",
            Self::Explore => "explore",
        }
    }

    /// Whether only read-only tools may be called.
    pub fn is_read_only(self) -> bool {
        matches!(self, Self::Plan | Self::Explore)
    }
}

/// `set_mode`.
pub struct SetMode(pub(crate) Arc<Governance>);

/// Input of `set_mode`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModeInput {
    /// `plan` (read-only tools), `build` (normal work) or `explore` (read-only, and never
    /// waiting on a person).
    pub mode: Mode,
}

/// Output of `set_mode`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ModeOutput {
    /// The mode before.
    pub was: Mode,
    /// The mode now.
    pub mode: Mode,
}

/// Why a mode could not be set.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModeError {
    /// The call has no agent identity.
    #[error("this needs an agent identity: a mode is an agent's")]
    NoIdentity,
}

impl Tool for SetMode {
    type Input = ModeInput;
    type Output = ModeOutput;
    type Error = ModeError;
    type State = ();

    fn name(&self) -> &str {
        SET_MODE
    }

    fn description(&self) -> &str {
        "Switch your working mode: `plan` (only read-only tools: think, read, ask), `build` \
         (normal work) or `explore` (read-only and quick: nothing waits on a person). The \
         swarm's rules may ask a person before you switch."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Switch working mode")
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    }

    fn apart(&self, _: &ModeInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ModeInput,
        ctx: CallContext,
    ) -> Result<ModeOutput, ModeError> {
        let agent = ctx.agent().ok_or(ModeError::NoIdentity)?;
        let was = self.0.mode(agent);
        self.0.set_mode(agent, input.mode);
        Ok(ModeOutput {
            was,
            mode: input.mode,
        })
    }
}
