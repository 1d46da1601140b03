//! [`Roots`]: where the file tools may go. A path is split into plain names and walked one
//! directory at a time from an open root, every step opened by the kernel beneath the one
//! before (`openat2` with `RESOLVE_BENEATH` where the kernel has it, through `cap-std`)
//! and never through a symlink. So `..`, absolute paths elsewhere, symlinks (also one
//! swapped in between a check and a use) and names the configuration denies cannot lead
//! out: there is no string comparison to get wrong, and no moment when the check and the
//! use see different files.

use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};

use cap_fs_ext::DirExt;
use cap_std::ambient_authority;
use cap_std::fs::Dir;

use super::FileError;

/// The longest path accepted, in bytes (Linux's `PATH_MAX`).
const MAX_PATH: usize = 4096;
/// The longest single name accepted, in bytes (`NAME_MAX`).
const MAX_NAME: usize = 255;

/// The directories the file tools may reach, opened once.
pub(crate) struct Roots {
    roots: Vec<Root>,
    /// Names no path may pass through or end at: globs over one name (`.env*`, `*.pem`),
    /// matched without regard to case, so a case-insensitive file system cannot be used to
    /// slip past them.
    deny: globset::GlobSet,
}

struct Root {
    /// The root as configured, made absolute: what absolute paths are compared with.
    path: PathBuf,
    dir: Dir,
}

/// A path inside a root: the directory holding it, opened without following symlinks, and
/// the final name in it.
pub(crate) struct Located {
    pub(crate) parent: Dir,
    pub(crate) name: OsString,
    /// The path as the tools show it: the root's path joined with the names walked.
    pub(crate) shown: PathBuf,
}

impl Roots {
    /// Opens `roots` (made absolute against the working directory); `deny` lists names
    /// that no path may contain.
    pub(crate) fn open(roots: &[PathBuf], deny: &[String]) -> Result<Self, FileError> {
        if roots.is_empty() {
            return Err(FileError::Config(
                "no root given: the file tools need at least one directory".into(),
            ));
        }
        let mut opened = Vec::with_capacity(roots.len());
        for root in roots {
            let path = std::path::absolute(root)
                .map_err(|err| FileError::Config(format!("root {}: {err}", root.display())))?;
            let path = path
                .canonicalize()
                .map_err(|err| FileError::Config(format!("root {}: {err}", path.display())))?;
            let dir = Dir::open_ambient_dir(&path, ambient_authority())
                .map_err(|err| FileError::Config(format!("root {}: {err}", path.display())))?;
            opened.push(Root { path, dir });
        }
        let mut set = globset::GlobSetBuilder::new();
        for name in deny {
            let glob = globset::GlobBuilder::new(name)
                .case_insensitive(true)
                .literal_separator(true)
                .build()
                .map_err(|err| FileError::Config(format!("deny `{name}`: {err}")))?;
            set.add(glob);
        }
        let deny = set
            .build()
            .map_err(|err| FileError::Config(format!("deny: {err}")))?;
        Ok(Self {
            roots: opened,
            deny,
        })
    }

