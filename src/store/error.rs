use std::path::PathBuf;
use std::sync::Arc;

/// Why the store could not open, read or write. Cheap to clone: one failed group commit is
/// reported to every batch in it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another process has the store open.
    #[error(
        "the store at {path} is in use by another process (is another guildhall running with \
         this data directory?)"
    )]
    Locked {
        /// The store file.
        path: PathBuf,
    },
    /// The file is damaged or is not a guildhall store. It was left untouched.
    #[error(
        "the store at {path} is corrupt or not a guildhall store: {reason}; it was left as it is"
    )]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// What the backend found.
        reason: String,
    },
    /// The store was written by a format this build does not know. It was left untouched.
    #[error(
        "the store at {path} has format version {found}, but this guildhall reads version \
         {supported}; it was left as it is"
    )]
    UnknownFormat {
        /// The store file.
        path: PathBuf,
        /// The version found (0 when no version marker is present).
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The file or directory could not be accessed.
    #[error("cannot open the store at {path}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
    /// A read or a commit failed.
    #[error("store {operation} failed")]
    Backend {
        /// `open`, `read`, `commit` and the like.
        operation: &'static str,
        /// The backend's error (redb's, tokio-postgres's), or what guildhall found wrong.
        #[source]
        error: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A stored value could not be decoded.
    #[error("a stored value in `{table}` could not be decoded: {reason}")]
    Decode {
        /// The table's name.
        table: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The database cannot be reached (a networked store: PostgreSQL down or the network
    /// broken). Nothing acknowledged is lost; the call can be made again once it is back.
    #[error("store unavailable: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
    /// Another server runs what this call needs (an agent's mailbox, a session) and did
    /// not hand it over in time.
    #[error(
        "`{subject}` is held by another guildhall server ({holder}), which did not hand it \
         over in time; try again"
    )]
    Held {
        /// What was needed.
        subject: String,
        /// The server holding it.
        holder: String,
    },
    /// This server was fenced out of the shared database (its lease ran out while it was
    /// paused or cut off, and another server took over what it held): nothing it writes
    /// is accepted.
    #[error(
        "this server lost the database to another guildhall server (its lease ran out while \
         it was paused or cut off); it no longer reads or writes it and must stop"
    )]
    Fenced,
    /// The store has shut down.
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    /// Whether the same call may succeed later: the database unreachable for now, or what
    /// the call needs held by another server that did not hand it over yet.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Held { .. })
    }

    /// A failed `operation`, for `error`: the backend's own error, or a message.
    pub(crate) fn backend(
        operation: &'static str,
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Backend {
            operation,
            error: Arc::from(error.into()),
        }
    }
}
