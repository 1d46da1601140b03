//! The file tools: `read_file`, `write_file`, `edit_file` and `multi_edit`. Each call runs its file work
//! on tokio's blocking pool; paths go through [`Roots::locate`](super::confine::Roots),
//! writes through the read-before-write check and an atomic replace.

use std::io::{Read as _, Write as _};
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::confine::{Located, symlink_refusal};
use super::ledger::hash;
use super::{FileError, Files};
use crate::time::rfc3339;

/// Lines `read_file` returns when no `limit` is given, and at most.
const DEFAULT_LINES: usize = 2_000;
const MAX_LINES: usize = 10_000;
/// The largest file the tools read or rewrite whole.
pub(super) const MAX_FILE: u64 = 16 * 1024 * 1024;
/// How far into a file a NUL byte marks it binary.
const BINARY_PROBE: usize = 8_192;
/// Nearest lines a failed edit shows.
const CANDIDATES: usize = 3;

/// The agent a read or write is recorded for: calls without one share the empty name.
pub(super) fn caller(ctx: &CallContext) -> Arc<str> {
    ctx.agent_shared().cloned().unwrap_or_else(|| Arc::from(""))
}

/// Runs `work` on the blocking pool (file systems block), within the calling agent's lane
/// ([`Lanes`](super::lanes::Lanes)): the lane is held by the work itself, so a call
/// dropped while its work runs still counts until the work ends.
pub(super) async fn blocking<T: Send + 'static>(
    files: &Files,
    ctx: &CallContext,
    work: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, FileError> {
    let agent = caller(ctx);
    let lane = files.lanes.enter(&agent).await;
    let done = tokio::task::spawn_blocking(move || {
        let _lane = lane;
        work()
    })
    .await
    .unwrap_or_else(|err| Err(FileError::Invalid(format!("the file work failed: {err}"))));
    files.lanes.tidy(&agent);
    done
}

/// A regular file's whole content, opened without following a symlink at its name.
/// `None` when nothing is there.
pub(super) fn read_existing(path: &str, at: &Located) -> Result<Option<Vec<u8>>, FileError> {
    let mut file = match at.parent.open_with(&at.name, &read_options()) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(open_error(path, at, err)),
    };
    let meta = file.metadata().map_err(|err| FileError::io(path, err))?;
    if meta.is_dir() {
        return Err(FileError::NotText {
            path: path.to_owned(),
            why: "is a directory".into(),
        });
    }
    if !meta.is_file() {
        return Err(FileError::NotText {
            path: path.to_owned(),
            why: "is not a regular file".into(),
        });
    }
    if cap_fs_ext::MetadataExt::nlink(&meta) > 1 {
        return Err(FileError::Refused {
            path: path.to_owned(),
            why: "it has more than one hard link, so it may be a file outside the roots".into(),
        });
    }
    if meta.len() > MAX_FILE {
        return Err(FileError::NotText {
            path: path.to_owned(),
            why: format!(
                "is {} bytes; the file tools handle files up to {MAX_FILE} bytes",
                meta.len()
            ),
        });
    }
    let mut content = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut content)
        .map_err(|err| FileError::io(path, err))?;
    Ok(Some(content))
}

/// How the tools open a file to read it: never through a symlink at its name, and without
/// waiting (a named pipe would otherwise hold the opening thread until a writer came).
pub(super) fn read_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    cap_std::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    options
}

/// Why a file could not be opened, with a symlink at its name called one.
fn open_error(path: &str, at: &Located, err: std::io::Error) -> FileError {
    symlink_refusal(path, &at.parent, &at.name, &at.shown)
        .unwrap_or_else(|| FileError::io(path, err))
}

