//! Working modes: what an agent may do right now. `build` is normal work; `plan` and
//! `explore` allow only the tools that declare themselves read-only (`readOnlyHint`), and
//! `explore` never waits on a person either (a rule's `ask` is a denial there).
//!
//! A mode starts from the config (`mode` of the agent, else of its role, else `build`) and
//! is switched with `set_mode`, an ordinary tool: a rule can make switching ask first
//! (`[[rules]] tool = "set_mode" action = "ask"`). Switching bumps the decision cache's
//! generation, so a call costs nothing more for modes existing. The tool is in `set_mode`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
