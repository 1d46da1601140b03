//! Optional per-agent tokens: proof that a client may act as an agent.
//!
//! By default an agent id is declared, not proven: any local client may name any agent.
//! When the config gives an agent a token (`[agents.tl] token_env = "…"` or `token_file`),
//! that id is usable over HTTP and the local socket only with it (see `docs/security.md`).
//! The embedding program's own calls, and the agent a `serve --stdio` process is started
//! as, are its operator's and need none.

use std::collections::HashMap;
use std::sync::Arc;

/// The HTTP header that carries an agent's token.
pub const TOKEN_HEADER: &str = "guildhall-agent-token";

/// The environment variable `guildhall mcp` (and the CLI) read an agent's token from.
pub const TOKEN_ENV: &str = "GUILDHALL_AGENT_TOKEN";

/// Where a launched agent in a sandbox reaches its server: a socket of its own, which
/// serves that agent alone (the data directory's is out of its reach). `guildhall mcp` and
/// the CLI connect there when it is set.
pub const SOCKET_ENV: &str = "GUILDHALL_SOCKET";

/// Which agents need a token, and theirs. Cheap to clone.
#[derive(Clone, Default)]
pub struct Credentials {
    tokens: Arc<HashMap<String, Box<str>>>,
}

/// A client named an agent it could not prove it may act as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The agent has a token and none was given.
    #[error(
        "agent `{agent}` is protected by a token and none was given: send it in the \
         `Guildhall-Agent-Token` header over HTTP, or set GUILDHALL_AGENT_TOKEN for \
         `guildhall mcp` and the CLI"
    )]
    TokenRequired {
        /// The agent.
        agent: String,
    },
    /// The token given is not the agent's.
    #[error("the token given for agent `{agent}` is not its token")]
    WrongToken {
        /// The agent.
        agent: String,
    },
}

impl Credentials {
    /// Tokens by agent id.
    pub fn new(tokens: impl IntoIterator<Item = (String, String)>) -> Self {
        Self {
            tokens: Arc::new(
                tokens
                    .into_iter()
                    .map(|(agent, token)| (agent, token.into_boxed_str()))
                    .collect(),
            ),
        }
    }

    /// Whether any agent has a token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether `agent` needs a token.
    pub fn protects(&self, agent: &str) -> bool {
        self.tokens.contains_key(agent)
    }

    /// Checks that `given` proves the right to act as `agent` (anything does for an agent
    /// without a token).
    ///
    /// # Errors
    /// [`IdentityError`] when the agent has a token and `given` is missing or another.
    pub fn check(&self, agent: &str, given: Option<&str>) -> Result<(), IdentityError> {
        let Some(expected) = self.tokens.get(agent) else {
            return Ok(());
        };
        match given {
            None => Err(IdentityError::TokenRequired {
                agent: agent.to_owned(),
            }),
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
            Some(_) => Err(IdentityError::WrongToken {
                agent: agent.to_owned(),
            }),
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens themselves.
        f.debug_struct("Credentials")
            .field("agents", &self.tokens.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Compares without an early exit, so the time taken does not reveal a matching prefix.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The role a client asks for, against the one the config gives the agent (if any): a
/// client may not claim another.
///
/// # Errors
/// The refusal, naming both roles.
pub fn checked_role(
    agent: &str,
    claimed: Option<String>,
    given: Option<&str>,
) -> Result<Option<String>, String> {
    match (claimed, given) {
        (Some(claimed), Some(given)) if claimed != given => Err(format!(
            "the config gives agent `{agent}` role `{given}`; it cannot connect as role `{claimed}`"
        )),
        (claimed, given) => Ok(claimed.or_else(|| given.map(str::to_owned))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_protected_agents_need_their_token() {
        let c = Credentials::new([("tl".to_owned(), "s3cret".to_owned())]);
        assert_eq!(c.check("pm", None), Ok(()));
        assert!(matches!(
            c.check("tl", None),
            Err(IdentityError::TokenRequired { .. })
        ));
        assert!(matches!(
            c.check("tl", Some("guess")),
            Err(IdentityError::WrongToken { .. })
        ));
        assert_eq!(c.check("tl", Some("s3cret")), Ok(()));
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
