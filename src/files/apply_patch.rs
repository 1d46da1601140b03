//! `apply_patch`: changes several files at once in the patch format Codex's models write
//! ([`patch`](super::patch)), with the guarantees of the other file tools.
//!
//! - **Stale context is refused.** An updated file's chunks must find their lines in it; a
//!   patch written against content someone has changed since does not land, and the
//!   refusal shows the nearest lines. That is the patch's own proof of reading, so an
//!   update needs no earlier `read_file`; a delete, which keeps nothing of the file, does.
//! - **All or nothing before any write.** Every file is located, locked, read and patched
//!   in memory first; only a patch that applies whole is written, each file replaced in one
//!   step. A system error part way (a full disk) names the files already changed.
//! - **Confined as every file tool**: each path goes through the roots; an added file or
//!   a move's destination must not exist.

use std::sync::Arc;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::confine::Located;
use super::ledger::hash;
use super::patch::{self, Chunk, Hunk, Missing, Unplaced};
use super::tools::{
    MAX_FILE, as_text, blocking, caller, check_read, kept_of, nearest_lines, read_existing,
    replace_atomically, sync_dir,
};
use super::{FileError, Files};

/// The most files one patch changes.
const MAX_FILES: usize = 100;

/// `apply_patch`.
pub struct ApplyPatch(pub(crate) Arc<Files>);

/// Input of `apply_patch`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchInput {
    /// The whole patch, from `*** Begin Patch` to `*** End Patch`.
    pub input: String,
}

/// What a patch did to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Created.
    Added,
    /// Changed in place.
    Updated,
    /// Changed (or not) and moved.
    Moved,
    /// Removed.
    Deleted,
}

/// One file a patch changed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PatchedFile {
    /// The file, as an absolute path (after a move, where it went).
    pub path: String,
    /// What happened to it.
    pub change: Change,
    /// Where a moved file was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Its size afterwards, in bytes (0 when deleted).
    pub bytes: usize,
}

/// What `apply_patch` did, file by file in the patch's order.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Patched {
    /// The files changed.
    pub files: Vec<PatchedFile>,
}

impl Tool for ApplyPatch {
    type Input = PatchInput;
    type Output = Patched;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "apply_patch"
    }

    fn description(&self) -> &str {
        "Adds, updates, moves and deletes files with one patch, all or nothing:\n\
         *** Begin Patch\n\
         *** Add File: path/new.txt\n\
         +its lines, each after a +\n\
         *** Update File: path/old.py\n\
         *** Move to: path/renamed.py   (optional)\n\
         @@ def f():   (optional: a line the change follows)\n \
         a kept line (a space first)\n\
         -a removed line\n\
         +an added line\n\
         *** Delete File: path/gone.txt\n\
         *** End Patch\n\
         Give about three kept lines around each change. If an updated file no longer has \
         the kept and removed lines, nothing is written and the nearest lines are shown. A \
         file to delete must have been read with read_file first."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Apply a patch")
            .destructive(true)
    }

    fn detach(&self, _: &(), _: &PatchInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: PatchInput,
        ctx: CallContext,
    ) -> Result<Patched, FileError> {
        if input.input.len() as u64 > MAX_FILE {
            return Err(FileError::Invalid(format!(
                "the patch is {} bytes; at most {MAX_FILE}",
                input.input.len()
            )));
        }
        let hunks =
            patch::parse(&input.input).map_err(|err| FileError::Invalid(err.to_string()))?;
        if hunks.len() > MAX_FILES {
            return Err(FileError::Invalid(format!(
                "the patch changes {} files; at most {MAX_FILES} at once",
                hunks.len()
            )));
        }
        let (files, agent) = (self.0.scoped(ctx.agent()), caller(&ctx));
        blocking(&self.0, &ctx, move || {
            match patch_locked(&files, &agent, &hunks) {
                Ok(patched) => Ok(patched),
                Err(Unapplied::Refused(err)) => Err(err),
                // The search for the nearest lines runs once the locks are let go.
                Err(Unapplied::Unplaced(misplaced)) => {
                    let Misplaced {
                        path,
                        text,
                        chunk,
                        unplaced,
                    } = *misplaced;
                    Err(unplaced_error(&path, &text, &chunk, &unplaced))
                }
            }
        })
        .await
    }
}

/// Why a patch was not applied: a refusal ready to return, or a chunk whose lines are not
/// in its file (explained once the locks are released).
enum Unapplied {
    Refused(FileError),
    Unplaced(Box<Misplaced>),
}

/// A chunk whose lines are not in its file, with the file's text to search for the
/// nearest ones.
struct Misplaced {
    path: String,
    text: String,
    chunk: Chunk,
    unplaced: Unplaced,
}

