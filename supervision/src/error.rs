use std::time::Duration;

/// Errors from supervisor operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SupervisorError {
    /// A child's start function failed.
    #[error("child `{id}` failed to start")]
    StartFailed {
        /// The child's id.
        id: String,
        /// Why it failed: ractor's spawn error, with the actor's own error as its source.
        #[source]
        error: ractor::SpawnErr,
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
    #[error("supervisor unavailable: {why}")]
    Unavailable {
        /// What went wrong talking to it.
        why: Unreachable,
    },
}

/// Why a supervisor did not answer. A closed set rather than ractor's messaging error, which
/// carries the unsent request (and its reply port) inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unreachable {
    /// It is not running: stopped, or never started.
    #[error("it is not running")]
    Stopped,
    /// It stopped while holding the request, without answering it.
    #[error("it stopped before answering")]
    NoReply,
}

/// Shows an error with its causes, outermost first, joined by `: `.
///
/// No message of guildhall's repeats its source, so `{err}` alone shows only the outermost
/// part; print `ErrorChain(&err)` where a person reads the whole story (the command line, a
/// tool's error text, logs). A cause whose text the story already holds is left out, since
/// some crates' messages do repeat their sources.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let next = cause.to_string();
            if !text.contains(&next) {
                text.push_str(": ");
                text.push_str(&next);
            }
            source = cause.source();
        }
        f.write_str(&text)
    }
}

impl std::fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorChain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("repeats: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn a_chain_shows_every_cause_once() {
        let inner = || std::io::Error::other("disk full");
        assert_eq!(ErrorChain(&Outer(inner())).to_string(), "outer: disk full");
        // A foreign error that prints its source is not repeated.
        assert_eq!(
            ErrorChain(&Repeats(inner())).to_string(),
            "repeats: disk full"
        );
    }
}
