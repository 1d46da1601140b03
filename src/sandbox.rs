//! The sandbox every process guildhall starts for an agent runs in: a command of `bash`, a
//! background shell, a command tool, a proxied stdio server, a launched agent.
//!
//! One policy per agent, from what it may already reach: read-write in its file tools'
//! roots and a private temporary directory of its own (its `TMPDIR`; the shared `/tmp` is
//! not reachable), read-only on what programs need to run ([`SYSTEM`], extended by
//! `[sandbox] read`), nothing else. The data directory (store, config, token files,
//! spilled output, logs, guildhall's local socket) and the files named as protected are
//! hidden whatever the roots say.
//!
//! Enforced by the kernel, unprivileged, in the new process before it runs its program
//! ([`child`]):
//! - user, mount and PID namespaces: the protected paths are covered (an empty read-only
//!   `tmpfs` on a directory, `/dev/null` on a file: Landlock cannot take a part out of a
//!   root, and the data directory often lies in one), `/proc` shows the sandbox's own
//!   processes only, and the number of processes is bounded by the namespace's `pid_max`,
//!   which holds root too (`RLIMIT_NPROC` does not);
//! - Landlock ([`rules`]): files by path beneath, TCP ports, signals and abstract Unix
//!   sockets scoped to the sandbox;
//! - seccomp ([`filter`]): sockets by family (none but `socketpair` without network),
//!   namespaces, mounts, ptrace, kernel keyrings, BPF, `io_uring`;
//! - `no_new_privs`: a setuid program does not raise.
//!
//! What the kernel lacks is reported, never silently assumed ([`Level`]); with
//! `[sandbox] require = true` a process is not started unconfined.

mod child;
mod filter;
mod probe;
mod rules;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

pub(crate) use child::{Confinement, Program};
pub use probe::Level;

/// What programs need to run, readable (and executable) in every sandbox: those present.
pub const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys",
];

/// What a program says when the kernel refused it something: the errors a sandbox's
/// refusal shows as (`EACCES`, `EPERM`, `EROFS`).
pub(crate) fn looks_refused(errors: &str) -> bool {
    [
        "Permission denied",
        "Operation not permitted",
        "Read-only file system",
    ]
    .iter()
    .any(|said| errors.contains(said))
}

/// Files under `/etc` readable only by root, covered when the server runs as root.
const ROOT_SECRETS: &[&str] = &["/etc/shadow", "/etc/gshadow", "/etc/sudoers"];

/// The network a sandboxed process has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// No socket but a `socketpair`: no TCP, UDP, DNS, netlink or Unix socket by path.
    #[default]
    None,
    /// The server's own network (every socket). guildhall's HTTP port is reachable then,
    /// and answers only what the agent's own token allows.
    Host,
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
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
    /// Paths readable besides [`SYSTEM`]: toolchains (`~/.cargo`, `~/.rustup`), an
    /// interpreter's prefix. `~` is the server's home directory.
    pub read: Vec<PathBuf>,
    /// Paths writable besides the agent's roots (shared by every agent: a cache, never a
    /// secret).
    pub write: Vec<PathBuf>,
    /// Processes at once in one sandbox, root included (at least 300: the kernel's floor
    /// for a PID namespace's `pid_max`).
    pub processes: u32,
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
        }
    }
}

/// Why a sandbox could not be set up, or a process not started in one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// A setting is unusable.
    #[error("[sandbox] {0}")]
    Invalid(String),
    /// `require = true` and the kernel lacks a mechanism.
    #[error(
        "refused to start a process unconfined: the kernel lacks {missing} ([sandbox] require = true; \
         `guildhall doctor` tells what this machine offers)"
    )]
    Unavailable {
        /// What is missing, in words.
        missing: String,
    },
    /// Preparing the policy failed (a path could not be opened, the kernel refused a rule).
    #[error("the sandbox could not be prepared: {0}")]
    Prepare(String),
}

/// Paths no sandbox may reach, whatever the roots say.
#[derive(Debug, Clone, Default)]
pub struct Protected {
    /// Directories covered whole: the data directory above all.
    pub dirs: Vec<PathBuf>,
    /// Single files: the config file, token files.
    pub files: Vec<PathBuf>,
}

