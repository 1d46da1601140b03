//! Prompts that brief an agent for its place in the swarm (tech lead, project manager,
//! worker: how mail, context and resources work here), and `completion/complete` for their
//! arguments and for the resource templates' variables.

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResult,
    ListPromptsResult, Reference,
};
use serde_json::{Value, json};

use super::resources::{AGENTS, INBOX, TASKS, model};
use crate::Runtime;

/// Completion values one answer holds at most (the protocol's limit).
const MAX_VALUES: usize = 100;

/// A role's briefing.
struct Brief {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    /// What this role does, in the second person.
    duty: &'static str,
}

const BRIEFS: &[Brief] = &[
    Brief {
        name: "tech-lead",
        title: "Brief a tech lead",
        description: "Briefs the agent leading the swarm: dividing work among project \
                      managers, keeping the shared plan, deciding.",
        duty: "You lead the swarm. Split the goal into parts, put each on the task board \
               for a project manager (task_create with `assignee`, parts that wait on others \
               `blocked_by` them), keep the plan and decisions in context, and answer \
               escalations. Decide; do not do the workers' work.",
    },
    Brief {
        name: "project-manager",
        title: "Brief a project manager",
        description: "Briefs an agent that runs one part of the work: splitting it among \
                      workers, tracking it, reporting up.",
        duty: "You run one part of the work. Split it into tasks for your workers \
               (task_create with `parent` set to your task, assigned to a worker or to \
               `role:NAME`), follow them with task_list, unblock them, and report results \
               and blockers to your parent.",
    },
    Brief {
        name: "worker",
        title: "Brief a worker",
        description: "Briefs an agent that does one task and reports to its parent.",
        duty: "You do one task at a time. Take it with task_claim (it is yours while you \
               renew it with task_heartbeat or task_update), do it, record what others need \
               in context, and finish it with task_update status `done` (or `failed` with a \
               note saying what you tried and what you need); task_release gives it back.",
    },
];

/// The briefing prompts.
pub(super) fn list() -> Result<ListPromptsResult, McpError> {
    let prompts: Vec<Value> = BRIEFS
        .iter()
        .map(|b| {
            json!({ "name": b.name, "title": b.title, "description": b.description,
                "arguments": [
                    { "name": "agent", "description": "The agent briefed (default: the caller)" },
                    { "name": "parent", "description": "The agent it reports to (default: its registered parent)" },
                    { "name": "task", "description": "What it should do now" },
                    { "name": "session", "description": "The context session the work shares" }
                ] })
        })
        .collect();
    model(json!({ "prompts": prompts }))
}

/// What a skill's prompt is named: `skill__NAME`.
pub(super) const SKILL_PREFIX: &str = "skill__";

/// The skills `agent` may load, as prompts (none when the runtime serves no skills).
pub(super) fn skills(runtime: &Runtime, agent: Option<&str>) -> Vec<rmcp::model::Prompt> {
    let Some(skills) = crate::skills::Skills::of(runtime) else {
        return Vec::new();
    };
    let role = agent
        .and_then(|a| runtime.lookup_agent(a))
        .map(|r| r.role.to_string());
    skills
        .for_role(role.as_deref())
        .iter()
        .filter_map(|skill| {
            serde_json::from_value(json!({
                "name": format!("{SKILL_PREFIX}{}", skill.name),
                "title": format!("Skill: {}", skill.name),
                "description": skill.description,
            }))
            .ok()
        })
        .collect()
}

