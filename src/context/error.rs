//! What can go wrong with a session's context.

use crate::store::StoreError;

/// Why a context operation failed. Nothing of a refused batch is applied.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// An expected version did not match.
    #[error(
        "version conflict on `{key}`: expected version {expected}, but it is at {actual}; \
         read it again and retry (nothing of the batch was applied)"
    )]
    Conflict {
        /// The entry.
        key: String,
        /// The version the change expected.
        expected: u64,
        /// The version it is at (0: absent).
        actual: u64,
    },
    /// Append to a value that is neither text nor an array, or text to an array's opposite.
    #[error(
        "cannot append {given} to `{key}`, which holds {holds} (nothing of the batch was applied)"
    )]
    WrongType {
        /// The entry.
        key: String,
        /// What the entry holds.
        holds: &'static str,
        /// What was appended.
        given: &'static str,
    },
    /// A key that is empty or too long.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key (cut to 80 characters).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An entry or the session over its size limit, or a batch with too many changes.
    #[error("{what} is {size} bytes; the limit is {limit} (nothing of the batch was applied)")]
    TooLarge {
        /// What is too large.
        what: String,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// An empty batch.
    #[error("the batch has no changes")]
    Empty,
    /// A session id that is empty, too long or has characters outside `A-Z a-z 0-9 _ - . @`.
    #[error("invalid session id {id:?}: {reason}")]
    InvalidSessionId {
        /// The id given.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No session has this id.
    #[error("no session `{id}`: create it first, or update it to create it")]
    UnknownSession {
        /// The id asked for.
        id: String,
    },
    /// A session with this id exists already.
    #[error("session `{id}` exists already")]
    SessionExists {
        /// The id.
        id: String,
    },
    /// The session is closed: it can be read, not changed.
    #[error("session `{id}` is closed: it can be read and exported, not changed")]
    SessionClosed {
        /// The id.
        id: String,
    },
    /// A version older than the history kept.
    #[error(
        "version {requested} of session `{session}` is no longer kept: history starts at version \
         {oldest}"
    )]
    HistoryPruned {
        /// The session.
        session: String,
        /// The version asked for.
        requested: u64,
        /// The oldest version that can be read.
        oldest: u64,
    },
    /// A version the session has not reached.
    #[error("session `{session}` is at version {current}; version {requested} does not exist yet")]
    FutureVersion {
        /// The session.
        session: String,
        /// The version asked for.
        requested: u64,
        /// The session's version.
        current: u64,
    },
    /// The author is not a registered agent.
    #[error("unknown author `{id}`: register the agent first")]
    UnknownAuthor {
        /// The id given.
        id: String,
    },
    /// A tool argument or API argument is out of range or contradicts another.
    #[error("invalid `{name}`: {reason}")]
    InvalidArgument {
        /// The argument.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An export that cannot be imported.
    #[error("cannot import the session: {reason}")]
    InvalidExport {
        /// What is wrong with it.
        reason: String,
    },
    /// The session's stored state is inconsistent.
    #[error("the stored state of session `{session}` is damaged: {reason}")]
    Damaged {
        /// The session.
        session: String,
        /// What was found.
        reason: String,
    },
    /// The session's actor could not be reached (it kept failing to start).
    #[error("session `{session}` is unavailable: {reason}")]
    Unavailable {
        /// The session.
        session: String,
        /// What went wrong.
        reason: String,
    },
    /// The store failed; the operation did not take effect.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ContextError {
    /// Whether the same call may succeed later: the session or the store unavailable for
    /// now (the database restarting, another server handing the session over).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Store(err) => err.is_transient(),
            _ => false,
        }
    }
}
