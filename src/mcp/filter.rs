//! Which tools a connection may see and call: names and globs such as
//! `send_message,check_inbox,context_*`.

use std::fmt;

use glob::Pattern;

/// Tool-name patterns. A tool the filter refuses is absent from `tools/list`, and calling
/// it is refused with an error that names the filter.
///
/// A filter is a list of layers (the server's `--tools`, a role's default set, a
/// connection's `--tools`); a name passes when it matches some pattern of every layer.
#[derive(Clone, Default)]
pub struct ToolFilter {
    layers: Vec<Vec<Pattern>>,
}

/// A pattern that is not a valid glob.
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid tool pattern `{pattern}`: {reason}")]
pub struct FilterError {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ToolFilter {
    /// Every tool.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only tools matching one of `patterns` (names, or globs with `*`, `?` and `[...]`).
    ///
    /// # Errors
    /// [`FilterError`] for an empty or malformed pattern.
    pub fn only<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> Result<Self, FilterError> {
        let layer = patterns
            .into_iter()
            .map(|p| {
                let p = p.as_ref().trim();
                if p.is_empty() {
                    return Err(FilterError {
                        pattern: p.to_owned(),
                        reason: "empty pattern".to_owned(),
                    });
                }
                Pattern::new(p).map_err(|err| FilterError {
                    pattern: p.to_owned(),
                    reason: err.msg.to_owned(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            layers: vec![layer],
        })
    }

    /// Parses a comma-separated list, as `--tools` takes it.
    ///
    /// # Errors
    /// As [`only`](Self::only).
    pub fn parse(list: &str) -> Result<Self, FilterError> {
        Self::only(list.split(',').filter(|p| !p.trim().is_empty()))
    }

    /// The tools both filters allow.
    #[must_use]
    pub fn and(mut self, other: Self) -> Self {
        self.layers.extend(other.layers);
        self
    }

    /// Whether `name` passes.
    pub fn allows(&self, name: &str) -> bool {
        self.layers
            .iter()
            .all(|layer| layer.iter().any(|p| p.matches(name)))
    }

    /// Whether this filter lets everything through.
    pub fn is_all(&self) -> bool {
        self.layers.is_empty()
    }
}

impl fmt::Display for ToolFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.layers.is_empty() {
            return f.write_str("*");
        }
        let layers: Vec<String> = self
            .layers
            .iter()
            .map(|layer| {
                let names: Vec<&str> = layer.iter().map(Pattern::as_str).collect();
                names.join(",")
            })
            .collect();
        f.write_str(&layers.join(" and "))
    }
}

impl fmt::Debug for ToolFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ToolFilter({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_globs_in_layers() {
        let f = ToolFilter::parse("send_message, check_inbox,context_*").expect("valid");
        assert!(f.allows("send_message"));
        assert!(f.allows("context_get"));
        assert!(!f.allows("read_message"));
        let narrowed = f.and(ToolFilter::parse("context_*,mark_read").expect("valid"));
        assert!(narrowed.allows("context_update"));
        assert!(!narrowed.allows("send_message"));
        assert!(ToolFilter::all().allows("anything"));
        assert!(ToolFilter::parse("[oops").is_err());
        assert_eq!(
            ToolFilter::parse("a,b*").expect("valid").to_string(),
            "a,b*"
        );
    }
}