/// `content` as text, or why it is not.
pub(super) fn as_text(path: &str, content: &[u8]) -> Result<String, FileError> {
    let probe = &content[..content.len().min(BINARY_PROBE)];
    if probe.contains(&0) {
        return Err(FileError::NotText {
            path: path.to_owned(),
            why: "is a binary file (it contains NUL bytes); the file tools show text only".into(),
        });
    }
    String::from_utf8(content.to_vec()).map_err(|err| FileError::NotText {
        path: path.to_owned(),
        why: format!(
            "is not UTF-8 text (invalid byte at offset {}); the file tools show text only",
            err.utf8_error().valid_up_to()
        ),
    })
}

/// Writes `content` to a new file beside `at` and moves it into place in one step, so a
/// reader sees the old content or the new, never part of either. The file's permissions,
/// owner and group are kept (as far as the server's user may set them). With `replace`
/// false the move fails if a file appeared there meanwhile.
pub(super) fn replace_atomically(
    path: &str,
    at: &Located,
    content: &[u8],
    kept: Option<Kept>,
    replace: bool,
) -> Result<(), FileError> {
    let temp = format!(
        ".{}.{}.guildhall-tmp",
        at.name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    );
    let written = (|| {
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create_new(true)
            .follow(FollowSymlinks::No);
        let mut file = at.parent.open_with(&temp, &options)?;
        file.write_all(content)?;
        if let Some(kept) = kept {
            // The owner first: changing it clears set-id bits the permissions then restore.
            // Only root may give a file away; anyone may set a group they belong to.
            if std::os::unix::fs::fchown(&file, Some(kept.uid), Some(kept.gid)).is_err() {
                let _ = std::os::unix::fs::fchown(&file, None, Some(kept.gid));
            }
            file.set_permissions(kept.permissions)?;
        }
        file.sync_all()?;
        if replace {
            at.parent.rename(&temp, &at.parent, &at.name)
        } else {
            // A hard link is refused when the name exists: a file created meanwhile by
            // someone else is never overwritten unread.
            at.parent.hard_link(&temp, &at.parent, &at.name)?;
            at.parent.remove_file(&temp)
        }
    })();
    if let Err(err) = written {
        let _ = at.parent.remove_file(&temp);
        if err.kind() == std::io::ErrorKind::AlreadyExists {
            return Err(FileError::Stale {
                path: path.to_owned(),
                why: "a file was created there meanwhile; read it with read_file first".into(),
            });
        }
        return Err(FileError::io(path, err));
    }
    sync_dir(&at.parent);
    Ok(())
}

/// Makes a rename durable (best effort: not every file system syncs directories).
pub(super) fn sync_dir(dir: &Dir) {
    if let Ok(file) = dir.open(".") {
        let _ = file.sync_all();
    }
}

/// Checks that `agent` read `at` at its current `content` before it writes.
pub(super) fn check_read(
    files: &Files,
    agent: &Arc<str>,
    path: &str,
    at: &Located,
    content: &[u8],
) -> Result<(), FileError> {
    match files.ledger.get(agent, &at.shown) {
        None => Err(FileError::Stale {
            path: path.to_owned(),
            why: "it exists and you have not read it; read it with read_file first, so \
                  nothing in it is lost"
                .into(),
        }),
        Some(seen) if seen.hash != hash(content) => Err(FileError::Stale {
            path: path.to_owned(),
            why: format!(
                "it changed since you read it at {} (another agent or a person wrote it); \
                 read it again with read_file and redo your change",
                rfc3339(seen.at_ms)
            ),
        }),
        Some(_) => Ok(()),
    }
}

/// `read_file`.
pub struct ReadFile(pub(crate) Arc<Files>);

/// Input of `read_file`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadInput {
    /// The file: relative to the first root, or absolute inside a root.
    pub path: String,
    /// The first line to show, counting from 1 (default 1).
    #[serde(default)]
    pub offset: Option<usize>,
    /// How many lines to show (default 2000, at most 10000).
    #[serde(default)]
    pub limit: Option<usize>,
}

