//! [`McpServer`]: the runtime's tools as an MCP server, one value per connection.
//!
//! The handler is protocol-era agnostic: rmcp negotiates 2025-11-25 (`initialize`) or
//! 2026-07-28 (`server/discover`, per-request `_meta`) and hands both to the same methods.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use guildhall_actors::{CallContext, CallError, CallObserver, Progress, ToolSpec};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, SubscriptionFilter, Tool, ToolAnnotations, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use futures::future::BoxFuture;
use rmcp::service::ElicitationMode;

use super::error_meta::{ERROR_META, TRANSIENT_META};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use super::federated;
use super::filter::ToolFilter;
#[cfg(feature = "conformance")]
use super::fixtures;
use super::tasks::{self, CallTasks};
use super::{page, prompts, resources};
use crate::agents::TOKEN_HEADER;
use crate::governance::{Approval, AskRequest, Asker, ToolReply};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use crate::servers::proxy::ProxyError;
use crate::{AgentSpec, CallOptions, Runtime};
use rmcp::task_manager::{TaskExit, TaskFuture};

/// The HTTP header that names the calling agent (an HTTP connection has no bound identity).
pub const AGENT_HEADER: &str = "guildhall-agent";
/// The HTTP header that gives the role an unknown agent named by [`AGENT_HEADER`] is
/// registered with (default `agent`).
pub const ROLE_HEADER: &str = "guildhall-role";
/// The HTTP header that names the agent an unknown agent named by [`AGENT_HEADER`] reports
/// to (registered or not yet).
pub const PARENT_HEADER: &str = "guildhall-parent";
/// The HTTP header that names the model behind the client (`[models."PATTERN"]`).
pub const MODEL_HEADER: &str = "guildhall-model";

/// The runtime's tools served over MCP. Cheap to clone; a clone per connection carries that
/// connection's identity and tool filter.
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
    agent: Option<Arc<str>>,
    filter: ToolFilter,
    /// The model behind this connection, when its opener said (`guildhall mcp --model`).
    model: Option<Arc<str>>,
    /// Counts this connection as one acting as its agent (bound, or named at an HTTP
    /// session's `initialize`) while any clone lives; its end may end the agent's
    /// background shells.
    presence: Arc<OnceLock<crate::runtime::Presence>>,
    /// This connection's resource subscriptions (`resources/subscribe`), by URI; each
    /// ends its relay when dropped.
    subscriptions: Arc<Mutex<std::collections::HashMap<String, DropGuard>>>,
    /// Ends this connection's list-changed watcher when the last clone goes.
    _alive: Arc<DropGuard>,
    alive: CancellationToken,
}

struct Shared {
    runtime: Runtime,
    fixtures: bool,
    /// Long calls running as MCP tasks, for every connection of this server.
    tasks: CallTasks,
    /// The converted tool list and the tool-set version it was built from.
    listing: Mutex<Option<(u64, Arc<[Tool]>)>>,
    /// The same with simplified schemas, for models that need them, when one asked.
    simplified: Mutex<Option<(u64, Arc<[Tool]>)>>,
    /// Prompts added by the fixture `test_trigger_prompt_change`: how many so far.
    added_prompts: tokio::sync::watch::Sender<u64>,
    /// The latest events for `guildhall://events`, kept from the first time a client asks.
    recent: std::sync::OnceLock<Arc<crate::observe::RecentEvents>>,
    /// The views of the events, each rendered once for its watchers: the operator's for the
    /// dashboard's `/events` and every `guildhall watch` of this server, and each agent's for
    /// the `/events` streams it opens.
    feeds: crate::observe::Feeds,
    /// `[models."PATTERN"]`: the tool sets fitted to the model behind a connection.
    models: super::models::ModelRules,
    /// `[mcp] disclose_after`: the proxied tools each agent has found.
    disclosure: super::disclosure::Disclosure,
}

impl Shared {
    fn new(
        runtime: Runtime,
        feeds: crate::observe::Feeds,
        fixtures: bool,
        models: super::models::ModelRules,
        disclose_after: Option<usize>,
    ) -> Self {
        Self {
            runtime,
            fixtures,
            tasks: CallTasks::default(),
            listing: Mutex::new(None),
            simplified: Mutex::new(None),
            added_prompts: tokio::sync::watch::Sender::new(0),
            recent: std::sync::OnceLock::new(),
            feeds,
            models,
            disclosure: super::disclosure::Disclosure::new(disclose_after),
        }
    }

    /// The kept events, keeping them from now on if nobody asked before.
    fn recent(&self) -> Arc<crate::observe::RecentEvents> {
        Arc::clone(self.recent.get_or_init(|| {
            Arc::new(crate::observe::RecentEvents::start(
                self.runtime.governance().events(),
                self.runtime.changes(),
            ))
        }))
    }
}

impl McpServer {
    /// Serves every tool of `runtime`, with no bound agent.
    pub fn new(runtime: Runtime) -> Self {
        let alive = CancellationToken::new();
        let feeds = crate::observe::Feeds::new(&runtime);
        Self {
            shared: Arc::new(Shared::new(
                runtime,
                feeds,
                false,
                super::models::ModelRules::default(),
                None,
            )),
            agent: None,
            filter: ToolFilter::all(),
            model: None,
            presence: Arc::default(),
            subscriptions: Arc::default(),
            _alive: Arc::new(alive.clone().drop_guard()),
            alive,
        }
    }

    /// This server with other settings: what it gathers while serving (the listing, the
    /// tasks, what agents found) starts again. Used before connections are made.
    fn rebuilt(
        self,
        fixtures: bool,
        models: super::models::ModelRules,
        disclose_after: Option<usize>,
    ) -> Self {
        let shared = Arc::new(Shared::new(
            self.shared.runtime.clone(),
            self.shared.feeds.clone(),
            fixtures,
            models,
            disclose_after,
        ));
        Self { shared, ..self }
    }

    /// Adds the conformance suite's fixture tools, resources and prompts.
    #[cfg(feature = "conformance")]
    #[must_use]
    pub fn with_conformance_fixtures(self) -> Self {
        let (models, after) = (self.shared.models.clone(), self.shared.disclosure.after());
        self.rebuilt(true, models, after)
    }

