//! `guildhall.toml`: settings a server reads at start.
//!
//! ```toml
//! trust = "bounded"                 # agents' default trust level
//!
//! [[rules]]                         # config-scope permission rules, in order
//! tool = "bash"
//! arg = "command"
//! pattern = "git *"
//! action = "allow"
//!
//! [roles.dev]
//! tools = ["send_message", "check_inbox", "read_message", "mark_read", "context_*"]
//! trust = "suggest"
//! rules = [{ tool = "context_update", action = "allow" }]
//! mode = "plan"                     # plan | build | explore: its agents start in it
//!
//! [agents.tl]
//! role = "tl"                       # the role config gives it (it cannot claim another)
//! trust = "autonomous"
//! token_env = "GUILDHALL_TL_TOKEN"  # or token_file = "secrets/tl.token": acting as `tl`
//!                                   # then takes this token (docs/security.md)
//!
//! [[hooks]]
//! tools = "bash"
//! phase = "before"                  # or "after"
//! command = ["sh", "hooks/no-rm.sh"] # run in this file's directory
//! timeout = "5s"
//! on_failure = "deny"               # what an error or timeout means
//! priority = 0                      # lower runs first
//!
//! [doom_loop]
//! threshold = 3
//! action = "deny"
//!
//! [truncate]
//! max_lines = 2000
//! max_bytes = 51200
//! retention = "7d"
//!
//! [tools.bash]
//! max_lines = 500
//! rate = "100/min"
//! cache_ttl = "30s"                 # declares the tool deterministic
//!
//! [limits]
//! agent_rate = "600/min"
//!
//! [audit]
//! enabled = true
//! retention = "90d"
//!
//! [launch]                          # agents started by spawn_agent (crate::launch)
//! max_agents = 16
//! [launch.profiles.claude]
//! command = ["claude", "-p", "{prompt}", "--mcp-config", "{mcp_config}"]
//!
//! [humans]                          # ask_human and confirm; who answers by mail
//! ids = ["ada"]
//!
//! [tasks]
//! max_tasks = 100000                # unfinished tasks on the board
//! max_held = 16                     # tasks one agent may hold at once
//! lease = "5m"                      # a claim's lease unless it asks for another
//! max_lease = "24h"                 # the longest lease a claim may ask for
//! idle = "60s"                      # the board's actor stops after this long unused
//! ```
//!
//! A role's `tools` is the default tool set of every MCP connection bound to an agent in that
//! role. An invalid file is rejected with its path, line and reason; nothing starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::agents::Credentials;
use crate::governance::doom::LoopConfig;
use crate::governance::truncate::Limits;
use crate::governance::{
    Action, CommandHook, Glob, GovernanceConfig, Mode, Phase, Principal, Rate, RegisteredHook,
    Rule, ToolPolicy, Trust,
};
use crate::mcp::ToolFilter;
use crate::mcp::local::RoleTools;
use crate::tasks::TaskConfig;

/// The config file's name in the data directory.
pub const CONFIG_FILE: &str = "guildhall.toml";

/// The parsed file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The trust level of agents whose role and own settings name none.
    #[serde(default)]
    pub trust: Trust,
    /// Config-scope permission rules.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Settings per role.
    #[serde(default)]
    pub roles: BTreeMap<String, RoleConfig>,
    /// Settings per agent.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentConfig>,
    /// Command hooks.
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    /// The loop guard.
    #[serde(default)]
    pub doom_loop: LoopConfig,
    /// Default truncation.
    #[serde(default)]
    pub truncate: TruncateConfig,
    /// Settings per tool.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    /// Rate limits that are not per tool.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// The audit log.
    #[serde(default)]
    pub audit: AuditConfig,
    /// The task board.
    #[serde(default)]
    pub tasks: TasksSection,
    /// Who answers `ask_human` and `confirm` when the asking agent's own client cannot:
    /// with this section the two tools are served.
    #[serde(default)]
    pub humans: Option<crate::humans::HumansConfig>,
    /// Agents the runtime launches (`spawn_agent`): served only when this section is
    /// present.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[serde(default)]
    pub launch: Option<crate::launch::LaunchConfig>,
    /// The file tools: served only when this section is present.
    #[serde(default)]
    pub files: Option<crate::files::FilesConfig>,
    /// The `bash` tool: served only when this section is present (in the file tools'
    /// roots, `[files]` or its defaults).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[serde(default)]
    pub shell: Option<crate::shell::ShellConfig>,
    /// The sandbox of every process started for an agent (on by default).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[serde(default)]
    pub sandbox: crate::sandbox::SandboxConfig,
    /// The `web_fetch` tool: served only when this section is present.
    #[cfg(feature = "fetch")]
    #[serde(default)]
    pub fetch: Option<crate::fetch::FetchConfig>,
    /// Other MCP servers proxied as tools (`mcp__NAME__tool`), by name.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[serde(default)]
    pub servers: BTreeMap<String, crate::servers::ServerConfig>,
    /// Command tools, by name: checked here, served by [`crate::commands::Commands`].
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[serde(default)]
    pub commands: BTreeMap<String, toml::Value>,
    /// Telemetry sent elsewhere: OpenTelemetry traces over OTLP.
    #[serde(default)]
    pub telemetry: crate::observe::TelemetryConfig,
    /// `[store]`: where agents, mail, context and tasks are kept.
    #[serde(default)]
    pub store: StoreSection,
    /// `[mcp]`: how the MCP server lists tools.
    #[serde(default)]
    pub mcp: McpSection,
    /// `[models."PATTERN"]`: the tool sets fitted to the model behind a connection.
    #[serde(default)]
    pub models: BTreeMap<String, crate::mcp::models::ModelConfig>,
    /// `[skills]`: skill folders served as the `skill` tool (only when this section is
    /// present).
    #[serde(default)]
    pub skills: Option<crate::skills::SkillsConfig>,
    /// `[a2a]`: agents and roles served to remote A2A clients, and remote A2A agents as
    /// tools.
    #[cfg(feature = "a2a")]
    #[serde(default)]
    pub a2a: Option<crate::a2a::A2aConfig>,
    /// `[pipelines.NAME]`: tools composed of tools, each step's result feeding the next.
    #[serde(default)]
    pub pipelines: BTreeMap<String, crate::compose::pipelines::PipelineConfig>,
    /// `[subsystems.NAME]`: settings of subsystems an embedder adds, handed to the runtime
    /// with [`RuntimeBuilder::sections`](crate::RuntimeBuilder::sections) (a name no
    /// subsystem has fails the build).
    #[serde(default)]
    pub subsystems: BTreeMap<String, toml::Table>,
    /// The directory of the file, where command hooks run.
    #[serde(skip)]
    pub dir: PathBuf,
}

