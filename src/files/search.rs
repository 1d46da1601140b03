//! `grep`: searches file contents as ripgrep does, with its walker (`ignore`), regex
//! engine (`grep-regex`) and searcher (`grep-searcher`). The walk goes by path names; each
//! file is opened through the confined walk (see [`confine`](super::confine)), one
//! directory handle kept while the walk stays in that directory, so a directory swapped for
//! a symlink mid-walk leads nowhere outside the roots.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cap_std::fs::Dir;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use guildhall_actors::{Annotations, CallContext, Tool};
use ignore::WalkState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tools::{blocking, read_options};
use super::{FileError, Files};

/// Results `grep` returns when no `limit` is given, and at most.
const DEFAULT_LIMIT: usize = 200;
const MAX_LIMIT: usize = 5_000;
/// Context lines at most, before and after.
const MAX_CONTEXT: usize = 20;
/// A matching line is cut to this many bytes in `content` mode.
const MAX_LINE: usize = 500;

/// What `grep` answers with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GrepMode {
    /// The paths of files with a match (the default).
    #[default]
    FilesWithMatches,
    /// `path:count` per file with a match.
    Count,
    /// The matching lines, `path:line:text`, with context lines as `path-line-text`.
    Content,
}

/// `grep`.
pub struct Grep(pub(crate) Arc<Files>);

/// Input of `grep`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepInput {
    /// A regular expression (Rust `regex` syntax, as ripgrep's).
    pub pattern: String,
    /// The directory or file to search: relative to the first root, or absolute inside a
    /// root (default: the first root).
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose path matches this glob (`*.rs`; without a `/` it matches the name
    /// at any depth).
    #[serde(default)]
    pub glob: Option<String>,
    /// Only files of this type, as ripgrep names them (`rust`, `py`, `js`, `md`, ...).
    #[serde(default, rename = "type")]
    pub file_type: Option<String>,
    /// Match without regard to case.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Lines of context before and after each match (`content` mode; 0 to 20).
    #[serde(default)]
    pub context: Option<usize>,
    /// What to answer with (default `files_with_matches`).
    #[serde(default)]
    pub mode: GrepMode,
    /// At most this many results: files, counts or lines (default 200, at most 5000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// What `grep` found.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct GrepResult {
    /// Paths, `path:count`, or `path:line:text` lines, by path.
    pub results: Vec<String>,
    /// Whether there were more results than `limit`.
    pub truncated: bool,
    /// Files searched.
    pub files_searched: usize,
}

impl Tool for Grep {
    type Input = GrepInput;
    type Output = GrepResult;
    type Error = FileError;
    type State = ();

    fn name(&self) -> &str {
        "grep"
    }

    fn description(&self) -> &str {
        "Searches file contents for a regular expression, as ripgrep does (.gitignore \
         respected, binary files skipped). `mode`: files_with_matches (default), count, or \
         content (`path:line:text`, with `context` lines). Filter with `glob` or `type`."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Search file contents")
    }

    fn detach(&self, _: &(), _: &GrepInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: GrepInput,
        ctx: CallContext,
    ) -> Result<GrepResult, FileError> {
        let limit = input.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(FileError::Invalid(format!(
                "limit is {limit}; give 1 to {MAX_LIMIT}"
            )));
        }
        let context = input.context.unwrap_or(0);
        if context > MAX_CONTEXT {
            return Err(FileError::Invalid(format!(
                "context is {context}; give 0 to {MAX_CONTEXT}"
            )));
        }
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(input.case_insensitive)
            .build(&input.pattern)
            .map_err(|err| FileError::Invalid(format!("pattern {:?}: {err}", input.pattern)))?;
        let query = Query {
            matcher,
            only: input.glob.as_deref().map(file_glob).transpose()?,
            types: input.file_type.as_deref().map(file_types).transpose()?,
            // Context lines only mean something beside the lines shown.
            context: if input.mode == GrepMode::Content {
                context
            } else {
                0
            },
            mode: input.mode,
            limit,
        };
        let files = self.0.scoped(ctx.agent());
        let path = input.path;
        blocking(&self.0, &ctx, move || {
            search(&files, path.as_deref(), query)
        })
        .await
    }
}