    /// Fits each connection's tool set to the model behind it (`[models."PATTERN"]`). Call
    /// before making connections: they share what the server has.
    #[must_use]
    pub fn with_models(self, models: super::models::ModelRules) -> Self {
        let (fixtures, after) = (self.shared.fixtures, self.shared.disclosure.after());
        self.rebuilt(fixtures, models, after)
    }

    /// Lists the proxied servers' tools to an agent only once it has found them with
    /// `find_tools`, when it would see more than `after` tools (`[mcp] disclose_after`) and
    /// the runtime serves `find_tools` ([`RuntimeBuilder::tool_search`]). Call before
    /// making connections.
    ///
    /// [`RuntimeBuilder::tool_search`]: crate::RuntimeBuilder::tool_search
    #[must_use]
    pub fn with_disclosure(self, after: Option<usize>) -> Self {
        let (fixtures, models) = (self.shared.fixtures, self.shared.models.clone());
        self.rebuilt(fixtures, models, after)
    }

    /// This connection's model, as its opener names it (`guildhall mcp --model`): before
    /// the agent's `[agents.X] model` and the client's `clientInfo.name`.
    #[must_use]
    pub fn with_model(mut self, model: Option<Arc<str>>) -> Self {
        self.model = model;
        self
    }

    /// A server for one connection: calls default to `agent` as the caller (the sender of
    /// mail, the author of context), and only tools passing `filter` are visible.
    #[must_use]
    pub fn connection(&self, agent: Option<Arc<str>>, filter: ToolFilter) -> Self {
        let alive = CancellationToken::new();
        let presence = Arc::new(OnceLock::new());
        if let Some(bound) = agent
            .as_deref()
            .and_then(|id| self.shared.runtime.connect_agent(id))
        {
            let _ = presence.set(bound);
        }
        Self {
            shared: Arc::clone(&self.shared),
            agent,
            filter: self.filter.clone().and(filter),
            model: self.model.clone(),
            presence,
            subscriptions: Arc::default(),
            _alive: Arc::new(alive.clone().drop_guard()),
            alive,
        }
    }

    /// Methods only the conformance fixtures implement: accepted in fixture mode, else
    /// "method not found".
    fn fixtures_only<M: rmcp::model::ConstString>(&self) -> Result<(), McpError> {
        if self.shared.fixtures {
            Ok(())
        } else {
            Err(McpError::method_not_found::<M>())
        }
    }

    /// Whether `agent` may use tool `name` on this connection: the test `visible_tools_for`
    /// makes, for this one tool (the call then applies governance's rules).
    fn may_use(&self, agent: Option<&str>, name: &str) -> bool {
        self.filter.allows(name)
            && self.shared.runtime.tool(name).is_some_and(|spec| {
                let spec = std::slice::from_ref(&spec);
                self.shared
                    .runtime
                    .governance()
                    .hidden(agent, spec)
                    .is_empty()
            })
    }

    /// Resource `uri`, if `agent` may use the tool that reads it on this connection (the
    /// tool call then applies governance's rules).
    fn readable(&self, agent: &str, uri: &str) -> Result<resources::Resource, McpError> {
        let resource = resources::Resource::parse(uri)?;
        // The events have no tool: every agent reads its own share of them.
        let Some((tool, _)) = resource.tool() else {
            return Ok(resource);
        };
        if self.may_use(Some(agent), tool) {
            Ok(resource)
        } else {
            Err(McpError::invalid_params(
                format!("`{agent}` may not read `{uri}` here (it may not use `{tool}`)"),
                Some(serde_json::json!({ "uri": uri })),
            ))
        }
    }

    /// A watch on resource `uri` for the caller of `cx`, with what it holds upstream when
    /// the resource is a proxied server's.
    async fn watch(
        &self,
        uri: &str,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(crate::changes::Watch, Held), McpError> {
        let agent = self.caller(cx).await?;
        let changes = self.shared.runtime.changes();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if federated::is_federated(uri) {
            // Watched before the server is asked: an update right after is not missed.
            let watch = changes.watch(crate::changes::Subject::Resource(Arc::from(uri)));
            let may_use = |tool: &str| self.may_use(Some(&agent), tool);
            let upstream = federated::subscribe(&self.shared.runtime, may_use, &agent, uri).await?;
            return Ok((watch, Some(upstream)));
        }
        let resource = self.readable(&agent, uri)?;
        if matches!(resource, resources::Resource::Events(_)) {
            // Kept from now on, so the first read after the first notice has them.
            self.shared.recent();
        }
        Ok((changes.watch(resource.subject(&agent)), Held::default()))
    }

    /// The proxied servers' resources, templates and prompts `agent` may see here.
    async fn federated(&self, agent: Option<&str>) -> Federated {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            let listed =
                federated::listed(&self.shared.runtime, |tool| self.may_use(agent, tool)).await;
            (listed.resources, listed.templates, listed.prompts)
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        {
            let _ = agent;
            Federated::default()
        }
    }

    /// What this server offers: tools (and list changes), plus what the fixtures add.
    fn capabilities(&self) -> ServerCapabilities {
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            return fixtures::capabilities();
        }
        ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .enable_completions()
            .enable_tasks()
            .build()
    }

    /// The runtime behind this server.
    pub fn runtime(&self) -> &Runtime {
        &self.shared.runtime
    }

    /// The views of the events, shared by every watcher of this server.
    pub fn feeds(&self) -> &crate::observe::Feeds {
        &self.shared.feeds
    }

    /// Every tool this connection may see, in name order, as `tools/list` shows them.
    pub fn visible_tools(&self) -> Vec<Tool> {
        let agent = self.agent.as_deref();
        let model = self
            .model
            .as_deref()
            .or_else(|| agent.and_then(|a| self.shared.models.of_agent(a)));
        self.visible_tools_for(agent, model)
    }