/// One role's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    /// Tool names and globs its agents' connections see (all when absent).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Its agents' trust level.
    #[serde(default)]
    pub trust: Option<Trust>,
    /// Its permission rules.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// The working mode its agents start in (`plan`, `build`, `explore`).
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Whether its agents' clients are kept going at a stop (`guildhall hook`'s `Stop`)
    /// while they have unread urgent mail or a claimed task still `in_progress`.
    #[serde(default)]
    pub keep_going: bool,
    /// The skills its agents may load with `skill` (names and globs; all when absent).
    #[serde(default)]
    pub skills: Option<Vec<String>>,
}

/// One agent's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The role the config gives it. Only then do its role's allow rules, and a role trust
    /// above the default, apply to it; a client cannot register it in another role.
    #[serde(default)]
    pub role: Option<String>,
    /// The environment variable holding its token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// The file holding its token (relative to this file's directory).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Its trust level, over its role's.
    #[serde(default)]
    pub trust: Option<Trust>,
    /// Its permission rules.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// The working mode it starts in (over its role's).
    #[serde(default)]
    pub mode: Option<Mode>,
    /// The model behind its clients, for `[models."PATTERN"]` (when a request names none).
    #[serde(default)]
    pub model: Option<String>,
}

/// A command hook.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// A name for messages (default: the command).
    #[serde(default)]
    pub name: Option<String>,
    /// The tools it sees (a glob; default all).
    #[serde(default = "all_tools")]
    pub tools: Glob,
    /// Before or after calls.
    pub phase: Phase,
    /// The program and its arguments.
    pub command: Command,
    /// How long it may take (default 10 s).
    #[serde(default, with = "crate::time::humane::option")]
    pub timeout: Option<Duration>,
    /// What an error or timeout means (default deny).
    #[serde(default)]
    pub on_failure: Option<Action>,
    /// Lower runs first (default 0).
    #[serde(default)]
    pub priority: i32,
}

/// A program and its arguments; never empty.
#[derive(Debug, Clone)]
pub struct Command(pub Vec<String>);

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let parts = Vec::<String>::deserialize(d)?;
        if parts.first().is_none_or(String::is_empty) {
            return Err(serde::de::Error::custom(
                "`command` needs a program, e.g. [\"sh\", \"hooks/check.sh\"]",
            ));
        }
        Ok(Self(parts))
    }
}

fn all_tools() -> Glob {
    Glob::new("*").unwrap_or_else(|_| unreachable!("`*` is a valid glob"))
}

/// Default truncation and spill-file retention.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TruncateConfig {
    /// Lines a model sees at most (default 2,000).
    #[serde(default)]
    pub max_lines: Option<usize>,
    /// Bytes a model sees at most (default 51,200).
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// How long spill files are kept (default 7 days).
    #[serde(default, with = "crate::time::humane::option")]
    pub retention: Option<Duration>,
}

