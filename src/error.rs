use guildhall_actors::RegistrationError;
use guildhall_supervision::SupervisorError;

/// Why the runtime could not be built or a tool could not be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A tool was rejected at registration.
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    /// The supervision tree could not be started.
    #[error("supervision tree failed to start: {0}")]
    Supervision(#[from] SupervisorError),
}
