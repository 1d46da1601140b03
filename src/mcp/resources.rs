//! The runtime's state as MCP resources: the caller's inbox, the agent directory, context
//! sessions and their entries, the task board and its tasks, the runtime's latest events;
//! and subscriptions to them, so a client is told of new mail or a changed entry instead of
//! polling.
//!
//! A read goes through the tool that reads the same thing (`check_inbox`, `list_agents`,
//! `context_get`, `task_list`, `task_get`) as the calling agent, so every rule that holds for
//! the tool holds for the resource: permissions, role tool sets, rate limits, audit. The
//! events are the exception: no tool reads them (a read through a tool would itself be
//! events, and a subscriber reading on each notice would never rest), and each agent reads
//! its own share, the share `/events` streams to it. A subscription watches the
//! subject in [`Changes`](crate::changes::Changes) and sends `notifications/resources/updated`
//! for it after each committed change (coalesced while a notification is on its way).

use std::sync::Arc;

use rmcp::model::{ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult};
use rmcp::{ErrorData as McpError, model::PaginatedRequestParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::page;
use crate::changes::{Subject, Watch};
use crate::observe::RecentEvents;
use crate::{CallOptions, Runtime};

/// The calling agent's inbox (unread mail, not marked read by reading it).
pub const INBOX: &str = "guildhall://inbox";
/// The agent directory.
pub const AGENTS: &str = "guildhall://agents";
/// Context sessions: `guildhall://context/{session}` and `…/{session}/{key}`.
const CONTEXT: &str = "guildhall://context/";
/// The task board's unfinished tasks.
pub const TASKS: &str = "guildhall://tasks";
/// One task: `guildhall://tasks/{id}`.
const TASK: &str = "guildhall://tasks/";
/// The latest events the caller may see; `…?after=N` those after event number N.
pub const EVENTS: &str = "guildhall://events";
/// Subscriptions one connection may hold at once.
pub(super) const MAX_SUBSCRIPTIONS: usize = 256;
/// Messages and entries one read returns at most.
const READ_LIMIT: u32 = 100;

/// A guildhall resource, from its URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resource {
    Inbox,
    Agents,
    Session(String),
    Entry(String, String),
    Tasks,
    Task(u64),
    /// After event number `after`, or the latest.
    Events(Option<u64>),
}

impl Resource {
    /// Parses `uri`; anything else is "no such resource", naming the ones there are.
    pub(super) fn parse(uri: &str) -> Result<Self, McpError> {
        let parsed = match uri {
            INBOX => Some(Self::Inbox),
            AGENTS => Some(Self::Agents),
            TASKS => Some(Self::Tasks),
            EVENTS => Some(Self::Events(None)),
            _ if uri.starts_with(EVENTS) => uri[EVENTS.len()..]
                .strip_prefix("?after=")
                .and_then(|n| n.parse().ok())
                .map(|after| Self::Events(Some(after))),
            _ if uri.starts_with(TASK) => uri[TASK.len()..]
                .parse()
                .ok()
                .filter(|id| *id > 0)
                .map(Self::Task),
            _ => uri.strip_prefix(CONTEXT).and_then(|rest| {
                match rest.split_once('/') {
                    None => Some(Self::Session(rest.to_owned())),
                    Some((session, key)) => {
                        (!key.is_empty()).then(|| Self::Entry(session.to_owned(), key.to_owned()))
                    }
                }
                .filter(|r| !matches!(r, Self::Session(s) | Self::Entry(s, _) if s.is_empty()))
            }),
        };
        parsed.ok_or_else(|| {
            McpError::resource_not_found(
                format!(
                    "no resource `{uri}`: guildhall serves `{INBOX}`, `{AGENTS}`, \
                     `{CONTEXT}{{session}}`, `{CONTEXT}{{session}}/{{key}}`, `{TASKS}`, \
                     `{TASK}{{id}}`, `{EVENTS}` and `{EVENTS}?after={{n}}`"
                ),
                Some(json!({ "uri": uri })),
            )
        })
    }

    /// What changes it: `agent` is the reader (whose inbox `guildhall://inbox` is).
    pub(super) fn subject(&self, agent: &str) -> Subject {
        match self {
            Self::Inbox => Subject::Inbox(Arc::from(agent)),
            Self::Agents => Subject::Agents,
            Self::Session(s) => Subject::Session(Arc::from(s.as_str())),
            Self::Entry(s, k) => Subject::Entry(Arc::from(s.as_str()), Arc::from(k.as_str())),
            Self::Tasks => Subject::Tasks,
            Self::Task(id) => Subject::Task(*id),
            Self::Events(_) => Subject::Events,
        }
    }