impl Tool for ReadFile {
    type Input = ReadInput;
    type Output = FileContent;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Reads a text file, with line numbers (`   12\\tline`). Long files come in pages: \
         give `offset` (first line) and `limit`. Reading a file is what allows you to \
         write_file or edit_file it afterwards."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Read a file")
    }

    fn detach(&self, _: &(), _: &ReadInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ReadInput,
        ctx: CallContext,
    ) -> Result<FileContent, FileError> {
        let offset = input.offset.unwrap_or(1);
        let limit = input.limit.unwrap_or(DEFAULT_LINES);
        if offset == 0 {
            return Err(FileError::Invalid(
                "offset counts lines from 1; give 1 for the start".into(),
            ));
        }
        if !(1..=MAX_LINES).contains(&limit) {
            return Err(FileError::Invalid(format!(
                "limit is {limit}; give 1 to {MAX_LINES}"
            )));
        }
        let (files, agent) = (self.0.scoped(ctx.agent()), caller(&ctx));
        blocking(&self.0, &ctx, move || {
            let path = input.path.as_str();
            let at = files.roots.locate(path, false)?;
            let content = read_existing(path, &at)?.ok_or_else(|| FileError::NotFound {
                path: path.to_owned(),
            })?;
            if let Some(mime_type) = image_type(&content) {
                let image = Image::of(path, mime_type, &content)?;
                files.ledger.record(&agent, at.shown.clone(), &content);
                return Ok(FileContent::Image(image));
            }
            let text = as_text(path, &content)?;
            files.ledger.record(&agent, at.shown.clone(), &content);
            Ok(FileContent::Text(numbered(&text, offset, limit)))
        })
        .await
    }
}

/// What `read_file` returns: numbered lines of text, or an image.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum FileContent {
    /// The lines asked for, numbered.
    Text(String),
    /// A PNG, JPEG, GIF or WebP image.
    Image(Image),
}

/// An image, shaped as an MCP image content block, so that it reaches the model as an
/// image rather than as text.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Image {
    /// Always `image`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The bytes, base64.
    pub data: String,
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    #[serde(rename = "mimeType")]
    pub mime_type: String,
}

/// The largest image `read_file` returns.
const MAX_IMAGE: usize = 5 * 1024 * 1024;

impl Image {
    fn of(path: &str, mime_type: &str, content: &[u8]) -> Result<Self, FileError> {
        if content.len() > MAX_IMAGE {
            return Err(FileError::NotText {
                path: path.to_owned(),
                why: format!(
                    "is a {mime_type} image of {} bytes, larger than the {MAX_IMAGE} bytes \
                     read_file returns",
                    content.len()
                ),
            });
        }
        Ok(Self {
            kind: "image".into(),
            data: base64::Engine::encode(&base64::engine::general_purpose::STANDARD, content),
            mime_type: mime_type.into(),
        })
    }
}

/// The image type of `content`, by its signature (the formats models take).
fn image_type(content: &[u8]) -> Option<&'static str> {
    match content {
        [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, ..] => Some("image/png"),
        [0xff, 0xd8, 0xff, ..] => Some("image/jpeg"),
        [b'G', b'I', b'F', b'8', b'7' | b'9', b'a', ..] => Some("image/gif"),
        [
            b'R',
            b'I',
            b'F',
            b'F',
            _,
            _,
            _,
            _,
            b'W',
            b'E',
            b'B',
            b'P',
            ..,
        ] => Some("image/webp"),
        _ => None,
    }
}

/// Lines `offset..offset + limit` of `text`, numbered, with a note when more follow.
fn numbered(text: &str, offset: usize, limit: usize) -> String {
    let total = text.lines().count();
    if total == 0 {
        return "(the file is empty)".into();
    }
    if offset > total {
        return format!("(the file has {total} lines; offset {offset} is past its end)");
    }
    let mut out = String::with_capacity(text.len().min(limit * 80));
    for (i, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
        use std::fmt::Write as _;
        let _ = writeln!(out, "{:>6}\t{line}", i + 1);
    }
    let last = (offset - 1 + limit).min(total);
    if last < total {
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "(lines {offset}–{last} of {total}; read on with offset {})",
            last + 1
        );
    }
    out
}