/// Tells an agent's role, for the network chosen by role.
pub type RoleOf = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The sandbox's shared state: the settings, what the kernel offers, the filters built once
/// and where the agents' private directories are.
pub struct Sandbox {
    config: SandboxConfig,
    level: Level,
    protected: Protected,
    /// Readable paths that exist: [`SYSTEM`] and `read`.
    readable: Vec<PathBuf>,
    writable: Vec<PathBuf>,
    private: PrivateDirs,
    filters: filter::Filters,
    role_of: OnceLock<RoleOf>,
    /// The server's uid and gid, mapped to themselves inside.
    ids: (u32, u32),
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.config)
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// A sandbox with `config`, hiding `protected`; the agents' private directories are
    /// made in a fresh directory of the system's temporary one, removed with the sandbox.
    ///
    /// # Errors
    /// [`SandboxError::Invalid`] for an unusable setting, [`SandboxError::Prepare`] when the
    /// private directory cannot be made.
    pub fn new(config: SandboxConfig, protected: Protected) -> Result<Arc<Self>, SandboxError> {
        if config.processes < 300 {
            return Err(SandboxError::Invalid(format!(
                "processes = {} is below 300, the kernel's floor for a PID namespace",
                config.processes
            )));
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let expand = |path: &Path| -> Result<PathBuf, SandboxError> {
            let path = match (path.strip_prefix("~"), &home) {
                (Ok(rest), Some(home)) => home.join(rest),
                (Ok(_), None) => {
                    return Err(SandboxError::Invalid(format!(
                        "`{}` starts with ~ and HOME is not set",
                        path.display()
                    )));
                }
                (Err(_), _) => path.to_path_buf(),
            };
            std::path::absolute(&path)
                .map_err(|e| SandboxError::Invalid(format!("`{}`: {e}", path.display())))
        };
        let mut readable: Vec<PathBuf> = SYSTEM.iter().map(PathBuf::from).collect();
        for path in &config.read {
            readable.push(expand(path)?);
        }
        readable.retain(|p| p.exists());
        let mut writable = Vec::new();
        for path in &config.write {
            let path = expand(path)?;
            if !path.is_dir() {
                return Err(SandboxError::Invalid(format!(
                    "write: `{}` is not a directory",
                    path.display()
                )));
            }
            writable.push(path);
        }
        let mut protected = protected;
        for dir in &protected.dirs {
            if let Some(inside) = writable
                .iter()
                .chain(&readable)
                .find(|p| p.starts_with(dir))
            {
                return Err(SandboxError::Invalid(format!(
                    "`{}` is inside the data directory `{}`, which no sandbox may reach",
                    inside.display(),
                    dir.display()
                )));
            }
        }
        let ids = probe::current_ids();
        if ids.0 == 0 {
            protected.files.extend(
                ROOT_SECRETS
                    .iter()
                    .map(PathBuf::from)
                    .filter(|p| p.exists()),
            );
        }
        // Covered with the directory they are in (and a path under a covered directory
        // no longer resolves to be covered again).
        let dirs = protected.dirs.clone();
        protected
            .dirs
            .retain(|p| !dirs.iter().any(|d| d != p && p.starts_with(d)));
        protected
            .files
            .retain(|p| p.is_file() && !dirs.iter().any(|d| p.starts_with(d)));
        let private = PrivateDirs::new()?;
        let filters = filter::Filters::build().map_err(SandboxError::Prepare)?;
        let level = probe::probe();
        Ok(Arc::new(Self {
            config,
            level,
            protected,
            readable,
            writable,
            private,
            filters,
            role_of: OnceLock::new(),
            ids,
        }))
    }

    /// What the kernel lets this sandbox enforce.
    pub fn level(&self) -> &Level {
        &self.level
    }

    /// Its settings.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// How this sandbox describes itself in `status`, `doctor` and the log: off, or the
    /// mechanisms applied.
    pub fn describe(&self) -> String {
        if self.config.enabled {
            self.level.to_string()
        } else {
            "off ([sandbox] enabled = false)".into()
        }
    }

    /// Whether `path` lies in a protected directory (the data directory).
    pub fn protects(&self, path: &Path) -> bool {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        self.protected.dirs.iter().any(|d| path.starts_with(d))
    }

    /// Sets how an agent's role is told, for `[sandbox.roles]` (once; later calls do
    /// nothing).
    pub fn resolve_roles_with(&self, role_of: RoleOf) {
        let _ = self.role_of.set(role_of);
    }

    /// The network `agent` gets: its own setting, else its role's, else the default.
    pub fn network_of(&self, agent: Option<&str>) -> Network {
        let Some(agent) = agent else {
            return self.config.network;
        };
        if let Some(network) = self.config.agents.get(agent) {
            return *network;
        }
        self.role_of
            .get()
            .and_then(|role_of| role_of(agent))
            .and_then(|role| self.config.roles.get(&role).copied())
            .unwrap_or(self.config.network)
    }

    /// The confinement of one process started for `agent`, read-write in `roots` and
    /// `extra.write`, readable `extra.read` besides the usual; `None` when the sandbox is
    /// off.
    ///
    /// # Errors
    /// [`SandboxError::Unavailable`] when `require` is set and the kernel lacks a
    /// mechanism; [`SandboxError::Prepare`] when a path or a rule cannot be set up.
    pub(crate) fn confine(
        &self,
        agent: Option<&str>,
        roots: &[PathBuf],
        extra: &Extra,
    ) -> Result<Option<Confinement>, SandboxError> {
        if !self.config.enabled {
            return Ok(None);
        }
        if self.config.require
            && let Some(missing) = self.level.missing()
        {
            return Err(SandboxError::Unavailable { missing });
        }
        let network = extra.network.unwrap_or_else(|| self.network_of(agent));
        let private = self.private.of(agent)?;
        for path in extra.read.iter().chain(&extra.write) {
            // Beneath a protected directory; or above one where no namespace covers it (a
            // rule on `/` would reach the data directory).
            if let Some(dir) =
                self.protected.dirs.iter().find(|d| {
                    path.starts_with(d) || (!self.level.namespaces && d.starts_with(path))
                })
            {
                return Err(SandboxError::Invalid(format!(
                    "`{}` is inside the data directory `{}`, which no sandbox may reach",
                    path.display(),
                    dir.display()
                )));
            }
        }
        let writable: Vec<&Path> = roots
            .iter()
            .chain(&self.writable)
            .chain(&extra.write)
            .chain([&private])
            .map(PathBuf::as_path)
            .collect();
        let readable: Vec<&Path> = self
            .readable
            .iter()
            .chain(&extra.read)
            .map(PathBuf::as_path)
            .collect();
        let ruleset = rules::build(&self.level, network, &readable, &writable)?;
        let namespaces = self.level.namespaces;
        let hide_dirs = c_paths(&self.protected.dirs)?;
        let hide_files = c_paths(&self.protected.files)?;
        let (uid, gid) = self.ids;
        Ok(Some(Confinement {
            network,
            namespaces,
            private_proc: self.level.private_proc,
            ruleset,
            proc_access: rules::read_access(&self.level),
            filters: self.filters.for_network(network, &self.level),
            uid_map: CString::new(format!("{uid} {uid} 1")).expect("digits"),
            gid_map: CString::new(format!("{gid} {gid} 1")).expect("digits"),
            pid_max: self
                .level
                .pid_limit
                .then(|| CString::new((self.config.processes + 1).to_string()).expect("digits")),
            hide_dirs,
            hide_files,
            dir: None,
            tmp: private,
        }))
    }

    /// What a sandboxed command's refusal most likely means, for the line added to its
    /// result when its errors show one (its own errors stay as they are).
    pub(crate) fn hint(&self, confinement: &Confinement, roots: &[PathBuf]) -> String {
        let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        format!(
            "guildhall's sandbox may have refused this: commands write only in {} and their \
             TMPDIR, read those and the system's directories, and have network = \"{}\"; see \
             [sandbox] in guildhall.toml",
            if roots.is_empty() {
                "their own directory".to_owned()
            } else {
                roots.join(", ")
            },
            confinement.network
        )
    }

    /// The environment a sandboxed process gets in place of `env`: `HOME` and `TMPDIR` are
    /// its private directory (the server's home is not reachable, and a program that finds
    /// its home unreadable often stops: git does).
    pub(crate) fn environment(
        &self,
        confinement: Option<&Confinement>,
        env: Vec<(String, String)>,
    ) -> Vec<(String, String)> {
        let Some(confinement) = confinement else {
            return env;
        };
        let tmp = confinement.tmp.display().to_string();
        env.into_iter()
            .filter(|(name, _)| name != "TMPDIR" && name != "HOME")
            .chain([("TMPDIR".to_owned(), tmp.clone()), ("HOME".to_owned(), tmp)])
            .collect()
    }
}