    /// The model behind a request: its `Guildhall-Model` header, the connection's, the
    /// agent's `[agents.X] model`, the client's `clientInfo.name`.
    fn model_of(&self, cx: &RequestContext<RoleServer>, agent: Option<&str>) -> Option<String> {
        let header = cx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get(MODEL_HEADER))
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty());
        header
            .or(self.model.as_deref())
            .or_else(|| agent.and_then(|a| self.shared.models.of_agent(a)))
            .map(str::to_owned)
            .or_else(|| {
                cx.peer
                    .peer_info()
                    .map(|info| info.client_info.name.clone())
            })
    }

    /// The tools `agent` sees on this connection: those its filter passes, governance
    /// does not deny it outright, and `[models]` leaves `model`.
    fn visible_tools_for(&self, agent: Option<&str>, model: Option<&str>) -> Vec<Tool> {
        let runtime = &self.shared.runtime;
        let specs = runtime.listed_tools();
        let hidden = runtime.governance().hidden(agent, &specs);
        let models = &self.shared.models;
        let listing = if models.simplifies(model) {
            self.simplified_listing()
        } else {
            self.listing()
        };
        let mut tools: Vec<Tool> = listing
            .iter()
            .filter(|t| {
                self.filter.allows(&t.name)
                    && !hidden.contains(&&*t.name)
                    && !models.hides(model, &t.name)
            })
            .cloned()
            .collect();
        self.shared.disclosure.narrow(agent, &mut tools);
        // The skills an agent is shown are those its role may load.
        if let Some(skills) = crate::skills::Skills::of(runtime)
            && let Some(tool) = tools.iter_mut().find(|t| t.name == crate::skills::TOOL)
        {
            let role = agent
                .and_then(|a| runtime.lookup_agent(a))
                .map(|r| r.role.to_string());
            tool.description = Some(skills.description_for(role.as_deref()).into());
        }
        tools
    }

    fn listing(&self) -> Arc<[Tool]> {
        let runtime = &self.shared.runtime;
        let version = runtime.tool_set_version();
        let mut cached = self
            .shared
            .listing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((v, tools)) = cached.as_ref()
            && *v == version
        {
            return Arc::clone(tools);
        }
        let mut tools: Vec<Tool> = runtime.listed_tools().iter().map(mcp_tool).collect();
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            tools.extend(fixtures::tools());
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let tools: Arc<[Tool]> = tools.into();
        *cached = Some((version, Arc::clone(&tools)));
        tools
    }

    /// [`Self::listing`] with every schema simplified (`[models] simplify_schemas`): made
    /// once per tool-set version, not at every `tools/list`.
    fn simplified_listing(&self) -> Arc<[Tool]> {
        // The version first: a listing newer than it is only made again, never kept as
        // current when it is older.
        let version = self.shared.runtime.tool_set_version();
        let listing = self.listing();
        let mut cached = self
            .shared
            .simplified
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((v, tools)) = cached.as_ref()
            && *v == version
        {
            return Arc::clone(tools);
        }
        let simplified: Arc<[Tool]> = listing
            .iter()
            .map(|tool| {
                let mut tool = tool.clone();
                if let Value::Object(input) =
                    super::models::simplify(&Value::Object((*tool.input_schema).clone()))
                {
                    tool.input_schema = Arc::new(input);
                }
                if let Some(output) = &tool.output_schema
                    && let Value::Object(output) =
                        super::models::simplify(&Value::Object((**output).clone()))
                {
                    tool.output_schema = Some(Arc::new(output));
                }
                tool
            })
            .collect();
        *cached = Some((version, Arc::clone(&simplified)));
        simplified
    }

    /// The calling agent: the connection's, else the one an HTTP request names (registered
    /// on first sight, in the role it claims unless the config gives it one). A call that
    /// names no agent is refused: every call over MCP is made by an agent, which the breaker,
    /// the loop guard, rate limits and the audit attribute it to.
    async fn caller(&self, cx: &RequestContext<RoleServer>) -> Result<Arc<str>, McpError> {
        self.named_caller(cx).await?.ok_or_else(no_identity)
    }

    /// As [`Self::caller`], but `None` when nothing names an agent.
    async fn named_caller(
        &self,
        cx: &RequestContext<RoleServer>,
    ) -> Result<Option<Arc<str>>, McpError> {
        if let Some(agent) = &self.agent {
            return Ok(Some(Arc::clone(agent)));
        }
        let Some(parts) = cx.extensions.get::<axum::http::request::Parts>() else {
            return Ok(None);
        };
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .map(|v| {
                    v.to_str().map_err(|_| {
                        McpError::invalid_request(format!("header `{name}` is not ASCII"), None)
                    })
                })
                .transpose()
        };
        let Some(agent) = header(AGENT_HEADER)? else {
            return Ok(None);
        };
        let runtime = &self.shared.runtime;
        let refused = |reason: String| McpError::invalid_request(reason, None);
        runtime
            .credentials()
            .check(agent, header(TOKEN_HEADER)?)
            .map_err(|err| refused(err.to_string()))?;
        let given = runtime.governance().given_role(agent);
        let role =
            crate::agents::checked_role(agent, header(ROLE_HEADER)?.map(str::to_owned), given)
                .map_err(refused)?;
        match runtime.lookup_agent(agent) {
            Some(record) => {
                if let Some(role) = role.filter(|r| *r != record.role) {
                    return Err(refused(format!(
                        "agent `{agent}` is registered with role `{}`; `{ROLE_HEADER}: {role}` \
                         cannot change it",
                        record.role
                    )));
                }
            }
            None => {
                let mut spec = AgentSpec::new(agent, role.unwrap_or_else(|| "agent".to_owned()));
                if let Some(parent) = header(PARENT_HEADER)? {
                    spec = spec.parent(parent);
                }
                runtime.register_agent(spec).await.map_err(|err| {
                    refused(format!(
                        "cannot register agent `{agent}` named by `{AGENT_HEADER}`: {err}"
                    ))
                })?;
            }
        }
        Ok(Some(Arc::from(agent)))
    }

    /// What a model is told at the handshake: what guildhall offers and, when the connection
    /// names one, which agent it acts as, in which role, under which parent.
    fn instructions(&self, agent: Option<&str>) -> String {
        let mut text = String::from(
            "guildhall: mailboxes (send_message, check_inbox, read_message, mark_read), the \
             agent directory (whoami, list_agents) and shared session context (context_get, \
             context_update, context_history) for a swarm of agents.",
        );
        match agent.and_then(|id| self.shared.runtime.lookup_agent(id)) {
            Some(record) => {
                text.push_str(&format!(
                    " You are agent `{}` in role `{}`",
                    record.id, record.role
                ));
                match &record.parent {
                    Some(parent) => text.push_str(&format!(
                        ", reporting to `{parent}` (send_message to `parent` reaches it)."
                    )),
                    None => text.push('.'),
                }
                text.push_str(" Your calls act as you: mail you send is from you.");
            }
            None => text.push_str(
                " This connection names no agent yet: over HTTP send the `Guildhall-Agent` \
                 header (with `Guildhall-Role` and `Guildhall-Parent` for a new agent).",
            ),
        }
        text
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        if !self.shared.models.is_empty() {
            let agent = self.named_caller(&cx).await?;
            let model = self.model_of(&cx, agent.as_deref());
            if self.shared.models.hides(model.as_deref(), name) {
                return Err(McpError::invalid_params(
                    format!(
                        "tool `{name}` is not offered to model `{}` (`[models]` in guildhall.toml)",
                        model.as_deref().unwrap_or("unknown")
                    ),
                    None,
                ));
            }
        }
        if !self.filter.allows(name) {
            return Err(McpError::invalid_params(
                format!(
                    "tool `{name}` is not available on this connection (its tools are limited to `{}`)",
                    self.filter
                ),
                None,
            ));
        }
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            if let Some(change) = fixtures::ListChange::triggered_by(name) {
                return self.change_list(change).await;
            }
            if fixtures::is_fixture(name) {
                return fixtures::call(request, cx, &self.shared.tasks).await;
            }
        }
        let agent = self.caller(&cx).await?;
        self.shared.runtime.agent_seen(&agent);
        let owner = Some(Arc::clone(&agent));
        let finding = name == crate::tool_search::TOOL && self.shared.disclosure.is_on();
        let finder = finding.then(|| (Arc::clone(&agent), self.model_of(&cx, Some(&agent))));
        let mut options = CallOptions::new().agent_id(agent);
        // The caller's trace context, as OpenTelemetry's MCP conventions carry it: the
        // call's span joins the agent's trace. An invalid one is ignored (W3C).
        if let Some(parent) = cx
            .meta
            .get("traceparent")
            .and_then(Value::as_str)
            .and_then(crate::TraceParent::parse)
        {
            options = options.trace_parent(parent);
        }
        let can_elicit = cx
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form);
        let progress = cx.meta.get_progress_token();
        if progress.is_some() || can_elicit {
            options = options.observer(ClientRelay::start(progress, can_elicit, cx.peer.clone()));
        }
        if can_elicit {
            options = options.asker(Arc::new(ElicitingAsker {
                peer: cx.peer.clone(),
            }));
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let long = self
            .shared
            .runtime
            .tool_timeout(name)
            .is_some_and(|t| t >= tasks::LONG_CALL);
        let client_takes_tasks = cx
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks());
        if long && client_takes_tasks {
            return self.call_as_task(name, args, options, owner, cx).await;
        }
        let outcome = tokio::select! {
            biased;
            outcome = self.shared.runtime.call_reply(name, args, options) => outcome,
            // Dropping the call fires its cancellation token in the tool.
            () = cx.ct.cancelled() => return Err(request_cancelled()),
        };
        match (outcome, finder) {
            (Ok(reply), Some((agent, model))) => {
                answer(Ok(self.disclose(&agent, model.as_deref(), reply)))
            }
            (outcome, _) => answer(outcome),
        }
    }

    /// A `find_tools` reply as this connection may see it: the tools its filter or its
    /// model hides left out, and the rest disclosed to its agent (who hears of them with
    /// `tools/list_changed`).
    fn disclose(&self, agent: &Arc<str>, model: Option<&str>, reply: ToolReply) -> ToolReply {
        let Ok(mut found) =
            serde_json::from_value::<crate::tool_search::Found>(reply.value.clone())
        else {
            return reply;
        };
        let listed = found.tools.len();
        found
            .tools
            .retain(|t| self.filter.allows(&t.name) && !self.shared.models.hides(model, &t.name));
        self.shared
            .disclosure
            .disclose(agent, found.tools.iter().map(|t| t.name.clone()));
        // A reply cut to the limits is passed on as it was cut.
        if found.tools.len() == listed || reply.truncated.is_some() {
            return reply;
        }
        let Ok(value) = serde_json::to_value(&found) else {
            return reply;
        };
        let mut fitted = ToolReply::new(value);
        fitted.notes = reply.notes;
        fitted
    }

    /// The agent a connection acts for, as it was named when it opened (bound, or by
    /// the `Guildhall-Agent` header its `initialize` was checked with).
    fn opened_as(&self, extensions: &rmcp::model::Extensions) -> Option<Arc<str>> {
        self.agent.clone().or_else(|| {
            extensions
                .get::<axum::http::request::Parts>()?
                .headers
                .get(AGENT_HEADER)?
                .to_str()
                .ok()
                .map(Arc::from)
        })
    }

    /// A long call for a client that takes tasks: answered directly when it ends within
    /// [`tasks::GRACE`], else continued as a task whose id the client polls.
    async fn call_as_task(
        &self,
        name: &str,
        args: Value,
        options: CallOptions,
        owner: Option<Arc<str>>,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let runtime = self.shared.runtime.clone();
        let tool = name.to_owned();
        let mut call = Box::pin(async move { runtime.call_reply(&tool, args, options).await });
        tokio::select! {
            biased;
            outcome = &mut call => return answer(outcome),
            () = tokio::time::sleep(tasks::GRACE) => {}
            () = cx.ct.cancelled() => return Err(request_cancelled()),
        }
        // From here on the call belongs to the task, not to this request.
        let task = self.shared.tasks.spawn(owner, |context| {
            let ended: TaskFuture = Box::pin(async move {
                match call.await {
                    Ok(reply) => Ok(model_result(reply)),
                    Err(CallError::UnknownTool { name }) => {
                        Err(TaskExit::Error(unknown_tool(&name)))
                    }
                    Err(err) => task_outcome(&err),
                }
            });
            Box::pin(tasks::cancellable(context, ended))
        })?;
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }
}