/// `write_file`.
pub struct WriteFile(pub(crate) Arc<Files>);

/// Input of `write_file`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteInput {
    /// The file: relative to the first root, or absolute inside a root. Missing
    /// directories are created.
    pub path: String,
    /// The whole new content.
    pub content: String,
}

/// What a write did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Written {
    /// The file, as an absolute path.
    pub path: String,
    /// Bytes written.
    pub bytes: usize,
    /// Whether the file is new.
    pub created: bool,
}

impl Tool for WriteFile {
    type Input = WriteInput;
    type Output = Written;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> &str {
        "Writes a whole file, creating it (and its directories) if needed. An existing file \
         must have been read with read_file first and be unchanged since; the file is \
         replaced in one step, never left half written. For a small change prefer edit_file."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Write a file")
            .destructive(true)
            .idempotent(true)
    }

    fn detach(&self, _: &(), _: &WriteInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: WriteInput,
        ctx: CallContext,
    ) -> Result<Written, FileError> {
        if input.content.len() as u64 > MAX_FILE {
            return Err(FileError::TooLarge {
                path: input.path,
                bytes: input.content.len() as u64,
                limit: MAX_FILE,
            });
        }
        let (files, agent) = (self.0.scoped(ctx.agent()), caller(&ctx));
        blocking(&self.0, &ctx, move || {
            let path = input.path.as_str();
            let at = files.roots.locate(path, true)?;
            let _guard = files.lock(&at.shown);
            let existing = read_existing(path, &at)?;
            let created = existing.is_none();
            let kept = match &existing {
                Some(content) => {
                    check_read(&files, &agent, path, &at, content)?;
                    Some(kept_of(path, &at)?)
                }
                None => None,
            };
            replace_atomically(path, &at, input.content.as_bytes(), kept, !created)?;
            files
                .ledger
                .record(&agent, at.shown.clone(), input.content.as_bytes());
            Ok(Written {
                path: at.shown.display().to_string(),
                bytes: input.content.len(),
                created,
            })
        })
        .await
    }
}

/// What a replaced file keeps of the old one.
pub(super) struct Kept {
    permissions: cap_std::fs::Permissions,
    uid: u32,
    gid: u32,
}

pub(super) fn kept_of(path: &str, at: &Located) -> Result<Kept, FileError> {
    use cap_std::fs::MetadataExt;
    at.parent
        .symlink_metadata(&at.name)
        .map(|m| Kept {
            permissions: m.permissions(),
            uid: m.uid(),
            gid: m.gid(),
        })
        .map_err(|err| FileError::io(path, err))
}

/// `edit_file`.
pub struct EditFile(pub(crate) Arc<Files>);

/// Input of `edit_file`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditInput {
    /// The file: relative to the first root, or absolute inside a root.
    pub path: String,
    /// The exact text to replace, whitespace included. It must occur once, unless
    /// `replace_all`.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence instead of exactly one.
    #[serde(default)]
    pub replace_all: bool,
}

/// One replacement of `multi_edit`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// The exact text to replace, whitespace included, as the file is after the edits
    /// before this one. It must occur once, unless `replace_all`.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence instead of exactly one.
    #[serde(default)]
    pub replace_all: bool,
}

/// What an edit did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Edited {
    /// The file, as an absolute path.
    pub path: String,
    /// How many occurrences were replaced, over all the edits.
    pub replacements: usize,
    /// The file's size afterwards, in bytes.
    pub bytes: usize,
}

/// The most edits one `multi_edit` applies.
const MAX_EDITS: usize = 100;

