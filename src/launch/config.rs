//! `[launch]`: how many agents the runtime may start, and the profiles it starts them with.
//!
//! ```toml
//! [launch]
//! max_agents = 16                   # launched agents alive at once, in all
//! max_per_parent = 8                # ... started by one agent
//!
//! [launch.profiles.claude]
//! command = ["claude", "-p", "{prompt}", "--mcp-config", "{mcp_config}"]
//! env = { CLAUDE_CODE_MAX_OUTPUT_TOKENS = "8000" }
//! cwd = "."                         # relative to this file's directory
//! worktree = false                  # a fresh git worktree per agent instead of `cwd`
//! restart = "transient"             # permanent | transient | temporary
//! max_restarts = 3                  # restarts within `period` before giving up
//! period = "60s"
//! stop_with_parent = true           # stopped when the agent that started it is
//! wake_on_mail = false              # once ended, started again when mail reaches it
//! resume = ["claude", "-p", "{prompt}", "--continue", "--mcp-config", "{mcp_config}"]
//! sandbox = { network = "proxy", read = ["~/.local/share/claude"] }  # on by default
//! ```
//!
//! Placeholders in `command` fill whole argv entries (never a shell): `{prompt}`,
//! `{mcp_config}` (a JSON file that makes an MCP client connect back as the agent),
//! `{agent}`, `{role}`, `{parent}`, `{task}`, `{data_dir}` and `{guildhall}` (this
//! program). One that has no value (no parent, no task) leaves its entry out.
//!
//! `wake_on_mail`: an agent of the profile that ended (a `temporary` one, or a `transient`
//! one that exited 0) is idle rather than done: unread mail sent since its last start
//! starts it again with `resume` (`command` when absent), its `{prompt}` naming that mail. A wake counts
//! as a restart against `max_restarts`, and against `max_agents` and `max_per_parent` like
//! any launch; the agents it launched keep running while it is idle.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::commands::template::Arg;
use crate::servers::RestartType;

/// The placeholders a profile's command may use.
pub const PLACEHOLDERS: [&str; 8] = [
    "prompt",
    "mcp_config",
    "agent",
    "role",
    "parent",
    "task",
    "data_dir",
    "guildhall",
];

/// `[launch]` in `guildhall.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LaunchConfig {
    /// Launched agents alive at once, in all.
    pub max_agents: usize,
    /// Launched agents alive at once that one agent started.
    pub max_per_parent: usize,
    /// The profiles, by name.
    pub profiles: BTreeMap<String, Profile>,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self {
            max_agents: 16,
            max_per_parent: 8,
            profiles: BTreeMap::new(),
        }
    }
}

/// How to start one kind of agent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The program and its arguments, with placeholders.
    pub command: Vec<String>,
    /// Extra environment (`GUILDHALL_*` is set by guildhall and cannot be given).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory, relative to the config file's directory.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Give each agent a fresh `git worktree` (detached at `HEAD` of `cwd`) under the data
    /// directory instead of `cwd` itself.
    #[serde(default)]
    pub worktree: bool,
    /// When it is started again after its process ends.
    #[serde(default = "transient")]
    pub restart: RestartType,
    /// Restarts within `period` past which it is given up (and its parent told).
    #[serde(default = "three")]
    pub max_restarts: u32,
    /// The window `max_restarts` counts in.
    #[serde(default = "minute", with = "crate::time::humane")]
    pub period: Duration,
    /// Stopped when the agent that started it is stopped or ends for good.
    #[serde(default = "yes")]
    pub stop_with_parent: bool,
    /// Once ended (not stopped, not given up), started again when mail reaches it.
    #[serde(default)]
    pub wake_on_mail: bool,
    /// The command a woken agent is started with (`command` when absent): its `{prompt}`
    /// names the mail that woke it; Claude Code's `--continue` resumes its conversation.
    #[serde(default)]
    pub resume: Option<Vec<String>>,
    /// Its sandbox (on by default, where the server has one): its agent's file roots and
    /// its working directory writable, its program and what the entries name readable, a
    /// home directory of its own (its config directory: `~/.claude` is there), `[sandbox]`'s
    /// network (`network = "proxy"` with the model's API host in `[sandbox.proxy] allow`).
    /// It reaches guildhall through a socket that serves its agent alone, never the data
    /// directory (so no `worktree`, which lives there).
    #[serde(default)]
    pub sandbox: crate::servers::config::ServerSandbox,
}

