//! The runtime: builds the supervision tree, registers tools and routes calls.
//!
//! The tree it starts:
//!
//! ```text
//! root              (one-for-one, OTP default intensity)
//! ├── tools         (one-for-one; never escalates)
//! │   ├── <tool>    (a sequential tool's actor, with the tool's breaker)
//! │   └── <tool>/i  (actor i of a concurrent tool)
//! ├── mailboxes     (one dynamic supervisor per core: an active agent's mailbox actor)
//! ├── contexts      (the same: an active session's context actor)
//! ├── tasks         (the same: the task board's actor, while active)
//! └── shells        (with `[shell]`: a dynamic supervisor, one temporary actor per
//!                    background shell)
//! ```
//!
//! Tool actors are direct children of `tools`, one actor per tool and no per-tool supervisor,
//! which keeps a tool at about one ractor actor of memory. Isolation comes from one-for-one
//! restarts, each actor's own backoff, and each tool's breaker; `tools` has unlimited
//! intensity so no tool's crash loop can escalate and restart the others.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use dashmap::DashMap;
use guildhall_actors::{CallError, InitState, RegistrationError, Tool, ToolSpec, WorkerPool};
use guildhall_supervision::{
    Backoff, ChildKind, ChildSnapshot, ChildSpec, ChildStatus, RestartIntensity, SharedBreaker,
    Strategy, Supervisor, SupervisorError, SupervisorSpec, Unreachable,
};
use serde_json::Value;

use crate::agents::roster::{ListAgents, WhoAmI};
use crate::agents::tools::{CheckInbox, MarkRead, ReadMessage, SendMessage};
use crate::agents::{
    Agent, AgentRecord, AgentSpec, Credentials, MailError, MailboxConfig, PostOffice,
};
use crate::changes::Changes;
use crate::context::tools::{ContextGet, ContextHistory, ContextUpdate};
use crate::context::{ContextConfig, ContextHub, Sessions};
use crate::error::BuildError;
use crate::governance::{
    Governance, GovernanceConfig, Governed, ToolEvent, ToolMeta, ToolReply, layers,
};
use crate::humans::tools::{AskHuman, Confirm};
use crate::humans::{Humans, HumansConfig};
use crate::options::{CallOptions, ToolOptions};
use crate::pipeline::{self, Sweeper};
use crate::registry::{ErasedTool, ToolEntry, ToolHandle};
use crate::store::{self, Cluster, MemoryStore, Store};
use crate::tasks::tools::{
    TaskClaim, TaskCreate, TaskGet, TaskHeartbeat, TaskList, TaskRelease, TaskUpdate,
};
use crate::tasks::{TaskBoard, TaskConfig, Tasks};

const TOOLS: &str = "tools";

/// A running guildhall runtime. Cheap to clone; all clones share one tree. Call
/// [`shutdown`](Self::shutdown) to stop it and wait; dropping the last clone also stops the
/// tree, without waiting.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    tools: DashMap<String, Arc<dyn ErasedTool>>,
    governance: Arc<Governance>,
    office: Arc<PostOffice>,
    contexts: Arc<ContextHub>,
    tasks: Arc<TaskBoard>,
    root: Supervisor,
    /// The `tools` supervisor, republished by every (re)start, so a `tools` restarted by
    /// root is found too.
    tools_sup: Arc<RwLock<Option<Supervisor>>>,
    defaults: ToolOptions,
    sweeper: Arc<Sweeper>,
    stopping: AtomicBool,
    /// Bumped whenever the tool set changes, for `tools/list_changed` notifications.
    tool_set: tokio::sync::watch::Sender<u64>,
    credentials: Credentials,
    /// The background shells: listed in `status`, ended with their agent's last
    /// connection.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    shell: Option<Arc<crate::shell::Shell>>,
    /// What every process started for an agent is confined by, and whose roots it gets.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    confiner: Option<crate::sandbox::Confiner>,
}

/// How late a timeout may fire: the deadline sweeper's tick.
const DEADLINE_RESOLUTION: Duration = Duration::from_millis(1);

/// Configures and starts a [`Runtime`].
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct RuntimeBuilder {
    defaults: ToolOptions,
    store: StoreChoice,
    /// A database URL: the store is there, and the data directory (if any) keeps the rest.
    #[cfg(feature = "postgres")]
    store_url: Option<String>,
    #[cfg(feature = "postgres")]
    store_lease: Duration,
    mailbox: MailboxConfig,
    context: ContextConfig,
    tasks: TaskConfig,
    governance: GovernanceConfig,
    credentials: Credentials,
    sweeper: Arc<Sweeper>,
    pending: Vec<Pending>,
    /// File roots that may depend on the calling agent's role, told how to find it.
    by_role: Vec<Arc<crate::files::Files>>,
    /// Sandboxes whose network may depend on the agent's role, told the same way.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    sandboxes: Vec<Arc<crate::sandbox::Sandbox>>,
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    confiner: Option<crate::sandbox::Confiner>,
    /// With [`humans`](Self::humans): `ask_human` and `confirm`, and who answers them.
    humans: Option<HumansConfig>,
    /// Subsystems started under the root after the built-in ones.
    subsystems: Vec<ChildSpec>,
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    shell: Option<Arc<crate::shell::Shell>>,
}

/// A tool waiting for the runtime's governance to exist before its stack is built.
type Pending =
    Box<dyn FnOnce(&Arc<Sweeper>, &Arc<Governance>) -> Result<Prepared, RegistrationError> + Send>;

