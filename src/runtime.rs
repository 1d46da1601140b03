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
//! └── <subsystem>   (each subsystem's children, in the order they were added: the task
//!                    board's `tasks`, the shell's `shells`, …)
//! ```
//!
//! A domain plugs in as a [`Subsystem`]: it installs its tools and children with what the
//! runtime gives it ([`Install`]), and hears when the tree runs, when an agent leaves, what
//! other servers say and when the runtime stops. The built-in ones (the `builtin` module) plug
//! in the same way an embedder's own do; this module names none of them.
//!
//! Tool actors are direct children of `tools`, one actor per tool and no per-tool supervisor,
//! which keeps a tool at about one ractor actor of memory. Isolation comes from one-for-one
//! restarts, each actor's own backoff, and each tool's breaker; `tools` has unlimited
//! intensity so no tool's crash loop can escalate and restart the others.

use std::any::Any;
use std::collections::BTreeMap;
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
use crate::agents::tools::{CheckInbox, MarkRead, MessageStatus, ReadMessage, SendMessage};
use crate::agents::{
    Agent, AgentDirectory, AgentRecord, AgentSpec, Credentials, MailError, MailboxConfig,
    PostOffice,
};
use crate::changes::Changes;
use crate::context::tools::{ContextGet, ContextHistory, ContextUpdate};
use crate::context::{ContextConfig, ContextHub, Sessions};
use crate::durable::Owner;
use crate::error::BuildError;
use crate::events::Events;
use crate::governance::{
    Governance, GovernanceConfig, Governed, ToolEvent, ToolMeta, ToolReply, layers, layers::Convert,
};
use crate::options::{CallOptions, ToolOptions};
use crate::pipeline::{self, Sweeper};
use crate::registry::{ErasedTool, ToolEntry, ToolHandle};
use crate::store::{self, Cluster, MemoryStore, Notice, Store};

const TOOLS: &str = "tools";

/// A running guildhall runtime. Cheap to clone; all clones share one tree. Call
/// [`shutdown`](Self::shutdown) to stop it and wait; dropping the last clone also stops the
/// tree, without waiting.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    tools: Tools,
    governance: Arc<Governance>,
    office: Arc<PostOffice>,
    contexts: Arc<ContextHub>,
    /// In the order they were added.
    subsystems: Vec<Arc<dyn Subsystem>>,
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
}

/// Finds a registered agent's role (see [`Install::role_of`]).
pub type RoleOf = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// What a [`Subsystem`]'s hooks return: a boxed future, so the trait stays object safe.
pub use futures::future::BoxFuture;

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
    /// The embedded store's page cache, bytes.
    store_cache: usize,
    mailbox: MailboxConfig,
    context: ContextConfig,
    governance: GovernanceConfig,
    credentials: Credentials,
    sweeper: Arc<Sweeper>,
    pending: Vec<Pending>,
    /// Installed in this order; their children start in it and stop in reverse.
    subsystems: Vec<Arc<dyn Subsystem>>,
    /// The subsystems' settings, by subsystem name ([`Install::section`]).
    sections: BTreeMap<String, toml::Table>,
}

/// What [`RuntimeBuilder::build`] opens first: the store and the core over it.
struct Core {
    store: Arc<dyn Store>,
    events: Events,
    /// What other servers sharing the store say, when it is shared.
    notices: Option<tokio::sync::broadcast::Receiver<Notice>>,
    office: Arc<PostOffice>,
    contexts: Arc<ContextHub>,
    governance: Arc<Governance>,
}

/// The runtime's tools, by name.
type Tools = DashMap<String, Arc<dyn ErasedTool>>;