impl From<FileError> for Unapplied {
    fn from(err: FileError) -> Self {
        Self::Refused(err)
    }
}

/// One file's planned change, checked and computed, not yet written.
enum Step<'h> {
    Add {
        path: &'h str,
        at: Located,
        content: &'h str,
    },
    Update {
        path: &'h str,
        at: Located,
        /// Where it moves, if it does.
        to: Option<(&'h str, Located)>,
        text: String,
        /// Whether the agent had read the old content whole (then it knows the new).
        seen: bool,
    },
    Delete {
        path: &'h str,
        at: Located,
    },
}

/// Locates every file, takes their locks, plans every change, then writes them.
fn patch_locked(files: &Files, agent: &Arc<str>, hunks: &[Hunk]) -> Result<Patched, Unapplied> {
    let mut located = Vec::with_capacity(hunks.len());
    for hunk in hunks {
        let (at, to) = match hunk {
            Hunk::Add { path, .. } => (files.roots.locate(path, true)?, None),
            Hunk::Delete { path } => (files.roots.locate(path, false)?, None),
            Hunk::Update { path, move_to, .. } => {
                let at = files.roots.locate(path, false)?;
                let to = match move_to {
                    Some(to) => Some((to.as_str(), files.roots.locate(to, true)?)),
                    None => None,
                };
                (at, to)
            }
        };
        located.push((at, to));
    }
    let mut named = std::collections::BTreeMap::new();
    for (hunk, (at, to)) in hunks.iter().zip(&located) {
        let mut paths = vec![(hunk.path(), &at.shown)];
        paths.extend(to.iter().map(|(to, at)| (*to, &at.shown)));
        for (given, shown) in paths {
            if let Some(before) = named.insert(shown, given) {
                return Err(FileError::Invalid(format!(
                    "{given}: the patch names this file twice (also as {before}); give each \
                     file once, with all its chunks"
                ))
                .into());
            }
        }
    }
    let _locks = files.lock_all(named.keys().map(|p| p.as_path()));
    let mut steps = Vec::with_capacity(hunks.len());
    let mut budget = patch::COMPARISONS;
    for (hunk, (at, to)) in hunks.iter().zip(located) {
        steps.push(plan(files, agent, hunk, at, to, &mut budget)?);
    }
    let mut done: Vec<PatchedFile> = Vec::with_capacity(steps.len());
    for step in steps {
        let changed = write(files, agent, step).map_err(|(path, err)| {
            if done.is_empty() {
                return err;
            }
            let applied: Vec<&str> = done.iter().map(|f| f.path.as_str()).collect();
            FileError::Interrupted {
                path,
                applied: applied.join(", "),
                why: guildhall_actors::ErrorChain(&err).to_string(),
            }
        })?;
        done.push(changed);
    }
    Ok(Patched { files: done })
}

/// Tags a write's error with the path it failed on.
fn failed(path: &str) -> impl FnOnce(FileError) -> (String, FileError) + '_ {
    move |err| (path.to_owned(), err)
}