/// One tool's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// Lines a model sees at most.
    #[serde(default)]
    pub max_lines: Option<usize>,
    /// Bytes a model sees at most.
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// Calls admitted per period, all callers together (`100/min`).
    #[serde(default)]
    pub rate: Option<Rate>,
    /// Declares the tool deterministic and caches its results this long.
    #[serde(default, with = "crate::time::humane::option")]
    pub cache_ttl: Option<Duration>,
}

/// Rate limits across tools.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Calls each agent may make per period, across its tools.
    #[serde(default)]
    pub agent_rate: Option<Rate>,
}

/// The audit log.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Whether calls are audited (default true).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// How long records are kept (default 90 days).
    #[serde(default, with = "crate::time::humane::option")]
    pub retention: Option<Duration>,
}

/// The largest `[store] cache_mib`: 1 TiB.
const MAX_CACHE_MIB: usize = 1 << 20;

/// `[store]`: where the runtime keeps what lasts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// A PostgreSQL connection string (`postgres://user@host:port/db`): the store is that
    /// database, which several servers may share. Absent: the embedded store in the data
    /// directory.
    #[serde(default)]
    pub url: Option<String>,
    /// How long this server holds the database without renewing its lease (default 5 s):
    /// the longest another server waits to take over after this one died.
    #[serde(default, with = "crate::time::humane::option")]
    pub lease: Option<Duration>,
    /// The embedded store's page cache, MiB (default 64, at least 1): the most memory the
    /// store keeps for itself, and so the most a server's memory grows by as its store does.
    #[serde(default)]
    pub cache_mib: Option<usize>,
}

/// `[mcp]`: how the MCP server lists tools.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSection {
    /// Past this many tools in an agent's listing, the proxied servers' tools are listed
    /// only once the agent finds them with `find_tools` (served then); absent: every tool
    /// is listed.
    #[serde(default)]
    pub disclose_after: Option<usize>,
}

/// `[tasks]`: the task board's size and timings; what is absent keeps its default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TasksSection {
    /// Unfinished tasks on the board.
    #[serde(default)]
    pub max_tasks: Option<usize>,
    /// Tasks one agent may hold at once.
    #[serde(default)]
    pub max_held: Option<usize>,
    /// The lease a claim gets unless it asks for another.
    #[serde(default, with = "crate::time::humane::option")]
    pub lease: Option<Duration>,
    /// The longest lease a claim may ask for.
    #[serde(default, with = "crate::time::humane::option")]
    pub max_lease: Option<Duration>,
    /// How long the board's actor may stay unused (and holding no lease) before it stops.
    #[serde(default, with = "crate::time::humane::option")]
    pub idle: Option<Duration>,
}

/// A config file that cannot be used.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {reason}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// The 1-based line of the problem, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

