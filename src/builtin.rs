//! The built-in domains as [`Subsystem`](crate::runtime::Subsystem)s: the task board (in every runtime
//! [`Runtime::builder`] makes), the file tools, the shell, the sandbox, `web_fetch` and the
//! humans in the loop. Each plugs in through the same contract an embedder's own subsystem
//! does; the builder methods here ([`RuntimeBuilder::files`], [`RuntimeBuilder::shell`], …)
//! only add one.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::sync::Arc;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use crate::governance::sandboxed::SandboxReport;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use crate::runtime::Install;
use crate::runtime::{Runtime, RuntimeBuilder};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use crate::sandbox::Sandbox;

pub mod departures;
#[cfg(feature = "fetch")]
pub mod fetch;
pub mod files;
pub mod humans;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod sandbox;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod shell;
pub mod tasks;

impl Runtime {
    /// Starts configuring a runtime: the core (agents, context, governance), the task
    /// board, and the parent told when an agent leaves with work in hand.
    /// [`RuntimeBuilder::core`] leaves both out.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::core()
            .subsystem(tasks::TaskBoardSubsystem::default())
            .subsystem(departures::Departures::default())
    }
}

/// Tells `sandbox` how to find an agent's role (its network may depend on it) and where
/// to report what it allows and refuses (governance's events and audit log).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn watch(sandbox: &Arc<Sandbox>, install: &Install<'_>) {
    sandbox.resolve_roles_with(install.role_of());
    sandbox.report_to(Arc::new(SandboxReport(Arc::downgrade(
        install.governance(),
    ))));
}

/// What `whoami` says of `sandbox` to an agent: the mechanisms applied and its network.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn describe(sandbox: &Arc<Sandbox>) -> crate::agents::roster::SandboxOf {
    let sandbox = Arc::clone(sandbox);
    Arc::new(move |agent: &str| {
        serde_json::json!({
            "applied": sandbox.describe(),
            "network": sandbox.network_of(Some(agent)),
        })
    })
}
