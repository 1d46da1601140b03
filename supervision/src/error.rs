use std::time::Duration;

/// Errors from supervisor operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SupervisorError {
    /// A child's start function failed.
    #[error("child `{id}` failed to start: {reason}")]
    StartFailed {
        /// The child's id.
        id: String,
        /// Why it failed.
        reason: String,
    },
    /// A child with this id is already supervised.
    #[error("a child with id `{id}` already exists")]
    DuplicateChild {
        /// The clashing id.
        id: String,
    },
    /// No child has this id.
    #[error("no child with id `{id}`")]
    UnknownChild {
        /// The id asked for.
        id: String,
    },
    /// More restarts happened within the period than the intensity allows; the supervisor
    /// stopped its children and escalated to its own parent.
    #[error("restart intensity exceeded: {restarts} restarts within {period:?}")]
    IntensityExceeded {
        /// Restarts counted in the window, including the one refused.
        restarts: u32,
        /// The intensity period.
        period: Duration,
    },
    /// The supervisor actor is gone or did not answer.
    #[error("supervisor unavailable: {reason}")]
    Unavailable {
        /// What went wrong talking to it.
        reason: String,
    },
}