impl Config {
    /// Reads `path`. A missing file is an error only when `required` (it was named
    /// explicitly); otherwise it means the defaults.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable or invalid file.
    pub fn load(path: &Path, required: bool) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Self::default());
            }
            Err(err) => {
                return Err(ConfigError {
                    path: path.to_owned(),
                    line: None,
                    reason: err.to_string(),
                });
            }
        };
        let config: Self = toml::from_str(&text).map_err(|err| ConfigError {
            path: path.to_owned(),
            line: err
                .span()
                .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1),
            reason: err.message().to_owned(),
        })?;
        config.role_tools().map_err(|reason| ConfigError {
            path: path.to_owned(),
            line: None,
            reason,
        })?;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        for (name, server) in &config.servers {
            crate::servers::validate_server_name(name)
                .and_then(|()| server.validate())
                .map_err(|reason| ConfigError {
                    path: path.to_owned(),
                    line: line_of(&text, &[format!("[servers.{name}]")]),
                    reason: format!("[servers.{name}]: {reason}"),
                })?;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if !config.commands.is_empty() {
            let base = crate::commands::manifest::base_dir(path);
            crate::commands::manifest::parse_config(path, &text, &base).map_err(|err| {
                ConfigError {
                    path: path.to_owned(),
                    line: Some(err.line),
                    reason: match &err.field {
                        Some(field) => format!("`{field}`: {}", err.reason),
                        None => err.reason.clone(),
                    },
                }
            })?;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if let Some(launch) = &config.launch {
            launch.validate().map_err(|reason| ConfigError {
                path: path.to_owned(),
                line: line_of(&text, &["[launch"]),
                reason,
            })?;
        }
        for (name, pipeline) in &config.pipelines {
            pipeline.check().map_err(|reason| ConfigError {
                path: path.to_owned(),
                line: pipeline_line(&text, name),
                reason: format!("[pipelines.{name}]: {reason}"),
            })?;
        }
        config.model_rules().map_err(|reason| ConfigError {
            path: path.to_owned(),
            line: line_of(&text, &["[models"]),
            reason,
        })?;
        config.task_config().map_err(|reason| ConfigError {
            path: path.to_owned(),
            line: line_of(&text, &["[tasks]"]),
            reason: format!("[tasks]: {reason}"),
        })?;
        #[cfg(feature = "a2a")]
        if let Some(a2a) = &config.a2a {
            a2a.check().map_err(|reason| ConfigError {
                path: path.to_owned(),
                line: line_of(&text, &["[a2a"]),
                reason: format!("[a2a]: {reason}"),
            })?;
        }
        config.store_cache_bytes().map_err(|reason| ConfigError {
            path: path.to_owned(),
            line: line_of(&text, &["cache_mib"]),
            reason: format!("[store]: {reason}"),
        })?;
        let mut config = config;
        config.dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        Ok(config)
    }

    /// Why pipeline `name` cannot be served, as the file's error: its path and line.
    pub fn pipeline_error_at(path: &Path, name: &str, reason: &str) -> ConfigError {
        ConfigError {
            path: path.to_owned(),
            line: std::fs::read_to_string(path)
                .ok()
                .and_then(|text| pipeline_line(&text, name)),
            reason: format!("[pipelines.{name}]: {reason}"),
        }
    }

    /// The `[models]` rules, with the models `[agents.X] model` names.
    ///
    /// # Errors
    /// A pattern that is no glob.
    pub fn model_rules(&self) -> Result<crate::mcp::models::ModelRules, String> {
        let agents = self
            .agents
            .iter()
            .filter_map(|(id, a)| a.model.clone().map(|m| (id.clone(), m)))
            .collect();
        crate::mcp::models::ModelRules::new(&self.models, agents)
    }

    /// The embedded store's page cache, bytes: `[store] cache_mib`; `None` for the store's
    /// default.
    ///
    /// # Errors
    /// A cache of 0, or past 1 TiB.
    pub fn store_cache_bytes(&self) -> Result<Option<usize>, String> {
        match self.store.cache_mib {
            None => Ok(None),
            Some(mib @ 1..=MAX_CACHE_MIB) => Ok(Some(mib << 20)),
            Some(mib) => Err(format!(
                "`cache_mib` is {mib}: it must be from 1 to {MAX_CACHE_MIB}"
            )),
        }
    }

    /// The task board's settings: `[tasks]` over the defaults.
    ///
    /// # Errors
    /// A size or time that cannot work, named.
    pub fn task_config(&self) -> Result<TaskConfig, String> {
        let mut config = TaskConfig::default();
        let section = &self.tasks;
        if let Some(max) = section.max_tasks {
            if max == 0 {
                return Err("`max_tasks` must be at least 1".into());
            }
            config.limits.max_tasks = max;
        }
        if let Some(max) = section.max_held {
            if max == 0 {
                return Err("`max_held` must be at least 1".into());
            }
            config.limits.max_held = max;
        }
        config.max_lease = section.max_lease.unwrap_or(config.max_lease);
        config.lease = section.lease.unwrap_or(config.lease.min(config.max_lease));
        config.idle = section.idle.unwrap_or(config.idle);
        if config.lease.is_zero() || config.max_lease < Duration::from_secs(1) {
            return Err("`lease` and `max_lease` must be at least 1s".into());
        }
        if config.lease > config.max_lease {
            return Err(format!(
                "`lease` ({}) is longer than `max_lease` ({})",
                humantime::format_duration(config.lease),
                humantime::format_duration(config.max_lease)
            ));
        }
        if config.idle.is_zero() {
            return Err("`idle` must be more than 0".into());
        }
        Ok(config)
    }

    /// The governance settings: rules, trust, hooks, guard, truncation, limits, audit.
    pub fn governance(&self) -> GovernanceConfig {
        let defaults = GovernanceConfig::default();
        let limits = Limits::default();
        let principal = |trust: Option<Trust>, rules: &[Rule]| Principal {
            trust,
            rules: rules.to_vec(),
            role: None,
        };
        let hooks = self
            .hooks
            .iter()
            .map(|h| {
                let program = h.command.0[0].clone();
                let hook = CommandHook::new(&program, h.command.0[1..].iter().cloned())
                    .current_dir(&self.dir);
                RegisteredHook {
                    name: h.name.clone().unwrap_or_else(|| h.command.0.join(" ")),
                    phase: h.phase,
                    tools: h.tools.clone(),
                    priority: h.priority,
                    timeout: h
                        .timeout
                        .unwrap_or(crate::governance::hooks::DEFAULT_TIMEOUT),
                    on_failure: h.on_failure.unwrap_or(Action::Deny),
                    hook: std::sync::Arc::new(hook),
                }
            })
            .collect();
        GovernanceConfig {
            trust: self.trust,
            rules: self.rules.clone(),
            roles: self
                .roles
                .iter()
                .map(|(role, c)| (role.clone(), principal(c.trust, &c.rules)))
                .collect(),
            agents: self
                .agents
                .iter()
                .map(|(agent, c)| {
                    let mut p = principal(c.trust, &c.rules);
                    p.role.clone_from(&c.role);
                    (agent.clone(), p)
                })
                .collect(),
            modes: self
                .roles
                .iter()
                .filter_map(|(role, c)| Some((format!("role:{role}"), c.mode?)))
                .chain(
                    self.agents
                        .iter()
                        .filter_map(|(agent, c)| Some((agent.clone(), c.mode?))),
                )
                .collect(),
            hooks,
            doom_loop: self.doom_loop,
            truncate: Limits {
                max_lines: self.truncate.max_lines.unwrap_or(limits.max_lines),
                max_bytes: self.truncate.max_bytes.unwrap_or(limits.max_bytes),
            },
            spill_retention: self.truncate.retention.unwrap_or(defaults.spill_retention),
            spill_dir: None,
            tools: self
                .tools
                .iter()
                .map(|(tool, c)| {
                    let truncate =
                        (c.max_lines.is_some() || c.max_bytes.is_some()).then(|| Limits {
                            max_lines: c
                                .max_lines
                                .or(self.truncate.max_lines)
                                .unwrap_or(limits.max_lines),
                            max_bytes: c
                                .max_bytes
                                .or(self.truncate.max_bytes)
                                .unwrap_or(limits.max_bytes),
                        });
                    let policy = ToolPolicy {
                        truncate,
                        rate: c.rate,
                        cache_ttl: c.cache_ttl,
                    };
                    (tool.clone(), policy)
                })
                .collect(),
            agent_rate: self.limits.agent_rate,
            audit: self.audit.enabled.unwrap_or(defaults.audit),
            audit_retention: self.audit.retention.unwrap_or(defaults.audit_retention),
        }
    }

    /// Checks that every tool a rule, hook, `[tools.NAME]` section or role's tool set names
    /// can exist: it matches one of `known` (the tools the server registered), or it is a
    /// pattern over proxied servers' tools (`mcp__…`), whose tools come and go. A rule about
    /// a tool that does not exist protects nothing (the README once said `tool = "shell"`
    /// for `bash`), so it is refused, with its line in the file at `path` and the names it
    /// could mean.
    ///
    /// # Errors
    /// The first name that matches no tool.
    pub fn check_tool_names(&self, path: &Path, known: &[String]) -> Result<(), ConfigError> {
        // What names a tool, and where: rules and hooks hold their patterns parsed; the
        // others are names (or globs) as written, which `load` has checked.
        let mut named: Vec<(String, Glob)> = Vec::new();
        let scopes = std::iter::once((String::from("a "), &self.rules))
            .chain(
                self.roles
                    .iter()
                    .map(|(role, c)| (format!("[roles.{role}] "), &c.rules)),
            )
            .chain(
                self.agents
                    .iter()
                    .map(|(agent, c)| (format!("[agents.{agent}] "), &c.rules)),
            );
        for (scope, rules) in scopes {
            named.extend(
                rules
                    .iter()
                    .map(|rule| (format!("{scope}rule's tool"), rule.tool.clone())),
            );
        }
        named.extend(
            self.hooks
                .iter()
                .map(|hook| ("a hook's tools".to_owned(), hook.tools.clone())),
        );
        let written = self
            .roles
            .iter()
            .flat_map(|(role, c)| {
                c.tools
                    .iter()
                    .flatten()
                    .map(move |tool| (format!("[roles.{role}] tools"), tool))
            })
            .chain(
                self.tools
                    .keys()
                    .map(|tool| (format!("[tools.{tool}]"), tool)),
            );
        named.extend(written.filter_map(|(what, tool)| Some((what, Glob::new(tool.trim()).ok()?))));
        let unknown = named.into_iter().find(|(_, glob)| {
            !glob.as_str().starts_with("mcp__") && !known.iter().any(|tool| glob.matches(tool))
        });
        let Some((what, glob)) = unknown else {
            return Ok(());
        };
        let pattern = glob.as_str();
        // Read again for the line, only when there is something to refuse.
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let line = line_of(
            &text,
            &[format!("[tools.{pattern}]"), format!("\"{pattern}\"")],
        );
        Err(ConfigError {
            path: path.to_owned(),
            line,
            reason: format!(
                "{what} names `{pattern}`, which is no tool this server has, so it would apply \
                 to nothing{}",
                could_mean(pattern, known)
            ),
        })
    }

    /// The agents' tokens, read from their variables and files.
    ///
    /// # Errors
    /// A variable or file that is missing, unreadable or empty, named with its agent.
    pub fn credentials(&self) -> Result<Credentials, ConfigError> {
        let fail = |reason: String| ConfigError {
            path: self.dir.join(CONFIG_FILE),
            line: None,
            reason,
        };
        let mut tokens = Vec::new();
        for (agent, c) in &self.agents {
            let token = match (&c.token_env, &c.token_file) {
                (None, None) => continue,
                (Some(_), Some(_)) => {
                    return Err(fail(format!(
                        "agents.{agent}: give token_env or token_file, not both"
                    )));
                }
                (Some(var), None) => std::env::var(var)
                    .map_err(|err| fail(format!("agents.{agent}.token_env: ${var}: {err}")))?,
                (None, Some(file)) => {
                    let path = self.dir.join(file);
                    std::fs::read_to_string(&path).map_err(|err| {
                        fail(format!(
                            "agents.{agent}.token_file: {}: {err}",
                            path.display()
                        ))
                    })?
                }
            };
            let token = token.trim();
            if token.is_empty() {
                return Err(fail(format!("agents.{agent}: its token is empty")));
            }
            tokens.push((agent.clone(), token.to_owned()));
        }
        Ok(Credentials::new(tokens))
    }

    /// What no sandbox may reach: the data directory `data_dir` (the store, the local
    /// socket, spilled output, logs), the config file `file` and the agents' token files.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn protected(&self, file: &Path, data_dir: &Path) -> crate::sandbox::Protected {
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut files = vec![absolute(file)];
        files.extend(
            self.agents
                .values()
                .filter_map(|c| c.token_file.as_ref())
                .map(|f| absolute(&self.dir.join(f))),
        );
        // Manifests beside the config define command tools, and what they may reach.
        let manifests = absolute(&self.dir.join("tools"));
        crate::sandbox::Protected {
            dirs: vec![absolute(data_dir), manifests],
            files,
        }
    }

    /// What agents' client hooks are answered: the roles kept going at a stop.
    pub fn loop_hooks(&self) -> crate::loop_hooks::LoopHooks {
        crate::loop_hooks::LoopHooks::new(
            self.roles
                .iter()
                .filter(|(_, config)| config.keep_going)
                .map(|(role, _)| role.clone())
                .collect(),
        )
    }

    /// Each role's tool filter.
    ///
    /// # Errors
    /// The first invalid pattern, with its role.
    pub fn role_tools(&self) -> Result<RoleTools, String> {
        self.roles
            .iter()
            .filter_map(|(role, config)| Some((role, config.tools.as_ref()?)))
            .map(|(role, tools)| {
                ToolFilter::only(tools)
                    .map(|filter| (role.clone(), filter))
                    .map_err(|err| format!("roles.{role}.tools: {err}"))
            })
            .collect()
    }
}