fn transient() -> RestartType {
    RestartType::Transient
}

fn three() -> u32 {
    3
}

fn minute() -> Duration {
    Duration::from_secs(60)
}

fn yes() -> bool {
    true
}

impl Profile {
    /// A profile running `command` with the defaults.
    pub fn new(command: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            command: command.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
            worktree: false,
            restart: RestartType::Transient,
            max_restarts: 3,
            period: minute(),
            stop_with_parent: true,
            wake_on_mail: false,
            resume: None,
            sandbox: crate::servers::config::ServerSandbox::default(),
        }
    }

    /// The command as a template.
    ///
    /// # Errors
    /// What is wrong with it, naming the entry or placeholder.
    pub(crate) fn template(&self) -> Result<Vec<Arg>, String> {
        self.check_env()?;
        parse_command("command", &self.command)
    }

    /// The command a woken agent is started with, as a template: `resume`, else `command`.
    ///
    /// # Errors
    /// What is wrong with it, naming the entry or placeholder.
    pub(crate) fn resume_template(&self) -> Result<Vec<Arg>, String> {
        match &self.resume {
            Some(resume) => parse_command("resume", resume),
            None => self.template(),
        }
    }

    fn check_env(&self) -> Result<(), String> {
        match self.env.keys().find(|name| name.starts_with("GUILDHALL_")) {
            Some(name) => Err(format!(
                "`env.{name}`: the GUILDHALL_ variables are set by guildhall itself"
            )),
            None => Ok(()),
        }
    }
}

/// `command` (the field `field`) as a template.
fn parse_command(field: &str, command: &[String]) -> Result<Vec<Arg>, String> {
    let Some(program) = command.first() else {
        return Err(format!(
            "`{field}` is empty: give the program and its arguments"
        ));
    };
    let args = command
        .iter()
        .map(|entry| Arg::parse(entry).map_err(|err| err.0))
        .collect::<Result<Vec<_>, _>>()?;
    if !matches!(args[0], Arg::Literal(_)) {
        return Err(format!(
            "the program `{program}` cannot be a placeholder: name it"
        ));
    }
    for arg in &args {
        for field in arg.fields() {
            if !PLACEHOLDERS.contains(&field) {
                return Err(format!(
                    "`{{{field}}}` is not a placeholder here; there are {}",
                    PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                ));
            }
        }
    }
    if crate::commands::template::script_has_placeholder(program, &args[1..]) {
        return Err(format!(
            "`{program} -c` would read a value as shell code: keep the script fixed and \
                 pass values as the entries after it (\"$1\", \"$2\", … in the script)"
        ));
    }
    Ok(args)
}

impl LaunchConfig {
    /// Checks every profile and the limits.
    ///
    /// # Errors
    /// The first problem, naming the profile and the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_agents == 0 || self.max_per_parent == 0 {
            return Err("`max_agents` and `max_per_parent` must be at least 1".into());
        }
        for (name, profile) in &self.profiles {
            crate::agents::check_name(name)
                .map_err(|reason| format!("profile name `{name}`: {reason}"))?;
            profile
                .template()
                .and_then(|_| profile.resume_template())
                .map_err(|reason| format!("[launch.profiles.{name}]: {reason}"))?;
            if profile.resume.is_some() && !profile.wake_on_mail {
                return Err(format!(
                    "[launch.profiles.{name}]: `resume` is the command of a woken agent: \
                     give `wake_on_mail = true` too, or drop it"
                ));
            }
            if profile.period.is_zero() {
                return Err(format!(
                    "[launch.profiles.{name}]: `period` must be more than 0"
                ));
            }
        }
        Ok(())
    }
}
