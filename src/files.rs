//! The built-in file tools: `read_file`, `write_file`, `edit_file`, `multi_edit`,
//! `apply_patch`, `list_dir`, `glob` and `grep`, confined to configured roots and guarded against lost updates.
//!
//! - **Confinement** ([`confine`]): every path is walked from an open root one directory
//!   at a time, by the kernel, never through a symlink or `..`, never into a denied name
//!   (`.git`, `.guildhall` by default). Files with more than one hard link are refused (the
//!   other link may be outside the roots).
//! - **Read before write** ([`ledger`]): a read records the hash of what this agent saw; a
//!   write or an edit of an existing file goes ahead only if the file still has that hash,
//!   so a change made since by another agent or a person is never silently overwritten.
//! - **Atomic writes**: the new content goes to a temporary file beside the old one, is
//!   synced, and replaces it in one rename (permissions kept); checking and replacing one
//!   file is serialized in this process, so of two agents editing the same file from the
//!   same read, exactly one wins and the other is told the file changed.
//!
//! Roots may differ per agent or role (`[files.agents]`, `[files.roles]`): an agent gets
//! its own roots if it has some, else its role's, else the default ones.
//!
//! Off unless configured: `[files] roots = ["."]` in `guildhall.toml`, or
//! [`RuntimeBuilder::files`](crate::RuntimeBuilder::files).

mod apply_patch;
mod confine;
mod error;
mod lanes;
mod ledger;
mod listing;
mod patch;
mod search;
mod tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};

pub use apply_patch::{ApplyPatch, Change, PatchInput, Patched, PatchedFile};
pub use error::FileError;
pub use listing::{DirEntry, GlobFiles, GlobInput, ListDir, ListDirInput, Listing, Matches};
pub use search::{Grep, GrepInput, GrepMode, GrepResult};
pub use tools::{
    Edit, EditFile, EditInput, Edited, FileContent, Image, MultiEdit, MultiEditInput, ReadFile,
    ReadInput, WriteFile, WriteInput, Written,
};

use confine::Roots;
use lanes::Lanes;
use ledger::Ledger;

/// Locks that serialize the check and the replace of one file (by hash of its path).
const STRIPES: usize = 64;

/// Where the file tools may go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesConfig {
    /// The directories the tools may reach; a relative path is the first root's. Relative
    /// roots are taken from the working directory.
    pub roots: Vec<PathBuf>,
    /// Names no path may contain: globs over one name (`.git`, `.env*`, `*.pem`), compared
    /// without regard to case.
    pub deny: Vec<String>,
    /// Roots of the agents of a role, instead of `roots` (`[files.roles] dev = ["src"]`).
    pub roles: BTreeMap<String, Vec<PathBuf>>,
    /// Roots of one agent, instead of its role's or `roots`.
    pub agents: BTreeMap<String, Vec<PathBuf>>,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            roots: vec![PathBuf::from(".")],
            deny: vec![".git".into(), ".guildhall".into()],
            roles: BTreeMap::new(),
            agents: BTreeMap::new(),
        }
    }
}

/// Tells an agent's role, for roots chosen by role.
pub type RoleOf = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Roots other than the default ones, by agent and by role.
#[derive(Default)]
struct Scopes {
    agents: BTreeMap<String, Arc<Roots>>,
    roles: BTreeMap<String, Arc<Roots>>,
    role_of: OnceLock<RoleOf>,
}

/// The file tools' shared state: the open roots, what each agent has read, and the write
/// locks. A clone scoped to one agent ([`Files::scoped`]) shares all but the roots.
pub struct Files {
    roots: Arc<Roots>,
    ledger: Arc<Ledger>,
    stripes: Arc<[Mutex<()>]>,
    scopes: Arc<Scopes>,
    lanes: Arc<Lanes>,
}

