//! `guildhall.toml`: settings a server reads at start.
//!
//! ```toml
//! [roles.dev]
//! tools = ["send_message", "check_inbox", "read_message", "mark_read", "context_*"]
//! ```
//!
//! A role's `tools` is the default tool set of every MCP connection bound to an agent in that
//! role. An invalid file is rejected with its path, line and reason; nothing starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::mcp::ToolFilter;
use crate::mcp::local::RoleTools;

/// The config file's name in the data directory.
pub const CONFIG_FILE: &str = "guildhall.toml";

/// The parsed file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Settings per role.
    #[serde(default)]
    pub roles: BTreeMap<String, RoleConfig>,
}

/// One role's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    /// Tool names and globs its agents' connections see.
    pub tools: Vec<String>,
}

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {reason}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// The 1-based line of the problem, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

impl Config {
    /// Reads `path`. A missing file is an error only when `required` (it was named
    /// explicitly); otherwise it means the defaults.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable or invalid file.
    pub fn load(path: &Path, required: bool) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Self::default());
            }
            Err(err) => {
                return Err(ConfigError {
                    path: path.to_owned(),
                    line: None,
                    reason: err.to_string(),
                });
            }
        };
        let config: Self = toml::from_str(&text).map_err(|err| ConfigError {
            path: path.to_owned(),
            line: err
                .span()
                .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1),
            reason: err.message().to_owned(),
        })?;
        config.role_tools().map_err(|reason| ConfigError {
            path: path.to_owned(),
            line: None,
            reason,
        })?;
        Ok(config)
    }

    /// Each role's tool filter.
    ///
    /// # Errors
    /// The first invalid pattern, with its role.
    pub fn role_tools(&self) -> Result<RoleTools, String> {
        self.roles
            .iter()
            .map(|(role, config)| {
                ToolFilter::only(&config.tools)
                    .map(|filter| (role.clone(), filter))
                    .map_err(|err| format!("roles.{role}.tools: {err}"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(
            &path,
            "[roles.dev]\ntools = [\"send_message\"]\n\n[roles.pm]\ntool = []\n",
        )
        .expect("write");
        let err = Config::load(&path, true).expect_err("unknown field");
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.to_string().contains("guildhall.toml:5"), "{err}");

        std::fs::write(&path, "[roles.dev]\ntools = [\"context_*\", \"[bad\"]\n").expect("write");
        let err = Config::load(&path, true).expect_err("bad glob");
        assert!(err.reason.contains("roles.dev.tools"), "{err}");

        std::fs::write(&path, "[roles.dev]\ntools = [\"context_*\"]\n").expect("write");
        let tools = Config::load(&path, true)
            .expect("valid")
            .role_tools()
            .expect("valid");
        assert!(tools["dev"].allows("context_get"));
        assert!(!tools["dev"].allows("send_message"));

        assert!(Config::load(&dir.path().join("absent.toml"), false).is_ok());
        assert!(Config::load(&dir.path().join("absent.toml"), true).is_err());
    }
}