/// The tools by name, and their actors' specs.
///
/// # Errors
/// [`RegistrationError::DuplicateName`] for a name given twice.
fn by_name(prepared: Vec<Prepared>) -> Result<(Tools, Vec<Vec<ChildSpec>>), BuildError> {
    let tools = DashMap::with_capacity(prepared.len());
    let mut children = Vec::with_capacity(prepared.len());
    for prepared in prepared {
        let name = prepared.entry.spec().name.clone();
        if tools.insert(name.clone(), prepared.entry).is_some() {
            return Err(RegistrationError::DuplicateName { name }.into());
        }
        children.push(prepared.children);
    }
    Ok((tools, children))
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
    /// The post office, for the crate's own tests of what the tools cannot reach.
    #[cfg(test)]
    pub(crate) fn post_office(&self) -> &Arc<PostOffice> {
        &self.inner.office
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

    /// The tools MCP's `tools/list` shows ([`ToolOptions::listed`]), sorted by name.
    pub fn listed_tools(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self
            .inner
            .tools
            .iter()
            .filter(|e| e.value().listed())
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
        self.register_encoded(tool, options, json_reply).await
    }

    /// Registers and starts a tool whose outputs a model is given as `encode` makes them
    /// (a proxied tool's: the server's result as it is), not as their JSON.
    pub(crate) async fn register_encoded<T: InitState>(
        &self,
        tool: T,
        options: ToolOptions,
        encode: Convert<T::Output, ToolReply>,
    ) -> Result<ToolHandle<T>, BuildError> {
        let PreparedTool { prepared, handle } = prepare(
            tool,
            &options,
            &self.inner.sweeper,
            &self.inner.governance,
            encode,
        )?;
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

    /// Searches the mail history of every agent: each message once, as sent, newest first
    /// (see [`MailSearch`](crate::agents::MailSearch) for the words it takes). What the
    /// recipients did with it is in each one's mail ([`Agent::message_status`] for the
    /// sender).
    ///
    /// # Errors
    /// [`MailError::InvalidArgument`] for a search that cannot be read; the store's error.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the search to finish on a blocking thread; nothing changes.
    pub async fn search_mail(
        &self,
        search: crate::agents::MailSearch,
    ) -> Result<crate::agents::MailFound, MailError> {
        self.search_mail_visible(search, Arc::new(|_: &str, _: &str| true))
            .await
    }

    /// The mail index's size once a search with words made it (`None` before): messages,
    /// distinct words, and about how many bytes it holds.
    pub fn mail_index_size(&self) -> Option<crate::agents::MailIndexSize> {
        self.inner.office.history.index_size()
    }

    /// As [`search_mail`](Self::search_mail), showing only what `visible` admits.
    pub(crate) async fn search_mail_visible(
        &self,
        search: crate::agents::MailSearch,
        visible: Arc<crate::agents::Visible>,
    ) -> Result<crate::agents::MailFound, MailError> {
        let office = Arc::clone(&self.inner.office);
        // What this server sent is searchable at once: the writer's buffer is written first.
        office.history.write_pending().await?;
        tokio::task::spawn_blocking(move || office.history.search(&search, &*visible))
            .await
            .map_err(|err| MailError::SearchStopped {
                reason: err.to_string(),
            })?
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

    /// The subsystem of type `T`, when one was added.
    pub fn subsystem<T: Subsystem>(&self) -> Option<&T> {
        self.inner
            .subsystems
            .iter()
            .find_map(|s| (&**s as &dyn Any).downcast_ref::<T>())
    }

    /// What each subsystem adds to `status`, by name, in the order they were added.
    pub fn subsystem_status(&self) -> Vec<(&'static str, Value)> {
        self.inner
            .subsystems
            .iter()
            .filter_map(|s| Some((s.name(), s.status()?)))
            .collect()
    }

    /// Waits for what each subsystem says a listing of tools waits for (a proxied server's
    /// first handshake, within its `listing_wait`), so a client that lists once sees them.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn settled(&self) {
        for subsystem in &self.inner.subsystems {
            subsystem.settling().await;
        }
    }

    /// What each subsystem adds to the metrics, by subsystem name.
    pub(crate) fn subsystem_metrics(&self) -> Vec<(&'static str, Metric)> {
        self.inner
            .subsystems
            .iter()
            .flat_map(|s| s.metrics().into_iter().map(|m| (s.name(), m)))
            .collect()
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
        for subsystem in self.inner.subsystems.iter().rev() {
            subsystem.stopping();
        }
        for entry in &self.inner.tools {
            entry.value().close();
        }
        if let Err(err) = self.inner.root.shutdown().await {
            tracing::debug!(error = %guildhall_actors::ErrorChain(&err), "root supervisor already stopped");
        }
        // No call is left to audit: write what the audit log holds; no send is left: write
        // what the mail log's writer holds.
        self.inner.governance.flush().await;
        if let Err(err) = self.inner.office.history.write_pending().await {
            tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "could not write the mail log");
        }
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

/// A live connection acting as an agent. When the agent's last one ends, the subsystems are
/// told, so what outlives a connection only for its agent's sake (background shells) ends.
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
            for subsystem in &inner.subsystems {
                subsystem.agent_left(&self.agent);
            }
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
    /// A builder of the runtime's core alone: agents and their mailboxes, session context,
    /// governance, and the tools of these, with no subsystem (not even the task board,
    /// which [`Runtime::builder`] adds).
    pub fn core() -> Self {
        Self {
            defaults: ToolOptions::default(),
            store: StoreChoice::Memory,
            #[cfg(feature = "postgres")]
            store_url: None,
            #[cfg(feature = "postgres")]
            store_lease: crate::store::DEFAULT_LEASE,
            store_cache: crate::store::DEFAULT_CACHE_BYTES,
            mailbox: MailboxConfig::default(),
            context: ContextConfig::default(),
            governance: GovernanceConfig::default(),
            credentials: Credentials::default(),
            sweeper: Sweeper::new(DEADLINE_RESOLUTION),
            pending: Vec::new(),
            subsystems: Vec::new(),
            sections: BTreeMap::new(),
        }
    }

    /// The subsystems' settings: each table is the section of the subsystem of that name,
    /// read with [`Install::section`] (`[subsystems.NAME]` of `guildhall.toml`, as
    /// `Config::subsystems`). A table named for no subsystem of this runtime fails the
    /// build: a misspelt name is not ignored.
    pub fn sections(mut self, sections: BTreeMap<String, toml::Table>) -> Self {
        self.sections = sections;
        self
    }

    /// Adds `subsystem`: installed at [`build`](Self::build) after those added before it,
    /// its children started after theirs and stopped before.
    pub fn subsystem(mut self, subsystem: impl Subsystem) -> Self {
        self.subsystems.push(Arc::new(subsystem));
        self
    }

    /// Puts `subsystem` in the place of the one of its type, or adds it when there is none.
    pub fn replace_subsystem<T: Subsystem>(mut self, subsystem: T) -> Self {
        let place = self
            .subsystems
            .iter()
            .position(|s| (&**s as &dyn Any).is::<T>());
        match place {
            Some(i) => self.subsystems[i] = Arc::new(subsystem),
            None => self.subsystems.push(Arc::new(subsystem)),
        }
        self
    }

    /// Adds a tool with the default options.
    pub fn tool<T: InitState>(self, tool: T) -> Self {
        let options = self.defaults.clone();
        self.tool_with(tool, options)
    }

    /// Adds a tool with its own options.
    pub fn tool_with<T: InitState>(mut self, tool: T, options: ToolOptions) -> Self {
        self.pending.push(Box::new(move |sweeper, governance| {
            prepare(tool, &options, sweeper, governance, json_reply).map(|p| p.prepared)
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

    /// The most memory the embedded store of [`data_dir`](Self::data_dir) keeps as its page
    /// cache (default [`DEFAULT_CACHE_BYTES`](crate::store::DEFAULT_CACHE_BYTES)): a
    /// server's memory grows by up to this much as its store is used.
    pub fn store_cache(mut self, bytes: usize) -> Self {
        self.store_cache = bytes;
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

    /// Opens the store and the core, installs each subsystem, validates every tool, starts
    /// the tree, then tells each subsystem it runs.
    ///
    /// # Errors
    /// [`BuildError::Section`] for settings no subsystem takes (nothing is opened),
    /// [`BuildError::Store`] and the core's own errors when the store cannot be read,
    /// [`BuildError::Registration`] for the first invalid or duplicate tool and
    /// [`BuildError::Subsystem`] for a subsystem that cannot install (nothing is started),
    /// [`BuildError::Supervision`] if the tree fails to start, and a subsystem's error once
    /// it runs (the runtime is shut down again).
    ///
    /// # Cancel safety
    /// Not cancel safe: await it to completion. Dropped part way, it may leave the store open
    /// and actors started with no [`Runtime`] to shut them down.
    pub async fn build(mut self) -> Result<Runtime, BuildError> {
        self.check_sections()?;
        let core = self.open_core()?;
        let (tools, subsystem_children) = self.install(&core).await?;
        let (tools, tool_children) = by_name(tools)?;
        let tools_sup: Arc<RwLock<Option<Supervisor>>> = Arc::default();
        let root_spec = SupervisorSpec::new(Strategy::OneForOne)
            .child(tools_supervisor_spec(tool_children, &tools_sup))
            .child(core.office.supervisor_spec())
            .child(core.contexts.supervisor_spec());
        let root_spec = subsystem_children
            .into_iter()
            .fold(root_spec, SupervisorSpec::child);
        let (root, _) = Supervisor::spawn(root_spec, None).await?;
        self.sweeper.start();
        core.office.start_sweep();
        core.office.start_held_sweep();
        core.contexts.start_sweep();
        if let Some(notices) = core.notices {
            tokio::spawn(follow_cluster(
                notices,
                Arc::downgrade(&core.office),
                Arc::downgrade(&core.contexts),
                Arc::downgrade(&core.governance),
                self.subsystems.iter().map(Arc::downgrade).collect(),
            ));
        }
        let runtime = Runtime {
            inner: Arc::new(Inner {
                tools,
                governance: core.governance,
                office: core.office,
                contexts: core.contexts,
                subsystems: self.subsystems,
                root,
                tools_sup,
                defaults: self.defaults,
                sweeper: self.sweeper,
                stopping: AtomicBool::new(false),
                tool_set: tokio::sync::watch::Sender::new(0),
                credentials: self.credentials,
            }),
        };
        for subsystem in &runtime.inner.subsystems {
            if let Err(err) = subsystem.started(&runtime).await {
                runtime.shutdown().await;
                return Err(err);
            }
        }
        Ok(runtime)
    }

    /// Fails on a section named for no subsystem (before anything is opened).
    fn check_sections(&self) -> Result<(), BuildError> {
        let Some(name) = self
            .sections
            .keys()
            .find(|name| !self.subsystems.iter().any(|s| s.name() == name.as_str()))
        else {
            return Ok(());
        };
        let known: Vec<&str> = self.subsystems.iter().map(|s| s.name()).collect();
        Err(BuildError::Section {
            name: name.clone(),
            reason: format!(
                "no subsystem of this runtime is named so (its subsystems: {})",
                known.join(", ")
            ),
        })
    }

    /// The store and the core over it: events, the post office, the sessions, governance.
    fn open_core(&mut self) -> Result<Core, BuildError> {
        let store = self.open_store()?;
        let data_dir = match &self.store {
            StoreChoice::Dir(dir) => Some(dir.clone()),
            _ => None,
        };
        // One event stream for the whole runtime: calls, tools, mail, agents.
        let events = Events::default();
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
        let governance = Governance::start(
            std::mem::take(&mut self.governance),
            Arc::clone(&office),
            Arc::clone(&contexts),
            Arc::clone(&store),
            data_dir,
            events.clone(),
        )?;
        Ok(Core {
            store,
            events,
            notices,
            office,
            contexts,
            governance,
        })
    }

    /// Every tool prepared (those given to the builder, each subsystem's, the core's) and
    /// the subsystems' children, in the order added.
    async fn install(
        &mut self,
        core: &Core,
    ) -> Result<(Vec<Prepared>, Vec<ChildSpec>), BuildError> {
        let mut install = Install {
            installing: "",
            sections: &self.sections,
            store: &core.store,
            events: &core.events,
            governance: &core.governance,
            office: &core.office,
            defaults: &self.defaults,
            sweeper: &self.sweeper,
            tools: Vec::with_capacity(self.pending.len() + 16),
            children: Vec::new(),
            sandbox_of: None,
            confining: false,
        };
        for pending in std::mem::take(&mut self.pending) {
            install
                .tools
                .push(pending(&self.sweeper, &core.governance)?);
        }
        for subsystem in &self.subsystems {
            install.installing = subsystem.name();
            subsystem.install(&mut install).await?;
        }
        core_tools(&mut install, &core.contexts, self.mailbox.max_wait)?;
        Ok((install.tools, install.children))
    }

    /// The store chosen: in memory, in a directory, given, or at a database URL.
    fn open_store(&self) -> Result<Arc<dyn Store>, BuildError> {
        Ok(match self.store {
            #[cfg(feature = "postgres")]
            _ if self.store_url.is_some() => Arc::new(crate::store::PostgresStore::open_url(
                self.store_url.as_deref().unwrap_or_default(),
                self.store_lease,
            )?),
            StoreChoice::Memory => Arc::new(MemoryStore::new()),
            StoreChoice::Dir(ref dir) => {
                Arc::new(store::RedbStore::open_with_cache(dir, self.store_cache)?)
            }
            StoreChoice::Given(ref store) => Arc::clone(store),
        })
    }
}

/// The core's own tools: the mailbox tools, `whoami`, `set_mode`, `list_agents` and the
/// context tools.
fn core_tools(
    install: &mut Install<'_>,
    contexts: &Arc<ContextHub>,
    max_wait: Duration,
) -> Result<(), RegistrationError> {
    let office = Arc::clone(install.office);
    // The mailbox tools wait up to `max_wait` by design; their deadline allows for it.
    let mail = install
        .defaults()
        .clone()
        .timeout(max_wait + Duration::from_secs(10));
    install.tool_with(SendMessage(Arc::clone(&office)), mail.clone())?;
    install.tool_with(CheckInbox(Arc::clone(&office)), mail.clone())?;
    install.tool_with(ReadMessage(Arc::clone(&office)), mail.clone())?;
    install.tool_with(MarkRead(Arc::clone(&office)), mail)?;
    install.tool(MessageStatus(Arc::clone(&office)))?;
    let sandbox_of = install.sandbox_of.take();
    install.tool(WhoAmI(Arc::clone(&office), sandbox_of))?;
    install.tool(crate::governance::SetMode(Arc::clone(install.governance)))?;
    install.tool(ListAgents(office))?;
    install.tool(ContextGet(Arc::clone(contexts)))?;
    install.tool(ContextUpdate(Arc::clone(contexts)))?;
    install.tool(ContextHistory(Arc::clone(contexts)))?;
    Ok(())
}

/// The `tools` supervisor over every tool's actors. One broken tool must not take the
/// others down: restarts never escalate from here. It publishes itself in `slot` at every
/// (re)start, so a `tools` restarted by root is found too.
fn tools_supervisor_spec(
    children: Vec<Vec<ChildSpec>>,
    slot: &Arc<RwLock<Option<Supervisor>>>,
) -> ChildSpec {
    let spec = SupervisorSpec {
        strategy: Strategy::OneForOne,
        intensity: RestartIntensity::new(u32::MAX, Duration::from_secs(10)),
        backoff: Backoff::default(),
        children: flatten_exact(children),
    };
    let slot = Arc::clone(slot);
    ChildSpec::supervisor(TOOLS, spec).on_start(move |cell| {
        *slot.write().unwrap_or_else(PoisonError::into_inner) =
            Some(Supervisor::from_ref(cell.clone().into()));
    })
}

/// A domain that plugs into the runtime: what it gives (its tools, its children under the
/// root, what it adds to `status` and `whoami`) and what it gets ([`Install`]: the store,
/// the events, governance, the agents' roles). The runtime calls it at these points, each
/// subsystem in the order added (the stop in reverse):
///
/// 1. [`install`](Self::install), at build, after the store, the agents, context and
///    governance exist and before the tree starts: its tools and children are part of the
///    tree from the start, restarted with it, stopped in order with it;
/// 2. [`started`](Self::started), once the tree runs (where one starts what needs a
///    running runtime, such as connecting to servers whose tools come later);
/// 3. while serving, [`agent_left`](Self::agent_left) and
///    [`on_notice`](Self::on_notice);
/// 4. [`stopping`](Self::stopping), at shutdown, before the tree stops.
///
/// # Examples
///
/// A subsystem with a tool of its own and a section in `status`:
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use guildhall::runtime::{BoxFuture, Install, Subsystem};
/// use guildhall::{BuildError, CallContext, CallOptions, Runtime, Tool};
/// use schemars::JsonSchema;
/// use serde::{Deserialize, Serialize};
///
/// /// Counts what agents ask it to.
/// #[derive(Default)]
/// struct Counter(Arc<AtomicU64>);
///
/// #[derive(Clone, Serialize, Deserialize, JsonSchema)]
/// struct Add { by: u64 }
///
/// #[derive(Serialize, JsonSchema)]
/// struct Total { total: u64 }
///
/// struct Count(Arc<AtomicU64>);
///
/// impl Tool for Count {
///     type Input = Add;
///     type Output = Total;
///     type Error = std::convert::Infallible;
///     type State = ();
///     fn name(&self) -> &str { "count" }
///     fn description(&self) -> &str { "Adds to the counter." }
///     async fn call(&self, _: &mut (), add: Add, _: CallContext) -> Result<Total, Self::Error> {
///         Ok(Total { total: self.0.fetch_add(add.by, Ordering::Relaxed) + add.by })
///     }
/// }
///
/// impl Subsystem for Counter {
///     fn name(&self) -> &'static str {
///         "counter"
///     }
///
///     fn install<'a>(
///         &'a self,
///         install: &'a mut Install<'_>,
///     ) -> BoxFuture<'a, Result<(), BuildError>> {
///         Box::pin(async move {
///             install.tool(Count(Arc::clone(&self.0)))?;
///             Ok(())
///         })
///     }
///
///     fn status(&self) -> Option<serde_json::Value> {
///         Some(serde_json::json!({ "total": self.0.load(Ordering::Relaxed) }))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let runtime = Runtime::builder().subsystem(Counter::default()).build().await?;
/// let out = runtime
///     .call_json("count", serde_json::json!({ "by": 2 }), CallOptions::new())
///     .await?;
/// assert_eq!(out["total"], 2);
/// let status = runtime.subsystem_status();
/// assert!(status.contains(&("counter", serde_json::json!({ "total": 2 }))));
/// runtime.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub trait Subsystem: Any + Send + Sync {
    /// Its name, in `status` and in logs.
    fn name(&self) -> &'static str;

    /// Adds its tools and children to the runtime being built.
    ///
    /// # Errors
    /// What stops the build: an invalid or duplicate tool, a setting that cannot work.
    fn install<'a>(&'a self, install: &'a mut Install<'_>)
    -> BoxFuture<'a, Result<(), BuildError>>;

    /// The tree runs: start what needs a running runtime.
    ///
    /// # Errors
    /// What stops the build (the runtime is shut down again).
    fn started<'a>(&'a self, _runtime: &'a Runtime) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async { Ok(()) })
    }

    /// What it adds to `status`, if anything.
    fn status(&self) -> Option<Value> {
        None
    }

    /// What it adds to the metrics (`GET /metrics`), read at each scrape: each one is
    /// named `guildhall_<subsystem>_<name>`. Read what is at hand; a scrape waits for it.
    fn metrics(&self) -> Vec<Metric> {
        Vec::new()
    }

    /// What a listing of tools (and of resources and prompts) waits for before it answers:
    /// its tools still on their way (a proxied server's first handshake). It must end by
    /// itself within a bound the subsystem names; the default waits for nothing.
    fn settling(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Agent `agent`'s last live connection ended.
    fn agent_left(&self, _agent: &str) {}

    /// What another server sharing the store says (a hand-over, a change to read again).
    fn on_notice<'a>(&'a self, _notice: &'a Notice) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// The runtime is stopping: end what is not in the tree (a sweep, a timer). Its
    /// children stop with the tree after this.
    fn stopping(&self) {}
}

/// A number a [`Subsystem`] reports at each metrics scrape: a gauge or a counter, with
/// one sample per set of labels.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Metric {
    /// Its name after `guildhall_<subsystem>_`: lowercase letters, digits and `_`.
    pub name: &'static str,
    /// What it counts, for the `# HELP` line.
    pub help: &'static str,
    /// A counter only grows; a gauge is read as it is.
    pub counter: bool,
    /// Its samples: labels (name, value) and the number.
    pub samples: Vec<(Vec<(String, String)>, f64)>,
}

impl Metric {
    /// A gauge with no samples yet.
    pub fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            counter: false,
            samples: Vec::new(),
        }
    }

    /// A counter with no samples yet.
    pub fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            counter: true,
            ..Self::gauge(name, help)
        }
    }

    /// Adds a sample with `labels`.
    #[must_use]
    pub fn sample(mut self, labels: &[(&str, &str)], value: f64) -> Self {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples.push((labels, value));
        self
    }

    /// Adds a sample with no labels.
    #[must_use]
    pub fn value(self, value: f64) -> Self {
        self.sample(&[], value)
    }
}

