//! The shell tools as a subsystem.

use std::sync::Arc;

use crate::error::BuildError;
use crate::runtime::{BoxFuture, Install, Metric, Runtime, RuntimeBuilder, Subsystem};
use crate::sandbox::Confiner;
use crate::shell::{Shell, ShellInfo};

/// `bash`, and the background shells `shell_start`, `shell_output` and `shell_kill` with
/// their supervisor (`shells`). An agent's background shells end when its last connection
/// does.
pub struct ShellTools {
    shell: Arc<Shell>,
    /// The shell's sandbox and roots: what processes started for agents get when no other
    /// sandbox is given.
    confiner: Confiner,
}

impl ShellTools {
    /// The tools of `shell`, confining what runs with its sandbox and roots.
    pub fn new(shell: &Arc<Shell>) -> Self {
        Self {
            shell: Arc::clone(shell),
            confiner: Confiner {
                sandbox: Arc::clone(shell.sandbox()),
                files: Some(Arc::clone(shell.files())),
            },
        }
    }

    pub(crate) fn confiner(&self) -> &Confiner {
        &self.confiner
    }
}

impl Subsystem for ShellTools {
    fn name(&self) -> &'static str {
        "shell"
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            let shell = &self.shell;
            shell.files().resolve_roles_with(install.role_of());
            super::watch(shell.sandbox(), install);
            install.describe_sandbox(super::describe(shell.sandbox()));
            install.child(shell.supervisor_spec());
            // `bash`'s deadline allows for the longest command the shell's settings permit;
            // none is retried (a command may have side effects).
            let once = install.defaults().clone().max_retries(0);
            let (start, output, kill) = shell.background_tools();
            install.tool_with(shell.tool(), once.clone().timeout(shell.max_call()))?;
            install.tool_with(start, once.clone())?;
            install.tool_with(output, once.clone().timeout(shell.max_output_wait()))?;
            install.tool_with(kill, once)?;
            Ok(())
        })
    }

    /// How many background shells run and how many have finished (the listing itself is
    /// [`Runtime::background_shells`]).
    fn status(&self) -> Option<serde_json::Value> {
        let shells = self.shell.background();
        let running = shells.iter().filter(|s| s.running).count();
        Some(serde_json::json!({ "running": running, "finished": shells.len() - running }))
    }

    fn metrics(&self) -> Vec<Metric> {
        let shells = self.shell.background();
        let running = shells.iter().filter(|s| s.running).count();
        vec![
            Metric::gauge(
                "background",
                "Background shells kept, running or finished (their output still readable)",
            )
            .sample(&[("state", "running")], running as f64)
            .sample(&[("state", "finished")], (shells.len() - running) as f64),
        ]
    }

    fn agent_left(&self, agent: &str) {
        self.shell.agent_left(agent);
    }
}

impl RuntimeBuilder {
    /// Adds the shell tools: `bash`, and the background shells `shell_start`,
    /// `shell_output` and `shell_kill` with their supervisor. `bash`'s deadline allows for
    /// the longest command the shell's settings permit; none is retried (a command may
    /// have side effects). An agent's background shells end when its last connection does.
    pub fn shell(self, shell: &Arc<Shell>) -> Self {
        self.subsystem(ShellTools::new(shell))
    }
}

impl Runtime {
    /// The background shells (with `[shell]`), running and finished, oldest first.
    pub fn background_shells(&self) -> Vec<ShellInfo> {
        self.subsystem::<ShellTools>()
            .map(|tools| tools.shell.background())
            .unwrap_or_default()
    }
}