    /// The roots' absolute paths.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Path> {
        self.roots.iter().map(|r| r.path.as_path())
    }

    /// Finds `path`: relative to the first root, or absolute inside any root. With
    /// `create_dirs`, missing directories on the way are made (beneath the root).
    pub(crate) fn locate(&self, path: &str, create_dirs: bool) -> Result<Located, FileError> {
        let refuse = |why: String| FileError::Refused {
            path: path.to_owned(),
            why,
        };
        if path.is_empty() {
            return Err(refuse("the path is empty".into()));
        }
        if path.contains('\0') {
            return Err(refuse("the path contains a NUL byte".into()));
        }
        if path.len() > MAX_PATH {
            return Err(refuse(format!(
                "the path is {} bytes long; at most {MAX_PATH}",
                path.len()
            )));
        }
        let given = Path::new(path);
        let (root, rest) = if given.is_absolute() {
            self.roots
                .iter()
                .find_map(|r| given.strip_prefix(&r.path).ok().map(|rest| (r, rest)))
                .ok_or_else(|| refuse(format!("it is outside the roots ({})", self.shown())))?
        } else {
            (&self.roots[0], given)
        };
        let mut names: Vec<&OsStr> = Vec::new();
        for component in rest.components() {
            match component {
                Component::Normal(name) => names.push(name),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(refuse(
                        "it contains `..`; give the path from the root without it".into(),
                    ));
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(refuse(format!(
                        "it is outside the roots ({})",
                        self.shown()
                    )));
                }
            }
        }
        let Some((last, dirs)) = names.split_last() else {
            return Err(refuse("it names a root itself, not a file in it".into()));
        };
        for name in &names {
            self.check_name(path, name)?;
        }
        let mut parent = root
            .dir
            .try_clone()
            .map_err(|err| FileError::io(path, err))?;
        let mut shown = root.path.clone();
        for name in dirs {
            shown.push(name);
            parent = match parent.open_dir_nofollow(name) {
                Ok(dir) => dir,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound && create_dirs => {
                    parent
                        .create_dir(name)
                        .map_err(|err| FileError::io(path, err))?;
                    parent
                        .open_dir_nofollow(name)
                        .map_err(|err| FileError::io(path, err))?
                }
                Err(err) => return Err(step_error(path, &shown, &parent, name, err)),
            };
        }
        shown.push(last);
        Ok(Located {
            parent,
            name: (*last).to_owned(),
            shown,
        })
    }

    /// Opens the directory `path` (the first root when `None`), never through a symlink.
    /// Answers it with its absolute path.
    pub(crate) fn locate_dir(&self, path: Option<&str>) -> Result<(Dir, PathBuf), FileError> {
        let root = |r: &Root| {
            r.dir
                .try_clone()
                .map(|dir| (dir, r.path.clone()))
                .map_err(|err| FileError::io(path.unwrap_or("."), err))
        };
        let Some(path) = path.filter(|p| !p.is_empty() && *p != "." && *p != "./") else {
            return root(&self.roots[0]);
        };
        if let Some(r) = self.roots.iter().find(|r| Path::new(path) == r.path) {
            return root(r);
        }
        let at = self.locate(path, false)?;
        match at.parent.open_dir_nofollow(&at.name) {
            Ok(dir) => Ok((dir, at.shown)),
            Err(err) => Err(step_error(path, &at.shown, &at.parent, &at.name, err)),
        }
    }

    /// Whether `name` is one the configuration denies.
    pub(crate) fn denies(&self, name: &OsStr) -> bool {
        self.deny.is_match(Path::new(name))
    }

    fn check_name(&self, path: &str, name: &OsStr) -> Result<(), FileError> {
        let refuse = |why: String| FileError::Refused {
            path: path.to_owned(),
            why,
        };
        if name.len() > MAX_NAME {
            return Err(refuse(format!(
                "a name in it is {} bytes long; at most {MAX_NAME}",
                name.len()
            )));
        }
        if self.denies(name) {
            return Err(refuse(format!(
                "`{}` is denied to the file tools (`[files] deny`)",
                name.to_string_lossy()
            )));
        }
        Ok(())
    }

    fn shown(&self) -> String {
        self.paths()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The refusal for `name` in `parent` when it is a symlink (shown as `shown`).
pub(crate) fn symlink_refusal(
    path: &str,
    parent: &Dir,
    name: &OsStr,
    shown: &Path,
) -> Option<FileError> {
    let is_link = parent
        .symlink_metadata(name)
        .is_ok_and(|m| m.file_type().is_symlink());
    is_link.then(|| FileError::Refused {
        path: path.to_owned(),
        why: format!(
            "{} is a symlink; the file tools do not follow symlinks",
            shown.display()
        ),
    })
}

/// Why a directory on the way could not be entered, in words: a symlink is named as one.
fn step_error(
    path: &str,
    shown: &Path,
    parent: &Dir,
    name: &OsStr,
    err: std::io::Error,
) -> FileError {
    if let Some(refusal) = symlink_refusal(path, parent, name, shown) {
        return refusal;
    }
    if err.kind() == std::io::ErrorKind::NotFound {
        return FileError::NotFound {
            path: path.to_owned(),
        };
    }
    FileError::io(path, err)
}