/// How a domain that needs the tree running plugs in (proxied servers, command tools,
/// launched agents: their tools come and go while the runtime runs): a [`Subsystem`] that
/// runs `start` on the running runtime and keeps what it returns, for
/// [`Runtime::subsystem`] to find as `AfterStart<T>` and [`get`](Self::get) to hand out.
pub struct AfterStart<T: Send + Sync + 'static> {
    name: &'static str,
    start: std::sync::Mutex<Option<StartFn<T>>>,
    started: std::sync::OnceLock<T>,
    settle: Option<SettleFn<T>>,
}

/// What an [`AfterStart`] runs once the tree runs.
type StartFn<T> = Box<dyn FnOnce(Runtime) -> BoxFuture<'static, Result<T, String>> + Send>;

/// What a listing waits for, of what an [`AfterStart`] started.
type SettleFn<T> = Box<dyn Fn(&T) -> BoxFuture<'static, ()> + Send + Sync>;

impl<T: Send + Sync + 'static> AfterStart<T> {
    /// A subsystem named `name` that runs `start` once the tree runs; an error it returns
    /// fails the build.
    pub fn new<F>(name: &'static str, start: impl FnOnce(Runtime) -> F + Send + 'static) -> Self
    where
        F: std::future::Future<Output = Result<T, String>> + Send + 'static,
    {
        Self {
            name,
            start: std::sync::Mutex::new(Some(Box::new(move |runtime| Box::pin(start(runtime))))),
            started: std::sync::OnceLock::new(),
            settle: None,
        }
    }

    /// What a listing of tools waits for once it started ([`Subsystem::settling`]): what
    /// `settle` returns for what `start` returned (bounded by it).
    #[must_use]
    pub fn settling<F>(mut self, settle: impl Fn(&T) -> F + Send + Sync + 'static) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.settle = Some(Box::new(move |started| Box::pin(settle(started))));
        self
    }

    /// What `start` returned, once it ran.
    pub fn get(&self) -> Option<&T> {
        self.started.get()
    }
}