/// What one kind of process may reach besides its agent's roots: a command tool's
/// manifest (`sandbox = { read = [...], write = [...], network = "host" }`), a proxied
/// server's or a launch profile's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Extra {
    /// Readable besides [`SYSTEM`] and `[sandbox] read`.
    pub read: Vec<PathBuf>,
    /// Writable besides the roots.
    pub write: Vec<PathBuf>,
    /// Over the agent's network.
    pub network: Option<Network>,
}

/// What running `program` (a path, or a name looked up in `PATH`) needs to read: its
/// installation, the directory above the one it is in (`/usr` for `/usr/bin/node`, the
/// prefix of a pyenv or a virtualenv, `node_modules` for `node_modules/.bin/x`), for the
/// path as given and the one its links lead to.
pub(crate) fn program_reach(program: &str, cwd: &Path) -> Vec<PathBuf> {
    let given = Path::new(program);
    let found = if given.components().count() > 1 {
        Some(cwd.join(given))
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(given))
                .find(|p| p.is_file())
        })
    };
    let Some(found) = found else {
        return Vec::new();
    };
    let real = std::fs::canonicalize(&found).ok();
    [Some(found), real]
        .into_iter()
        .flatten()
        .filter_map(|p| p.parent()?.parent().map(Path::to_path_buf))
        .filter(|p| p.parent().is_some())
        .collect()
}