/// The tools a name that matches none could mean, as a message's end: names that contain it
/// or are close to it, and the shell tool for the shell's usual names.
fn could_mean(pattern: &str, known: &[String]) -> String {
    let lower = pattern.to_ascii_lowercase();
    let mut near: Vec<&str> = known
        .iter()
        .map(String::as_str)
        .filter(|tool| {
            tool.contains(lower.as_str())
                || (lower.len() > 2 && lower.contains(*tool))
                || strsim::normalized_levenshtein(tool, &lower) >= 0.6
        })
        .collect();
    if ["shell", "sh", "exec", "run", "command", "terminal"].contains(&lower.as_str())
        && known.iter().any(|t| t == "bash")
    {
        near.insert(0, "bash");
    }
    near.dedup();
    near.truncate(6);
    if near.is_empty() {
        "; `guildhall tools` lists the tools".into()
    } else {
        format!(
            "; did you mean {}? (`guildhall tools` lists them all)",
            near.iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// The line of `[pipelines.NAME]` in `text`, when it is there.
fn pipeline_line(text: &str, name: &str) -> Option<usize> {
    line_of(
        text,
        &[
            format!("[pipelines.{name}]"),
            format!("[pipelines.\"{name}\"]"),
        ],
    )
}

/// The 1-based line where the first of `needles` found in `text` starts: where a section
/// an error is about begins, for the message.
fn line_of(text: &str, needles: &[impl AsRef<str>]) -> Option<usize> {
    needles
        .iter()
        .find_map(|needle| text.find(needle.as_ref()))
        .map(|at| text[..at].matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_or_setting_naming_no_tool_is_refused_with_its_line_and_what_it_could_mean() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        let known: Vec<String> = ["bash", "shell_start", "shell_output", "read_file"]
            .map(String::from)
            .to_vec();
        for (text, line, named) in [
            (
                "[[rules]]\ntool = \"shell\"\narg = \"command\"\npattern = \"rm *\"\naction = \"deny\"\n",
                2,
                "`bash`",
            ),
            (
                "trust = \"bounded\"\n[tools.reed_file]\nmax_lines = 5\n",
                2,
                "`read_file`",
            ),
            (
                "[roles.dev]\ntools = [\"read_file\", \"grpe\"]\n",
                2,
                "lists the tools",
            ),
            (
                "[[hooks]]\ntools = \"shel*\"\nphase = \"before\"\ncommand = [\"true\"]\n",
                0,
                "",
            ),
        ] {
            std::fs::write(&path, text).expect("write");
            let config = Config::load(&path, true).expect("parses");
            let checked = config.check_tool_names(&path, &known);
            if line == 0 {
                assert!(
                    checked.is_ok(),
                    "{text}: a glob that matches a tool is fine"
                );
                continue;
            }
            let err = checked.expect_err(text);
            assert_eq!(err.line, Some(line), "{text}: {err}");
            assert!(err.reason.contains(named), "{text}: {err}");
        }
        std::fs::write(
            &path,
            "[[rules]]\ntool = \"mcp__every__*\"\naction = \"deny\"\n",
        )
        .expect("write");
        let config = Config::load(&path, true).expect("parses");
        assert!(
            config.check_tool_names(&path, &known).is_ok(),
            "proxied tools come later"
        );
    }

    #[test]
    fn the_file_and_shell_tools_are_on_only_with_their_sections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(&path, "trust = \"bounded\"\n").expect("write");
        assert_eq!(Config::load(&path, true).expect("valid").files, None);
        std::fs::write(&path, "[files]\n").expect("write");
        assert_eq!(
            Config::load(&path, true).expect("valid").files,
            Some(crate::files::FilesConfig::default())
        );
        std::fs::write(
            &path,
            "[files]\nroots = [\"src\", \"/srv/data\"]\ndeny = [\".env\"]\n",
        )
        .expect("write");
        let files = Config::load(&path, true).expect("valid").files.expect("on");
        assert_eq!(
            files.roots,
            [PathBuf::from("src"), PathBuf::from("/srv/data")]
        );
        assert_eq!(files.deny, [".env"]);
        std::fs::write(&path, "[files]\nroot = \".\"\n").expect("write");
        let err = Config::load(&path, true).expect_err("unknown field");
        assert_eq!(err.line, Some(2), "{err}");

        std::fs::write(
            &path,
            "[shell]\ntimeout_secs = 30\ndeny = [\"make deploy*\"]\n",
        )
        .expect("write");
        let shell = Config::load(&path, true).expect("valid").shell.expect("on");
        assert_eq!(shell.timeout_secs, 30);
        assert_eq!(shell.deny, ["make deploy*"]);
        assert_eq!(shell.max_timeout_secs, 600, "the rest keeps its defaults");

        std::fs::write(
            &path,
            "[files]\nroots = [\".\"]\n[files.roles]\nwriter = [\"docs\"]\n[files.agents]\nfe = [\"web\", \"assets\"]\n",
        )
        .expect("write");
        let files = Config::load(&path, true).expect("valid").files.expect("on");
        assert_eq!(files.roles["writer"], [PathBuf::from("docs")]);
        assert_eq!(files.agents["fe"].len(), 2);
    }

    #[test]
    fn the_task_section_sets_the_board_and_refuses_what_cannot_work() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(&path, "trust = \"bounded\"\n").expect("write");
        let config = Config::load(&path, true).expect("valid").task_config();
        assert_eq!(config, Ok(TaskConfig::default()));
        std::fs::write(
            &path,
            "[tasks]\nmax_tasks = 10\nlease = \"30s\"\nmax_lease = \"1h\"\n",
        )
        .expect("write");
        let config = Config::load(&path, true)
            .expect("valid")
            .task_config()
            .expect("ok");
        assert_eq!(config.limits.max_tasks, 10);
        assert_eq!(config.lease, Duration::from_secs(30));
        assert_eq!(config.max_lease, Duration::from_secs(3600));
        assert_eq!(config.idle, TaskConfig::default().idle);
        for (text, expect) in [
            ("max_tasks = 0", "`max_tasks`"),
            ("max_held = 0", "`max_held`"),
            (
                "lease = \"2h\"\nmax_lease = \"1h\"",
                "longer than `max_lease`",
            ),
            ("lease = \"0s\"", "at least 1s"),
            ("leases = \"1s\"", "unknown field `leases`"),
        ] {
            std::fs::write(&path, format!("# tasks\n[tasks]\n{text}\n")).expect("write");
            let err = Config::load(&path, true).expect_err(text);
            assert!(err.to_string().contains(expect), "{text}: {err}");
            assert_eq!(err.line.map(|l| l >= 2), Some(true), "{text}: {err}");
        }
    }

    #[cfg(feature = "a2a")]
    #[test]
    fn an_a2a_section_that_cannot_work_is_refused_at_its_line_naming_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(
            &path,
            "[a2a]\nexpose = [\"role:tl\", \"reviewer\"]\nwait = \"5s\"\n\
             [a2a.remote.planner]\nurl = \"http://127.0.0.1:9\"\n",
        )
        .expect("write");
        let config = Config::load(&path, true).expect("valid");
        let a2a = config.a2a.expect("the section");
        assert_eq!(a2a.targets().expect("targets").len(), 2);
        for (text, says) in [
            ("expose = [\"role:tl\", \"role:tl\"]", "exposed twice"),
            ("expose = [\"not an id!\"]", "cannot be exposed"),
            ("max_streams = 0", "max_streams"),
            ("wait = \"1h\"", "at most 10m"),
            (
                "[a2a.remote.x]\nurl = \"ftp://host\"",
                "http:// or https://",
            ),
            ("[a2a.remote.a__b]\nurl = \"http://h\"", "`__`"),
        ] {
            std::fs::write(&path, format!("# agents\n[a2a]\n{text}\n")).expect("write");
            let err = Config::load(&path, true).expect_err(text);
            assert!(err.to_string().contains(says), "{text}: {err}");
            assert_eq!(err.line, Some(2), "{text}: {err}");
        }
    }

    #[test]
    fn the_store_cache_is_taken_in_mib_and_a_size_that_cannot_work_is_refused_at_its_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(&path, "[store]\n").expect("write");
        let config = Config::load(&path, true).expect("valid");
        assert_eq!(config.store_cache_bytes(), Ok(None));
        std::fs::write(&path, "[store]\ncache_mib = 8\n").expect("write");
        let config = Config::load(&path, true).expect("valid");
        assert_eq!(config.store_cache_bytes(), Ok(Some(8 << 20)));
        for text in ["cache_mib = 0", "cache_mib = 2000000"] {
            std::fs::write(&path, format!("# store\n[store]\n{text}\n")).expect("write");
            let err = Config::load(&path, true).expect_err(text);
            assert!(err.to_string().contains("`cache_mib`"), "{text}: {err}");
            assert_eq!(err.line, Some(3), "{text}: {err}");
        }
    }

    #[cfg(feature = "fetch")]
    #[test]
    fn web_fetch_is_on_only_with_its_section() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(&path, "trust = \"bounded\"\n").expect("write");
        assert_eq!(Config::load(&path, true).expect("valid").fetch, None);
        std::fs::write(
            &path,
            "[fetch]\nmax_bytes = 1000\nallow_hosts = [\"docs.internal\"]\n",
        )
        .expect("write");
        let fetch = Config::load(&path, true).expect("valid").fetch.expect("on");
        assert_eq!(fetch.max_bytes, 1000);
        assert_eq!(fetch.allow_hosts, ["docs.internal"]);
        assert!(!fetch.allow_private, "private addresses stay refused");
        std::fs::write(&path, "[fetch]\nmax_byte = 1000\n").expect("write");
        let err = Config::load(&path, true).expect_err("unknown field");
        assert_eq!(err.line, Some(2), "{err}");
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(
            &path,
            "[roles.dev]\ntools = [\"send_message\"]\n\n[roles.pm]\ntool = []\n",
        )
        .expect("write");
        let err = Config::load(&path, true).expect_err("unknown field");
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.to_string().contains("guildhall.toml:5"), "{err}");

        std::fs::write(&path, "[roles.dev]\ntools = [\"context_*\", \"[bad\"]\n").expect("write");
        let err = Config::load(&path, true).expect_err("bad glob");
        assert!(err.reason.contains("roles.dev.tools"), "{err}");

        std::fs::write(&path, "[roles.dev]\ntools = [\"context_*\"]\n").expect("write");
        let tools = Config::load(&path, true)
            .expect("valid")
            .role_tools()
            .expect("valid");
        assert!(tools["dev"].allows("context_get"));
        assert!(!tools["dev"].allows("send_message"));

        // Semantic errors in governance settings name their line too.
        for (text, line, what) in [
            (
                "[[rules]]\ntool = \"x\"\naction = \"perhaps\"\n",
                3,
                "perhaps",
            ),
            ("[tools.shell]\nrate = \"lots\"\n", 2, "invalid rate `lots`"),
            (
                "[audit]\nretention = \"forever\"\n",
                2,
                "invalid duration `forever`",
            ),
            (
                "[[hooks]]\nphase = \"before\"\ncommand = []\n",
                3,
                "needs a program",
            ),
            ("trust = \"total\"\n", 1, "total"),
        ] {
            std::fs::write(&path, text).expect("write");
            let err = Config::load(&path, true).expect_err(text);
            assert_eq!(err.line, Some(line), "{text}: {err}");
            assert!(err.reason.contains(what), "{text}: {err}");
        }

        std::fs::write(
            &path,
            "trust = \"bounded\"\n[roles.dev]\ntrust = \"read_only\"\n[tools.shell]\nmax_lines = 5\nrate = \"10/min\"\n[[hooks]]\ntools = \"shell\"\nphase = \"before\"\ncommand = [\"true\"]\n",
        )
        .expect("write");
        let governance = Config::load(&path, true).expect("valid").governance();
        assert_eq!(governance.trust, Trust::Bounded);
        assert_eq!(governance.roles["dev"].trust, Some(Trust::ReadOnly));
        let shell = &governance.tools["shell"];
        assert_eq!(
            shell.truncate.map(|l| (l.max_lines, l.max_bytes)),
            Some((5, 51_200))
        );
        assert_eq!(governance.hooks[0].name, "true");

        assert!(Config::load(&dir.path().join("absent.toml"), false).is_ok());
        assert!(Config::load(&dir.path().join("absent.toml"), true).is_err());
    }
}