impl<T: Send + Sync + 'static> Subsystem for AfterStart<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn install<'a>(&'a self, _: &'a mut Install<'_>) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async { Ok(()) })
    }

    fn started<'a>(&'a self, runtime: &'a Runtime) -> BoxFuture<'a, Result<(), BuildError>> {
        let start = self
            .start
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        Box::pin(async move {
            let Some(start) = start else {
                return Ok(());
            };
            let started = start(runtime.clone())
                .await
                .map_err(|reason| BuildError::Subsystem {
                    name: self.name,
                    reason,
                })?;
            let _ = self.started.set(started);
            Ok(())
        })
    }

    fn settling(&self) -> BoxFuture<'_, ()> {
        match (&self.settle, self.started.get()) {
            (Some(settle), Some(started)) => settle(started),
            _ => Box::pin(async {}),
        }
    }
}

/// What a [`Subsystem`] gets as it installs: the runtime's store, events, governance and
/// agents' directory, and where it adds its tools and children.
pub struct Install<'a> {
    /// The subsystem installing now: whose section [`section`](Self::section) reads.
    installing: &'static str,
    sections: &'a BTreeMap<String, toml::Table>,
    store: &'a Arc<dyn Store>,
    events: &'a Events,
    governance: &'a Arc<Governance>,
    office: &'a Arc<PostOffice>,
    defaults: &'a ToolOptions,
    sweeper: &'a Arc<Sweeper>,
    tools: Vec<Prepared>,
    children: Vec<ChildSpec>,
    /// What `whoami` says of an agent's sandbox, from the subsystem that knows it.
    sandbox_of: Option<crate::agents::roster::SandboxOf>,
    /// Whether `sandbox_of` is the sandbox processes started for agents are confined by.
    confining: bool,
}

