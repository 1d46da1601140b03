//! How one MCP server is started and proxied: a `[servers.NAME]` section of
//! `guildhall.toml`, or the same fields given at run time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::governance::Glob;

/// One proxied MCP server, started over stdio.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The program to run (looked up in `PATH`), e.g. `npx`.
    pub command: String,
    /// Its arguments, each passed as one argv entry (no shell).
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables set for it, on top of guildhall's own environment (less any
    /// `GUILDHALL_*` variable, where tokens live).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory (relative paths are taken from the config file's directory).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Which of its tools to expose (globs on the server's own tool names; all when absent).
    #[serde(default)]
    pub tools: Option<Vec<Glob>>,
    /// The default time budget of a call to one of its tools.
    #[serde(default = "default_timeout", with = "crate::time::humane")]
    pub timeout: Duration,
    /// How long starting it (process start and MCP handshake) may take.
    #[serde(default = "default_startup_timeout", with = "crate::time::humane")]
    pub startup_timeout: Duration,
    /// After a call is cancelled (its deadline, its caller gone), how long the server has to
    /// answer a liveness probe before it is taken for hung, killed and restarted.
    #[serde(default = "default_hang_grace", with = "crate::time::humane")]
    pub hang_grace: Duration,
    /// When it is restarted (OTP restart types).
    #[serde(default)]
    pub restart: RestartType,
    /// The most calls in flight to it at once; further calls wait their turn (up to their
    /// deadline). Unlimited when absent.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Restart it when its process's resident memory passes this many MiB (checked every
    /// second).
    #[serde(default)]
    pub max_rss_mib: Option<u64>,
}

/// When a server's process is restarted after it ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartType {
    /// Always (the default).
    #[default]
    Permanent,
    /// Only after it failed (crashed, hung, exited non-zero, failed to start).
    Transient,
    /// Never: once it ends, its tools answer `unavailable` until it is restarted by hand
    /// (`guildhall servers restart`).
    Temporary,
}

impl RestartType {
    /// The type as the config file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Permanent => "permanent",
            Self::Transient => "transient",
            Self::Temporary => "temporary",
        }
    }
}

impl ServerConfig {
    /// A server run as `command args…`, with the defaults for everything else.
    pub fn command(command: impl Into<String>, args: impl IntoIterator<Item = String>) -> Self {
        Self {
            command: command.into(),
            args: args.into_iter().collect(),
            env: BTreeMap::new(),
            cwd: None,
            tools: None,
            timeout: default_timeout(),
            startup_timeout: default_startup_timeout(),
            hang_grace: default_hang_grace(),
            restart: RestartType::Permanent,
            concurrency: None,
            max_rss_mib: None,
        }
    }

    /// Whether the server's tool `name` is exposed.
    pub(crate) fn exposes(&self, name: &str) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|globs| globs.iter().any(|g| g.matches(name)))
    }
}

/// Checks a server's name: it becomes part of its tools' names (`mcp__NAME__tool`), so 1–32
/// characters of `[A-Za-z0-9_-]`, with no `__` (which separates the parts).
///
/// # Errors
/// A message naming the rule broken.
pub fn validate_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 32 {
        return Err(format!(
            "server name `{name}` must be 1 to 32 characters long"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
    {
        return Err(format!(
            "server name `{name}` has {c:?}; use letters, digits, `_` or `-`"
        ));
    }
    if name.contains("__") {
        return Err(format!(
            "server name `{name}` contains `__`, which separates the parts of its tools' names"
        ));
    }
    Ok(())
}

fn default_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_startup_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_hang_grace() -> Duration {
    Duration::from_secs(5)
}