/// Checks the edits' arguments before any file is touched. `which` names an edit in a
/// message (empty for a single one).
fn check_edit(edit: &Edit, which: &str) -> Result<(), FileError> {
    if edit.old_string.is_empty() {
        return Err(FileError::Invalid(format!(
            "{which}old_string is empty; give the text to replace (to write a whole file, use \
             write_file)"
        )));
    }
    if edit.old_string == edit.new_string {
        return Err(FileError::Invalid(format!(
            "{which}old_string and new_string are the same; nothing would change"
        )));
    }
    Ok(())
}

/// Why an edit could not be applied: a refusal ready to return, or text that does not
/// occur, whose explanation (a search for the nearest lines) waits until the file's write
/// lock is released.
enum Unapplied {
    Refused(FileError),
    /// Edit `index` (counting from 0) did not occur in `text`, the file as the edits
    /// before it left it.
    NotFound {
        index: usize,
        text: String,
    },
}

impl From<FileError> for Unapplied {
    fn from(err: FileError) -> Self {
        Self::Refused(err)
    }
}

/// How a message names edit `index` of `count` (nothing for a single edit).
fn which(index: usize, count: usize) -> String {
    if count > 1 {
        format!("edit {} of {count}: ", index + 1)
    } else {
        String::new()
    }
}

/// `text` with `edit` applied, and how many occurrences it replaced (`None` when it does
/// not occur). The result's size is checked before it is built: an edit may not make the
/// file larger than [`MAX_FILE`].
fn apply(
    path: &str,
    text: &str,
    edit: &Edit,
    which: &str,
) -> Result<Option<(String, usize)>, FileError> {
    let found = text.matches(edit.old_string.as_str()).count();
    if found == 0 {
        return Ok(None);
    }
    if found > 1 && !edit.replace_all {
        return Err(FileError::NoMatch {
            path: path.to_owned(),
            why: format!(
                "{which}old_string occurs {found} times ({}); add surrounding lines to make \
                 it unique, or set replace_all",
                lines_of(text, &edit.old_string)
            ),
        });
    }
    let replaced = if edit.replace_all { found } else { 1 };
    let bytes = edited_size(text.len(), edit, replaced);
    if bytes > MAX_FILE {
        return Err(FileError::TooLarge {
            path: path.to_owned(),
            bytes,
            limit: MAX_FILE,
        });
    }
    let edited = if edit.replace_all {
        text.replace(&edit.old_string, &edit.new_string)
    } else {
        text.replacen(&edit.old_string, &edit.new_string, 1)
    };
    Ok(Some((edited, found)))
}

/// The size of a text of `len` bytes once `replaced` occurrences of the edit's old string
/// are replaced, counted without building it (saturating: a size past `u64` is past any
/// bound).
fn edited_size(len: usize, edit: &Edit, replaced: usize) -> u64 {
    let (old, new) = (edit.old_string.len() as u64, edit.new_string.len() as u64);
    let replaced = replaced as u64;
    (len as u64 - old.saturating_mul(replaced)).saturating_add(new.saturating_mul(replaced))
}

/// Applies `edits` in order to the file at `path`, all or none, after the read check.
/// A failed edit's search for the nearest lines runs after the write lock is released.
fn edit_file(
    files: &Files,
    agent: &Arc<str>,
    path: &str,
    edits: &[Edit],
) -> Result<Edited, FileError> {
    match edit_locked(files, agent, path, edits) {
        Ok(edited) => Ok(edited),
        Err(Unapplied::Refused(err)) => Err(err),
        Err(Unapplied::NotFound { index, text }) => Err(FileError::NoMatch {
            path: path.to_owned(),
            why: format!(
                "{}{}",
                which(index, edits.len()),
                not_found(&text, &edits[index].old_string)
            ),
        }),
    }
}

