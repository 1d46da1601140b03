//! How one MCP server is started and proxied: a `[servers.NAME]` section of
//! `guildhall.toml`, or the same fields given at run time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::governance::Glob;

/// One proxied MCP server: a program started over stdio (`command`), or a Streamable HTTP
/// endpoint (`url`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The program to run (looked up in `PATH`), e.g. `npx`. Empty for an HTTP server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    /// The server's Streamable HTTP endpoint, instead of a `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent with every request to `url` (e.g. `Authorization`). `${NAME}` in a value
    /// is guildhall's environment variable `NAME`, read at each connection.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
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
    /// How long a listing of tools waits for its first start once it is added (at most
    /// `startup_timeout`; `0s` waits not at all): a client that lists once, as it connects,
    /// then sees its tools. Past it, its tools come later with `list_changed`.
    #[serde(default = "default_listing_wait", with = "crate::time::humane")]
    pub listing_wait: Duration,
    /// After a call is cancelled (its deadline, its caller gone), how long the server has to
    /// answer a liveness probe before it is taken for hung, killed and restarted.
    #[serde(default = "default_hang_grace", with = "crate::time::humane")]
    pub hang_grace: Duration,
    /// When it is restarted (OTP restart types).
    #[serde(default)]
    pub restart: RestartType,
    /// The most calls in flight to it (to each copy, with `instances`) at once; further calls
    /// wait their turn (up to their deadline). Unlimited when absent, one per copy when
    /// absent with `instances` above 1.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Restart it when its process's resident memory passes this many MiB (checked every
    /// second).
    #[serde(default)]
    pub max_rss_mib: Option<u64>,
    /// Copies of the server to run (stdio only), for a tool set that is not safe to call
    /// concurrently: each call goes to one copy, each copy takes `concurrency` calls at once
    /// (one, unless set). Default 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub instances: usize,
    /// Its sandbox (stdio only; on unless `sandbox = { enabled = false }`): `[sandbox]`'s
    /// network, writing in its directory and the default file roots, reading what its
    /// program needs ([`ServerSandbox`]).
    #[serde(default)]
    pub sandbox: ServerSandbox,
}

/// `[servers.NAME] sandbox = { ... }`: what a proxied stdio server may reach.
///
/// Confined by default (`enabled = false` runs it with the server's rights): besides what
/// every sandbox reads, it reads its program's installation (the directory above the one
/// its program is in: `/usr`, a virtualenv) and each argument that names an existing path
/// (a file's whole directory, its package's root and every `node_modules` above it); it
/// writes in its working directory and the default file roots; its network is `[sandbox]`'s
/// (none by default). Never the data directory: an argument inside it stops the start with
/// an error that says so. A server that fetches its package at start (`npx -y`, `uvx`)
/// needs the network: `network = "proxy"` with the registry in `[sandbox.proxy] allow`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSandbox {
    /// Confined at all (default `true`).
    pub enabled: bool,
    /// More paths it reads (relative ones are the config file's; `~` is the home
    /// directory).
    pub read: Vec<PathBuf>,
    /// More paths it writes.
    pub write: Vec<PathBuf>,
    /// Its network, over `[sandbox] network`.
    pub network: Option<crate::sandbox::Network>,
}

impl ServerSandbox {
    /// What a process running `programs` with `args` in `cwd` reaches besides its agent's
    /// roots: `read` and `write` (relative ones from `base`), the programs' installations,
    /// the arguments' paths, and `cwd` writable unless it is the data directory (covered:
    /// the process runs there with nothing to see). `unix` allows Unix stream sockets.
    ///
    /// # Errors
    /// An argument naming a path in the data directory, which no sandbox may reach.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub(crate) fn reach(
        &self,
        sandbox: &crate::sandbox::Sandbox,
        base: &std::path::Path,
        cwd: &std::path::Path,
        programs: &[&str],
        args: &[String],
        unix: bool,
    ) -> Result<crate::sandbox::Extra, String> {
        use crate::sandbox::{argument_paths, expand_home, program_reach};
        let arguments = argument_paths(args, cwd);
        if let Some(inside) = arguments.iter().find(|p| sandbox.protects(p)) {
            return Err(format!(
                "its argument path `{}` is inside the data directory, which no sandbox may \
                 reach: keep its files elsewhere, or give it sandbox = {{ enabled = false }}",
                inside.display()
            ));
        }
        let from_base = |p: &PathBuf| base.join(expand_home(p));
        Ok(crate::sandbox::Extra {
            read: self
                .read
                .iter()
                .map(from_base)
                .chain(programs.iter().flat_map(|p| program_reach(p, cwd)))
                .chain(arguments)
                .filter(|p| !sandbox.protects(p))
                .collect(),
            write: self
                .write
                .iter()
                .map(from_base)
                .chain(Some(cwd.to_path_buf()).filter(|d| !sandbox.protects(d)))
                .collect(),
            network: self.network,
            unix,
        })
    }
}

