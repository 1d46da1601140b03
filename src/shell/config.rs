//! The shell's settings (`[shell]`) and its errors.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Settings of the shell tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShellConfig {
    /// A command's time when the call names none, in seconds.
    pub timeout_secs: u64,
    /// The longest time a call may ask for, in seconds.
    pub max_timeout_secs: u64,
    /// CPU seconds per command (`RLIMIT_CPU`).
    pub cpu_secs: u64,
    /// Address space per process, in MiB (`RLIMIT_AS`).
    pub memory_mib: u64,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Processes of the user (`RLIMIT_NPROC`; the kernel does not hold root to it).
    pub processes: u64,
    /// Environment variables passed to commands besides the basic ones (`PATH`, `HOME`,
    /// `LANG`, `LC_*`, `TERM`, `USER`, `TMPDIR`). Nothing named `GUILDHALL_*` ever is.
    pub env: Vec<String>,
    /// Commands refused before they run: globs over the whole command line (`*` matches
    /// anything, spaces included).
    pub deny: Vec<String>,
    /// Background shells one agent may have running at once.
    pub background_per_agent: usize,
    /// Output kept per background shell, in MiB (past it, bytes are counted, not kept).
    pub background_output_mib: u64,
}

impl Default for ShellConfig {
    fn default() -> Self {
        Self {
            timeout_secs: 120,
            max_timeout_secs: 600,
            cpu_secs: 600,
            memory_mib: 4096,
            open_files: 1024,
            processes: 512,
            env: Vec::new(),
            deny: [
                "rm -rf /",
                "rm -rf /[*]",
                "rm -rf ~",
                "rm -rf ~/",
                "mkfs*",
                "dd * of=/dev/*",
                ":(){*",
                "git push --force*",
                "git push -f*",
                "curl * | *sh",
                "wget * | *sh",
            ]
            .map(String::from)
            .to_vec(),
            background_per_agent: 8,
            background_output_mib: 64,
        }
    }
}

/// Why a command was refused or could not run.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ShellError {
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
    /// The command matches a `[shell] deny` pattern.
    #[error("refused: the command matches the deny pattern `{pattern}` (`[shell] deny`)")]
    Denied {
        /// The pattern.
        pattern: String,
    },
    /// The working directory may not be used (see the file tools' confinement).
    #[error(transparent)]
    Directory(#[from] crate::files::FileError),
    /// The command's sandbox could not be set up (or `[sandbox] require` refused it).
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// The shell could not be started, or its output not read (shared, so the error stays
    /// `Clone`).
    #[error("could not start bash")]
    Spawn(#[source] Arc<std::io::Error>),
    /// Background shells are not running: the runtime is stopping.
    #[error("background shells are not running (the runtime is stopping)")]
    Stopping,
    /// A background shell's actor could not be started under its supervisor.
    #[error("could not start the background shell")]
    Supervisor(#[source] Arc<guildhall_supervision::SupervisorError>),
    /// No background shell of this agent has the id.
    #[error(
        "no background shell `{0}` of this agent (ids come from shell_start; a killed shell is forgotten)"
    )]
    UnknownShell(String),
}

impl From<std::io::Error> for ShellError {
    fn from(error: std::io::Error) -> Self {
        Self::Spawn(Arc::new(error))
    }
}