/// [`edit_file`]'s work under the file's write lock: check, edit, replace.
fn edit_locked(
    files: &Files,
    agent: &Arc<str>,
    path: &str,
    edits: &[Edit],
) -> Result<Edited, Unapplied> {
    let at = files.roots.locate(path, false)?;
    let _guard = files.lock(&at.shown);
    let content = read_existing(path, &at)?.ok_or_else(|| FileError::NotFound {
        path: path.to_owned(),
    })?;
    check_read(files, agent, path, &at, &content)?;
    let mut text = as_text(path, &content)?;
    drop(content);
    let mut replacements = 0;
    for (index, edit) in edits.iter().enumerate() {
        match apply(path, &text, edit, &which(index, edits.len()))? {
            Some((edited, found)) => {
                text = edited;
                replacements += found;
            }
            None => return Err(Unapplied::NotFound { index, text }),
        }
    }
    let kept = kept_of(path, &at)?;
    replace_atomically(path, &at, text.as_bytes(), Some(kept), true)?;
    files
        .ledger
        .record(agent, at.shown.clone(), text.as_bytes());
    Ok(Edited {
        path: at.shown.display().to_string(),
        replacements,
        bytes: text.len(),
    })
}

impl Tool for EditFile {
    type Input = EditInput;
    type Output = Edited;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "edit_file"
    }

    fn description(&self) -> &str {
        "Replaces exact text in a file you have read with read_file (and that is unchanged \
         since). `old_string` must occur exactly once unless `replace_all`; include enough \
         surrounding lines to make it unique. When it is not found, the nearest lines are \
         shown."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Edit a file")
            .destructive(true)
    }

    fn detach(&self, _: &(), _: &EditInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: EditInput,
        ctx: CallContext,
    ) -> Result<Edited, FileError> {
        let edit = Edit {
            old_string: input.old_string,
            new_string: input.new_string,
            replace_all: input.replace_all,
        };
        check_edit(&edit, "")?;
        let (files, agent) = (self.0.scoped(ctx.agent()), caller(&ctx));
        blocking(&self.0, &ctx, move || {
            edit_file(&files, &agent, &input.path, &[edit])
        })
        .await
    }
}

/// `multi_edit`.
pub struct MultiEdit(pub(crate) Arc<Files>);

/// Input of `multi_edit`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiEditInput {
    /// The file: relative to the first root, or absolute inside a root.
    pub path: String,
    /// The replacements, applied in order, each to the result of the ones before (1 to
    /// 100).
    pub edits: Vec<Edit>,
}

impl Tool for MultiEdit {
    type Input = MultiEditInput;
    type Output = Edited;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "multi_edit"
    }

    fn description(&self) -> &str {
        "Several edit_file replacements in one file, applied in order and all or none: if \
         any does not match, the file is left as it was. The file must have been read with \
         read_file and be unchanged since."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Edit a file in several places")
            .destructive(true)
    }

    fn detach(&self, _: &(), _: &MultiEditInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: MultiEditInput,
        ctx: CallContext,
    ) -> Result<Edited, FileError> {
        if input.edits.is_empty() || input.edits.len() > MAX_EDITS {
            return Err(FileError::Invalid(format!(
                "{} edits given; give 1 to {MAX_EDITS}",
                input.edits.len()
            )));
        }
        for (i, edit) in input.edits.iter().enumerate() {
            check_edit(edit, &format!("edit {} of {}: ", i + 1, input.edits.len()))?;
        }
        let (files, agent) = (self.0.scoped(ctx.agent()), caller(&ctx));
        blocking(&self.0, &ctx, move || {
            edit_file(&files, &agent, &input.path, &input.edits)
        })
        .await
    }
}

