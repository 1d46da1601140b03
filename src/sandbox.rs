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
mod config;
mod egress;
mod error;
mod filter;
mod probe;
mod report;
mod rules;

use std::ffi::CString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub(crate) use child::{Confinement, Program};
pub use config::{GitAccess, Network, ProxyConfig, SandboxConfig};
pub use error::SandboxError;
pub use probe::Level;
pub use report::Report;

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
    egress: egress::Egress,
    report: Arc<OnceLock<Arc<dyn Report>>>,
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
        let report = Arc::new(OnceLock::new());
        let egress = egress::Egress::new(&config.proxy, Arc::clone(&report))?;
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
            egress,
            report,
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

    /// Sets where decisions are reported (once; later calls do nothing).
    pub fn report_to(&self, report: Arc<dyn Report>) {
        let _ = self.report.set(report);
    }

    /// Marks `port` on this machine as one of guildhall's own listeners (its HTTP port):
    /// the egress proxy never connects to it.
    pub fn guard_port(&self, port: u16) {
        self.egress.guard(port);
    }

    /// The port on 127.0.0.1 of `agent`'s egress proxy, started on first use (on the
    /// current Tokio runtime): where its sandboxes' `HTTP_PROXY` points.
    ///
    /// # Errors
    /// [`SandboxError::Prepare`] when it cannot listen, or no Tokio runtime runs.
    pub fn egress_port(&self, agent: Option<&str>) -> Result<u16, SandboxError> {
        self.egress.port_of(agent, &file_name(agent.unwrap_or("")))
    }

    /// `agent`'s private directory (its `HOME` and `TMPDIR` inside a sandbox), made if
    /// missing: outside the data directory, reachable by that agent's sandboxes alone.
    pub(crate) fn private_dir(&self, agent: Option<&str>) -> Result<PathBuf, SandboxError> {
        self.private.of(agent)
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
        let mut network = extra.network.unwrap_or_else(|| self.network_of(agent));
        if network == Network::Proxy && self.level.landlock < 4 {
            // Without Landlock's TCP rules nothing keeps a program to the proxy: no
            // network at all rather than all of it.
            if self.config.require {
                return Err(SandboxError::Unavailable {
                    missing: "Landlock's TCP rules (ABI 4), which network = \"proxy\" needs".into(),
                });
            }
            network = Network::None;
        }
        let proxy = match network {
            Network::Proxy => Some(self.egress_port(agent)?),
            Network::None | Network::Host => None,
        };
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
        let ruleset = rules::build(&self.level, network, proxy, &readable, &writable)?;
        let namespaces = self.level.namespaces;
        let mut hidden = self.protected.dirs.clone();
        if extra.unix && self.level.namespaces {
            // Landlock (ABI 7) cannot refuse a connect to a socket by path: the system's
            // are covered.
            hidden.extend(["/run"].iter().map(PathBuf::from).filter(|p| {
                p.is_dir() && !roots.iter().chain([&private]).any(|r| r.starts_with(p))
            }));
        }
        let hide_dirs = c_paths(&hidden)?;
        let read_only = if self.config.git == GitAccess::Read && self.level.namespaces {
            let repos: Vec<PathBuf> = roots
                .iter()
                .map(|root| root.join(".git"))
                .filter(|git| git.is_dir())
                .collect();
            c_paths(&repos)?
        } else {
            Vec::new()
        };
        let hide_files = c_paths(&self.protected.files)?;
        let (uid, gid) = self.ids;
        Ok(Some(Confinement {
            network,
            proxy,
            namespaces,
            private_proc: self.level.private_proc,
            ruleset,
            proc_access: rules::read_access(&self.level),
            filters: self.filters.for_network(network, extra.unix, &self.level),
            uid_map: CString::new(format!("{uid} {uid} 1")).expect("digits"),
            gid_map: CString::new(format!("{gid} {gid} 1")).expect("digits"),
            pid_max: self
                .level
                .pid_limit
                .then(|| CString::new((self.config.processes + 1).to_string()).expect("digits")),
            read_only,
            hide_dirs,
            hide_files,
            dir: None,
            tmp: private,
        }))
    }

    /// What a command's result needs to name a refusal later: cheap, formatted only when
    /// a refusal shows ([`explain`](Self::explain)).
    pub(crate) fn hint(
        &self,
        confinement: &Confinement,
        agent: Option<&str>,
        roots: &[PathBuf],
    ) -> Hint {
        Hint {
            agent: agent.map(Arc::from),
            roots: roots.to_vec(),
            network: confinement.network,
            started: Instant::now(),
        }
    }

    /// The line a sandboxed command's result gets, if any: the hosts the egress proxy
    /// refused it by name; else, when it failed with what a refusal shows as, the policy
    /// in words (its own errors stay as they are). Reported as a refusal of `tool`.
    pub(crate) fn explain(
        &self,
        hint: &Hint,
        tool: &str,
        failed: bool,
        errors: &str,
    ) -> Option<String> {
        let agent = hint.agent.as_deref();
        let proxied = if hint.network == Network::Proxy {
            self.egress
                .refused_since(&file_name(agent.unwrap_or("")), hint.started)
        } else {
            Vec::new()
        };
        let line = if !proxied.is_empty() {
            format!(
                "guildhall's sandbox proxy refused {}; see [sandbox.proxy] in guildhall.toml",
                proxied.join("; ")
            )
        } else if failed && looks_refused(errors) {
            self.policy_in_words(&hint.roots, hint.network)
        } else {
            return None;
        };
        if let Some(report) = self.report.get() {
            report.refused(agent, tool, &line);
        }
        Some(line)
    }

    /// What a sandboxed command's refusal most likely means.
    fn policy_in_words(&self, roots: &[PathBuf], network: Network) -> String {
        let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        format!(
            "guildhall's sandbox may have refused this: commands write only in {} and their \
             TMPDIR, read those and the system's directories, and have network = \"{network}\"; \
             see [sandbox] in guildhall.toml",
            if roots.is_empty() {
                "their own directory".to_owned()
            } else {
                roots.join(", ")
            },
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
        let proxy = confinement
            .proxy
            .map(|port| format!("http://127.0.0.1:{port}"));
        let proxy_vars = proxy.into_iter().flat_map(|url| {
            PROXY_VARIABLES
                .iter()
                .map(move |name| ((*name).to_owned(), url.clone()))
                .chain([("NODE_USE_ENV_PROXY".to_owned(), "1".to_owned())])
        });
        env.into_iter()
            .filter(|(name, _)| {
                name != "TMPDIR"
                    && name != "HOME"
                    && !PROXY_VARIABLES.contains(&name.as_str())
                    && !["NO_PROXY", "no_proxy"].contains(&name.as_str())
            })
            .chain([("TMPDIR".to_owned(), tmp.clone()), ("HOME".to_owned(), tmp)])
            .chain(proxy_vars)
            .collect()
    }
}