/// Where the builder gets its store.
enum StoreChoice {
    Memory,
    Dir(PathBuf),
    Given(Arc<dyn Store>),
}

/// A tool ready to be started: its entry and its actors' child specs.
struct Prepared {
    entry: Arc<dyn ErasedTool>,
    children: Vec<ChildSpec>,
}

/// A tool prepared for registration, with its typed handle.
struct PreparedTool<T: Tool> {
    prepared: Prepared,
    handle: ToolHandle<T>,
}

impl Runtime {
    /// Starts configuring a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            defaults: ToolOptions::default(),
            store: StoreChoice::Memory,
            #[cfg(feature = "postgres")]
            store_url: None,
            #[cfg(feature = "postgres")]
            store_lease: crate::store::DEFAULT_LEASE,
            mailbox: MailboxConfig::default(),
            context: ContextConfig::default(),
            tasks: TaskConfig::default(),
            governance: GovernanceConfig::default(),
            credentials: Credentials::default(),
            sweeper: Sweeper::new(DEADLINE_RESOLUTION),
            pending: Vec::new(),
            by_role: Vec::new(),
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            sandboxes: Vec::new(),
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            confiner: None,
            humans: None,
            subsystems: Vec::new(),
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            shell: None,
        }
    }

    /// Calls a tool by name with JSON arguments, which are checked against the tool's input
    /// type before it runs.
    ///
    /// # Errors
    /// [`CallError::UnknownTool`], [`CallError::InvalidArguments`] (naming the field and what
    /// was expected; the tool did not run), or any outcome of the call itself.
    ///
    /// # Cancel safety
    /// Dropping the future fires the call's cancellation token.
    pub async fn call_json(
        &self,
        name: &str,
        args: Value,
        options: CallOptions,
    ) -> Result<Value, CallError> {
        Ok(self.call_reply(name, args, options).await?.value)
    }

    /// Calls a tool by name as a model's client would: the result comes with its text form,
    /// hook notes, and the truncated text when it is too long for a model.
    ///
    /// # Errors
    /// As [`call_json`](Self::call_json).
    ///
    /// # Cancel safety
    /// Dropping the future fires the call's cancellation token.
    pub async fn call_reply(
        &self,
        name: &str,
        args: Value,
        options: CallOptions,
    ) -> Result<ToolReply, CallError> {
        let entry = self
            .inner
            .tools
            .get(name)
            .map(|e| Arc::clone(e.value()))
            .ok_or_else(|| CallError::UnknownTool {
                name: name.to_owned(),
            })?;
        entry.call_json(args, options).await
    }

    /// A typed handle to tool `name`, which must be of type `T`.
    ///
    /// # Errors
    /// [`CallError::UnknownTool`] when no tool of that name and type is registered.
    pub fn handle<T: Tool>(&self, name: &str) -> Result<ToolHandle<T>, CallError> {
        self.inner
            .tools
            .get(name)
            .and_then(|e| {
                e.value()
                    .as_any()
                    .downcast_ref::<ToolEntry<T>>()
                    .map(|t| t.handle.clone())
            })
            .ok_or_else(|| CallError::UnknownTool {
                name: name.to_owned(),
            })
    }

    /// Calls tool `name` of type `T` with a typed input.
    ///
    /// # Errors
    /// As [`handle`](Self::handle) and [`ToolHandle::call`].
    ///
    /// # Cancel safety
    /// Dropping the future fires the call's cancellation token.
    pub async fn call<T: Tool>(&self, name: &str, input: T::Input) -> Result<T::Output, CallError> {
        self.handle::<T>(name)?.call(input).await
    }

    /// Every registered tool, sorted by name.
    pub fn tools(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self
            .inner
            .tools
            .iter()
            .map(|e| e.value().spec().clone())
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        specs
    }

    /// The spec of tool `name`.
    pub fn tool(&self, name: &str) -> Option<ToolSpec> {
        self.inner.tools.get(name).map(|e| e.value().spec().clone())
    }

    /// How long a call of tool `name` may take (its registered timeout).
    pub fn tool_timeout(&self, name: &str) -> Option<Duration> {
        self.inner.tools.get(name).map(|e| e.value().timeout())
    }

    /// Registers and starts a tool with the runtime's default options; returns its typed
    /// handle.
    ///
    /// # Errors
    /// [`BuildError::Registration`] for an invalid or duplicate name; nothing is started.
    ///
    /// # Cancel safety
    /// If dropped after the tool's supervisor was asked to start it, the tool may be running
    /// but not registered; await it to completion.
    pub async fn register<T: InitState>(&self, tool: T) -> Result<ToolHandle<T>, BuildError> {
        self.register_with(tool, self.inner.defaults.clone()).await
    }

    /// Registers and starts a tool with `options`.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    ///
    /// # Cancel safety
    /// As [`register`](Self::register).
    pub async fn register_with<T: InitState>(
        &self,
        tool: T,
        options: ToolOptions,
    ) -> Result<ToolHandle<T>, BuildError> {
        let PreparedTool { prepared, handle } =
            prepare(tool, &options, &self.inner.sweeper, &self.inner.governance)?;
        let name = prepared.entry.spec().name.clone();
        match self.inner.tools.entry(name.clone()) {
            dashmap::Entry::Occupied(_) => {
                return Err(RegistrationError::DuplicateName { name }.into());
            }
            dashmap::Entry::Vacant(slot) => {
                slot.insert(Arc::clone(&prepared.entry));
            }
        }
        let started = match self.tools_supervisor() {
            Ok(tools_sup) => start_all(&tools_sup, prepared.children).await,
            Err(err) => Err(err),
        };
        if let Err(err) = started {
            prepared.entry.close();
            self.inner.tools.remove(&name);
            return Err(err.into());
        }
        self.inner.tool_set.send_modify(|version| *version += 1);
        Ok(handle)
    }

    /// Removes tool `name` and stops its actors; calls in flight end `Unavailable`. `false`
    /// when no tool has that name.
    ///
    /// # Cancel safety
    /// If dropped midway the tool is already unlisted; its actors may still be stopping.
    pub async fn deregister(&self, name: &str) -> bool {
        let Some((_, entry)) = self.inner.tools.remove(name) else {
            return false;
        };
        entry.close();
        self.inner.tool_set.send_modify(|version| *version += 1);
        if let Ok(tools_sup) = self.tools_supervisor() {
            for id in entry.actor_ids() {
                if let Err(err) = tools_sup.terminate_child(&**id).await {
                    tracing::debug!(error = %guildhall_actors::ErrorChain(&err), tool = name, "tool actor already gone");
                }
            }
        }
        true
    }

    /// Starts `child` under the root supervisor of the running runtime: how a subsystem
    /// built on the runtime (the proxied MCP servers, say) joins its tree, its restarts and
    /// its ordered shutdown (children started later stop first).
    ///
    /// # Errors
    /// [`SupervisorError`] when the child fails to start or the runtime has stopped.
    ///
    /// # Cancel safety
    /// If dropped after the start was asked for, the child may be running; await it.
    pub async fn supervise(&self, child: ChildSpec) -> Result<(), SupervisorError> {
        self.inner.root.start_child(child).await
    }

    /// Shows `process` as agent `id`'s process in listings (`list_agents`), from now on.
    pub(crate) fn attach_process(&self, id: &str, process: Arc<dyn crate::agents::ProcessReport>) {
        if let Some(entry) = self.inner.office.directory.get(id) {
            entry.set_process(process);
        }
    }

    /// Starts `id` under the root: a one-for-one supervisor of children added later that
    /// never escalates (a child's crash loop is bounded by the child's own breaker or
    /// intensity, and by backoff from 100 ms doubling to 10 s). Returns where the
    /// supervisor is, republished by its every (re)start.
    ///
    /// # Errors
    /// As [`supervise`](Self::supervise).
    ///
    /// # Cancel safety
    /// As [`supervise`](Self::supervise).
    pub(crate) async fn supervise_subsystem(
        &self,
        id: &str,
    ) -> Result<Arc<RwLock<Option<Supervisor>>>, SupervisorError> {
        let slot: Arc<RwLock<Option<Supervisor>>> = Arc::default();
        let spec = SupervisorSpec {
            strategy: Strategy::OneForOne,
            intensity: RestartIntensity::new(u32::MAX, Duration::from_secs(10)),
            backoff: Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10)),
            children: Vec::new(),
        };
        let child = ChildSpec::supervisor(id, spec).on_start({
            let slot = Arc::clone(&slot);
            move |cell| {
                *slot.write().unwrap_or_else(PoisonError::into_inner) =
                    Some(Supervisor::from_ref(cell.clone().into()));
            }
        });
        self.supervise(child).await?;
        Ok(slot)
    }

    /// Stops the root's child `id`, started by [`supervise`](Self::supervise).
    ///
    /// # Errors
    /// [`SupervisorError`] when there is no such child.
    ///
    /// # Cancel safety
    /// If dropped midway, the child may still be stopping.
    pub async fn unsupervise(&self, id: &str) -> Result<(), SupervisorError> {
        self.inner.root.terminate_child(id).await
    }

    /// A handle that does not keep the runtime alive: what a subsystem's actors hold, so
    /// that dropping the last [`Runtime`] still stops the tree.
    pub fn downgrade(&self) -> WeakRuntime {
        WeakRuntime(Arc::downgrade(&self.inner))
    }

    /// The tool set's version: it grows by one with each registration or removal.
    pub fn tool_set_version(&self) -> u64 {
        *self.inner.tool_set.borrow()
    }

    /// A receiver that sees a new value each time a tool is registered, so a server can tell
    /// its clients the tool list changed.
    pub fn tool_set_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.tool_set.subscribe()
    }

    /// The `tools` supervisor as it is now.
    fn tools_supervisor(&self) -> Result<Supervisor, SupervisorError> {
        self.inner
            .tools_sup
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|sup| ractor::ACTIVE_STATES.contains(&sup.cell().get_status()))
            .ok_or(SupervisorError::Unavailable {
                why: Unreachable::Stopped,
            })
    }

    /// Registers an agent, or updates the role, parent and metadata of one already
    /// registered, and returns its handle. Persisted before it returns.
    ///
    /// # Errors
    /// [`MailError`] for an invalid id or role, an unknown parent, a parent cycle, or a
    /// store failure.
    ///
    /// # Cancel safety
    /// Dropping the future after the record was submitted may leave the agent registered; look
    /// it up with [`agent`](Self::agent) before registering it again.
    pub async fn register_agent(&self, spec: AgentSpec) -> Result<Agent, MailError> {
        let entry = self.inner.office.register(spec).await?;
        Ok(Agent::new(Arc::clone(&self.inner.office), entry))
    }

    /// The handle of a registered agent.
    ///
    /// # Errors
    /// [`MailError::UnknownAgent`].
    pub fn agent(&self, id: &str) -> Result<Agent, MailError> {
        let entry = self.inner.office.directory.require(id)?;
        Ok(Agent::new(Arc::clone(&self.inner.office), entry))
    }

    /// Looks up an agent's record.
    pub fn lookup_agent(&self, id: &str) -> Option<Arc<AgentRecord>> {
        self.inner.office.directory.get(id).map(|e| e.record())
    }

    /// Notes that agent `id` made a call now (`list_agents` shows it as last seen).
    pub(crate) fn agent_seen(&self, id: &str) {
        if let Some(entry) = self.inner.office.directory.get(id) {
            entry.seen();
        }
    }

    /// Counts a live connection acting as agent `id` while the guard is held, and warns when
    /// it is not the only one. `None` for an agent that is not registered.
    pub(crate) fn connect_agent(&self, id: &str) -> Option<Presence> {
        let entry = self.inner.office.directory.get(id)?;
        let (connection, live) = entry.connect();
        if live == 1 {
            self.inner.office.events.emit(|| ToolEvent::AgentConnected {
                agent: Arc::from(id),
            });
        }
        if live > 1 {
            tracing::warn!(
                agent = id,
                live,
                "{}",
                crate::agents::roster::shared_identity_warning(id, live)
            );
        }
        Some(Presence {
            connection: Some(connection),
            agent: Arc::from(id),
            runtime: Arc::downgrade(&self.inner),
        })
    }

    /// How many live connections act as agent `id` (0 for an unknown agent).
    pub fn connections_of(&self, id: &str) -> u32 {
        self.inner
            .office
            .directory
            .get(id)
            .map_or(0, |entry| entry.connections())
    }

    /// The background shells (with `[shell]`), running and finished, oldest first.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn background_shells(&self) -> Vec<crate::shell::ShellInfo> {
        self.inner
            .shell
            .as_ref()
            .map(|shell| shell.background())
            .unwrap_or_default()
    }

    /// The sandbox processes started for agents run in: the one given to
    /// [`RuntimeBuilder::sandbox`], else the shell's.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn sandbox(&self) -> Option<&Arc<crate::sandbox::Sandbox>> {
        self.inner.confiner.as_ref().map(|c| &c.sandbox)
    }

    /// The sandbox and the roots processes started for agents get.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub(crate) fn confiner(&self) -> Option<&crate::sandbox::Confiner> {
        self.inner.confiner.as_ref()
    }

    /// Every registered agent, sorted by id.
    pub fn agents(&self) -> Vec<Arc<AgentRecord>> {
        self.inner.office.directory.list()
    }

    /// Removes an agent, its mailbox and its messages.
    ///
    /// # Errors
    /// [`MailError::UnknownAgent`], or a store failure (the agent then stays registered).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the agent deregistered or not; calling again finishes the
    /// job or reports the agent unknown.
    pub async fn deregister_agent(&self, id: &str) -> Result<(), MailError> {
        self.inner.office.deregister(id).await
    }

    /// How many mailbox actors are running (the rest are passive, in the store only).
    pub fn active_mailboxes(&self) -> usize {
        self.inner.office.active()
    }

    /// Starts the mailbox actors of `agents` now rather than on first use.
    ///
    /// # Errors
    /// [`MailError::Unavailable`] if one fails to start.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the mailboxes started so far running; they passivate when
    /// idle.
    pub async fn activate_agents(&self, agents: &[Agent]) -> Result<(), MailError> {
        let entries: Vec<_> = agents.iter().map(Agent::entry).cloned().collect();
        self.inner.office.activate_all(&entries).await
    }

    /// Permission rules, hooks, the audit log and tool events.
    pub fn governance(&self) -> &Governance {
        &self.inner.governance
    }

    /// The agents that need a token to be acted as, and their tokens.
    pub fn credentials(&self) -> &Credentials {
        &self.inner.credentials
    }

    /// The sessions and their contexts.
    pub fn sessions(&self) -> Sessions {
        Sessions::new(Arc::clone(&self.inner.contexts))
    }

    /// The task board.
    pub fn tasks(&self) -> Tasks {
        Tasks(Arc::clone(&self.inner.tasks))
    }

    /// Where committed changes of inboxes, context sessions and the agent directory are
    /// reported, for listeners such as the MCP server's resource subscriptions.
    pub fn changes(&self) -> Arc<Changes> {
        Arc::clone(&self.inner.office.shared.changes)
    }

    /// The runtime's store.
    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.inner.office.shared.store)
    }

    /// A snapshot of the supervision tree: every node's status and restart count, and each
    /// tool's breaker state.
    ///
    /// # Errors
    /// [`SupervisorError::Unavailable`] once the runtime has shut down.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn tree(&self) -> Result<ChildSnapshot, SupervisorError> {
        Ok(ChildSnapshot {
            id: "root".into(),
            kind: ChildKind::Supervisor,
            status: ChildStatus::Running,
            restarts: 0,
            breaker: None,
            children: self.inner.root.snapshot().await?,
        })
    }

    /// Stops accepting calls, then stops the tree in reverse start order, giving each tool's
    /// actors their grace period to finish the call in hand.
    ///
    /// # Cancel safety
    /// If dropped midway, the shutdown carries on in the background.
    pub async fn shutdown(&self) {
        if self.inner.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.office.stop_sweep();
        self.inner.contexts.stop_sweep();
        self.inner.tasks.stop_sweep();
        for entry in &self.inner.tools {
            entry.value().close();
        }
        if let Err(err) = self.inner.root.shutdown().await {
            tracing::debug!(error = %guildhall_actors::ErrorChain(&err), "root supervisor already stopped");
        }
        // No call is left to audit: write what the audit log holds.
        self.inner.governance.flush().await;
        // Every actor that wrote is stopped: commit what is pending and release the store.
        self.inner.office.shared.store.close();
    }
}