/// A call's failure as a task's end: the tool's own errors (and refusals) are a completed
/// task whose result has `isError`; a call that never completed (a crash, a deadline, a
/// tool unavailable or its breaker open) is a failed task, its error naming the kind.
fn task_outcome(err: &CallError) -> Result<CallToolResult, TaskExit> {
    match err {
        CallError::Crashed { .. }
        | CallError::Timeout { .. }
        | CallError::CircuitOpen { .. }
        | CallError::Unavailable { .. } => Err(TaskExit::Error(McpError::internal_error(
            format!("{}: {err}", err.kind().as_str()),
            Some(serde_json::json!({ "kind": err.kind().as_str() })),
        ))),
        _ => Ok(tool_failure(err)),
    }
}

/// A call's outcome as the answer to `tools/call`: the result, a tool's failure as an
/// `isError` result, an unknown tool as a protocol error.
fn answer(outcome: Result<ToolReply, CallError>) -> Result<CallToolResponse, McpError> {
    match outcome {
        Ok(reply) => Ok(model_result(reply).into()),
        Err(CallError::UnknownTool { name }) => Err(unknown_tool(&name)),
        Err(err) => Ok(tool_failure(&err).into()),
    }
}

fn request_cancelled() -> McpError {
    McpError::invalid_request("the request was cancelled", None)
}

