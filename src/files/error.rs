//! [`FileError`]: why a file tool refused or failed. Every variant names the path and what
//! to do about it.

use std::sync::Arc;

/// Why a file tool call was refused or failed. Nothing was written when one is returned.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The path may not be used: outside the roots, through a symlink, denied, malformed.
    #[error("{path}: refused: {why}")]
    Refused {
        /// The path given.
        path: String,
        /// Why, and what to give instead.
        why: String,
    },
    /// Nothing exists at the path.
    #[error("{path}: no such file")]
    NotFound {
        /// The path given.
        path: String,
    },
    /// The file is not text the tools can show or edit.
    #[error("{path}: {why}")]
    NotText {
        /// The path given.
        path: String,
        /// What it is instead.
        why: String,
    },
    /// A write to a file this agent has not read at its current content.
    #[error("{path}: not written: {why}")]
    Stale {
        /// The path given.
        path: String,
        /// Since when, and what to do.
        why: String,
    },
    /// An edit whose text does not occur as the edit needs.
    #[error("{path}: not edited: {why}")]
    NoMatch {
        /// The path given.
        path: String,
        /// How the text was (not) found, with the nearest lines.
        why: String,
    },
    /// The change would make the file larger than the file tools handle; nothing was
    /// written.
    #[error(
        "{path}: not written: the result would be {bytes} bytes, past the {limit} bytes the file tools handle (read_file would refuse it); change less at once"
    )]
    TooLarge {
        /// The path given.
        path: String,
        /// The size the result would have had.
        bytes: u64,
        /// The largest file the tools write.
        limit: u64,
    },
    /// A change of several files stopped part way by a system error (a full disk): the
    /// files named were already changed, the rest were not.
    #[error("{path}: {why}; stopped there, after changing {applied}")]
    Interrupted {
        /// The file it failed on.
        path: String,
        /// The files already changed, as absolute paths.
        applied: String,
        /// What failed, with its causes.
        why: String,
    },
    /// Bad arguments that are not about the path.
    #[error("{0}")]
    Invalid(String),
    /// The configuration of the file tools is unusable.
    #[error("file tools: {0}")]
    Config(String),
    /// The operating system refused or failed.
    #[error("{path}")]
    Io {
        /// The path given.
        path: String,
        /// The system's error (shared, so the error stays `Clone`).
        #[source]
        error: Arc<std::io::Error>,
    },
}

impl FileError {
    pub(crate) fn io(path: &str, error: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            error: Arc::new(error),
        }
    }
}