/// A [`Runtime`] that may have stopped: see [`Runtime::downgrade`].
#[derive(Clone)]
pub struct WeakRuntime(std::sync::Weak<Inner>);

impl WeakRuntime {
    /// The runtime, while any [`Runtime`] handle to it is left and it is not shutting down.
    pub fn upgrade(&self) -> Option<Runtime> {
        let inner = self.0.upgrade()?;
        (!inner.stopping.load(Ordering::Acquire)).then_some(Runtime { inner })
    }
}

/// A live connection acting as an agent. When the agent's last one ends, what outlives a
/// connection only for its agent's sake (background shells) is ended.
pub(crate) struct Presence {
    connection: Option<crate::agents::Connection>,
    agent: Arc<str>,
    runtime: std::sync::Weak<Inner>,
}

impl Drop for Presence {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        if connection.release() > 0 {
            return;
        }
        if let Some(inner) = self.runtime.upgrade() {
            inner.office.events.emit(|| ToolEvent::AgentLeft {
                agent: Arc::clone(&self.agent),
            });
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if let Some(shell) = self.runtime.upgrade().and_then(|inner| inner.shell.clone()) {
            shell.agent_left(&self.agent);
        }
    }
}

impl Drop for Inner {
    /// The last handle went away without `shutdown`: stop the tree anyway (children stop in
    /// reverse start order) rather than leave actors running with nothing to call them.
    fn drop(&mut self) {
        if !self.stopping.swap(true, Ordering::AcqRel) {
            for entry in &self.tools {
                entry.value().close();
            }
            self.root.cell().stop(Some("runtime dropped".into()));
        }
    }
}