fn unknown_tool(name: &str) -> McpError {
    McpError::invalid_params(
        format!(
            "unknown tool `{}`; `tools/list` shows the available tools",
            cut_text(name, MAX_QUOTED_NAME)
        ),
        None,
    )
}

/// Bytes of a name an error quotes: past MCP's advised 128 characters, no tool has it.
const MAX_QUOTED_NAME: usize = 128;

/// `text` cut to `max` bytes at a character boundary, saying how much was cut.
fn cut_text(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes cut]", &text[..end], text.len() - end).into()
}

/// The answer to a call that names no agent.
fn no_identity() -> McpError {
    McpError::invalid_request(
        "this connection names no agent, and guildhall's tools act for one: over HTTP send \
         the `Guildhall-Agent` header (and `Guildhall-Agent-Token` for an agent with a token); \
         over stdio start `guildhall mcp --agent ID` or set GUILDHALL_AGENT",
        None,
    )
}

/// A result as the model sees it: the structured value with its text copy, or, when it was
/// too long, the cut text pointing at the spill file, with the value shortened to its shape
/// as the structured copy when it could be (so that it still matches the output schema);
/// hook notes follow as text.
fn model_result(reply: ToolReply) -> CallToolResult {
    let image = reply
        .image()
        .map(|(data, mime_type)| ContentBlock::image(data, mime_type));
    let mut result = match reply.truncated {
        None if let Some(verbatim) = reply.verbatim => passed_on(Arc::unwrap_or_clone(verbatim)),
        // A server's result over the limits: its text cut as any result's is, its other
        // blocks (images, resources) kept as they are.
        Some(cut) if let Some(verbatim) = reply.verbatim => {
            let mut result = passed_on(Arc::unwrap_or_clone(verbatim));
            result.content.retain(|block| block.as_text().is_none());
            result.content.insert(0, ContentBlock::text(cut.text));
            result.structured_content = cut.structured;
            result
        }
        _ if image.is_some() => CallToolResult::success(image.into_iter().collect()),
        Some(cut) => {
            let mut result = CallToolResult::success(vec![ContentBlock::text(cut.text)]);
            result.structured_content = cut.structured;
            result
        }
        None if reply.value.is_object() => {
            let mut result = CallToolResult::success(vec![ContentBlock::text(reply.text)]);
            result.structured_content = Some(reply.value);
            result
        }
        None => CallToolResult::success(vec![ContentBlock::text(reply.text)]),
    };
    result.content.extend(
        reply
            .notes
            .into_iter()
            .map(|note| ContentBlock::text(format!("note: {note}"))),
    );
    result
}

/// A proxied server's result as this server's answer: as the server sent it, said to be
/// complete (what a server of the older era leaves unsaid, and a 2026-07-28 client
/// requires; rmcp clears it again for an older client).
fn passed_on(mut result: CallToolResult) -> CallToolResult {
    result.result_type = Some(rmcp::model::ResultType::COMPLETE);
    result
}

/// Asks the client's user through a form elicitation (2025-11-25 clients that declare the
/// capability). Declining or cancelling the form denies the call.
struct ElicitingAsker {
    peer: rmcp::Peer<RoleServer>,
}

/// The approval form.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct ApprovalForm {
    /// `once` (this call), `session` (calls like it this session), `always` (from now
    /// on), or `deny`.
    approve: Answer,
}

/// [`Approval`] as a plain string enum, the only kind of choice an elicitation form holds.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[schemars(inline)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
enum Answer {
    Once,
    Session,
    Always,
    Deny,
}

impl From<Answer> for Approval {
    fn from(answer: Answer) -> Self {
        match answer {
            Answer::Once => Self::Once,
            Answer::Session => Self::Session,
            Answer::Always => Self::Always,
            Answer::Deny => Self::Deny,
        }
    }
}

rmcp::elicit_safe!(ApprovalForm);

impl Asker for ElicitingAsker {
    fn ask(&self, request: AskRequest) -> BoxFuture<'static, Approval> {
        let peer = self.peer.clone();
        Box::pin(async move {
            let who = request.agent.as_deref().unwrap_or("an agent");
            let message = format!(
                "{who} wants to call `{}` with {}.\n{}. Allow it?",
                request.tool, request.arguments, request.reason
            );
            match peer.elicit::<ApprovalForm>(message).await {
                Ok(Some(form)) => form.approve.into(),
                Ok(None) => Approval::Deny,
                Err(err) => {
                    tracing::info!(error = %guildhall_actors::ErrorChain(&err), tool = %request.tool, "approval request failed; the call is denied");
                    Approval::Deny
                }
            }
        })
    }
}

/// Bytes of an error's text a model is shown at most. Errors may quote what was given (a
/// parser names the value it could not take), and an argument can be megabytes: errors are
/// not spilled as results are, so they are cut here.
const MAX_ERROR_TEXT: usize = 8 * 1024;

