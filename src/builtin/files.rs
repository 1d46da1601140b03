//! The file tools as a subsystem.

use std::sync::Arc;

use crate::error::BuildError;
use crate::files::Files;
use crate::runtime::{BoxFuture, Install, RuntimeBuilder, Subsystem};

/// `read_file`, `write_file`, `edit_file`, `multi_edit`, `apply_patch`, `list_dir`, `glob` and `grep` over
/// one [`Files`]' roots, which may depend on the calling agent's role.
pub struct FileTools(pub Arc<Files>);

impl Subsystem for FileTools {
    fn name(&self) -> &'static str {
        "files"
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            self.0.resolve_roles_with(install.role_of());
            let tools = self.0.tools();
            install.tool(tools.read)?;
            install.tool(tools.write)?;
            install.tool(tools.edit)?;
            install.tool(tools.multi_edit)?;
            install.tool(tools.apply_patch)?;
            install.tool(tools.list_dir)?;
            install.tool(tools.glob)?;
            install.tool(tools.grep)?;
            Ok(())
        })
    }
}

impl RuntimeBuilder {
    /// Adds the file tools (`read_file`, `write_file`, `edit_file`, `multi_edit`,
    /// `apply_patch`, `list_dir`, `glob`, `grep`) over `files`' roots.
    pub fn files(self, files: &Arc<Files>) -> Self {
        self.subsystem(FileTools(Arc::clone(files)))
    }
}