impl Install<'_> {
    /// Adds a tool with the runtime's default options.
    ///
    /// # Errors
    /// [`RegistrationError`] for an invalid tool (a duplicate name is found at the end of
    /// the build).
    pub fn tool<T: InitState>(&mut self, tool: T) -> Result<(), RegistrationError> {
        let options = self.defaults.clone();
        self.tool_with(tool, options)
    }

    /// Adds a tool with its own options.
    ///
    /// # Errors
    /// As [`tool`](Self::tool).
    pub fn tool_with<T: InitState>(
        &mut self,
        tool: T,
        options: ToolOptions,
    ) -> Result<(), RegistrationError> {
        let prepared = prepare(tool, &options, self.sweeper, self.governance, json_reply)?;
        self.tools.push(prepared.prepared);
        Ok(())
    }

    /// This subsystem's settings: the table given for its name to
    /// [`RuntimeBuilder::sections`] (`[subsystems.NAME]` of `guildhall.toml`), if any.
    ///
    /// # Errors
    /// [`BuildError::Section`] when the table does not fit `T`, with serde's reason (the
    /// field that is unknown, missing or of the wrong type).
    pub fn section<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, BuildError> {
        let Some(table) = self.sections.get(self.installing) else {
            return Ok(None);
        };
        table
            .clone()
            .try_into()
            .map(Some)
            .map_err(|err: toml::de::Error| BuildError::Section {
                name: self.installing.to_owned(),
                reason: err.message().to_owned(),
            })
    }

    /// The options tools get unless given their own.
    pub fn defaults(&self) -> &ToolOptions {
        self.defaults
    }

    /// Adds a child under the root, started after the core's and the children added
    /// before it, stopped before them.
    pub fn child(&mut self, child: ChildSpec) {
        self.children.push(child);
    }

    /// The runtime's store.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.store
    }

    /// The runtime's event stream.
    pub fn events(&self) -> &Events {
        self.events
    }

    /// Permission rules, hooks, the audit log.
    pub fn governance(&self) -> &Arc<Governance> {
        self.governance
    }

    /// The agents' directory, for as long as the runtime lives.
    pub fn agents(&self) -> AgentDirectory {
        AgentDirectory::of(self.office)
    }

    /// Finds a registered agent's role (for settings that depend on it), for as long as
    /// the runtime lives.
    pub fn role_of(&self) -> RoleOf {
        let agents = self.agents();
        Box::new(move |agent| Some(agents.get(agent)?.role.clone()))
    }

    /// The agents, for the built-in subsystems that mail them.
    pub(crate) fn office(&self) -> &Arc<PostOffice> {
        self.office
    }

    /// Sets what `whoami` says of an agent's sandbox, unless the sandbox processes are
    /// confined by said it (the shell's own sandbox says this).
    pub(crate) fn describe_sandbox(&mut self, sandbox_of: crate::agents::roster::SandboxOf) {
        if !self.confining {
            self.sandbox_of = Some(sandbox_of);
        }
    }

    /// Sets what `whoami` says of an agent's sandbox: the one processes started for agents
    /// run in.
    pub(crate) fn describe_confining_sandbox(
        &mut self,
        sandbox_of: crate::agents::roster::SandboxOf,
    ) {
        self.sandbox_of = Some(sandbox_of);
        self.confining = true;
    }
}