impl Files {
    /// Opens the roots of `config`.
    ///
    /// # Errors
    /// [`FileError::Config`] when there is no root or one cannot be opened.
    pub fn open(config: &FilesConfig) -> Result<Arc<Self>, FileError> {
        let open = |which: &str, roots: &[PathBuf]| {
            Roots::open(roots, &config.deny)
                .map(Arc::new)
                .map_err(|err| match err {
                    FileError::Config(why) if !which.is_empty() => {
                        FileError::Config(format!("{which}: {why}"))
                    }
                    other => other,
                })
        };
        let scoped = |kind: &str, map: &BTreeMap<String, Vec<PathBuf>>| {
            map.iter()
                .map(|(name, roots)| {
                    Ok((
                        name.clone(),
                        open(&format!("[files.{kind}] {name}"), roots)?,
                    ))
                })
                .collect::<Result<BTreeMap<_, _>, FileError>>()
        };
        Ok(Arc::new(Self {
            roots: open("", &config.roots)?,
            ledger: Arc::new(Ledger::new()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            scopes: Arc::new(Scopes {
                agents: scoped("agents", &config.agents)?,
                roles: scoped("roles", &config.roles)?,
                role_of: OnceLock::new(),
            }),
            lanes: Arc::new(Lanes::new()),
        }))
    }

    /// The roots, as absolute paths.
    pub fn roots(&self) -> Vec<PathBuf> {
        self.roots.paths().map(Path::to_path_buf).collect()
    }

    /// Tells these files how to find an agent's role (for `[files.roles]`); the runtime
    /// does, from its agent directory. Set once; later calls change nothing.
    pub fn resolve_roles_with(&self, role_of: RoleOf) {
        let _ = self.scopes.role_of.set(role_of);
    }

    /// These files as `agent` sees them: its own roots, else its role's, else the
    /// default ones.
    pub fn scoped(self: &Arc<Self>, agent: Option<&str>) -> Arc<Self> {
        let scopes = &self.scopes;
        let Some(agent) = agent.filter(|_| !(scopes.agents.is_empty() && scopes.roles.is_empty()))
        else {
            return Arc::clone(self);
        };
        let chosen = scopes.agents.get(agent).or_else(|| {
            let role = scopes.role_of.get().and_then(|role_of| role_of(agent))?;
            scopes.roles.get(&role)
        });
        match chosen {
            None => Arc::clone(self),
            Some(roots) => Arc::new(Self {
                roots: Arc::clone(roots),
                ledger: Arc::clone(&self.ledger),
                stripes: Arc::clone(&self.stripes),
                scopes: Arc::clone(&self.scopes),
                lanes: Arc::clone(&self.lanes),
            }),
        }
    }

    /// Opens the directory `path` inside the roots (the first root when `None`), never
    /// through a symlink; with its absolute path.
    ///
    /// # Errors
    /// As the file tools refuse a path.
    pub(crate) fn open_dir(
        &self,
        path: Option<&str>,
    ) -> Result<(cap_std::fs::Dir, PathBuf), FileError> {
        self.roots.locate_dir(path)
    }

    /// Holds the write lock of `path` (a path shares its lock with about 1/64 of others).
    fn lock(&self, path: &Path) -> MutexGuard<'_, ()> {
        self.stripes[stripe_of(path)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the write locks of all `paths`, taken in one order (the stripes', ascending)
    /// so that two callers locking several never wait for each other in a circle.
    fn lock_all<'p>(&self, paths: impl Iterator<Item = &'p Path>) -> Vec<MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = paths.map(stripe_of).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .into_iter()
            .map(|i| {
                self.stripes[i]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
            })
            .collect()
    }

    /// The file tools, sharing this state.
    pub fn tools(self: &Arc<Self>) -> FileTools {
        FileTools {
            read: ReadFile(Arc::clone(self)),
            write: WriteFile(Arc::clone(self)),
            edit: EditFile(Arc::clone(self)),
            multi_edit: MultiEdit(Arc::clone(self)),
            apply_patch: ApplyPatch(Arc::clone(self)),
            list_dir: ListDir(Arc::clone(self)),
            glob: GlobFiles(Arc::clone(self)),
            grep: Grep(Arc::clone(self)),
        }
    }
}

/// Every file tool, over one [`Files`].
pub struct FileTools {
    /// `read_file`.
    pub read: ReadFile,
    /// `write_file`.
    pub write: WriteFile,
    /// `edit_file`.
    pub edit: EditFile,
    /// `multi_edit`.
    pub multi_edit: MultiEdit,
    /// `apply_patch`.
    pub apply_patch: ApplyPatch,
    /// `list_dir`.
    pub list_dir: ListDir,
    /// `glob`.
    pub glob: GlobFiles,
    /// `grep`.
    pub grep: Grep,
}

/// The write lock stripe of `path`.
fn stripe_of(path: &Path) -> usize {
    let stripe = xxhash_rust::xxh3::xxh3_64(path.as_os_str().as_encoded_bytes());
    // The modulo keeps it below STRIPES, which fits any usize.
    #[allow(clippy::cast_possible_truncation)]
    let index = (stripe % STRIPES as u64) as usize;
    index
}
