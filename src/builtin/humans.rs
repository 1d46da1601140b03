//! The humans in the loop as a subsystem.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::BuildError;
use crate::humans::tools::{AskHuman, Confirm, MAX_WAIT};
use crate::humans::{Humans, HumansConfig};
use crate::runtime::{BoxFuture, Install, Runtime, RuntimeBuilder, Subsystem};

/// `ask_human` and `confirm`: answered by the caller's own user when its MCP client can
/// ask, else mailed to the configured humans (registered with role `human` as it installs).
pub struct HumansInTheLoop(pub HumansConfig, OnceLock<Arc<Humans>>);

impl HumansInTheLoop {
    /// The humans of `config`.
    pub fn new(config: HumansConfig) -> Self {
        Self(config, OnceLock::new())
    }
}

impl Subsystem for HumansInTheLoop {
    fn name(&self) -> &'static str {
        "humans"
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            let humans = Humans::start(Arc::clone(install.office()), self.0.clone()).await?;
            let _ = self.1.set(Arc::clone(&humans));
            // They wait for a person by design; their deadline allows for the longest wait.
            let options = install
                .defaults()
                .clone()
                .timeout(MAX_WAIT + Duration::from_secs(10));
            install.tool_with(AskHuman(Arc::clone(&humans)), options.clone())?;
            install.tool_with(Confirm(humans), options)?;
            Ok(())
        })
    }
}

impl RuntimeBuilder {
    /// Adds `ask_human` and `confirm`: answered by the caller's own user when its MCP client
    /// can ask, else mailed to `config`'s humans (registered with role `human`).
    pub fn humans(self, config: HumansConfig) -> Self {
        self.subsystem(HumansInTheLoop::new(config))
    }
}

impl Runtime {
    /// The humans in the loop; `None` without `[humans]`.
    pub fn humans(&self) -> Option<Arc<Humans>> {
        self.subsystem::<HumansInTheLoop>()
            .and_then(|h| h.1.get())
            .cloned()
    }
}