/// Acts on what other servers sharing the store say, until the runtime or the store ends.
/// Hand-overs run apart, so that one slow stop does not hold the notices behind it; a run
/// of notices that each say "read the directory again" is read once.
async fn follow_cluster(
    mut notices: tokio::sync::broadcast::Receiver<crate::store::Notice>,
    office: std::sync::Weak<PostOffice>,
    contexts: std::sync::Weak<ContextHub>,
    governance: std::sync::Weak<Governance>,
    subsystems: Vec<std::sync::Weak<dyn Subsystem>>,
) {
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
        let (Some(office), Some(contexts), Some(governance)) =
            (office.upgrade(), contexts.upgrade(), governance.upgrade())
        else {
            return;
        };
        let subsystems: Vec<Arc<dyn Subsystem>> = subsystems
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let mut seen = Vec::new();
        for notice in std::mem::take(&mut pending) {
            match notice {
                Notice::Release(_) => {
                    let (office, contexts, subsystems) = (
                        Arc::clone(&office),
                        Arc::clone(&contexts),
                        subsystems.clone(),
                    );
                    tokio::spawn(async move {
                        office.on_notice(&notice).await;
                        contexts.on_notice(&notice).await;
                        for subsystem in &subsystems {
                            subsystem.on_notice(&notice).await;
                        }
                    });
                }
                Notice::Mail { .. } => office.on_notice(&notice).await,
                // Said once, it is done for every time it was said.
                _ if seen.contains(&notice) => {}
                _ => {
                    office.on_notice(&notice).await;
                    contexts.on_notice(&notice).await;
                    governance.on_notice(&notice).await;
                    for subsystem in &subsystems {
                        subsystem.on_notice(&notice).await;
                    }
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

/// A tool's output as a model is given it: its JSON.
fn json_reply<O: serde::Serialize>(output: O, tool: &str) -> Result<ToolReply, CallError> {
    serde_json::to_value(output)
        .map(ToolReply::new)
        .map_err(|e| CallError::InvalidOutput {
            tool: tool.to_owned(),
            reason: e.to_string(),
        })
}

fn prepare<T: InitState>(
    tool: T,
    options: &ToolOptions,
    sweeper: &Arc<Sweeper>,
    governance: &Arc<Governance>,
    encode: Convert<T::Output, ToolReply>,
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
                listed: options.listed,
            }),
            children,
        },
        handle,
    })
}