/// A search, checked: what to match, in which files, and what to return.
struct Query {
    matcher: grep_regex::RegexMatcher,
    /// `glob`: the files searched, by path from where the search starts.
    only: Option<globset::GlobMatcher>,
    /// `type`: ripgrep's file types.
    types: Option<ignore::types::Types>,
    context: usize,
    mode: GrepMode,
    limit: usize,
}

/// `glob` as a matcher of paths: a glob without `/` matches at any depth.
fn file_glob(glob: &str) -> Result<globset::GlobMatcher, FileError> {
    let glob = if glob.contains('/') {
        glob.to_owned()
    } else {
        format!("**/{glob}")
    };
    globset::GlobBuilder::new(&glob)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|err| FileError::Invalid(format!("glob {glob:?}: {err}")))
}

/// Ripgrep's file type `name`, alone.
fn file_types(name: &str) -> Result<ignore::types::Types, FileError> {
    let mut types = ignore::types::TypesBuilder::new();
    types.add_defaults();
    if !types.definitions().iter().any(|d| d.name() == name) {
        return Err(FileError::Invalid(format!(
            "unknown file type {name:?}; ripgrep's names, such as rust, py, js, \
             ts, go, java, c, cpp, md, json, toml, yaml"
        )));
    }
    types.select(name);
    types
        .build()
        .map_err(|err| FileError::Invalid(format!("file type {name:?}: {err}")))
}

/// Runs `query` from `path` in `files`' roots (blocking): in parallel, as ripgrep walks,
/// one searcher and one directory handle per thread, until the limit.
fn search(files: &Arc<Files>, path: Option<&str>, query: Query) -> Result<GrepResult, FileError> {
    let Query {
        matcher,
        only,
        types,
        context,
        mode,
        limit,
    } = query;
    let base = start(files, path)?;
    let mut walker = ignore::WalkBuilder::new(&base);
    let walk_files = Arc::clone(files);
    walker
        .hidden(false)
        .follow_links(false)
        .require_git(false)
        .filter_entry(move |e| !walk_files.roots.denies(e.file_name()));
    if let Some(types) = types {
        walker.types(types);
    }
    let searcher = SearcherBuilder::new()
        .line_number(true)
        .before_context(context)
        .after_context(context)
        .binary_detection(BinaryDetection::quit(0))
        .build();
    let shared = Shared {
        mode,
        limit,
        hits: Mutex::new(Vec::new()),
        results: AtomicUsize::new(0),
        searched: AtomicUsize::new(0),
    };
    walker.build_parallel().run(|| {
        let (mut searcher, mut opener) = (searcher.clone(), Opener::default());
        let (shared, files, base) = (&shared, &files, &base);
        let (matcher, only) = (&matcher, &only);
        Box::new(move |entry| {
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            let relative = entry.path().strip_prefix(base).unwrap_or(entry.path());
            if only.as_ref().is_some_and(|g| !g.is_match(relative)) {
                return WalkState::Continue;
            }
            let Some(file) = opener.open(files, entry.path()) else {
                return WalkState::Continue;
            };
            shared.searched.fetch_add(1, Ordering::Relaxed);
            let mut sink = FileSink {
                mode: shared.mode,
                cap: shared.limit + 1,
                path: entry.path().display().to_string(),
                lines: Vec::new(),
                count: 0,
            };
            // A file that cannot be read as the search goes is skipped, as ripgrep
            // does.
            let _ = searcher.search_file(matcher, &file, &mut sink);
            if shared.add(sink) {
                WalkState::Continue
            } else {
                WalkState::Quit
            }
        })
    });
    Ok(shared.finish())
}