/// Checks one hunk against its file and computes what it writes.
fn plan<'h>(
    files: &Files,
    agent: &Arc<str>,
    hunk: &'h Hunk,
    at: Located,
    to: Option<(&'h str, Located)>,
    budget: &mut u64,
) -> Result<Step<'h>, Unapplied> {
    let absent = |path: &str, at: &Located, why: &str| match at.parent.symlink_metadata(&at.name) {
        Ok(_) => Err(FileError::Stale {
            path: path.to_owned(),
            why: why.to_owned(),
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(FileError::io(path, err)),
    };
    match hunk {
        Hunk::Add { path, contents } => {
            absent(
                path,
                &at,
                "it exists already; change it with `*** Update File:`, or delete it first",
            )?;
            Ok(Step::Add {
                path,
                at,
                content: contents,
            })
        }
        Hunk::Delete { path } => {
            let content = read_existing(path, &at)?
                .ok_or_else(|| FileError::NotFound { path: path.clone() })?;
            check_read(files, agent, path, &at, &content)?;
            Ok(Step::Delete { path, at })
        }
        Hunk::Update { path, chunks, .. } => {
            let content = read_existing(path, &at)?
                .ok_or_else(|| FileError::NotFound { path: path.clone() })?;
            let seen = files
                .ledger
                .get(agent, &at.shown)
                .is_some_and(|seen| seen.hash == hash(&content));
            let old = as_text(path, &content)?;
            drop(content);
            let text = match patch::apply(&old, chunks, budget) {
                Ok(text) => text,
                Err(unplaced) => {
                    return Err(Unapplied::Unplaced(Box::new(Misplaced {
                        path: path.clone(),
                        chunk: chunks[unplaced.index].clone(),
                        text: old,
                        unplaced,
                    })));
                }
            };
            if text.len() as u64 > MAX_FILE {
                return Err(FileError::TooLarge {
                    path: path.clone(),
                    bytes: text.len() as u64,
                    limit: MAX_FILE,
                }
                .into());
            }
            if let Some((to, dest)) = &to {
                absent(
                    to,
                    dest,
                    "it exists already; a move never overwrites a file",
                )?;
            }
            Ok(Step::Update {
                path,
                at,
                to,
                text,
                seen,
            })
        }
    }
}

/// Writes one planned change. On failure, the path it failed on and why.
fn write(
    files: &Files,
    agent: &Arc<str>,
    step: Step<'_>,
) -> Result<PatchedFile, (String, FileError)> {
    match step {
        Step::Add { path, at, content } => {
            replace_atomically(path, &at, content.as_bytes(), None, false).map_err(failed(path))?;
            files
                .ledger
                .record(agent, at.shown.clone(), content.as_bytes());
            Ok(PatchedFile {
                path: at.shown.display().to_string(),
                change: Change::Added,
                from: None,
                bytes: content.len(),
            })
        }
        Step::Update {
            path,
            at,
            to,
            text,
            seen,
        } => {
            let kept = kept_of(path, &at).map_err(failed(path))?;
            let (change, from, written) = match &to {
                None => {
                    replace_atomically(path, &at, text.as_bytes(), Some(kept), true)
                        .map_err(failed(path))?;
                    (Change::Updated, None, &at)
                }
                Some((to, dest)) => {
                    replace_atomically(to, dest, text.as_bytes(), Some(kept), false)
                        .map_err(failed(to))?;
                    at.parent
                        .remove_file(&at.name)
                        .map_err(|err| failed(path)(FileError::io(path, err)))?;
                    sync_dir(&at.parent);
                    (Change::Moved, Some(at.shown.display().to_string()), dest)
                }
            };
            if seen {
                files
                    .ledger
                    .record(agent, written.shown.clone(), text.as_bytes());
            }
            Ok(PatchedFile {
                path: written.shown.display().to_string(),
                change,
                from,
                bytes: text.len(),
            })
        }
        Step::Delete { path, at } => {
            at.parent
                .remove_file(&at.name)
                .map_err(|err| failed(path)(FileError::io(path, err)))?;
            sync_dir(&at.parent);
            Ok(PatchedFile {
                path: at.shown.display().to_string(),
                change: Change::Deleted,
                from: None,
                bytes: 0,
            })
        }
    }
}

/// The refusal of a chunk whose lines are not in `text`, with the lines nearest to what it
/// looked for.
fn unplaced_error(path: &str, text: &str, chunk: &Chunk, unplaced: &Unplaced) -> FileError {
    let which = format!("chunk {} (patch line {})", unplaced.index + 1, chunk.line);
    let (what, first) = match &unplaced.missing {
        Missing::TooCostly => {
            return FileError::NoMatch {
                path: path.to_owned(),
                why: format!(
                    "{which}: placing the patch would compare more than {} lines; give \
                     fewer, more distinctive lines",
                    patch::COMPARISONS
                ),
            };
        }
        Missing::Context(line) => (
            format!("its `@@ {line}` line is not in the file"),
            line.trim().to_owned(),
        ),
        Missing::Lines(lines) => {
            let after = chunk
                .context
                .as_ref()
                .map(|c| format!(" after `@@ {c}`"))
                .unwrap_or_default();
            let first = lines.iter().map(|l| l.trim()).find(|l| !l.is_empty());
            (
                format!("its kept and removed lines are not in the file{after}"),
                first.unwrap_or_default().to_owned(),
            )
        }
    };
    let first: String = first.chars().take(256).collect();
    let (near, stopped) = nearest_lines(text, &first);
    let shown: Vec<String> = near
        .iter()
        .map(|(_, n, line)| format!("line {n}: {}", line.chars().take(300).collect::<String>()))
        .collect();
    let partly = if stopped.is_some() {
        " (as far as the search looks)"
    } else {
        ""
    };
    let nearest = if shown.is_empty() {
        format!("no line{partly} resembles `{first}`")
    } else {
        format!(
            "the nearest lines{partly} to `{first}` are:\n{}",
            shown.join("\n")
        )
    };
    FileError::NoMatch {
        path: path.to_owned(),
        why: format!(
            "{which}: {what} (it changed, or the patch was written from a stale reading); \
             nothing was written; {nearest}\nRead the file again and redo the patch."
        ),
    }
}