    /// The tool a read goes through, and its arguments (none for the events).
    pub(super) fn tool(&self) -> Option<(&'static str, Value)> {
        Some(match self {
            Self::Inbox => ("check_inbox", json!({ "limit": READ_LIMIT, "full": true })),
            Self::Agents => ("list_agents", json!({})),
            Self::Session(s) => ("context_get", json!({ "session": s, "limit": READ_LIMIT })),
            Self::Entry(s, k) => ("context_get", json!({ "session": s, "keys": [k] })),
            Self::Tasks => (
                "task_list",
                json!({ "status": ["open", "in_progress"], "limit": READ_LIMIT }),
            ),
            Self::Task(id) => ("task_get", json!({ "id": id })),
            Self::Events(_) => return None,
        })
    }
}

/// Reads `uri` as `agent`; the events from `recent`.
pub(super) async fn read(
    runtime: &Runtime,
    recent: impl FnOnce() -> Arc<RecentEvents>,
    agent: Arc<str>,
    uri: &str,
) -> Result<ReadResourceResult, McpError> {
    let resource = Resource::parse(uri)?;
    let Some((tool, args)) = resource.tool() else {
        let Resource::Events(after) = resource else {
            unreachable!("only the events are read without a tool")
        };
        let page = recent().read(&agent, after, READ_LIMIT as usize);
        let value = json!({ "events": page.events, "next": page.next, "missed": page.missed,
            "more": format!("{EVENTS}?after={}", page.next) });
        return contents(uri, &value);
    };
    let value = runtime
        .call_json(tool, args, CallOptions::new().agent_id(agent))
        .await
        .map_err(|err| {
            McpError::invalid_params(
                format!("cannot read `{uri}`: {err}"),
                Some(json!({ "uri": uri })),
            )
        })?;
    let value = match resource {
        Resource::Entry(_, key) => {
            let entry = value["entries"]
                .as_array()
                .and_then(|entries| entries.iter().find(|e| e["key"] == key.as_str()));
            match entry {
                Some(entry) => entry.clone(),
                None => {
                    return Err(McpError::resource_not_found(
                        format!("no entry `{key}` in `{uri}`"),
                        Some(json!({ "uri": uri })),
                    ));
                }
            }
        }
        _ => value,
    };
    contents(uri, &value)
}

/// A read's answer: `value` as the JSON text of `uri`.
fn contents(uri: &str, value: &Value) -> Result<ReadResourceResult, McpError> {
    model(json!({ "contents": [{
        "uri": uri,
        "mimeType": "application/json",
        "text": serde_json::to_string_pretty(value).unwrap_or_default(),
    }] }))
}

/// The fixed resources, every context session and then `proxied` (the proxied servers'
/// resources the caller may read), paged.
pub(super) fn list(
    runtime: &Runtime,
    agent: Option<&str>,
    request: Option<PaginatedRequestParams>,
    proxied: Vec<rmcp::model::Resource>,
) -> Result<ListResourcesResult, McpError> {
    let mut all = Vec::new();
    if let Some(agent) = agent {
        all.push(
            json!({ "uri": INBOX, "name": "inbox", "title": format!("Inbox of {agent}"),
            "description": "Your unread mail (reading it marks nothing read). Subscribe to \
                            hear of new mail instead of waiting in check_inbox.",
            "mimeType": "application/json" }),
        );
    }
    all.push(
        json!({ "uri": AGENTS, "name": "agents", "title": "Agent directory",
        "description": "Every registered agent: id, role, parent.",
        "mimeType": "application/json" }),
    );
    all.push(
        json!({ "uri": TASKS, "name": "tasks", "title": "Task board",
        "description": "Unfinished tasks (open or in progress), oldest first. Subscribe to \
                        hear of any change instead of polling task_list; one task is \
                        guildhall://tasks/{id}.",
        "mimeType": "application/json" }),
    );
    all.push(json!({ "uri": EVENTS, "name": "events", "title": "Events",
        "description": "The latest events you may see: your calls and how they ended, mail \
                        you sent or that was sent to you, agents connecting and leaving, \
                        context changes, tools' restarts and breakers. Read `next` from the \
                        answer and read guildhall://events?after={next} for what came \
                        since; subscribe to hear when more came.",
        "mimeType": "application/json" }));
    let mut sessions = runtime.sessions().list();
    sessions.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    all.extend(sessions.iter().map(|s| {
        json!({ "uri": format!("{CONTEXT}{}", s.id.as_str()),
            "name": format!("context/{}", s.id.as_str()),
            "title": if s.title.is_empty() { s.id.as_str() } else { &s.title },
            "description": "A context session's entries. Subscribe to hear of changes; \
                            one entry is …/{session}/{key}.",
            "mimeType": "application/json" })
    }));
    all.extend(proxied.iter().filter_map(|r| serde_json::to_value(r).ok()));
    let (resources, next) = page::page(all, request)?;
    let mut result = json!({ "resources": resources });
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    }
    model(result)
}

