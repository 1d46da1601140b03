//! The Agent Card of an exposed agent or role: who it is, where to reach it, its skills
//! (the skills its role may load, from `[skills]` and `[roles.R] skills`).

use std::collections::HashMap;

use a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentSkill, HttpAuthSecurityScheme,
    SecurityScheme, TRANSPORT_PROTOCOL_HTTP_JSON, TRANSPORT_PROTOCOL_JSONRPC,
};

use super::config::Target;
use crate::runtime::Runtime;

/// The card of `target`, served at `url` (its JSON-RPC endpoint; REST below `/rest`).
pub(super) fn card(
    runtime: Option<&Runtime>,
    target: &Target,
    url: &str,
    description: Option<&str>,
    secured: bool,
) -> AgentCard {
    let address = target.address();
    let role = match target {
        Target::Role(role) => Some(role.clone()),
        Target::Agent(id) => runtime
            .and_then(|rt| rt.lookup_agent(id))
            .map(|r| r.role.clone()),
    };
    let mut skills: Vec<AgentSkill> = runtime
        .and_then(crate::skills::Skills::of)
        .map(|skills| skills.for_role(role.as_deref()))
        .unwrap_or_default()
        .iter()
        .map(|skill| AgentSkill {
            id: skill.name.clone(),
            name: skill.name.clone(),
            description: skill.description.clone(),
            tags: vec!["guildhall".to_owned(), "skill".to_owned()],
            examples: None,
            input_modes: None,
            output_modes: None,
            security_requirements: None,
        })
        .collect();
    if skills.is_empty() {
        skills.push(AgentSkill {
            id: "task".to_owned(),
            name: format!("A task for {address}"),
            description: format!(
                "Anything {address} of this swarm does: the message becomes a task on its \
                 board and mail to it; its replies and the task's result come back."
            ),
            tags: vec!["guildhall".to_owned()],
            examples: None,
            input_modes: None,
            output_modes: None,
            security_requirements: None,
        });
    }
    let (security_schemes, security_requirements) = if secured {
        (
            Some(HashMap::from([(
                "bearer".to_owned(),
                SecurityScheme::HttpAuth(HttpAuthSecurityScheme {
                    scheme: "bearer".to_owned(),
                    description: Some("the server's token (`serve --token`)".to_owned()),
                    bearer_format: None,
                }),
            )])),
            Some(vec![HashMap::from([("bearer".to_owned(), Vec::new())])]),
        )
    } else {
        (None, None)
    };
    AgentCard {
        name: format!("guildhall {address}"),
        description: format!(
            "{}{address} of a guildhall swarm, over A2A: a message becomes mail to it and a task \
             on its board, which the A2A task mirrors.",
            description.map(|d| format!("{d} ")).unwrap_or_default(),
        ),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        supported_interfaces: vec![
            AgentInterface::new(url, TRANSPORT_PROTOCOL_JSONRPC),
            AgentInterface::new(format!("{url}/rest"), TRANSPORT_PROTOCOL_HTTP_JSON),
        ],
        capabilities: AgentCapabilities {
            streaming: Some(true),
            push_notifications: Some(true),
            extensions: None,
            extended_agent_card: Some(false),
        },
        default_input_modes: vec!["text/plain".to_owned(), "application/json".to_owned()],
        default_output_modes: vec!["text/plain".to_owned(), "application/json".to_owned()],
        skills,
        provider: None,
        documentation_url: None,
        icon_url: None,
        security_schemes,
        security_requirements,
        signatures: None,
    }
}