/// The arguments that name an existing path (relative ones from `cwd`): a server's script,
/// its directory argument. A file's whole directory, for the modules beside it.
pub(crate) fn argument_paths(args: &[String], cwd: &Path) -> Vec<PathBuf> {
    args.iter()
        .filter(|a| !a.starts_with('-'))
        .map(|a| cwd.join(a))
        .filter(|p| p.exists())
        .filter_map(|p| {
            if p.is_dir() {
                Some(p)
            } else {
                p.parent().map(Path::to_path_buf)
            }
        })
        .collect()
}

/// A sandbox and the file roots whose agent's part a started process may write.
#[derive(Clone)]
pub struct Confiner {
    /// The sandbox.
    pub sandbox: Arc<Sandbox>,
    /// The file tools' roots; without them a process writes only in its own directory.
    pub files: Option<Arc<crate::files::Files>>,
}

impl Confiner {
    /// The confinement of a `std` command started for `agent` in `dir` (which it enters
    /// again inside its mount namespace).
    pub(crate) fn confine(
        &self,
        agent: Option<&str>,
        dir: &Path,
        extra: &Extra,
    ) -> Result<Option<Arc<Confinement>>, SandboxError> {
        let roots = match &self.files {
            Some(files) => files.scoped(agent).roots(),
            None if self.sandbox.protects(dir) => Vec::new(),
            None => vec![dir.to_path_buf()],
        };
        let Some(mut confinement) = self.sandbox.confine(agent, &roots, extra)? else {
            return Ok(None);
        };
        let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        confinement.dir = CString::new(absolute.into_os_string().into_encoded_bytes()).ok();
        Ok(Some(Arc::new(confinement)))
    }
}

/// Where each agent's private temporary directory is: `<base>/<agent>`, the base made
/// (mode 0700) in the system's temporary directory and removed with the sandbox. Not in
/// the data directory: that is covered whole.
struct PrivateDirs {
    base: tempfile::TempDir,
}

impl PrivateDirs {
    fn new() -> Result<Self, SandboxError> {
        let base = tempfile::Builder::new()
            .prefix("guildhall-sandbox-")
            .tempdir()
            .map_err(|e| {
                SandboxError::Prepare(format!("cannot make the private directories: {e}"))
            })?;
        Ok(Self { base })
    }

    /// `agent`'s directory, made if missing (mode 0700).
    fn of(&self, agent: Option<&str>) -> Result<PathBuf, SandboxError> {
        let dir = self.base.path().join(file_name(agent.unwrap_or("")));
        crate::private_fs::create_dir_all(&dir)
            .map_err(|e| SandboxError::Prepare(format!("cannot make `{}`: {e}", dir.display())))?;
        Ok(dir)
    }
}

/// `paths` as the C strings the new process's system calls take.
fn c_paths(paths: &[PathBuf]) -> Result<Vec<CString>, SandboxError> {
    paths
        .iter()
        .map(|path| {
            CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|_| SandboxError::Prepare(format!("`{}` has a NUL", path.display())))
        })
        .collect()
}

/// An agent's name as one safe file name: letters, digits, `-`, `_` and `.` kept, anything
/// else (and a leading dot) as `%XX`; the anonymous caller is `%`.
fn file_name(agent: &str) -> String {
    if agent.is_empty() {
        return "%".into();
    }
    let mut name = String::with_capacity(agent.len());
    for (i, byte) in agent.bytes().enumerate() {
        if byte.is_ascii_alphanumeric() || b"-_".contains(&byte) || (byte == b'.' && i > 0) {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_become_one_safe_file_name() {
        assert_eq!(file_name("tl"), "tl");
        assert_eq!(file_name("a.b-c_d"), "a.b-c_d");
        assert_eq!(file_name(".."), "%2E.");
        assert_eq!(file_name("a/b"), "a%2Fb");
        assert_eq!(file_name(""), "%");
        assert_ne!(file_name("a/b"), file_name("a%2Fb"));
    }
}