/// The templates (a session, one entry, a task, the events after one) and then `proxied`
/// (the proxied servers' templates the caller may read), paged.
pub(super) fn templates(
    request: Option<PaginatedRequestParams>,
    proxied: Vec<rmcp::model::ResourceTemplate>,
) -> Result<ListResourceTemplatesResult, McpError> {
    let mut all = vec![
        json!({ "uriTemplate": format!("{CONTEXT}{{session}}"), "name": "context-session",
          "title": "Context session", "description": "A context session's entries.",
          "mimeType": "application/json" }),
        json!({ "uriTemplate": format!("{CONTEXT}{{session}}/{{key}}"), "name": "context-entry",
          "title": "Context entry", "description": "One entry of a context session.",
          "mimeType": "application/json" }),
        json!({ "uriTemplate": format!("{TASK}{{id}}"), "name": "task",
          "title": "Task", "description": "One task of the board, with its notes.",
          "mimeType": "application/json" }),
        json!({ "uriTemplate": format!("{EVENTS}{{?after}}"), "name": "events-after",
          "title": "Events after", "description": "The events you may see after event \
          number `after` (the `next` of your last read).",
          "mimeType": "application/json" }),
    ];
    all.extend(proxied.iter().filter_map(|t| serde_json::to_value(t).ok()));
    let (templates, next) = page::page(all, request)?;
    let mut result = json!({ "resourceTemplates": templates });
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    }
    model(result)
}

/// Sends `notify` after every change `watch` sees (and once at once, when `at_once`),
/// until `stop` or a failed send.
pub(super) async fn relay<N, E>(
    mut watch: Watch,
    at_once: bool,
    stop: impl Future<Output = ()>,
    mut notify: impl FnMut() -> N,
) where
    N: Future<Output = Result<(), E>>,
{
    tokio::pin!(stop);
    if at_once && notify().await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            // Stopped first: nothing is announced once a subscription has ended.
            biased;
            () = &mut stop => return,
            () = watch.changed() => {
                if notify().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// An rmcp model value from its JSON form (the handler clears `resultType` for older eras).
pub(super) fn model<T: DeserializeOwned>(mut value: Value) -> Result<T, McpError> {
    value["resultType"] = json!("complete");
    serde_json::from_value(value)
        .map_err(|err| McpError::internal_error(format!("building the answer: {err}"), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_to_resources_and_nothing_else() {
        assert_eq!(Resource::parse(INBOX).unwrap(), Resource::Inbox);
        assert_eq!(Resource::parse(TASKS).unwrap(), Resource::Tasks);
        assert_eq!(
            Resource::parse("guildhall://tasks/42").unwrap(),
            Resource::Task(42)
        );
        assert_eq!(
            Resource::parse("guildhall://context/s1/plan/step").unwrap(),
            Resource::Entry("s1".into(), "plan/step".into())
        );
        assert_eq!(
            Resource::parse("guildhall://context/s1").unwrap(),
            Resource::Session("s1".into())
        );
        for bad in [
            "guildhall://context/",
            "guildhall://context//k",
            "guildhall://context/s1/",
            "guildhall://inbox/bob",
            "guildhall://tasks/",
            "guildhall://tasks/0",
            "guildhall://tasks/x",
            "file:///etc/passwd",
            "",
        ] {
            let err = Resource::parse(bad).unwrap_err();
            assert!(err.message.contains("guildhall serves"), "{bad}: {err:?}");
        }
    }
}