/// A failed call as an `isError` result: the error's kind and a message a model can act on,
/// at most [`MAX_ERROR_TEXT`] bytes of it.
///
/// A proxied server's own error result is passed on as the server sent it, each text cut
/// to the same bound. Every error
/// guildhall makes says so in its `_meta` (`guildhall/error`: the kind), which a server's
/// does not, so a client tells a crash, a deadline or an open breaker from the tool's own
/// answer.
fn tool_failure(err: &CallError) -> CallToolResult {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Some(ProxyError::Failed { result, .. }) = err.tool_error::<ProxyError>() {
        // As bounded as guildhall's own: each text at most MAX_ERROR_TEXT.
        let mut result = passed_on(CallToolResult::clone(result));
        for block in &mut result.content {
            if let ContentBlock::Text(text) = block
                && text.text.len() > MAX_ERROR_TEXT
            {
                text.text = cut_text(&text.text, MAX_ERROR_TEXT).into_owned();
            }
        }
        return result;
    }
    let kind = err.kind().as_str();
    let text = format!("{kind}: {err}");
    let mut result =
        CallToolResult::error(vec![ContentBlock::text(cut_text(&text, MAX_ERROR_TEXT))]);
    let mut meta = rmcp::model::MetaObject::new();
    meta.0.insert(ERROR_META.into(), Value::from(kind));
    if err.is_transient() {
        meta.0.insert(TRANSIENT_META.into(), Value::Bool(true));
    }
    result.meta = Some(meta);
    result
}

/// A guildhall tool contract as an MCP tool.
fn mcp_tool(spec: &ToolSpec) -> Tool {
    // Registration guarantees an object schema (`ToolSpec::of`), as MCP requires.
    let input = spec.input_schema.as_object().cloned().unwrap_or_default();
    let mut tool = Tool::new(spec.name.clone(), spec.description.clone(), Arc::new(input));
    if let Value::Object(output) = spec.output_schema.as_ref()
        && output.get("type") == Some(&Value::from("object"))
    {
        tool = tool.with_raw_output_schema(Arc::new(output.clone()));
    }
    let a = &spec.annotations;
    let annotations = match &a.title {
        Some(title) => ToolAnnotations::with_title(title.clone()),
        None => ToolAnnotations::new(),
    }
    .read_only(a.read_only_hint)
    .destructive(a.destructive_hint)
    .idempotent(a.idempotent_hint)
    .open_world(a.open_world_hint);
    tool.with_annotations(annotations)
}

/// The calling client, as a call's tools see it: progress reports become
/// `notifications/progress` for the request's progress token, and a tool's questions (a
/// proxied server's elicitation) become `elicitation/create` requests to the client when it
/// supports form elicitation. Reports run on the tool's actor and must not block, so they go
/// through a channel to a task that owns the sending.
struct ClientRelay {
    progress: Option<mpsc::UnboundedSender<Progress>>,
    /// The client, when it answers questions.
    asks: Option<rmcp::Peer<RoleServer>>,
}

impl ClientRelay {
    fn start(
        token: Option<ProgressToken>,
        can_elicit: bool,
        peer: rmcp::Peer<RoleServer>,
    ) -> Arc<dyn CallObserver> {
        let progress = token.map(|token| {
            let (tx, mut rx) = mpsc::unbounded_channel::<Progress>();
            let peer = peer.clone();
            tokio::spawn(async move {
                let mut last = f64::NEG_INFINITY;
                while let Some(p) = rx.recv().await {
                    // The protocol wants progress to increase; a report that does not is
                    // dropped.
                    if p.progress.partial_cmp(&last) != Some(std::cmp::Ordering::Greater) {
                        continue;
                    }
                    last = p.progress;
                    let mut param = ProgressNotificationParam::new(token.clone(), p.progress);
                    if let Some(total) = p.total {
                        param = param.with_total(total);
                    }
                    if let Some(message) = p.message {
                        param = param.with_message(message);
                    }
                    if peer.notify_progress(param).await.is_err() {
                        break;
                    }
                }
            });
            tx
        });
        Arc::new(Self {
            progress,
            asks: can_elicit.then_some(peer),
        })
    }
}

impl CallObserver for ClientRelay {
    fn on_progress(&self, _call: &CallContext, progress: Progress) {
        if let Some(tx) = &self.progress {
            let _ = tx.send(progress);
        }
    }

    fn elicit(&self, _call: &CallContext, request: Value) -> Option<guildhall_actors::Elicitation> {
        let peer = self.asks.clone()?;
        Some(Box::pin(async move {
            let params: rmcp::model::ElicitRequestParams = serde_json::from_value(request)
                .map_err(|err| format!("not an elicitation request: {err}"))?;
            let answer = peer
                .create_elicitation(params)
                .await
                .map_err(|err| format!("the client did not answer: {err}"))?;
            serde_json::to_value(answer).map_err(|err| err.to_string())
        }))
    }
}

/// Calls `notify` for each tool-set change after now, until `stop` completes or `notify`
/// fails (the client is gone).
#[cfg(feature = "conformance")]
impl McpServer {
    /// A fixture trigger: a real change to the tool list (a tool is registered) or to the
    /// fixture prompts, so clients' list-changed notifications can be observed.
    async fn change_list(
        &self,
        change: fixtures::ListChange,
    ) -> Result<CallToolResponse, McpError> {
        let what = match change {
            fixtures::ListChange::Tools => {
                let name = format!(
                    "test_dynamic_tool_{}",
                    self.shared.runtime.tool_set_version()
                );
                self.shared
                    .runtime
                    .register(fixtures::AddedTool(name.clone()))
                    .await
                    .map_err(|err| McpError::internal_error(err.to_string(), None))?;
                format!("tool `{name}` added")
            }
            fixtures::ListChange::Prompts => {
                self.shared.added_prompts.send_modify(|n| *n += 1);
                format!(
                    "prompt `{}` added",
                    fixtures::added_prompt_name(*self.shared.added_prompts.borrow())
                )
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(what)]).into())
    }
}

async fn relay_changes<N, E>(
    mut changes: tokio::sync::watch::Receiver<u64>,
    stop: impl Future<Output = ()>,
    mut notify: impl FnMut() -> N,
) where
    N: Future<Output = Result<(), E>>,
{
    changes.mark_unchanged();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            changed = changes.changed() => {
                if changed.is_err() || notify().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Calls `resources` or `prompts` for each change of the proxied servers' resource or prompt
/// lists after now, until `stop` completes or a call fails (the client is gone).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
async fn relay_lists<R, P, E>(
    mut lists: tokio::sync::watch::Receiver<crate::servers::Lists>,
    stop: impl Future<Output = ()>,
    mut resources: impl FnMut() -> R,
    mut prompts: impl FnMut() -> P,
) where
    R: Future<Output = Result<(), E>>,
    P: Future<Output = Result<(), E>>,
{
    let mut seen = *lists.borrow_and_update();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            changed = lists.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *lists.borrow_and_update();
                if now.resources != seen.resources && resources().await.is_err() {
                    return;
                }
                if now.prompts != seen.prompts && prompts().await.is_err() {
                    return;
                }
                seen = now;
            }
        }
    }
}