impl RuntimeBuilder {
    /// Adds a tool with the default options.
    pub fn tool<T: InitState>(self, tool: T) -> Self {
        let options = self.defaults.clone();
        self.tool_with(tool, options)
    }

    /// Adds a tool with its own options.
    pub fn tool_with<T: InitState>(mut self, tool: T, options: ToolOptions) -> Self {
        self.pending.push(Box::new(move |sweeper, governance| {
            prepare(tool, &options, sweeper, governance).map(|p| p.prepared)
        }));
        self
    }

    /// Sets permission rules, hooks, the loop guard, truncation, rate limits, caching and
    /// auditing (see [`GovernanceConfig`]; the default lets every call through and audits
    /// it).
    pub fn governance(mut self, config: GovernanceConfig) -> Self {
        self.governance = config;
        self
    }

    /// Agents that clients may act as only with their token (over MCP and the local socket;
    /// the embedding program's own calls need none).
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    /// Keeps agents and messages in the durable store in `dir` (created if missing). Without
    /// this, or [`store`](Self::store), everything is kept in memory.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.store = StoreChoice::Dir(dir.into());
        self
    }

    /// Keeps agents, messages, context and tasks in the PostgreSQL database at `url`
    /// ([`PostgresStore`](crate::store::PostgresStore)), which other servers may share. A
    /// [`data_dir`](Self::data_dir) given as well keeps only what is not shared (spilled
    /// results).
    #[cfg(feature = "postgres")]
    pub fn store_url(mut self, url: impl Into<String>) -> Self {
        self.store_url = Some(url.into());
        self
    }

    /// How long this server holds the database of [`store_url`](Self::store_url) without
    /// renewing its lease (default [`DEFAULT_LEASE`](crate::store::DEFAULT_LEASE)): the
    /// longest another server waits to take over after this one died.
    #[cfg(feature = "postgres")]
    pub fn store_lease(mut self, lease: Duration) -> Self {
        self.store_lease = lease;
        self
    }

    /// Uses `store` for agents and messages.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = StoreChoice::Given(store);
        self
    }

    /// Sets session context limits and timings.
    pub fn context_config(mut self, config: ContextConfig) -> Self {
        self.context = config;
        self
    }

    /// Sets the task board's limits and timings.
    pub fn task_config(mut self, config: TaskConfig) -> Self {
        self.tasks = config;
        self
    }

    /// Adds the file tools (`read_file`, `write_file`, `edit_file`, `multi_edit`,
    /// `list_dir`, `glob`, `grep`) over `files`' roots.
    pub fn files(mut self, files: &Arc<crate::files::Files>) -> Self {
        let tools = files.tools();
        self.by_role.push(Arc::clone(files));
        self.tool(tools.read)
            .tool(tools.write)
            .tool(tools.edit)
            .tool(tools.multi_edit)
            .tool(tools.list_dir)
            .tool(tools.glob)
            .tool(tools.grep)
    }

    /// Adds the shell tools: `bash`, and the background shells `shell_start`,
    /// `shell_output` and `shell_kill` with their supervisor. `bash`'s deadline allows for
    /// the longest command the shell's settings permit; none is retried (a command may
    /// have side effects). An agent's background shells end when its last connection does.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn shell(mut self, shell: &Arc<crate::shell::Shell>) -> Self {
        let once = self.defaults.clone().max_retries(0);
        let (start, output, kill) = shell.background_tools();
        self.subsystems.push(shell.supervisor_spec());
        self.by_role.push(Arc::clone(shell.files()));
        self.sandboxes.push(Arc::clone(shell.sandbox()));
        self.shell = Some(Arc::clone(shell));
        self.tool_with(shell.tool(), once.clone().timeout(shell.max_call()))
            .tool_with(start, once.clone())
            .tool_with(output, once.clone().timeout(shell.max_output_wait()))
            .tool_with(kill, once)
    }

    /// Confines every process started for an agent (command tools, proxied servers,
    /// launched agents; the shell has its own) with `sandbox`, read-write in the agent's
    /// roots of `files` (else in the process's own directory).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn sandbox(
        mut self,
        sandbox: &Arc<crate::sandbox::Sandbox>,
        files: Option<&Arc<crate::files::Files>>,
    ) -> Self {
        self.sandboxes.push(Arc::clone(sandbox));
        self.confiner = Some(crate::sandbox::Confiner {
            sandbox: Arc::clone(sandbox),
            files: files.map(Arc::clone),
        });
        self
    }

    /// Adds the `web_fetch` tool. Its deadline allows for the fetch's own timeout.
    #[cfg(feature = "fetch")]
    pub fn fetch(self, fetch: &Arc<crate::fetch::Fetch>) -> Self {
        let options = self.defaults.clone().timeout(fetch.max_call());
        self.tool_with(fetch.tool(), options)
    }

    /// Adds `ask_human` and `confirm`: answered by the caller's own user when its MCP client
    /// can ask, else mailed to `config`'s humans (registered with role `human`).
    pub fn humans(mut self, config: HumansConfig) -> Self {
        self.humans = Some(config);
        self
    }

    /// Sets mailbox limits and timings.
    pub fn mailbox_config(mut self, config: MailboxConfig) -> Self {
        self.mailbox = config;
        self
    }

    /// Sets the options used by [`tool`](Self::tool) and [`Runtime::register`] (set it before
    /// adding tools).
    pub fn default_tool_options(mut self, options: ToolOptions) -> Self {
        self.defaults = options;
        self
    }

    /// What `whoami` says of an agent's sandbox: the one processes started for agents run
    /// in, when there is one.
    fn sandbox_of(&self) -> Option<crate::agents::roster::SandboxOf> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            let sandbox = match (&self.confiner, &self.shell) {
                (Some(confiner), _) => Arc::clone(&confiner.sandbox),
                (None, Some(shell)) => Arc::clone(shell.sandbox()),
                (None, None) => return None,
            };
            Some(Arc::new(move |agent: &str| {
                serde_json::json!({
                    "applied": sandbox.describe(),
                    "network": sandbox.network_of(Some(agent)),
                })
            }))
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        None
    }

    /// Validates every tool and starts the tree.
    ///
    /// # Errors
    /// [`BuildError::Registration`] for the first invalid or duplicate tool (nothing is
    /// started), or [`BuildError::Supervision`] if the tree fails to start.
    ///
    /// # Cancel safety
    /// Not cancel safe: await it to completion. Dropped part way, it may leave the store open
    /// and actors started with no [`Runtime`] to shut them down.
    pub async fn build(mut self) -> Result<Runtime, BuildError> {
        let store: Arc<dyn Store> = match self.store {
            #[cfg(feature = "postgres")]
            _ if self.store_url.is_some() => Arc::new(crate::store::PostgresStore::open_url(
                self.store_url.as_deref().unwrap_or_default(),
                self.store_lease,
            )?),
            StoreChoice::Memory => Arc::new(MemoryStore::new()),
            StoreChoice::Dir(ref dir) => store::open(dir)?,
            StoreChoice::Given(ref store) => Arc::clone(store),
        };
        let data_dir = match &self.store {
            StoreChoice::Dir(dir) => Some(dir.clone()),
            _ => None,
        };
        // One event stream for the whole runtime: calls, tools, mail, agents.
        let events = crate::events::Events::default();
        // Listening before the directory and the sessions are read: a change another
        // server makes from here on is either read by them or noticed after.
        let notices = store.cluster().map(Cluster::subscribe);
        let office = PostOffice::open(
            Arc::clone(&store),
            self.mailbox.clone(),
            Arc::new(Changes::default()),
            events.clone(),
        )?;
        let contexts = ContextHub::open(
            Arc::clone(&store),
            self.context.clone(),
            Arc::clone(&office),
        )?;
        let tasks = TaskBoard::open(Arc::clone(&store), self.tasks.clone(), Arc::clone(&office));
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        let sandboxes = std::mem::take(&mut self.sandboxes);
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        for sandbox in &sandboxes {
            let office = Arc::downgrade(&office);
            sandbox.resolve_roles_with(Box::new(move |agent| {
                let entry = office.upgrade()?.directory.get(agent)?;
                Some(entry.record().role.clone())
            }));
        }
        for files in std::mem::take(&mut self.by_role) {
            let office = Arc::downgrade(&office);
            files.resolve_roles_with(Box::new(move |agent| {
                let entry = office.upgrade()?.directory.get(agent)?;
                Some(entry.record().role.clone())
            }));
        }
        let governance = Governance::start(
            std::mem::take(&mut self.governance),
            Arc::clone(&office),
            Arc::clone(&contexts),
            store,
            data_dir,
            events,
        )?;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        for sandbox in sandboxes {
            sandbox.report_to(Arc::new(crate::governance::sandboxed::SandboxReport(
                Arc::downgrade(&governance),
            )));
        }
        // The mailbox tools wait up to `max_wait` by design; their deadline allows for it.
        let mail_options = self
            .defaults
            .clone()
            .timeout(self.mailbox.max_wait + Duration::from_secs(10));
        let sandbox_of = self.sandbox_of();
        self = self
            .tool_with(SendMessage(Arc::clone(&office)), mail_options.clone())
            .tool_with(CheckInbox(Arc::clone(&office)), mail_options.clone())
            .tool_with(ReadMessage(Arc::clone(&office)), mail_options.clone())
            .tool_with(MarkRead(Arc::clone(&office)), mail_options)
            .tool(WhoAmI(Arc::clone(&office), sandbox_of))
            .tool(crate::governance::SetMode(Arc::clone(&governance)))
            .tool(ListAgents(Arc::clone(&office)))
            .tool(ContextGet(Arc::clone(&contexts)))
            .tool(ContextUpdate(Arc::clone(&contexts)))
            .tool(ContextHistory(Arc::clone(&contexts)))
            .tool(TaskCreate(Tasks(Arc::clone(&tasks))))
            .tool(TaskList(Tasks(Arc::clone(&tasks))))
            .tool(TaskGet(Tasks(Arc::clone(&tasks))))
            .tool(TaskUpdate(Tasks(Arc::clone(&tasks))))
            .tool(TaskClaim(Tasks(Arc::clone(&tasks))))
            .tool(TaskHeartbeat(Tasks(Arc::clone(&tasks))))
            .tool(TaskRelease(Tasks(Arc::clone(&tasks))));
        if let Some(config) = self.humans.take() {
            let humans = Humans::start(Arc::clone(&office), config).await?;
            // They wait for a person by design; their deadline allows for the longest wait.
            let options = self
                .defaults
                .clone()
                .timeout(crate::humans::tools::MAX_WAIT + Duration::from_secs(10));
            self = self
                .tool_with(AskHuman(Arc::clone(&humans)), options.clone())
                .tool_with(Confirm(humans), options);
        }
        let tools: DashMap<String, Arc<dyn ErasedTool>> =
            DashMap::with_capacity(self.pending.len());
        let mut children = Vec::with_capacity(self.pending.len());
        for pending in self.pending {
            let prepared = pending(&self.sweeper, &governance)?;
            let name = prepared.entry.spec().name.clone();
            if tools.insert(name.clone(), prepared.entry).is_some() {
                return Err(RegistrationError::DuplicateName { name }.into());
            }
            children.push(prepared.children);
        }
        // One broken tool must not take the others down: restarts never escalate from here.
        let tools_spec = SupervisorSpec {
            strategy: Strategy::OneForOne,
            intensity: RestartIntensity::new(u32::MAX, Duration::from_secs(10)),
            backoff: Backoff::default(),
            children: flatten_exact(children),
        };
        let tools_sup: Arc<RwLock<Option<Supervisor>>> = Arc::default();
        let root_spec = SupervisorSpec::new(Strategy::OneForOne)
            .child(ChildSpec::supervisor(TOOLS, tools_spec).on_start({
                let slot = Arc::clone(&tools_sup);
                move |cell| {
                    *slot.write().unwrap_or_else(PoisonError::into_inner) =
                        Some(Supervisor::from_ref(cell.clone().into()));
                }
            }))
            .child(office.supervisor_spec())
            .child(contexts.supervisor_spec())
            .child(tasks.supervisor_spec());
        let root_spec = self
            .subsystems
            .into_iter()
            .fold(root_spec, SupervisorSpec::child);
        let (root, _) = Supervisor::spawn(root_spec, None).await?;
        self.sweeper.start();
        office.start_sweep();
        contexts.start_sweep();
        tasks.start_sweep();
        if let Some(notices) = notices {
            tokio::spawn(follow_cluster(
                notices,
                Arc::downgrade(&office),
                Arc::downgrade(&contexts),
                Arc::downgrade(&tasks),
                Arc::downgrade(&governance),
            ));
        }
        Ok(Runtime {
            inner: Arc::new(Inner {
                tools,
                governance,
                office,
                contexts,
                tasks,
                root,
                tools_sup,
                defaults: self.defaults,
                sweeper: self.sweeper,
                stopping: AtomicBool::new(false),
                tool_set: tokio::sync::watch::Sender::new(0),
                credentials: self.credentials,
                #[cfg(all(target_os = "linux", target_env = "gnu"))]
                confiner: self.confiner.or_else(|| {
                    self.shell.as_ref().map(|shell| crate::sandbox::Confiner {
                        sandbox: Arc::clone(shell.sandbox()),
                        files: Some(Arc::clone(shell.files())),
                    })
                }),
                #[cfg(all(target_os = "linux", target_env = "gnu"))]
                shell: self.shell,
            }),
        })
    }
}