/// Skill `name` as a prompt: loaded through the `skill` tool as `agent` (governed and
/// audited as that call; refused as it would be).
pub(super) async fn get_skill(
    runtime: &Runtime,
    agent: &std::sync::Arc<str>,
    name: &str,
) -> Result<GetPromptResult, McpError> {
    let options = crate::CallOptions::new().agent_id(std::sync::Arc::clone(agent));
    let loaded = runtime
        .call_json(crate::skills::TOOL, json!({ "name": name }), options)
        .await
        .map_err(|err| McpError::invalid_params(err.to_string(), None))?;
    let mut text = loaded["instructions"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if let Some(files) = loaded["files"].as_array().filter(|f| !f.is_empty()) {
        let dir = loaded["dir"].as_str().unwrap_or_default();
        let names: Vec<&str> = files.iter().filter_map(Value::as_str).collect();
        text.push_str(&format!(
            "\n\nFiles beside it, in {dir}: {}",
            names.join(", ")
        ));
    }
    model(json!({
        "description": loaded["description"],
        "messages": [{ "role": "user", "content": { "type": "text", "text": text } }]
    }))
}

/// One briefing, for `caller` unless the arguments name another agent.
pub(super) fn get(
    runtime: &Runtime,
    caller: Option<&str>,
    request: &GetPromptRequestParams,
) -> Result<GetPromptResult, McpError> {
    let Some(brief) = BRIEFS.iter().find(|b| b.name == request.name) else {
        let names: Vec<&str> = BRIEFS.iter().map(|b| b.name).collect();
        return Err(McpError::invalid_params(
            format!(
                "no prompt `{}`; the prompts are {}",
                request.name,
                names.join(", ")
            ),
            None,
        ));
    };
    let arg = |name: &str| -> Result<Option<String>, McpError> {
        match request.arguments.as_ref().and_then(|a| a.get(name)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(McpError::invalid_params(
                format!("prompt argument `{name}` must be a string, not {other}"),
                None,
            )),
        }
    };
    let agent = arg("agent")?.or_else(|| caller.map(str::to_owned));
    let record = agent.as_deref().and_then(|id| runtime.lookup_agent(id));
    let parent = arg("parent")?.or_else(|| {
        record
            .as_ref()
            .and_then(|r| r.parent.clone())
            .map(|p| p.to_string())
    });
    let mut text = String::new();
    match (&agent, &record) {
        (Some(id), Some(record)) => text.push_str(&format!(
            "You are agent `{id}`, role `{}`, in a guildhall swarm.",
            record.role
        )),
        (Some(id), None) => text.push_str(&format!("You are agent `{id}` in a guildhall swarm.")),
        (None, _) => text.push_str("You are an agent in a guildhall swarm."),
    }
    if let Some(parent) = &parent {
        text.push_str(&format!(" You report to `{parent}`."));
    }
    text.push_str("\n\n");
    text.push_str(brief.duty);
    text.push_str(
        "\n\nHow this swarm works:\n\
         - Mail: send_message (to an agent id, a role as `role:NAME`, `parent`, `children` or \
         `*`) and check_inbox; read_message and mark_read for what you handled. Keep a thread \
         by replying (reply_to).\n\
         - New mail: subscribe to the resource ",
    );
    text.push_str(INBOX);
    text.push_str(
        " if your client can, else call check_inbox with wait_secs instead of polling.\n\
         - Shared state: context_get and context_update on a session (replace, merge or \
         append one key; give expected_version when you must not overwrite someone else's \
         change); context_history shows who changed what.\n\
         - Who is here: whoami and list_agents (also the resource ",
    );
    text.push_str(AGENTS);
    text.push_str(
        ").\n\
         - Work: the task board (task_create, task_list, task_get, task_update, task_claim, \
         task_heartbeat, task_release; also the resource ",
    );
    text.push_str(TASKS);
    text.push_str(
        "). A claimed task is yours until its lease ends; whoever waits on it is mailed \
         when it is done or failed.\n",
    );
    if let Some(session) = arg("session")? {
        text.push_str(&format!(
            "- This work shares the context session `{session}` (guildhall://context/{session}).\n"
        ));
    }
    if let Some(task) = arg("task")? {
        text.push_str(&format!("\nYour task now: {task}\n"));
    }
    model(json!({
        "description": brief.description,
        "messages": [{ "role": "user", "content": { "type": "text", "text": text } }]
    }))
}

/// Completions for the prompts' `agent` and `parent` arguments (agent ids) and the
/// templates' `session` (session ids) and `key` (the entries of the session given).
pub(super) async fn complete(
    runtime: &Runtime,
    request: &CompleteRequestParams,
) -> Result<CompleteResult, McpError> {
    let typed = request.argument.value.as_str();
    let name = request.argument.name.as_str();
    let mut values: Vec<String> = match (&request.r#ref, name) {
        (Reference::Prompt(prompt), "agent" | "parent")
            if BRIEFS.iter().any(|b| b.name == prompt.name) =>
        {
            runtime
                .agents()
                .iter()
                .map(|a| a.id.to_string())
                .filter(|id| id.starts_with(typed))
                .collect()
        }
        (Reference::Resource(_), "session") => runtime
            .sessions()
            .list()
            .iter()
            .map(|s| s.id.as_str().to_owned())
            .filter(|id| id.starts_with(typed))
            .collect(),
        (Reference::Resource(_), "key") => {
            let session = request
                .context
                .as_ref()
                .and_then(|c| c.arguments.as_ref())
                .and_then(|a| a.get("session"))
                .cloned();
            match session {
                Some(session) => keys(runtime, &session, typed).await,
                None => Vec::new(),
            }
        }
        _ => Vec::new(),
    };
    values.sort();
    let total = values.len();
    values.truncate(MAX_VALUES);
    model(json!({ "completion": {
        "values": values, "total": total, "hasMore": total > MAX_VALUES
    } }))
}

/// The keys of `session` starting with `typed`, read directly: completion names keys, it
/// reads no values.
async fn keys(runtime: &Runtime, session: &str, typed: &str) -> Vec<String> {
    let Ok(context) = runtime.sessions().context(session) else {
        return Vec::new();
    };
    let select = crate::context::Select::Prefix(typed.to_owned());
    match context.read(select, MAX_VALUES + 1).await {
        Ok(view) => view.entries.into_iter().map(|e| e.key).collect(),
        Err(_) => Vec::new(),
    }
}
