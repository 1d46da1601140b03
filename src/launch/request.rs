//! What a caller asks of the launcher, and why it may be refused.

use crate::agents::MailError;
use crate::tasks::{TaskError, TaskId};

/// Bytes of a prompt at most: it is passed as one argument (`{prompt}`), and Linux refuses
/// a program whose single argument is over 128 KiB (`MAX_ARG_STRLEN`), so a longer prompt
/// would start nothing and restart until given up.
pub const MAX_PROMPT: usize = 64 * 1024;

/// Why an agent could not be launched or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// No profile of that name, or none given where several exist.
    #[error("{0}")]
    Profile(String),
    /// A launched agent of that id is alive.
    #[error("agent `{0}` is already launched and alive; stop it first")]
    Duplicate(String),
    /// No launched agent has that id.
    #[error("no launched agent `{0}`; `list_agents` shows them")]
    Unknown(String),
    /// Too many launched agents.
    #[error("{0}")]
    Limit(String),
    /// The caller may not stop this agent.
    #[error("`{caller}` may not stop `{agent}`: only an agent above it, or the server, may")]
    NotAbove {
        /// Who asked.
        caller: String,
        /// The agent.
        agent: String,
    },
    /// A field out of range or malformed.
    #[error("invalid `{name}`: {reason}")]
    InvalidArgument {
        /// The field.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Registering the agent or mailing failed.
    #[error(transparent)]
    Agent(#[from] MailError),
    /// The task named could not be read or assigned.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// Its working directory or files could not be prepared.
    #[error("could not prepare agent `{agent}`: {reason}")]
    Prepare {
        /// The agent.
        agent: String,
        /// What failed.
        reason: String,
    },
    /// The runtime has stopped.
    #[error("{0}")]
    Unavailable(String),
    /// The `launched` supervisor refused to start or stop an agent's actor.
    #[error("the `launched` supervisor refused")]
    Supervisor(#[from] guildhall_supervision::SupervisorError),
    /// The launcher's tools could not be registered.
    #[error(transparent)]
    Registration(#[from] crate::BuildError),
}

/// What `spawn_agent` asks for.
#[derive(Debug, Clone, Default)]
pub struct SpawnRequest {
    /// The agent's id; generated from the role when absent.
    pub id: Option<String>,
    /// Its role.
    pub role: String,
    /// Who it reports to (and who hears of its exit).
    pub parent: Option<String>,
    /// What to tell it (`{prompt}`).
    pub prompt: Option<String>,
    /// A task to give it: assigned to it, and its prompt when none is given.
    pub task: Option<TaskId>,
    /// Which profile; the only one when there is one.
    pub profile: Option<String>,
}
