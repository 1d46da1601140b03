//! `find_tools`: a search over the tools an agent may use, by name and description, for
//! tool sets too large to list whole (many proxied servers).
//!
//! Over MCP, a connection whose tool set is past `[mcp] disclose_after` sees guildhall's
//! own tools and `find_tools`; the proxied tools it finds are added to its listing and
//! announced with `tools/list_changed` (the MCP server does that, above this module). Here
//! is only the search, a supervised, governed tool like any other: it never shows a tool
//! governance denies the caller outright.

use guildhall_actors::{Annotations, CallContext, Tool, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::runtime::{AfterStart, Runtime, RuntimeBuilder, WeakRuntime};

/// The tool's name.
pub const TOOL: &str = "find_tools";

/// Matches returned when no `limit` is given, and at most.
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 50;
/// The longest query accepted, in bytes, and the most words counted in it.
const MAX_QUERY: usize = 1_000;
const MAX_WORDS: usize = 16;

/// `find_tools`.
pub struct FindTools {
    runtime: WeakRuntime,
}

/// Input of `find_tools`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindInput {
    /// Words to look for in tools' names and descriptions (`"github issue"`), or a tool's
    /// exact name.
    pub query: String,
    /// How many tools to return, best first (default 10, at most 50).
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    pub limit: Option<usize>,
}

/// One tool found.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FoundTool {
    /// Its name, to call it by.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub input_schema: Value,
}

/// What `find_tools` found.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Found {
    /// The tools that match, best first.
    pub tools: Vec<FoundTool>,
    /// How many more match than are shown.
    pub more: usize,
}

/// Why a search was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FindError {
    /// The query or the limit is unusable.
    #[error("{0}")]
    Invalid(String),
    /// The runtime is stopping.
    #[error("the runtime is stopping")]
    Stopping,
}

impl Tool for FindTools {
    type Input = FindInput;
    type Output = Found;
    type Error = FindError;
    type State = ();

    fn name(&self) -> &str {
        TOOL
    }

    fn description(&self) -> &str {
        "Finds tools by what they do: give words (\"create github issue\") or a tool's name. \
         Not every tool is listed at once; the ones found are added to your tool list, and \
         can be called as soon as they are."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Find tools")
    }

    async fn call(
        &self,
        _: &mut (),
        input: FindInput,
        ctx: CallContext,
    ) -> Result<Found, FindError> {
        let limit = input.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(FindError::Invalid(format!(
                "limit is {limit}; give 1 to {MAX_LIMIT}"
            )));
        }
        if input.query.len() > MAX_QUERY {
            return Err(FindError::Invalid(format!(
                "the query is {} bytes; at most {MAX_QUERY}",
                input.query.len()
            )));
        }
        let words: Vec<String> = input
            .query
            .split(|c: char| !c.is_alphanumeric() && c != '_' && c != '-')
            .filter(|w| !w.is_empty())
            .take(MAX_WORDS)
            .map(str::to_lowercase)
            .collect();
        if words.is_empty() {
            return Err(FindError::Invalid(
                "the query has no words; give what the tool should do, or its name".into(),
            ));
        }
        let runtime = self.runtime.upgrade().ok_or(FindError::Stopping)?;
        Ok(search(
            &runtime,
            ctx.agent(),
            input.query.trim(),
            &words,
            limit,
        ))
    }
}

/// The tools `agent` may use that match, best first: an exact name, then by how many
/// words the name holds (each worth three in the description), then by name.
fn search(
    runtime: &Runtime,
    agent: Option<&str>,
    query: &str,
    words: &[String],
    limit: usize,
) -> Found {
    let specs = runtime.listed_tools();
    let hidden = runtime.governance().hidden(agent, &specs);
    let mut scored: Vec<(usize, &ToolSpec)> = specs
        .iter()
        .filter(|spec| spec.name != TOOL && !hidden.contains(&spec.name.as_str()))
        .filter_map(|spec| {
            if spec.name == query {
                return Some((usize::MAX, spec));
            }
            let (name, description) = (spec.name.to_lowercase(), spec.description.to_lowercase());
            let score: usize = words
                .iter()
                .map(|w| {
                    3 * usize::from(name.contains(w.as_str()))
                        + usize::from(description.contains(w.as_str()))
                })
                .sum();
            (score > 0).then_some((score, spec))
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
    let more = scored.len().saturating_sub(limit);
    let tools = scored
        .into_iter()
        .take(limit)
        .map(|(_, spec)| FoundTool {
            name: spec.name.clone(),
            description: spec.description.clone(),
            input_schema: (*spec.input_schema).clone(),
        })
        .collect();
    Found { tools, more }
}

impl RuntimeBuilder {
    /// Adds `find_tools`, a search over the tools each caller may use.
    pub fn tool_search(self) -> Self {
        self.subsystem(AfterStart::new(TOOL, |runtime: Runtime| async move {
            runtime
                .register(FindTools {
                    runtime: runtime.downgrade(),
                })
                .await
                .map(|_| ())
                .map_err(|err| err.to_string())
        }))
    }
}
