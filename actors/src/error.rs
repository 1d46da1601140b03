use std::sync::Arc;
use std::time::Duration;

/// Why a call did not succeed. Every call ends in exactly one `Ok` or one of these.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No tool has this name.
    #[error("unknown tool `{name}`")]
    UnknownTool {
        /// The name asked for.
        name: String,
    },
    /// The arguments do not match the tool's input schema; the tool did not run.
    #[error("invalid arguments for `{tool}`: at `{path}`: {reason}")]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// Where in the arguments the problem is (`.` for the top level).
        path: String,
        /// What was wrong and what was expected.
        reason: String,
    },
    /// The tool ran and returned its own error.
    ///
    /// `message` holds the tool error's whole chain (it crosses MCP and the audit as text), so
    /// the error is not also this one's [`source`](std::error::Error::source), which would
    /// print it twice: get the typed value with [`CallError::tool_error`].
    #[error("`{tool}` failed: {message}")]
    Tool {
        /// The tool.
        tool: String,
        /// The tool error's message, with its causes.
        message: String,
        /// Whether the tool says a retry may succeed.
        transient: bool,
        /// The tool's error value, for typed callers to downcast.
        error: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The tool panicked (or its actor died) while handling this call; it is being restarted.
    #[error("`{tool}` crashed while handling the call and is being restarted: {reason}")]
    Crashed {
        /// The tool.
        tool: String,
        /// The panic message, when known.
        reason: String,
    },
    /// The call passed its deadline; its cancellation token was fired.
    #[error("`{tool}` timed out after {after:?}")]
    Timeout {
        /// The tool.
        tool: String,
        /// The time budget the call had.
        after: Duration,
    },
    /// The tool's circuit breaker is open; the call was rejected without running.
    #[error("{}", circuit_open_message(tool, *retry_after, *own))]
    CircuitOpen {
        /// The tool.
        tool: String,
        /// When a call may be let through again.
        retry_after: Duration,
        /// Only this caller's circuit is open: its own calls kept failing, while the tool
        /// serves other callers.
        own: bool,
    },
    /// The runtime is shutting down or the tool was removed.
    #[error("`{tool}` is unavailable: {reason}")]
    Unavailable {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The tool's output could not be encoded.
    #[error("`{tool}` returned output that could not be encoded: {reason}")]
    InvalidOutput {
        /// The tool.
        tool: String,
        /// The encoder's message.
        reason: String,
    },
    /// Governance refused the call (a permission rule, a hook, the loop guard, or an asked
    /// person); the tool did not run.
    #[error("`{tool}` was denied: {reason}")]
    Denied {
        /// The tool.
        tool: String,
        /// Why, and what would allow it.
        reason: String,
    },
    /// A rate limit refused the call; the tool did not run.
    #[error("`{tool}` is rate limited ({limit}); retry after {retry_after:?}")]
    RateLimited {
        /// The tool.
        tool: String,
        /// Which limit, e.g. `100/min per tool`.
        limit: String,
        /// When a call may be admitted again.
        retry_after: Duration,
    },
}

/// A stable, machine-readable name for each [`CallError`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`CallError::UnknownTool`].
    UnknownTool,
    /// [`CallError::InvalidArguments`].
    InvalidArguments,
    /// [`CallError::Tool`].
    ToolError,
    /// [`CallError::Crashed`].
    Crashed,
    /// [`CallError::Timeout`].
    Timeout,
    /// [`CallError::CircuitOpen`].
    CircuitOpen,
    /// [`CallError::Unavailable`].
    Unavailable,
    /// [`CallError::InvalidOutput`].
    InvalidOutput,
    /// [`CallError::Denied`].
    Denied,
    /// [`CallError::RateLimited`].
    RateLimited,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [Self; 10] = [
        Self::UnknownTool,
        Self::InvalidArguments,
        Self::ToolError,
        Self::Crashed,
        Self::Timeout,
        Self::CircuitOpen,
        Self::Unavailable,
        Self::InvalidOutput,
        Self::Denied,
        Self::RateLimited,
    ];

    /// The kind's stable name, as it is serialized (`tool_error`, `circuit_open`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownTool => "unknown_tool",
            Self::InvalidArguments => "invalid_arguments",
            Self::ToolError => "tool_error",
            Self::Crashed => "crashed",
            Self::Timeout => "timeout",
            Self::CircuitOpen => "circuit_open",
            Self::Unavailable => "unavailable",
            Self::InvalidOutput => "invalid_output",
            Self::Denied => "denied",
            Self::RateLimited => "rate_limited",
        }
    }
}

impl CallError {
    /// The variant's stable name.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::UnknownTool { .. } => ErrorKind::UnknownTool,
            Self::InvalidArguments { .. } => ErrorKind::InvalidArguments,
            Self::Tool { .. } => ErrorKind::ToolError,
            Self::Crashed { .. } => ErrorKind::Crashed,
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::CircuitOpen { .. } => ErrorKind::CircuitOpen,
            Self::Unavailable { .. } => ErrorKind::Unavailable,
            Self::InvalidOutput { .. } => ErrorKind::InvalidOutput,
            Self::Denied { .. } => ErrorKind::Denied,
            Self::RateLimited { .. } => ErrorKind::RateLimited,
        }
    }

    /// Whether retrying the same call may succeed: a crash, or a tool error the tool marked
    /// transient. Only idempotent tools are retried automatically.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Crashed { .. } => true,
            Self::Tool { transient, .. } => *transient,
            _ => false,
        }
    }

    /// Whether this outcome counts against the tool's circuit breaker: crashes and timeouts.
    pub fn is_breaker_failure(&self) -> bool {
        matches!(self, Self::Crashed { .. } | Self::Timeout { .. })
    }

    /// The tool's own error, if this is a [`CallError::Tool`] of type `E`.
    pub fn tool_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Self::Tool { error, .. } => error.downcast_ref::<E>(),
            _ => None,
        }
    }
}

/// Why a tool could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// The name is empty, too long, or has characters outside `[A-Za-z0-9_.-]`.
    #[error("invalid tool name `{name}`: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What rule it broke.
        reason: String,
    },
    /// Another tool already has this name.
    #[error("a tool named `{name}` is already registered")]
    DuplicateName {
        /// The clashing name.
        name: String,
    },
    /// The input schema is not an object schema, as MCP requires.
    #[error("tool `{name}` has an input schema that is not an object: {reason}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// What a refused caller reads: whether the circuit is open for it alone or for everyone.
fn circuit_open_message(tool: &str, retry_after: Duration, own: bool) -> String {
    if own {
        format!(
            "your calls to `{tool}` kept failing, so its circuit is open for you (it serves \
             other callers); retry after {retry_after:?}, with different arguments"
        )
    } else {
        format!("`{tool}` is failing and its circuit is open; retry after {retry_after:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn names_match_the_serialized_form() {
        for kind in ErrorKind::ALL {
            assert_eq!(
                serde_json::to_value(kind).ok(),
                Some(serde_json::Value::from(kind.as_str()))
            );
        }
    }
}
