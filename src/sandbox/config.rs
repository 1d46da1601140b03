//! `[sandbox]` in `guildhall.toml`: the settings every sandbox is made from.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The network a sandboxed process has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// No socket but a `socketpair`: no TCP, UDP, DNS, netlink or Unix socket by path.
    #[default]
    None,
    /// Out only through guildhall's egress proxy (`HTTP_PROXY`, `HTTPS_PROXY`), to the
    /// hosts `[sandbox.proxy]` allows: TCP to the proxy's port alone, no other socket.
    Proxy,
    /// The server's own network (every socket). guildhall's HTTP port is reachable then,
    /// and answers only what the agent's own token allows.
    Host,
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Proxy => "proxy",
            Self::Host => "host",
        })
    }
}

/// `[sandbox]` in `guildhall.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Confine started processes at all (default `true`). `false` runs them with the
    /// server's own rights, as guildhall did before it had a sandbox.
    pub enabled: bool,
    /// Refuse to start a process the kernel cannot confine fully (default `false`: start it
    /// confined as far as the kernel allows, the level reported).
    pub require: bool,
    /// The network of every sandbox, unless its role or agent says otherwise.
    pub network: Network,
    /// Network by role (`[sandbox.roles] builder = "host"`).
    pub roles: BTreeMap<String, Network>,
    /// Network by agent, over its role's.
    pub agents: BTreeMap<String, Network>,
    /// Paths readable besides [`SYSTEM`](super::SYSTEM): toolchains (`~/.cargo`, `~/.rustup`), an
    /// interpreter's prefix. `~` is the server's home directory.
    pub read: Vec<PathBuf>,
    /// Paths writable besides the agent's roots (shared by every agent: a cache, never a
    /// secret).
    pub write: Vec<PathBuf>,
    /// Processes at once in one sandbox, root included (at least 300: the kernel's floor
    /// for a PID namespace's `pid_max`).
    pub processes: u32,
    /// Where `network = "proxy"` may go.
    pub proxy: ProxyConfig,
    /// What commands may do to the `.git` directly in each root: `"write"` (default:
    /// agents commit) or `"read"` (history read-only, as Codex keeps it; needs the mount
    /// namespace).
    pub git: GitAccess,
}

/// `[sandbox] git`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GitAccess {
    /// Writable like the rest of the root.
    #[default]
    Write,
    /// Read-only: `git log` and `git diff` work, `git commit` does not.
    Read,
}

/// `[sandbox.proxy]`: the hosts sandboxes with `network = "proxy"` may reach, each
/// `name`, `*.name` (its subdomains), an address, or `*`, with `:port` for one port (else
/// 80 and 443; a `deny` entry without a port denies every port). Deny wins. A loopback,
/// private or link-local destination (and this machine's own addresses) is reached only
/// through an `allow` entry naming its host exactly; guildhall's own listeners never.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Hosts that may be reached (none by default).
    pub allow: Vec<String>,
    /// Hosts never reached, whatever `allow` says.
    pub deny: Vec<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            require: false,
            network: Network::None,
            roles: BTreeMap::new(),
            agents: BTreeMap::new(),
            read: Vec::new(),
            write: Vec::new(),
            processes: 512,
            proxy: ProxyConfig::default(),
            git: GitAccess::Write,
        }
    }
}
