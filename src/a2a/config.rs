//! `[a2a]`: who is exposed to remote A2A clients, and the remote A2A agents made tools.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// `[a2a]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aConfig {
    /// The agents (`reviewer`) and roles (`role:tl`) remote A2A clients may send to.
    #[serde(default)]
    pub expose: Vec<String>,
    /// The cards' description (each names its agent or role after it).
    #[serde(default)]
    pub description: Option<String>,
    /// The longest a blocking `SendMessage` waits for its task to end or ask (default 30 s);
    /// after it the task is answered as it stands.
    #[serde(default, with = "crate::time::humane::option")]
    pub wait: Option<Duration>,
    /// Streams and blocking sends waiting at once, over all callers (default 256): a stream
    /// past it is refused, a blocking send answers at once.
    #[serde(default)]
    pub max_streams: Option<usize>,
    /// The same for one caller (default 16), so one caller cannot take them all.
    #[serde(default)]
    pub max_streams_per_caller: Option<usize>,
    /// Webhooks may be at private addresses (loopback, the local network): for local
    /// webhooks a trusted operator runs. Off by default: a caller could otherwise make the
    /// server post into the network it sits in.
    #[serde(default)]
    pub push_private: bool,
    /// Remote A2A agents, each the tool `a2a__NAME__send`.
    #[serde(default)]
    pub remote: BTreeMap<String, RemoteConfig>,
}

/// `[a2a.remote.NAME]`: a remote A2A agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// Its base URL: where its card is (`/.well-known/agent-card.json` below it).
    pub url: String,
    /// The call's budget (default 60 s): past it the call is cut off and answered `timeout`.
    #[serde(default, with = "crate::time::humane::option")]
    pub timeout: Option<Duration>,
    /// Sent as `Authorization: Bearer …`, read from this environment variable.
    #[serde(default)]
    pub token_env: Option<String>,
}

/// The default of `[a2a] wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The default of `[a2a] max_streams`.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// The default of `[a2a] max_streams_per_caller`.
pub const DEFAULT_MAX_STREAMS_PER_CALLER: usize = 16;
/// The default of `[a2a.remote.NAME] timeout`.
pub const DEFAULT_REMOTE_TIMEOUT: Duration = Duration::from_secs(60);

/// Who an exposed name is: one agent, or anyone in a role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `reviewer`.
    Agent(String),
    /// `role:tl`.
    Role(String),
}

impl Target {
    /// Reads `role:NAME` or an agent id.
    ///
    /// # Errors
    /// What is wrong with the name.
    pub fn parse(name: &str) -> Result<Self, String> {
        let target = match name.strip_prefix("role:") {
            Some(role) => Self::Role(role.to_owned()),
            None => Self::Agent(name.to_owned()),
        };
        let id = match &target {
            Self::Agent(id) | Self::Role(id) => id,
        };
        crate::agents::AgentId::parse(id)
            .map_err(|err| format!("`{name}` cannot be exposed over A2A: {err}"))?;
        Ok(target)
    }

    /// As mail and the board address it: `reviewer`, `role:tl`.
    pub fn address(&self) -> String {
        match self {
            Self::Agent(id) => id.clone(),
            Self::Role(role) => format!("role:{role}"),
        }
    }

    /// Its path below the server: `/a2a/agent/reviewer`, `/a2a/role/tl`.
    pub fn path(&self) -> String {
        match self {
            Self::Agent(id) => format!("/a2a/agent/{id}"),
            Self::Role(role) => format!("/a2a/role/{role}"),
        }
    }
}

impl A2aConfig {
    /// The exposed targets, checked.
    ///
    /// # Errors
    /// The first name that cannot be exposed, or one given twice.
    pub fn targets(&self) -> Result<Vec<Target>, String> {
        let mut targets: Vec<Target> = Vec::with_capacity(self.expose.len());
        for name in &self.expose {
            let target = Target::parse(name)?;
            if targets.contains(&target) {
                return Err(format!("`{name}` is exposed twice"));
            }
            targets.push(target);
        }
        Ok(targets)
    }

    /// Checks every setting (the config's load calls it, to name the line).
    ///
    /// # Errors
    /// What is wrong.
    pub fn check(&self) -> Result<(), String> {
        self.targets()?;
        if self.max_streams == Some(0) || self.max_streams_per_caller == Some(0) {
            return Err("max_streams and max_streams_per_caller must be at least 1".into());
        }
        if self.wait.is_some_and(|w| w > Duration::from_secs(600)) {
            return Err("wait must be at most 10m: a caller can stream or poll for longer".into());
        }
        for (name, remote) in &self.remote {
            check_remote(name, remote)?;
        }
        Ok(())
    }
}

/// Checks `[a2a.remote.NAME]`.
fn check_remote(name: &str, remote: &RemoteConfig) -> Result<(), String> {
    crate::agents::AgentId::parse(name)
        .map_err(|err| format!("[a2a.remote.{name}]: not a usable name: {err}"))?;
    if name.contains("__") {
        return Err(format!(
            "[a2a.remote.{name}]: a name may not hold `__` (the tool is a2a__NAME__send)"
        ));
    }
    let url = remote.url.trim();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "[a2a.remote.{name}] url `{url}`: give an http:// or https:// URL"
        ));
    }
    if remote.timeout.is_some_and(|t| t.is_zero()) {
        return Err(format!("[a2a.remote.{name}] timeout must be above zero"));
    }
    Ok(())
}