/// Acts on what other servers sharing the store say, until the runtime or the store ends.
/// Hand-overs run apart, so that one slow stop does not hold the notices behind it; a run
/// of notices that each say "read the directory again" is read once.
async fn follow_cluster(
    mut notices: tokio::sync::broadcast::Receiver<crate::store::Notice>,
    office: std::sync::Weak<PostOffice>,
    contexts: std::sync::Weak<ContextHub>,
    tasks: std::sync::Weak<TaskBoard>,
    governance: std::sync::Weak<Governance>,
) {
    use crate::store::Notice;
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    let mut pending = Vec::new();
    loop {
        if pending.is_empty() {
            match notices.recv().await {
                Ok(notice) => pending.push(notice),
                Err(RecvError::Lagged(_)) => pending.push(Notice::Resync),
                Err(RecvError::Closed) => return,
            }
        }
        loop {
            match notices.try_recv() {
                Ok(notice) => pending.push(notice),
                Err(TryRecvError::Lagged(_)) => pending.push(Notice::Resync),
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        let (Some(office), Some(contexts), Some(tasks), Some(governance)) = (
            office.upgrade(),
            contexts.upgrade(),
            tasks.upgrade(),
            governance.upgrade(),
        ) else {
            return;
        };
        let mut seen = Vec::new();
        for notice in std::mem::take(&mut pending) {
            match notice {
                Notice::Release(_) => {
                    let (office, contexts, tasks) = (
                        Arc::clone(&office),
                        Arc::clone(&contexts),
                        Arc::clone(&tasks),
                    );
                    tokio::spawn(async move {
                        office.on_notice(&notice).await;
                        contexts.on_notice(&notice).await;
                        tasks.on_notice(&notice).await;
                    });
                }
                Notice::Mail { .. } => office.on_notice(&notice).await,
                // Said once, it is done for every time it was said.
                _ if seen.contains(&notice) => {}
                _ => {
                    office.on_notice(&notice).await;
                    contexts.on_notice(&notice).await;
                    governance.on_notice(&notice).await;
                    seen.push(notice);
                }
            }
        }
    }
}

/// Starts a tool's actors: all of them, or none (those already started are stopped again).
async fn start_all(
    tools_sup: &Supervisor,
    children: Vec<ChildSpec>,
) -> Result<(), SupervisorError> {
    let mut started = Vec::with_capacity(children.len());
    for child in children {
        let id = child.id().to_owned();
        if let Err(err) = tools_sup.start_child(child).await {
            for id in started {
                let _ = tools_sup.terminate_child(id).await;
            }
            return Err(err);
        }
        started.push(id);
    }
    Ok(())
}

/// One list of every tool's children, allocated at its exact size: `tools`' spec keeps it
/// for restarts, so a flattening `collect`'s doubling slack would be held for good.
fn flatten_exact(lists: Vec<Vec<ChildSpec>>) -> Vec<ChildSpec> {
    let mut all = Vec::with_capacity(lists.iter().map(Vec::len).sum());
    for list in lists {
        all.extend(list);
    }
    all
}

fn prepare<T: InitState>(
    tool: T,
    options: &ToolOptions,
    sweeper: &Arc<Sweeper>,
    governance: &Arc<Governance>,
) -> Result<PreparedTool<T>, RegistrationError> {
    let spec = ToolSpec::of(&tool)?;
    let idempotent = spec.annotations.idempotent_hint;
    let name: Arc<str> = Arc::from(spec.name.as_str());
    let breaker = Arc::new(SharedBreaker::new(options.breaker));
    let pool = WorkerPool::new(Arc::new(tool), options.grace);
    let children: Vec<ChildSpec> = pool
        .child_specs()
        .into_iter()
        .map(|c| {
            let (governance, tool) = (Arc::clone(governance), Arc::clone(&name));
            let starts = std::sync::atomic::AtomicU64::new(0);
            c.breaker(Arc::clone(&breaker))
                .backoff(options.backoff)
                .on_start(move |_| {
                    let restarts = starts.fetch_add(1, Ordering::Relaxed);
                    if restarts > 0 {
                        governance.emit(|| ToolEvent::Restarted {
                            tool: Arc::clone(&tool),
                            restarts,
                        });
                    }
                })
        })
        .collect();
    let service = pipeline::build(
        Arc::clone(&name),
        pool.clone(),
        options,
        breaker,
        Arc::clone(sweeper),
        idempotent,
        governance.events_sender(),
    );
    let meta = Arc::new(ToolMeta::new(
        Arc::clone(&name),
        spec.clone(),
        T::polls,
        Arc::clone(governance),
    ));
    // A typed result has no room for the hooks' notes; a model's reply carries them.
    let typed = Governed::new(layers::typed(service.clone()), Arc::clone(&meta), |_, _| {});
    let encode = |output, tool: &str| {
        serde_json::to_value(output)
            .map(ToolReply::new)
            .map_err(|e| CallError::InvalidOutput {
                tool: tool.to_owned(),
                reason: e.to_string(),
            })
    };
    let json = Governed::new(
        layers::json(service.clone(), encode),
        meta,
        |reply: &mut ToolReply, notes| reply.notes.extend(notes),
    );
    let handle = ToolHandle::new(typed, service, options.timeout);
    Ok(PreparedTool {
        prepared: Prepared {
            entry: Arc::new(ToolEntry {
                name,
                spec,
                handle: handle.clone(),
                json,
                pool,
                actor_ids: children.iter().map(|c| c.id().into()).collect(),
            }),
            children,
        },
        handle,
    })
}