impl Default for ServerSandbox {
    fn default() -> Self {
        Self {
            enabled: true,
            read: Vec::new(),
            write: Vec::new(),
            network: None,
        }
    }
}

/// The most copies of one server.
pub const MAX_INSTANCES: usize = 64;

fn one() -> usize {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn is_one(n: &usize) -> bool {
    *n == 1
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
            url: None,
            headers: BTreeMap::new(),
            args: args.into_iter().collect(),
            env: BTreeMap::new(),
            cwd: None,
            tools: None,
            timeout: default_timeout(),
            startup_timeout: default_startup_timeout(),
            listing_wait: default_listing_wait(),
            hang_grace: default_hang_grace(),
            restart: RestartType::Permanent,
            concurrency: None,
            max_rss_mib: None,
            instances: 1,
            sandbox: ServerSandbox::default(),
        }
    }

    /// A server reached over Streamable HTTP at `url`, with the defaults for everything else.
    pub fn http(url: impl Into<String>) -> Self {
        Self {
            command: String::new(),
            url: Some(url.into()),
            ..Self::command("", Vec::new())
        }
    }

    /// Checks that the fields fit together: a `command` or a `url` (not both), an `http(s)`
    /// URL, header names HTTP allows, and no process settings for an HTTP server.
    ///
    /// # Errors
    /// A message naming the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_INSTANCES).contains(&self.instances) {
            return Err(format!(
                "`instances` is {}; give 1 to {MAX_INSTANCES}",
                self.instances
            ));
        }
        if self.concurrency == Some(0) {
            return Err("`concurrency` must be at least 1".into());
        }
        match (&self.url, self.command.is_empty()) {
            (None, true) => {
                return Err("give `command` (a program run over stdio) or `url` (a Streamable HTTP endpoint)".into());
            }
            (Some(_), false) => {
                return Err("give `command` or `url`, not both".into());
            }
            (Some(url), true) => {
                let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                if !matches!(scheme.as_deref(), Some("http" | "https")) {
                    return Err(format!(
                        "`url` is `{url}`; an MCP endpoint is `http://` or `https://`"
                    ));
                }
                for (field, set) in [
                    ("args", !self.args.is_empty()),
                    ("env", !self.env.is_empty()),
                    ("cwd", self.cwd.is_some()),
                    ("max_rss_mib", self.max_rss_mib.is_some()),
                    ("instances", self.instances != 1),
                ] {
                    if set {
                        return Err(format!(
                            "`{field}` is for a server guildhall runs (`command`), not one at a `url`"
                        ));
                    }
                }
                for name in self.headers.keys() {
                    if name.is_empty()
                        || !name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
                    {
                        return Err(format!("`headers`: `{name}` is not an HTTP header name"));
                    }
                }
            }
            (None, false) => {
                if !self.headers.is_empty() {
                    return Err("`headers` are for a server at a `url`".into());
                }
            }
        }
        Ok(())
    }

    /// What `status` shows for it: its command line or its URL.
    pub(crate) fn describe(&self) -> String {
        match &self.url {
            Some(url) => url.clone(),
            None => std::iter::once(self.command.as_str())
                .chain(self.args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
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

fn default_listing_wait() -> Duration {
    Duration::from_secs(10)
}

fn default_hang_grace() -> Duration {
    Duration::from_secs(5)
}
