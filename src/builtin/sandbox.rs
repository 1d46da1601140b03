//! The sandbox of every process started for an agent, as a subsystem.

use std::sync::Arc;

use crate::error::BuildError;
use crate::files::Files;
use crate::runtime::{BoxFuture, Install, Runtime, RuntimeBuilder, Subsystem};
use crate::sandbox::{Confiner, Sandbox};

/// Confines every process started for an agent (command tools, proxied servers, launched
/// agents; the shell has its own) with a sandbox, read-write in the agent's roots of the
/// file tools (else in the process's own directory). It adds no tool.
pub struct Confinement(pub Confiner);

impl Subsystem for Confinement {
    fn name(&self) -> &'static str {
        "sandbox"
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            let sandbox = &self.0.sandbox;
            super::watch(sandbox, install);
            // The sandbox processes run in is the one `whoami` describes.
            install.describe_confining_sandbox(super::describe(sandbox));
            Ok(())
        })
    }
}

impl RuntimeBuilder {
    /// Confines every process started for an agent (command tools, proxied servers,
    /// launched agents; the shell has its own) with `sandbox`, read-write in the agent's
    /// roots of `files` (else in the process's own directory).
    pub fn sandbox(self, sandbox: &Arc<Sandbox>, files: Option<&Arc<Files>>) -> Self {
        self.subsystem(Confinement(Confiner {
            sandbox: Arc::clone(sandbox),
            files: files.map(Arc::clone),
        }))
    }
}

impl Runtime {
    /// The sandbox processes started for agents run in: the one given to
    /// [`RuntimeBuilder::sandbox`], else the shell's.
    pub fn sandbox(&self) -> Option<&Arc<Sandbox>> {
        self.confiner().map(|confiner| &confiner.sandbox)
    }

    /// The sandbox and the roots processes started for agents get.
    pub(crate) fn confiner(&self) -> Option<&Confiner> {
        match self.subsystem::<Confinement>() {
            Some(confinement) => Some(&confinement.0),
            None => self
                .subsystem::<super::shell::ShellTools>()
                .map(super::shell::ShellTools::confiner),
        }
    }
}