/// Where programs look for their proxy: each set to the agent's egress proxy with
/// `network = "proxy"`.
const PROXY_VARIABLES: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// What a command's result needs to name a sandbox's refusal ([`Sandbox::explain`]).
#[derive(Debug, Clone)]
pub(crate) struct Hint {
    agent: Option<Arc<str>>,
    roots: Vec<PathBuf>,
    network: Network,
    started: Instant,
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
    /// Unix stream sockets allowed (a launched agent's way back to guildhall, its own
    /// socket); `/run`, where the system's sockets live, is covered then. Never from a
    /// manifest.
    #[serde(skip)]
    pub unix: bool,
}

/// `path` with a leading `~` as the server's home directory (as it is, without `HOME`).
pub(crate) fn expand_home(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
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
/// its directory argument. A file's whole directory, for the modules beside it; and above
/// it, what a script's runtime looks for there: the package's root (the nearest directory
/// with a `package.json` or `pyproject.toml`) and every `node_modules` directory on the
/// way up, where Node resolves a package's dependencies.
pub(crate) fn argument_paths(args: &[String], cwd: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for path in args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(|a| cwd.join(a))
        .filter(|p| p.exists())
    {
        let path = std::path::absolute(&path).unwrap_or(path);
        let dir = if path.is_dir() {
            path
        } else {
            match path.parent() {
                Some(parent) => parent.to_path_buf(),
                None => continue,
            }
        };
        let mut package = false;
        // The root itself is never a package's (a rule there would reach everything).
        for above in dir.ancestors().skip(1).filter(|a| a.parent().is_some()) {
            if above.file_name().is_some_and(|n| n == "node_modules") {
                found.push(above.to_path_buf());
                continue;
            }
            let modules = above.join("node_modules");
            if modules.is_dir() {
                found.push(modules);
            }
            if !package
                && ["package.json", "pyproject.toml"]
                    .iter()
                    .any(|f| above.join(f).is_file())
            {
                found.push(above.to_path_buf());
                package = true;
            }
        }
        found.push(dir);
    }
    found.sort();
    found.dedup();
    found
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
///
/// A process that ends without dropping its sandbox (killed, or an embedder's runtime never
/// dropped) cannot remove its base, and what its agents left there would stay in the
/// temporary directory for good, one base a crash. So each base holds a lock file, locked
/// for as long as its sandbox lives; the first sandbox a process makes removes every base
/// whose lock nobody holds ([`sweep_abandoned`]).
struct PrivateDirs {
    base: tempfile::TempDir,
    /// Held (an exclusive `flock`) while the base is in use; the kernel lets it go with the
    /// process however it ends.
    _lock: std::fs::File,
}

/// What each base's name starts with.
const BASE_PREFIX: &str = "guildhall-sandbox-";
/// The lock file in each base. Agents' directories never have this name: a leading dot is
/// escaped ([`file_name`]).
const BASE_LOCK: &str = ".lock";

impl PrivateDirs {
    fn new() -> Result<Self, SandboxError> {
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            let removed = sweep_abandoned(&std::env::temp_dir());
            if removed > 0 {
                tracing::info!(
                    removed,
                    "removed private directories crashed processes left"
                );
            }
        });
        let prepare = |e: std::io::Error| {
            SandboxError::Prepare(format!("cannot make the private directories: {e}"))
        };
        let base = tempfile::Builder::new()
            .prefix(BASE_PREFIX)
            .tempdir()
            .map_err(prepare)?;
        let lock = std::fs::File::create_new(base.path().join(BASE_LOCK)).map_err(prepare)?;
        lock.try_lock()
            .map_err(|e| prepare(std::io::Error::other(e)))?;
        Ok(Self { base, _lock: lock })
    }

    /// `agent`'s directory, made if missing (mode 0700).
    fn of(&self, agent: Option<&str>) -> Result<PathBuf, SandboxError> {
        let dir = self.base.path().join(file_name(agent.unwrap_or("")));
        crate::private_fs::create_dir_all(&dir)
            .map_err(|e| SandboxError::Prepare(format!("cannot make `{}`: {e}", dir.display())))?;
        Ok(dir)
    }
}

