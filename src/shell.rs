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
mod process;
mod spawn;
mod spool;

use std::sync::Arc;
use std::time::Duration;

use guildhall_supervision::{ChildSpec, DynamicSpec, Supervisor};
use serde::{Deserialize, Serialize};

pub use background::{
    Ended, JobOutput, KillInput, Killed, OutputInput, ShellInfo, ShellKill, ShellOutput,
    ShellStart, StartInput, Started,
};
pub use bash::{Bash, BashInput, BashOutput};
pub(crate) use process::environment;

use crate::files::Files;
use crate::sandbox::{Protected, Sandbox, SandboxConfig};

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

/// The shell's shared state: its settings, the roots commands run in, the background
/// shells.
pub struct Shell {
    config: ShellConfig,
    deny: Vec<(String, glob::Pattern)>,
    /// Where `bash` is (commands are started by path).
    bash: std::ffi::CString,
    files: Arc<Files>,
    sandbox: Arc<Sandbox>,
    jobs: background::Jobs,
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
            bash: process::find_bash()?,
            files,
            sandbox,
            jobs: background::Jobs::default(),
        }))
    }

    /// The sandbox its commands run in.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// The longest a `bash` call may take, kill included: what its deadline allows for.
    pub fn max_call(&self) -> Duration {
        Duration::from_secs(self.config.max_timeout_secs)
            + process::TERM_GRACE
            + Duration::from_secs(5)
    }

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
        ChildSpec::dynamic_supervisor(background::SHELLS, DynamicSpec::never_escalate()).on_start(
            move |cell| {
                shell
                    .jobs
                    .publish(Supervisor::from_ref(cell.clone().into()));
            },
        )
    }

    /// The roots commands run in.
    pub fn files(&self) -> &Arc<Files> {
        &self.files
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
