//! What every shell tool shares: the settings, the roots commands run in, their sandbox,
//! and the background shells.

use std::ffi::CString;
use std::sync::Arc;
use std::time::Duration;

use super::config::{ShellConfig, ShellError};
use super::jobs::Jobs;
use crate::files::Files;
use crate::process_group::TERM_GRACE;
use crate::sandbox::{Protected, Sandbox, SandboxConfig};

/// The shell's shared state: its settings, the roots commands run in, the background
/// shells.
pub struct Shell {
    pub(super) config: ShellConfig,
    pub(super) deny: Vec<(String, glob::Pattern)>,
    /// Where `bash` is (commands are started by path).
    pub(super) bash: CString,
    pub(super) files: Arc<Files>,
    pub(super) sandbox: Arc<Sandbox>,
    pub(super) jobs: Jobs,
}

impl Shell {
    /// The `bash` tool with `config`, running commands inside `files`' roots, in the
    /// default sandbox (no network, nothing protected beyond what is outside the roots).
    ///
    /// # Errors
    /// As [`with_sandbox`](Self::with_sandbox), and [`ShellError::Sandbox`] when the
    /// sandbox's private directory cannot be made.
    pub fn new(config: ShellConfig, files: Arc<Files>) -> Result<Arc<Self>, ShellError> {
        let sandbox = Sandbox::new(SandboxConfig::default(), Protected::default())?;
        Self::with_sandbox(config, files, sandbox)
    }

    /// The `bash` tool with `config`, running commands inside `files`' roots confined by
    /// `sandbox`.
    ///
    /// # Errors
    /// [`ShellError::Invalid`] for an unusable setting (a deny glob that does not parse, a
    /// zero timeout or limit), or when `PATH` has no `bash`.
    pub fn with_sandbox(
        config: ShellConfig,
        files: Arc<Files>,
        sandbox: Arc<Sandbox>,
    ) -> Result<Arc<Self>, ShellError> {
        let zero = [
            ("timeout_secs", config.timeout_secs),
            ("max_timeout_secs", config.max_timeout_secs),
            ("cpu_secs", config.cpu_secs),
            ("memory_mib", config.memory_mib),
            ("open_files", config.open_files),
            ("processes", config.processes),
            ("background_output_mib", config.background_output_mib),
        ]
        .into_iter()
        .find(|(_, v)| *v == 0);
        if let Some((name, _)) = zero {
            return Err(ShellError::Invalid(format!(
                "[shell] {name} is 0; give a positive number"
            )));
        }
        if config.timeout_secs > config.max_timeout_secs {
            return Err(ShellError::Invalid(format!(
                "[shell] timeout_secs ({}) is above max_timeout_secs ({})",
                config.timeout_secs, config.max_timeout_secs
            )));
        }
        let deny = config
            .deny
            .iter()
            .map(|p| {
                glob::Pattern::new(p)
                    .map(|g| (p.clone(), g))
                    .map_err(|err| ShellError::Invalid(format!("[shell] deny `{p}`: {err}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Arc::new(Self {
            config,
            deny,
            bash: find_bash()?,
            files,
            sandbox,
            jobs: Jobs::default(),
        }))
    }

    /// The roots commands run in.
    pub fn files(&self) -> &Arc<Files> {
        &self.files
    }

    /// The sandbox its commands run in.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// The longest a `bash` call may take, kill included: what its deadline allows for.
    pub fn max_call(&self) -> Duration {
        Duration::from_secs(self.config.max_timeout_secs) + TERM_GRACE + Duration::from_secs(5)
    }
}

/// The absolute path of `bash` in `PATH`, which commands are started with (posix_spawn
/// takes a path; looking it up once also spares every command the search).
fn find_bash() -> Result<CString, ShellError> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join("bash"))
        .find(|candidate| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .and_then(|found| CString::new(found.into_os_string().into_encoded_bytes()).ok())
        .ok_or_else(|| ShellError::Invalid("the shell tools need bash, and PATH has none".into()))
}
