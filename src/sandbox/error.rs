//! Why a sandbox could not be set up.

/// Why a sandbox could not be set up, or a process not started in one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// A setting is unusable.
    #[error("[sandbox] {0}")]
    Invalid(String),
    /// `require = true` and the kernel lacks a mechanism.
    #[error(
        "refused to start a process unconfined: the kernel lacks {missing} ([sandbox] require = true; \
         `guildhall doctor` tells what this machine offers)"
    )]
    Unavailable {
        /// What is missing, in words.
        missing: String,
    },
    /// Preparing the policy failed (a path could not be opened, the kernel refused a rule).
    #[error("the sandbox could not be prepared: {0}")]
    Prepare(String),
}