/// The lines where `needle` starts in `text`, the first few, each line named once
/// (several occurrences on one line are one line).
fn lines_of(text: &str, needle: &str) -> String {
    const SHOWN: usize = 10;
    let (mut lines, mut line, mut counted) = (Vec::<usize>::new(), 1, 0);
    let mut more = false;
    for (offset, _) in text.match_indices(needle) {
        line += text[counted..offset].matches('\n').count();
        counted = offset;
        if lines.last() == Some(&line) {
            continue;
        }
        if lines.len() == SHOWN {
            more = true;
            break;
        }
        lines.push(line);
    }
    let listed = lines
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match (lines.len(), more) {
        (1, _) => format!("all on line {listed}"),
        (_, false) => format!("on lines {listed}"),
        (_, true) => format!("on lines {listed} and more"),
    }
}

/// Why `old` was not found, with the lines of `text` nearest to its first line.
fn not_found(text: &str, old: &str) -> String {
    // One copy of the text at most (no list of its words): 16 MiB of one-letter words
    // would otherwise be 8 M slices.
    let squeeze = |s: &str| {
        let mut out = String::with_capacity(s.len());
        for word in s.split_whitespace() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(word);
        }
        out
    };
    if text.contains(old.trim()) {
        return "old_string is not in the file as given, but it is without its leading or \
                trailing whitespace; copy it exactly as read_file shows it (without the \
                line numbers)"
            .into();
    }
    if !old.trim().is_empty() && squeeze(text).contains(&squeeze(old)) {
        return "old_string differs from the file only in whitespace (indentation or line \
                breaks); copy it exactly as read_file shows it (without the line numbers)"
            .into();
    }
    let first: String = old
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(NEAR_CHARS)
        .collect();
    let (near, stopped) = nearest_lines(text, &first);
    let partly = match stopped {
        Some(searched) => format!(" (of the first {searched} lines, as far as the search looks)"),
        None => String::new(),
    };
    if near.is_empty() {
        return format!(
            "old_string does not occur in the file, and no line{partly} resembles its first \
             line; read the file again with read_file"
        );
    }
    let shown: Vec<String> = near
        .iter()
        .map(|(_, n, line)| {
            let line: String = line.chars().take(NEAR_SHOWN).collect();
            format!("line {n}: {line}")
        })
        .collect();
    format!(
        "old_string does not occur in the file; the nearest lines{partly} to its first line \
         are:\n{}",
        shown.join("\n")
    )
}

/// Characters of old_string's first line, and of each line, compared: lines are compared
/// by their starts, so a long line costs no more than a short one.
const NEAR_CHARS: usize = 256;
/// Characters of a near line shown.
const NEAR_SHOWN: usize = 300;
/// Edit-distance cells a failed edit's search may compute in all, whatever the file (16 MiB
/// of long lines compared whole took minutes): about 50 ms of one core in a release build
/// (2 ns a cell, measured with strsim 0.11), 1.4 s in a debug build.
const NEAR_BUDGET: usize = 25_000_000;

/// The lines of `text` most like `first` (normalized edit distance at least 0.5), best
/// first, at most [`CANDIDATES`], and, when the budget ran out first, how many lines were
/// searched.
///
/// A line is compared only if its length could reach the threshold: the distance is at
/// least the difference of the lengths, so a line (start) more than twice as long as
/// `first` or less than half as long never resembles it, and costs only its count.
pub(super) fn nearest_lines<'t>(
    text: &'t str,
    first: &str,
) -> (Vec<(f64, usize, &'t str)>, Option<usize>) {
    let want = first.chars().count();
    let mut budget = NEAR_BUDGET;
    let mut near: Vec<(f64, usize, &str)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        let start = trimmed
            .char_indices()
            .nth(NEAR_CHARS)
            .map_or(trimmed, |(end, _)| &trimmed[..end]);
        let len = start.chars().count();
        if 2 * len >= want && len <= 2 * want {
            let cost = want.max(1) * len.max(1);
            if cost > budget {
                return (near, Some(i));
            }
            budget -= cost;
            let score = strsim::normalized_levenshtein(start, first);
            if score >= 0.5 {
                near.push((score, i + 1, line));
                near.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                near.truncate(CANDIDATES);
            }
        }
    }
    (near, None)
}
