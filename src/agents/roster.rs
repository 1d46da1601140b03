//! The directory tools: `whoami` (who the caller is, whom it reports to, what waits for it)
//! and `list_agents` (who else is here). A model that knows its place in the swarm
//! addresses mail correctly the first time.

use std::sync::Arc;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::directory::{AgentEntry, ProcessView};
use super::{Agent, MailError, PostOffice};
use crate::time::rfc3339;

/// Agents one `list_agents` call shows by default, and at most.
const DEFAULT_LIST: u32 = 100;
const MAX_LIST: u32 = 500;

/// Unread messages waiting for `entry` (see [`Agent::unread`]: a passive mailbox stays
/// passive).
async fn unread(office: &Arc<PostOffice>, entry: Arc<AgentEntry>) -> Result<usize, MailError> {
    Agent::new(Arc::clone(office), entry).unread().await
}

/// Why two connections acting as one agent is worth a word.
pub(crate) fn shared_identity_warning(agent: &str, connections: u32) -> String {
    format!(
        "{connections} live connections act as agent `{agent}`: they share one inbox, and \
         each may take mail meant for the other. Give every client its own agent id \
         (`guildhall mcp --agent ID` or GUILDHALL_AGENT)"
    )
}

/// `whoami`.
pub struct WhoAmI(pub(crate) Arc<PostOffice>, pub(crate) Option<SandboxOf>);

/// What the sandbox of an agent's commands is, as `whoami` shows it.
pub(crate) type SandboxOf = Arc<dyn Fn(&str) -> serde_json::Value + Send + Sync>;

/// Input of `whoami`: nothing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhoAmIInput {}

/// Output of `whoami`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Identity {
    /// Your agent id: the sender of your mail, the author of your context changes.
    pub agent: String,
    /// Your role.
    pub role: String,
    /// The agent you report to (`send_message` to `parent` reaches it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Whether your parent has registered yet (mail to it waits for that).
    pub parent_registered: bool,
    /// The agents that report to you (`send_message` to `children` reaches them).
    pub children: Vec<String>,
    /// Unread messages in your inbox.
    pub unread: usize,
    /// Live connections acting as you (normally 1).
    pub connections: u32,
    /// Something to fix, such as two clients sharing your identity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// The sandbox your commands run in: the mechanisms applied and your network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<serde_json::Value>,
}

impl Tool for WhoAmI {
    type Input = WhoAmIInput;
    type Output = Identity;
    type Error = MailError;
    type State = ();

    fn is_transient(error: &MailError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "whoami"
    }

    fn description(&self) -> &str {
        "Who you are in this swarm: your agent id, role, parent and children, and how many \
         unread messages wait in your inbox."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Who am I")
    }

    fn detach(&self, _: &(), _: &WhoAmIInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        _: WhoAmIInput,
        ctx: CallContext,
    ) -> Result<Identity, MailError> {
        let id = ctx.agent().ok_or(MailError::NoIdentity)?;
        let directory = &self.0.directory;
        let entry = directory.require(id)?;
        let record = entry.record();
        let connections = entry.connections();
        Ok(Identity {
            agent: record.id.to_string(),
            role: record.role.clone(),
            parent_registered: record
                .parent
                .as_ref()
                .is_some_and(|p| directory.get(p.as_str()).is_some()),
            parent: record.parent.as_ref().map(ToString::to_string),
            children: directory
                .children_of(id)
                .iter()
                .map(ToString::to_string)
                .collect(),
            unread: unread(&self.0, entry).await?,
            connections,
            warning: (connections > 1).then(|| shared_identity_warning(id, connections)),
            sandbox: self.1.as_ref().map(|sandbox_of| sandbox_of(id)),
        })
    }
}

/// `list_agents`.
pub struct ListAgents(pub(crate) Arc<PostOffice>);

/// Input of `list_agents`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListInput {
    /// Only agents in this role.
    #[serde(default)]
    pub role: Option<String>,
    /// At most this many agents, by id (default 100, at most 500).
    #[serde(default)]
    #[schemars(range(min = 1, max = 500))]
    pub limit: Option<u32>,
}

/// One agent as `list_agents` shows it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentView {
    /// Its id (an address for `send_message`).
    pub id: String,
    /// Its role (`role:<name>` addresses everyone in it).
    pub role: String,
    /// The agent it reports to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Unread messages in its inbox.
    pub unread: usize,
    /// When it last made a call (RFC 3339), if it has since the server started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    /// Live connections acting as it.
    pub connections: u32,
    /// Its process, when the runtime launched it (`spawn_agent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launched: Option<ProcessView>,
}

/// Output of `list_agents`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentList {
    /// The agents, by id.
    pub agents: Vec<AgentView>,
    /// How many agents match, shown or not.
    pub total: usize,
}

impl Tool for ListAgents {
    type Input = ListInput;
    type Output = AgentList;
    type Error = MailError;
    type State = ();

    fn is_transient(error: &MailError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "list_agents"
    }

    fn description(&self) -> &str {
        "The agents of this swarm: ids, roles, parents, unread counts, when each was last \
         seen and whether it is connected. Filter by `role`."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("List agents")
    }

    fn detach(&self, _: &(), _: &ListInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ListInput,
        _ctx: CallContext,
    ) -> Result<AgentList, MailError> {
        let limit = input.limit.unwrap_or(DEFAULT_LIST);
        if !(1..=MAX_LIST).contains(&limit) {
            return Err(MailError::InvalidArgument {
                name: "limit",
                reason: format!("{limit} given; give 1 to {MAX_LIST}"),
            });
        }
        let directory = &self.0.directory;
        let ids = match &input.role {
            Some(role) => directory.in_role(role),
            None => directory.ids(),
        };
        let total = ids.len();
        let mut agents = Vec::new();
        for id in ids.iter().take(limit as usize) {
            // Removed since the listing was taken: left out.
            let Some(entry) = directory.get(id.as_str()) else {
                continue;
            };
            let record = entry.record();
            agents.push(AgentView {
                id: record.id.to_string(),
                role: record.role.clone(),
                parent: record.parent.as_ref().map(ToString::to_string),
                last_seen: entry.last_seen_ms().map(rfc3339),
                connections: entry.connections(),
                launched: entry.process(),
                unread: unread(&self.0, entry).await?,
            });
        }
        Ok(AgentList { agents, total })
    }
}
