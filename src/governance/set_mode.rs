//! `set_mode`, the tool that switches an agent's working mode (see `mode`).

use std::sync::Arc;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Governance;
use super::mode::{Mode, SET_MODE};

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
