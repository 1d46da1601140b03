//! `web_fetch` as a subsystem.

use std::sync::Arc;

use crate::error::BuildError;
use crate::fetch::Fetch;
use crate::runtime::{BoxFuture, Install, RuntimeBuilder, Subsystem};

/// The `web_fetch` tool. Its deadline allows for the fetch's own timeout.
pub struct WebFetch(pub Arc<Fetch>);

impl Subsystem for WebFetch {
    fn name(&self) -> &'static str {
        "fetch"
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            let options = install.defaults().clone().timeout(self.0.max_call());
            install.tool_with(self.0.tool(), options)?;
            Ok(())
        })
    }
}

impl RuntimeBuilder {
    /// Adds the `web_fetch` tool. Its deadline allows for the fetch's own timeout.
    pub fn fetch(self, fetch: &Arc<Fetch>) -> Self {
        self.subsystem(WebFetch(Arc::clone(fetch)))
    }
}
