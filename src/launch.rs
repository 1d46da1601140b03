//! Agents the runtime launches and supervises: a tech lead starts its workers with
//! `spawn_agent`, guildhall runs each as a process (a profile of `[launch]`: `claude -p …`
//! or any agent CLI) bound to its identity, and keeps it under supervision until it is done.
//!
//! ```text
//! root
//! └── launched         (one-for-one; never escalates; backoff 100 ms doubling to 10 s)
//!     └── <agent>      (the process's actor: transient; the profile's restart type and
//!                       intensity are applied by the actor, per agent)
//! ```
//!
//! - **Identity.** The agent is registered (role, parent: the caller by default) before its
//!   process starts, with `GUILDHALL_AGENT`, `GUILDHALL_ROLE`, `GUILDHALL_PARENT` and
//!   `GUILDHALL_DATA_DIR` in its environment and `{mcp_config}` naming a file that makes an
//!   MCP client connect back through `guildhall mcp` as that agent.
//! - **Supervision.** Its process runs in a process group of its own, its stdout and stderr
//!   in `<data dir>/launched/<agent>.log`. When it exits, its parent is mailed the exit and
//!   its code. Then, as OTP restart types say: `temporary` is done; `transient` is done
//!   after exit 0 and restarted otherwise; `permanent` is always restarted. Restarts past
//!   `max_restarts` within `period` give it up, and its parent is told.
//! - **Stopping.** `stop_agent` (by an agent above it, or the embedding program), its
//!   parent's own stop (`stop_with_parent`) and the runtime's shutdown kill the group.
//! - **Limits.** `max_agents` alive at once, `max_per_parent` started by one agent.

mod actor;
pub mod config;
mod launched;
mod launcher;
mod request;
pub mod tools;
mod wake;

use std::path::PathBuf;
use std::sync::Arc;

pub use config::{LaunchConfig, Profile};
pub use launched::{LaunchInfo, LaunchState};
pub use launcher::{AgentSockets, Launcher};
pub use request::{LaunchError, MAX_PROMPT, SpawnRequest};

use crate::runtime::Runtime;

/// How the launcher's files are wired: its supervisor and its two tools.
impl Launcher {
    /// Starts the `launched` supervisor under `runtime`'s root and registers `spawn_agent`
    /// and `stop_agent`. `data_dir` is the runtime's
    /// (agents connect back to it; `None` keeps logs in memory and gives no MCP config),
    /// `program` the `guildhall` they connect through, `base_dir` where relative paths of
    /// the config are taken from.
    ///
    /// # Errors
    /// An invalid `config`, or the runtime refusing the supervisor.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the `launched` supervisor started and the two tools
    /// registered or not, with no `Launcher` to use them; nothing is launched.
    pub async fn start(
        runtime: &Runtime,
        config: LaunchConfig,
        base_dir: PathBuf,
        data_dir: Option<PathBuf>,
        program: PathBuf,
    ) -> Result<Arc<Self>, LaunchError> {
        let launcher = Self::open(runtime, config, base_dir, data_dir, program).await?;
        for registered in [
            runtime
                .register(tools::SpawnAgent(Arc::clone(&launcher)))
                .await
                .map(drop),
            runtime
                .register(tools::StopAgent(Arc::clone(&launcher)))
                .await
                .map(drop),
        ] {
            registered?;
        }
        Ok(launcher)
    }
}
