//! The tools that find files: `list_dir` (one directory, read through its open handle) and
//! `glob` (a walk as ripgrep's `ignore` does it, `.gitignore` respected, newest first).
//! A walk goes by path names, so every file it reports is confirmed through
//! [`Roots::locate`](super::confine::Roots) first: a directory swapped for a symlink
//! mid-walk cannot show a name from outside the roots.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tools::blocking;
use super::{FileError, Files};

/// Entries `list_dir` and files `glob` return when no `limit` is given, and at most.
const DEFAULT_LIMIT: usize = 1_000;
const MAX_LIMIT: usize = 10_000;

fn limit(given: Option<usize>) -> Result<usize, FileError> {
    let limit = given.unwrap_or(DEFAULT_LIMIT);
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(FileError::Invalid(format!(
            "limit is {limit}; give 1 to {MAX_LIMIT}"
        )))
    }
}

/// `list_dir`.
pub struct ListDir(pub(crate) Arc<Files>);

/// Input of `list_dir`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirInput {
    /// The directory: relative to the first root, or absolute inside a root (default: the
    /// first root).
    #[serde(default)]
    pub path: Option<String>,
    /// At most this many entries, by name (default 1000, at most 10000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One entry of a directory.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DirEntry {
    /// Its name.
    pub name: String,
    /// `file`, `dir`, `symlink` (not followed by the file tools) or `other`.
    pub kind: String,
    /// Its size in bytes (files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// A directory's entries.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Listing {
    /// The directory, as an absolute path.
    pub path: String,
    /// Its entries by name (denied names left out).
    pub entries: Vec<DirEntry>,
    /// How many entries it has in all (denied names left out).
    pub total: usize,
}

impl Tool for ListDir {
    type Input = ListDirInput;
    type Output = Listing;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "list_dir"
    }

    fn description(&self) -> &str {
        "Lists a directory: names, kinds (file, dir, symlink) and file sizes, by name. \
         Without `path`, the first root."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("List a directory")
    }

    fn detach(&self, _: &(), _: &ListDirInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ListDirInput,
        ctx: CallContext,
    ) -> Result<Listing, FileError> {
        let limit = limit(input.limit)?;
        let files = self.0.scoped(ctx.agent());
        blocking(&self.0, &ctx, move || {
            let shown_path = input.path.as_deref().unwrap_or(".");
            let (dir, path) = files.roots.locate_dir(input.path.as_deref())?;
            let io = |err: std::io::Error| FileError::io(shown_path, err);
            let mut entries = Vec::new();
            for entry in dir.entries().map_err(io)? {
                let entry = entry.map_err(io)?;
                let name = entry.file_name();
                if files.roots.denies(&name) {
                    continue;
                }
                let kind = entry.file_type().map_err(io)?;
                let (kind, bytes) = if kind.is_symlink() {
                    ("symlink", None)
                } else if kind.is_dir() {
                    ("dir", None)
                } else if kind.is_file() {
                    ("file", entry.metadata().ok().map(|m| m.len()))
                } else {
                    ("other", None)
                };
                entries.push(DirEntry {
                    name: name.to_string_lossy().into_owned(),
                    kind: kind.into(),
                    bytes,
                });
            }
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let total = entries.len();
            entries.truncate(limit);
            Ok(Listing {
                path: path.display().to_string(),
                entries,
                total,
            })
        })
        .await
    }
}

/// `glob`.
pub struct GlobFiles(pub(crate) Arc<Files>);

/// Input of `glob`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobInput {
    /// The pattern, matched against paths relative to `path`: `*` within one name, `**`
    /// across directories, `{a,b}` alternatives (e.g. `src/**/*.rs`, `**/*.{md,txt}`).
    pub pattern: String,
    /// The directory to search: relative to the first root, or absolute inside a root
    /// (default: the first root).
    #[serde(default)]
    pub path: Option<String>,
    /// At most this many files, newest first (default 1000, at most 10000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Files a pattern matched.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Matches {
    /// Absolute paths, most recently modified first.
    pub files: Vec<String>,
    /// How many files matched in all.
    pub total: usize,
}

impl Tool for GlobFiles {
    type Input = GlobInput;
    type Output = Matches;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "glob"
    }

    fn description(&self) -> &str {
        "Finds files by name pattern (`src/**/*.rs`), most recently modified first. Files \
         that .gitignore ignores are left out, as are symlinks."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Find files by pattern")
    }

    fn detach(&self, _: &(), _: &GlobInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: GlobInput,
        ctx: CallContext,
    ) -> Result<Matches, FileError> {
        let limit = limit(input.limit)?;
        let matcher = globset::GlobBuilder::new(&input.pattern)
            .literal_separator(true)
            .build()
            .map_err(|err| FileError::Invalid(format!("pattern {:?}: {err}", input.pattern)))?
            .compile_matcher();
        let files = self.0.scoped(ctx.agent());
        blocking(&self.0, &ctx, move || {
            let (_, base) = files.roots.locate_dir(input.path.as_deref())?;
            let walk_files = Arc::clone(&files);
            let walker = ignore::WalkBuilder::new(&base)
                .hidden(false)
                .follow_links(false)
                .require_git(false)
                .filter_entry(move |e| !walk_files.roots.denies(e.file_name()))
                .build();
            let mut found: Vec<(SystemTime, String)> = Vec::new();
            for entry in walker.flatten() {
                if !entry.file_type().is_some_and(|t| t.is_file()) {
                    continue;
                }
                let Ok(relative) = entry.path().strip_prefix(&base) else {
                    continue;
                };
                if !matcher.is_match(relative) {
                    continue;
                }
                if let Some(modified) = confirmed(&files, entry.path()) {
                    found.push((modified, entry.path().display().to_string()));
                }
            }
            found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let total = found.len();
            Ok(Matches {
                files: found.into_iter().take(limit).map(|(_, p)| p).collect(),
                total,
            })
        })
        .await
    }
}

/// The modification time of the regular file at `path`, if the confined walk reaches it
/// (none through a symlink, none outside the roots).
fn confirmed(files: &Files, path: &Path) -> Option<SystemTime> {
    let at = files.roots.locate(path.to_str()?, false).ok()?;
    let meta = at.parent.symlink_metadata(&at.name).ok()?;
    if !meta.is_file() {
        return None;
    }
    meta.modified()
        .ok()
        .map(cap_std::time::SystemTime::into_std)
}