/// Removes the bases in `tmp` that this user owns and whose lock nobody holds: their
/// processes ended without removing them. A base without a lock file is left (another
/// user's, or one being made this moment). Returns how many were removed.
fn sweep_abandoned(tmp: &Path) -> usize {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return 0;
    };
    let (me, _) = probe::current_ids();
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(BASE_PREFIX.as_bytes())
        {
            continue;
        }
        let base = entry.path();
        // Not followed: a link is not a base, and one owned by another user is theirs.
        match std::fs::symlink_metadata(&base) {
            Ok(meta) if meta.is_dir() && meta.uid() == me => {}
            _ => continue,
        }
        let Ok(lock) = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(base.join(BASE_LOCK))
        else {
            continue;
        };
        if lock.try_lock().is_ok() && std::fs::remove_dir_all(&base).is_ok() {
            removed += 1;
        }
    }
    removed
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

    /// Only this user's bases whose lock nobody holds go: not one in use, not one without
    /// a lock, not a link or a file that merely has the name.
    #[test]
    fn the_sweep_removes_only_abandoned_bases() {
        let tmp = tempfile::tempdir().unwrap();
        let base = |name: &str, lock: bool| {
            let dir = tmp.path().join(format!("{BASE_PREFIX}{name}"));
            std::fs::create_dir_all(dir.join("agent")).unwrap();
            std::fs::write(dir.join("agent/left.txt"), "an agent's file").unwrap();
            if lock {
                std::fs::write(dir.join(BASE_LOCK), "").unwrap();
            }
            dir
        };
        let abandoned = base("abandoned", true);
        let in_use = base("in-use", true);
        let held = std::fs::File::open(in_use.join(BASE_LOCK)).unwrap();
        held.try_lock().unwrap();
        let unlocked = base("no-lock", false);
        let outside = base_outside(&tmp);
        let link = tmp.path().join(format!("{BASE_PREFIX}link"));
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        std::fs::write(tmp.path().join(format!("{BASE_PREFIX}file")), "").unwrap();

        assert_eq!(sweep_abandoned(tmp.path()), 1);
        assert!(!abandoned.exists());
        assert!(in_use.join("agent/left.txt").exists());
        assert!(unlocked.exists());
        assert!(outside.join(BASE_LOCK).exists(), "a link is not followed");
        drop(held);
        assert_eq!(sweep_abandoned(tmp.path()), 1, "released, it is abandoned");
        assert!(!in_use.exists());
    }

    /// A directory with a lock file that only a link in the swept directory leads to.
    fn base_outside(tmp: &tempfile::TempDir) -> PathBuf {
        let outside = tmp.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join(BASE_LOCK), "").unwrap();
        outside
    }

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