/// What a resource subscription holds besides its watch: a proxied server's upstream
/// subscription, for its resources.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
type Held = Option<crate::servers::Upstream>;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
type Held = ();

/// The proxied servers' resources, templates and prompts a caller may see.
type Federated = (
    Vec<rmcp::model::Resource>,
    Vec<rmcp::model::ResourceTemplate>,
    Vec<rmcp::model::Prompt>,
);

/// Whether `uri` is a proxied server's resource.
fn is_federated(uri: &str) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    return federated::is_federated(uri);
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = uri;
        false
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = self.capabilities();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("guildhall", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.instructions(self.agent.as_deref()))
    }

    /// A connection that names its agent over HTTP (`Guildhall-Agent`) has it registered
    /// now, not at its first call, and hears who it is in the instructions.
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, McpError> {
        cx.peer.set_peer_info(request.clone());
        let agent = self.named_caller(&cx).await?;
        // An HTTP session acts as the agent its headers name from now until it ends.
        if let Some(named) = agent.as_deref().filter(|_| self.agent.is_none())
            && self.presence.get().is_none()
            && let Some(presence) = self.shared.runtime.connect_agent(named)
        {
            let _ = self.presence.set(presence);
        }
        let mut info = self.negotiate_initialize(&request)?;
        info.instructions = Some(self.instructions(agent.as_deref()));
        Ok(info)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let agent = self.named_caller(&cx).await?;
        // Tools on their way (a proxied server's first handshake) are waited for, a bounded
        // time: many clients list once, as they connect.
        self.shared.runtime.settled().await;
        let model = self.model_of(&cx, agent.as_deref());
        let tools = self.visible_tools_for(agent.as_deref(), model.as_deref());
        let (tools, next) = page::page(tools, request)?;
        let mut result = ListToolsResult::with_all_items(tools);
        result.next_cursor = next;
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.listing()
            .iter()
            .find(|t| t.name == name && self.filter.allows(name))
            .cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.call(request, cx).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = self.named_caller(&cx).await?;
        let task = self.shared.tasks.get(caller.as_deref(), &request.task_id)?;
        Ok(GetTaskResult::new(task))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.named_caller(&cx).await?;
        self.shared
            .tasks
            .update(caller.as_deref(), &request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.named_caller(&cx).await?;
        self.shared
            .tasks
            .cancel(caller.as_deref(), &request.task_id)
    }

    async fn on_initialized(&self, cx: NotificationContext<RoleServer>) {
        // Handshake-era clients hear of tool-set changes on the connection itself.
        let changes = self.shared.runtime.tool_set_changes();
        let alive = self.alive.clone();
        let peer = cx.peer;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if let Some(lists) = federated::list_changes(&self.shared.runtime) {
            let (alive, peer) = (alive.clone(), peer.clone());
            tokio::spawn(async move {
                relay_lists(
                    lists,
                    alive.cancelled(),
                    || peer.notify_resource_list_changed(),
                    || peer.notify_prompt_list_changed(),
                )
                .await;
            });
        }
        // And of what their agent found with `find_tools`.
        if let Some(found) = self
            .opened_as(&cx.extensions)
            .and_then(|agent| self.shared.disclosure.changes(&agent))
        {
            let (alive, peer) = (alive.clone(), peer.clone());
            tokio::spawn(async move {
                relay_changes(found, alive.cancelled(), || peer.notify_tool_list_changed()).await;
            });
        }
        tokio::spawn(async move {
            relay_changes(changes, alive.cancelled(), || {
                peer.notify_tool_list_changed()
            })
            .await;
        });
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::builder().tools_list_changed();
        if self.shared.fixtures {
            return Some(accepted.prompts_list_changed().build());
        }
        // The proxied servers' lists change; guildhall's own do not.
        if requested.resources_list_changed == Some(true) {
            accepted = accepted.resources_list_changed();
        }
        if requested.prompts_list_changed == Some(true) {
            accepted = accepted.prompts_list_changed();
        }
        // The URIs guildhall serves; whether the caller may read them is checked in `listen`.
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|uri| resources::Resource::parse(uri).is_ok() || is_federated(uri))
            .take(resources::MAX_SUBSCRIPTIONS)
            .cloned()
            .collect();
        Some(if uris.is_empty() {
            accepted.build()
        } else {
            accepted.resource_subscriptions(uris).build()
        })
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        // 2026-07-28 clients subscribe with `subscriptions/listen` instead.
        let found = self
            .named_caller(subscription.request_context())
            .await?
            .and_then(|agent| self.shared.disclosure.changes(&agent));
        let tools = async {
            let all = relay_changes(
                self.shared.runtime.tool_set_changes(),
                subscription.cancelled(),
                || subscription.sink().notify_tool_list_changed(),
            );
            let found = async {
                if let Some(found) = found {
                    relay_changes(found, subscription.cancelled(), || {
                        subscription.sink().notify_tool_list_changed()
                    })
                    .await;
                }
            };
            tokio::join!(all, found);
        };
        if self.shared.fixtures {
            let prompts = relay_changes(
                self.shared.added_prompts.subscribe(),
                subscription.cancelled(),
                || subscription.sink().notify_prompt_list_changed(),
            );
            tokio::join!(tools, prompts);
            return Ok(());
        }
        let mut watches = Vec::new();
        // Held until the subscription ends: the proxied servers' upstream subscriptions.
        let mut held = Vec::new();
        for uri in subscription
            .accepted()
            .resource_subscriptions
            .iter()
            .flatten()
        {
            let (watch, upstream) = self.watch(uri, subscription.request_context()).await?;
            watches.push((uri, watch));
            held.push(upstream);
        }
        // The acknowledgment went out before these watches began: a change in between would
        // be missed, so each resource is reported changed once at the start.
        let subscription = &subscription;
        let resources = futures::future::join_all(watches.into_iter().map(|(uri, watch)| {
            resources::relay(watch, true, subscription.cancelled(), move || {
                subscription.sink().notify_resource_updated(uri.clone())
            })
        }));
        let lists = async {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            if let Some(lists) = federated::list_changes(&self.shared.runtime) {
                let accepted = subscription.accepted();
                let (resources, prompts) = (
                    accepted.resources_list_changed == Some(true),
                    accepted.prompts_list_changed == Some(true),
                );
                relay_lists(
                    lists,
                    subscription.cancelled(),
                    || async move {
                        match resources {
                            true => subscription.sink().notify_resource_list_changed().await,
                            false => Ok(()),
                        }
                    },
                    || async move {
                        match prompts {
                            true => subscription.sink().notify_prompt_list_changed().await,
                            false => Ok(()),
                        }
                    },
                )
                .await;
            }
        };
        tokio::join!(tools, resources, lists);
        drop(held);
        Ok(())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, McpError> {
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            return fixtures::list_resources(request, cx);
        }
        let agent = self.named_caller(&cx).await?;
        // As for tools: a proxied server's first start is waited for, a bounded time.
        self.shared.runtime.settled().await;
        let (proxied, _, _) = self.federated(agent.as_deref()).await;
        resources::list(&self.shared.runtime, agent.as_deref(), request, proxied)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, McpError> {
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            return fixtures::list_resource_templates(request, cx);
        }
        let agent = self.named_caller(&cx).await?;
        self.shared.runtime.settled().await;
        let (_, proxied, _) = self.federated(agent.as_deref()).await;
        resources::templates(request, proxied)
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            return fixtures::read_resource(request, cx).await;
        }
        let agent = self.caller(&cx).await?;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if federated::is_federated(&request.uri) {
            self.shared.runtime.agent_seen(&agent);
            let may_use = |tool: &str| self.may_use(Some(&agent), tool);
            let result = federated::read(
                &self.shared.runtime,
                may_use,
                Arc::clone(&agent),
                &request.uri,
            )
            .await?;
            return Ok(rmcp::model::ReadResourceResponse::from(result));
        }
        self.readable(&agent, &request.uri)?;
        self.shared.runtime.agent_seen(&agent);
        let result = resources::read(
            &self.shared.runtime,
            || self.shared.recent(),
            agent,
            &request.uri,
        )
        .await?;
        Ok(rmcp::model::ReadResourceResponse::from(result))
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, McpError> {
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            let added = *self.shared.added_prompts.borrow();
            return fixtures::list_prompts(added, request, cx);
        }
        let agent = self.named_caller(&cx).await?;
        self.shared.runtime.settled().await;
        let (_, _, proxied) = self.federated(agent.as_deref()).await;
        let mut all = prompts::list()?.prompts;
        all.extend(proxied);
        all.extend(prompts::skills(&self.shared.runtime, agent.as_deref()));
        let (prompts, next) = page::page(all, request)?;
        let mut result = rmcp::model::ListPromptsResult::with_all_items(prompts);
        result.next_cursor = next;
        Ok(result)
    }

    async fn complete(
        &self,
        request: rmcp::model::CompleteRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CompleteResult, McpError> {
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            return fixtures::complete(&request);
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if federated::is_federated_ref(&request.r#ref) {
            let agent = self.caller(&cx).await?;
            let may_use = |tool: &str| self.may_use(Some(&agent), tool);
            let runtime = &self.shared.runtime;
            return federated::complete(runtime, may_use, Arc::clone(&agent), &request).await;
        }
        let _ = cx;
        prompts::complete(&self.shared.runtime, &request).await
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.fixtures_only::<rmcp::model::SetLevelRequestMethod>()
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if self.shared.fixtures {
            return Ok(());
        }
        let (watch, held) = self.watch(&request.uri, &cx).await?;
        let mut subscriptions = self
            .subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !subscriptions.contains_key(&request.uri)
            && subscriptions.len() >= resources::MAX_SUBSCRIPTIONS
        {
            return Err(McpError::invalid_request(
                format!(
                    "this connection holds {} resource subscriptions, the most it may; \
                     unsubscribe from one first",
                    resources::MAX_SUBSCRIPTIONS
                ),
                None,
            ));
        }
        let stop = self.alive.child_token();
        let (peer, uri) = (cx.peer.clone(), request.uri.clone());
        // Watched before the answer: every change after it is reported.
        let relay = resources::relay(watch, false, stop.clone().cancelled_owned(), move || {
            let (peer, uri) = (peer.clone(), uri.clone());
            async move {
                peer.notify_resource_updated(rmcp::model::ResourceUpdatedNotificationParam::new(
                    uri,
                ))
                .await
            }
        });
        tokio::spawn(async move {
            relay.await;
            // Held while it relays: a proxied server's upstream subscription.
            drop(held);
        });
        // A second subscription to the same URI replaces the first (one notification each).
        subscriptions.insert(request.uri, stop.drop_guard());
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if self.shared.fixtures {
            return Ok(());
        }
        self.subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&request.uri);
        Ok(())
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        #[cfg(feature = "conformance")]
        if self.shared.fixtures {
            return fixtures::get_prompt(request, cx).await;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if federated::is_federated_prompt(&request.name) {
            let agent = self.caller(&cx).await?;
            let may_use = |tool: &str| self.may_use(Some(&agent), tool);
            let runtime = &self.shared.runtime;
            let result =
                federated::get_prompt(runtime, may_use, Arc::clone(&agent), &request).await?;
            return Ok(rmcp::model::GetPromptResponse::from(result));
        }
        if let Some(skill) = request.name.strip_prefix(prompts::SKILL_PREFIX) {
            let agent = self.caller(&cx).await?;
            let result = prompts::get_skill(&self.shared.runtime, &agent, skill).await?;
            return Ok(rmcp::model::GetPromptResponse::from(result));
        }
        let agent = self.named_caller(&cx).await?;
        let result = prompts::get(&self.shared.runtime, agent.as_deref(), &request)?;
        Ok(rmcp::model::GetPromptResponse::from(result))
    }
}

#[cfg(test)]
mod approval_form_tests {
    use super::*;

    #[test]
    fn the_approval_form_is_a_valid_elicitation_schema() {
        let schema = rmcp::model::ElicitationSchema::from_type::<ApprovalForm>();
        assert!(schema.is_ok(), "{schema:?}");
    }
}