/// Where a search starts: a directory, or one file (the walk then yields just it).
fn start(files: &Files, path: Option<&str>) -> Result<PathBuf, FileError> {
    let dir_err = match files.roots.locate_dir(path) {
        Ok((_, base)) => return Ok(base),
        Err(err) => err,
    };
    let Some(path) = path else {
        return Err(dir_err);
    };
    let at = files.roots.locate(path, false)?;
    match at.parent.symlink_metadata(&at.name) {
        Ok(meta) if meta.is_file() => Ok(at.shown),
        // A named pipe, socket or device: say so, rather than the directory walk's "Not a
        // directory".
        Ok(meta) if !meta.is_dir() && !meta.is_symlink() => Err(FileError::NotText {
            path: path.to_owned(),
            why: "is not a regular file or a directory (a named pipe, socket or device); \
                  grep searches files and directories"
                .into(),
        }),
        _ => Err(dir_err),
    }
}

/// Opens the files of a walk through the confined walk, keeping the last directory's
/// handle (a walk lists a directory's files together).
#[derive(Default)]
struct Opener {
    last: Option<(PathBuf, Dir)>,
}

impl Opener {
    fn open(&mut self, files: &Files, path: &Path) -> Option<std::fs::File> {
        let (parent_path, name) = (path.parent()?, path.file_name()?);
        if self.last.as_ref().is_none_or(|(p, _)| p != parent_path) {
            let at = files.roots.locate(path.to_str()?, false).ok()?;
            self.last = Some((parent_path.to_owned(), at.parent));
        }
        let (_, dir) = self.last.as_ref()?;
        let file = dir.open_with(OsString::from(name), &read_options()).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || cap_fs_ext::MetadataExt::nlink(&meta) > 1 {
            return None;
        }
        Some(file.into_std())
    }
}

/// What the walking threads share: the files with matches, and how many results they make.
struct Shared {
    mode: GrepMode,
    limit: usize,
    hits: Mutex<Vec<FileSink>>,
    results: AtomicUsize,
    searched: AtomicUsize,
}

impl Shared {
    /// Keeps one file's matches; `false` once there are more results than the limit.
    fn add(&self, file: FileSink) -> bool {
        if file.count == 0 {
            return true;
        }
        let results = match self.mode {
            GrepMode::Content => file.lines.len(),
            GrepMode::FilesWithMatches | GrepMode::Count => 1,
        };
        self.hits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(file);
        self.results.fetch_add(results, Ordering::Relaxed) + results <= self.limit
    }

    /// The results by path, cut at the limit.
    fn finish(self) -> GrepResult {
        let mut hits = self
            .hits
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        hits.sort_by(|a, b| a.path.cmp(&b.path));
        let mut results = Vec::new();
        for hit in hits {
            match self.mode {
                GrepMode::FilesWithMatches => results.push(hit.path),
                GrepMode::Count => results.push(format!("{}:{}", hit.path, hit.count)),
                GrepMode::Content => results.extend(hit.lines),
            }
        }
        let truncated = results.len() > self.limit;
        results.truncate(self.limit);
        GrepResult {
            results,
            truncated,
            files_searched: self.searched.into_inner(),
        }
    }
}

/// One file's matches.
struct FileSink {
    mode: GrepMode,
    /// Lines kept at most (one more than the limit, to know it was passed).
    cap: usize,
    path: String,
    lines: Vec<String>,
    count: u64,
}

impl FileSink {
    fn line(&mut self, separator: char, number: Option<u64>, bytes: &[u8]) -> bool {
        if self.lines.len() >= self.cap {
            return false;
        }
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim_end_matches(['\n', '\r']);
        let text = match text.char_indices().nth(MAX_LINE) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text.to_owned(),
        };
        let number = number.unwrap_or(0);
        self.lines
            .push(format!("{}{separator}{number}{separator}{text}", self.path));
        true
    }
}

impl Sink for &mut FileSink {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        self.count += 1;
        match self.mode {
            // One match is enough to list the file.
            GrepMode::FilesWithMatches => Ok(false),
            GrepMode::Count => Ok(true),
            GrepMode::Content => Ok(self.line(':', mat.line_number(), mat.bytes())),
        }
    }

    fn context(&mut self, _: &Searcher, context: &SinkContext<'_>) -> Result<bool, Self::Error> {
        Ok(self.line('-', context.line_number(), context.bytes()))
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, Self::Error> {
        if self.lines.len() >= self.cap {
            return Ok(false);
        }
        self.lines.push("--".into());
        Ok(true)
    }
}
