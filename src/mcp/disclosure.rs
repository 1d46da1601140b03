//! Progressive disclosure of large tool sets (`[mcp] disclose_after = N`).
//!
//! When an agent would see more than `N` tools and `find_tools` is served, its listing
//! holds guildhall's own tools and `find_tools`, and of the proxied servers' tools only
//! those it has found: each search adds what it found (as the connection may see it) and
//! announces the change with `tools/list_changed`, as the MCP roadmap's progressive
//! discovery proposes. What an agent has found is kept per agent, for every connection it
//! has (a stateless HTTP request is a connection of its own), while the server runs.
//! Hidden is not refused: a tool not yet found may still be called by name.

use std::collections::BTreeSet;
use std::sync::Arc;

use dashmap::DashMap;
use rmcp::model::Tool;
use tokio::sync::watch;

use crate::tool_search::TOOL;

/// Whether a tool is listed only once found: the proxied servers' tools.
fn on_demand(name: &str) -> bool {
    name.starts_with("mcp__")
}

/// What each agent has found, when disclosure is on.
#[derive(Default)]
pub(super) struct Disclosure {
    /// The tool count past which a listing is narrowed (`None`: never).
    after: Option<usize>,
    found: DashMap<Arc<str>, Found>,
}

/// One agent's found tools, and a counter its connections watch to hear they grew.
struct Found {
    names: BTreeSet<String>,
    changes: watch::Sender<u64>,
}

impl Default for Found {
    fn default() -> Self {
        Self {
            names: BTreeSet::new(),
            changes: watch::Sender::new(0),
        }
    }
}

impl Disclosure {
    pub(super) fn new(after: Option<usize>) -> Self {
        Self {
            after,
            found: DashMap::new(),
        }
    }

    pub(super) fn is_on(&self) -> bool {
        self.after.is_some()
    }

    pub(super) fn after(&self) -> Option<usize> {
        self.after
    }

    /// Narrows `tools`, the set `agent` may see on a connection, to what it is shown: past
    /// the bound, and with `find_tools` among them to find the rest.
    pub(super) fn narrow(&self, agent: Option<&str>, tools: &mut Vec<Tool>) {
        let Some(after) = self.after else {
            return;
        };
        if tools.len() <= after || !tools.iter().any(|t| t.name == TOOL) {
            return;
        }
        let found = agent.and_then(|a| self.found.get(a));
        tools.retain(|t| {
            !on_demand(&t.name) || found.as_ref().is_some_and(|f| f.names.contains(&*t.name))
        });
    }

    /// Adds `names` to what `agent` has found; its connections hear of it if that grew.
    pub(super) fn disclose(&self, agent: &Arc<str>, names: impl IntoIterator<Item = String>) {
        let mut found = self.found.entry(Arc::clone(agent)).or_default();
        let before = found.names.len();
        found
            .names
            .extend(names.into_iter().filter(|name| on_demand(name)));
        if found.names.len() > before {
            found.changes.send_modify(|n| *n += 1);
        }
    }

    /// Changes of what `agent` has found, for its connection to relay as
    /// `tools/list_changed`; `None` when disclosure is off.
    pub(super) fn changes(&self, agent: &Arc<str>) -> Option<watch::Receiver<u64>> {
        self.is_on().then(|| {
            self.found
                .entry(Arc::clone(agent))
                .or_default()
                .changes
                .subscribe()
        })
    }
}
