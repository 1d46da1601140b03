//! The built-in shell tools. Every command runs with `bash -c` in its own session and
//! process group, in a directory inside the file tools' roots, with a filtered environment
//! and resource limits ([`process`]).
//!
//! - `bash` ([`bash`]): one command, waited for, its output streamed as progress. The whole
//!   group is killed when the command ends (no background child outlives it), when it
//!   passes its timeout, when the call is cancelled, and when the call's future is dropped
//!   for any other reason (the runtime stopping, the pipeline cutting off a stuck call).
//! - `shell_start`, `shell_output`, `shell_kill` ([`background`]): a command left running,
//!   each one a supervised actor holding its process group and its output.
//!
//! Off unless configured: `[shell]` in `guildhall.toml`, or
//! [`RuntimeBuilder::shell`](crate::RuntimeBuilder::shell).

mod background;
mod bash;
mod config;
mod jobs;
mod process;
mod spawn;
mod spool;
mod state;

use std::sync::Arc;
use std::time::Duration;

use guildhall_supervision::{ChildSpec, DynamicSpec, Supervisor};

pub use background::{
    JobOutput, KillInput, Killed, OutputInput, ShellKill, ShellOutput, ShellStart, StartInput,
    Started,
};
pub use bash::{Bash, BashInput, BashOutput};
pub use config::{ShellConfig, ShellError};
pub use jobs::{Ended, ShellInfo};
pub(crate) use process::environment;
pub use state::Shell;

/// How the shell's files are wired: its tools and the background shells' supervisor.
impl Shell {
    /// The longest a `shell_output` call may wait, with room to answer.
    pub fn max_output_wait(&self) -> Duration {
        Duration::from_secs(background::MAX_WAIT_SECS + 5)
    }

    /// The `bash` tool.
    pub fn tool(self: &Arc<Self>) -> Bash {
        Bash(Arc::clone(self))
    }

    /// The background shell tools: `shell_start`, `shell_output`, `shell_kill`.
    pub fn background_tools(self: &Arc<Self>) -> (ShellStart, ShellOutput, ShellKill) {
        (
            ShellStart(Arc::clone(self)),
            ShellOutput(Arc::clone(self)),
            ShellKill(Arc::clone(self)),
        )
    }

    /// The supervisor the background shells run under, as a child of the runtime's root:
    /// one-for-one and never escalating (a background command's failure is its own).
    pub fn supervisor_spec(self: &Arc<Self>) -> ChildSpec {
        let shell = Arc::clone(self);
        ChildSpec::dynamic_supervisor(jobs::SHELLS, DynamicSpec::never_escalate()).on_start(
            move |cell| {
                shell
                    .jobs
                    .publish(Supervisor::from_ref(cell.clone().into()));
            },
        )
    }

    /// The background shells, running and finished, oldest first.
    pub fn background(&self) -> Vec<ShellInfo> {
        self.jobs.list()
    }

    /// Kills and forgets the background shells of `agent`, whose last connection ended.
    pub fn agent_left(&self, agent: &str) {
        self.jobs.agent_left(agent);
    }
}
