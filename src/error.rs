use guildhall_actors::RegistrationError;
use guildhall_supervision::SupervisorError;

/// Why the runtime could not be built or a tool could not be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A tool was rejected at registration.
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The agent directory could not be loaded.
    #[error("the agent directory could not be loaded")]
    Agents(#[from] crate::agents::MailError),
    /// The sessions could not be loaded.
    #[error("the sessions could not be loaded")]
    Sessions(#[from] crate::context::ContextError),
    /// The supervision tree could not be started.
    #[error("the supervision tree failed to start")]
    Supervision(#[from] SupervisorError),
    /// A subsystem could not install or start.
    #[error("subsystem `{name}` cannot start: {reason}")]
    Subsystem {
        /// The subsystem's name (`Subsystem::name`).
        name: &'static str,
        /// Why.
        reason: String,
    },
    /// A subsystem's settings (`[subsystems.NAME]`) name no subsystem or do not fit it.
    #[error("[subsystems.{name}]: {reason}")]
    Section {
        /// The section's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}
