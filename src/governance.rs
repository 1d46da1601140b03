//! Call governance: what every call passes before and after it reaches a tool's pipeline.
//!
//! Each stage is a tower layer in [`layers`] (its order table says why each sits where it
//! does); [`Governed`] is a tool's stack of them as the registry calls it, typed and JSON
//! alike, so no call passes by governance unless nothing is configured for it to do (a
//! typed call then goes straight to the pipeline). What the stages judge by lives in the
//! modules beside it:
//!
//! | concern | module | layer |
//! |---|---|---|
//! | audit log and events | [`audit`], [`events`](crate::events) | [`layers::AuditLayer`] |
//! | rate limits | [`limits`] | [`layers::RateLimitLayer`] |
//! | hooks | [`hooks`] | [`layers::HooksLayer`] |
//! | permission rules, asking | [`rules`], [`asker`] | [`layers::PermissionLayer`] |
//! | loop guard | [`doom`] | [`layers::LoopGuardLayer`] |
//! | result cache (JSON calls) | [`cache`] | [`layers::CacheLayer`] |
//! | truncation (JSON calls) | [`truncate`] | [`layers::TruncateLayer`] |
//! | the tool's pipeline | [`crate::pipeline`] | [`layers::Pipeline`] |

pub mod asker;
pub mod audit;
pub mod cache;
mod call;
pub mod call_stats;
pub mod doom;
pub mod hooks;
pub mod layers;
pub mod limits;
pub mod mode;
mod reply;
pub mod rules;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) mod sandboxed;
mod service;
pub mod set_mode;
mod shorten;
pub mod truncate;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use dashmap::DashMap;
use guildhall_actors::ToolSpec;
use rustc_hash::FxBuildHasher;
use serde_json::Value;

pub use crate::events::{EventStream, ToolEvent};
pub use asker::{Approval, AskRequest, Asker};
pub use audit::{AuditLog, AuditQuery, AuditRecord, Outcome};
pub use call::{Call, CallScope, Decided, ToolMeta};
pub use hooks::{CommandHook, Hook, HookInput, HookReply, Hooks, Phase, RegisteredHook};
pub use limits::Rate;
pub use mode::Mode;
pub use reply::ToolReply;
pub(crate) use reply::texts;
pub use rules::{Action, Glob, Rule, Scope, ScopedRules, Trust, Verdict};
pub use service::{Governed, GovernedFuture};
pub use set_mode::SetMode;

use crate::agents::PostOffice;
use crate::context::ContextHub;
use crate::events::Events;
use crate::store::{self, Batch, Notice, Store, StoreError, Table, codec};
use doom::{LoopConfig, LoopGuard};
use limits::RateLimits;
use truncate::{Limits, Spill};

/// Rules and trust for a role or an agent.
#[derive(Debug, Clone, Default)]
pub struct Principal {
    /// Its trust level, if set here.
    pub trust: Option<Trust>,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
    /// For an agent: the role the config gives it. A role an agent merely claims (its
    /// client registered it so) may lower its trust, never raise it: that role's allow rules
    /// and a role trust above the default apply only to agents the config gives the role.
    pub role: Option<String>,
}

/// Per-tool settings.
#[derive(Debug, Clone, Default)]
pub struct ToolPolicy {
    /// Truncation limits for this tool, instead of the defaults.
    pub truncate: Option<Limits>,
    /// Calls admitted per period for this tool (all callers together).
    pub rate: Option<Rate>,
    /// Declares the tool deterministic and caches its JSON results this long.
    pub cache_ttl: Option<Duration>,
}

/// Everything governance is told. The defaults let every call through (autonomous trust,
/// no rules, no hooks), with the loop guard at 3, truncation at 2,000 lines / 50 KiB, and
/// the audit log on.
#[derive(Debug, Clone)]
pub struct GovernanceConfig {
    /// The trust of agents whose role and own settings name none.
    pub trust: Trust,
    /// Config-scope rules.
    pub rules: Vec<Rule>,
    /// Per role.
    pub roles: BTreeMap<String, Principal>,
    /// Per agent.
    pub agents: BTreeMap<String, Principal>,
    /// Hooks.
    pub hooks: Vec<RegisteredHook>,
    /// The loop guard.
    pub doom_loop: LoopConfig,
    /// Default truncation limits.
    pub truncate: Limits,
    /// How long spill files are kept.
    pub spill_retention: Duration,
    /// Where spill files go (`<data dir>/spill` by default).
    pub spill_dir: Option<PathBuf>,
    /// Per tool.
    pub tools: BTreeMap<String, ToolPolicy>,
    /// Calls admitted per period for each agent, across its tools.
    pub agent_rate: Option<Rate>,
    /// Whether calls are audited.
    pub audit: bool,
    /// How long audit records are kept.
    pub audit_retention: Duration,
    /// Working modes to start in, by agent id or `role:NAME` (`build` when absent).
    pub modes: BTreeMap<String, Mode>,
}

impl Default for GovernanceConfig {
    fn default() -> Self {
        Self {
            trust: Trust::default(),
            rules: Vec::new(),
            roles: BTreeMap::new(),
            agents: BTreeMap::new(),
            hooks: Vec::new(),
            doom_loop: LoopConfig::default(),
            truncate: Limits::default(),
            spill_retention: Duration::from_secs(7 * 86_400),
            spill_dir: None,
            tools: BTreeMap::new(),
            agent_rate: None,
            audit: true,
            audit_retention: Duration::from_secs(90 * 86_400),
            modes: BTreeMap::new(),
        }
    }
}

/// An agent and its session, if any.
type AgentSession = (Arc<str>, Option<Arc<str>>);
/// A tool ([`ToolMeta::id`]) and a hash of its caller's id (0: the embedding program). A
/// lookup builds it without cloning the caller's id, whose count every call of that agent
/// writes; the entry holds the id itself, compared on a hit.
type CallerTool = (u64, u64);

/// A decision kept for a caller and a tool.
struct Remembered {
    /// The caller (none: the embedding program).
    agent: Option<Arc<str>>,
    /// The approvals' and modes' generation it was made in.
    generation: u64,
    verdict: Arc<Verdict>,
}

/// What the permission layer needs of a [`Verdict`], taken from the cached one without
/// touching its count (each call to a tool would write it).
pub(crate) struct Ruling {
    pub(crate) action: Action,
    pub(crate) label: Arc<str>,
    pub(crate) asking_rule: Option<Rule>,
}

impl Ruling {
    fn of(verdict: &Verdict) -> Self {
        Self {
            action: verdict.action,
            label: Arc::clone(&verdict.label),
            asking_rule: verdict.asking_rule.clone(),
        }
    }
}

/// The caller half of a [`CallerTool`].
fn caller_hash(agent: Option<&Arc<str>>) -> u64 {
    agent.map_or(0, |a| xxhash_rust::xxh3::xxh3_64(a.as_bytes()))
}

impl GovernanceConfig {
    /// No governance stage does anything: no rules, no hooks, no loop guard, no audit. Calls
    /// still pass the layer (it is part of every stack) but only pay for a check. For
    /// embedders that govern calls themselves, and for measuring the bare pipeline.
    pub fn off() -> Self {
        Self {
            doom_loop: LoopConfig {
                threshold: 0,
                ..LoopConfig::default()
            },
            audit: false,
            ..Self::default()
        }
    }

    /// Whether this configuration does nothing to typed calls, so they can go straight to
    /// the pipeline (events are still checked per call).
    fn is_off(&self) -> bool {
        self.rules.is_empty()
            && self.trust == Trust::Autonomous
            && self
                .roles
                .values()
                .all(|p| p.rules.is_empty() && p.trust.is_none_or(|t| t == Trust::Autonomous))
            && self
                .agents
                .values()
                .all(|p| p.rules.is_empty() && p.trust.is_none_or(|t| t == Trust::Autonomous))
            && self.hooks.is_empty()
            && self.doom_loop.threshold == 0
            && self.tools.values().all(|p| p.rate.is_none())
            && self.agent_rate.is_none()
            && self.modes.is_empty()
            && !self.audit
    }
}

/// The shared state of every [`Governed`] layer.
pub struct Governance {
    config: GovernanceConfig,
    hooks: Hooks,
    office: Arc<PostOffice>,
    contexts: Arc<ContextHub>,
    store: Arc<dyn Store>,
    /// "Always" approvals, by agent (also in the store).
    lasting: RwLock<HashMap<String, Vec<Rule>>>,
    /// "Session" approvals, by agent and session.
    session: DashMap<AgentSession, Vec<Rule>, FxBuildHasher>,
    /// Whether any session approval exists, checked before looking one up.
    any_session_approval: std::sync::atomic::AtomicBool,
    /// Bumped when lasting approvals change.
    approvals_generation: AtomicU64,
    /// Decisions that depend on no argument, by caller and tool.
    decided: DashMap<CallerTool, Remembered, FxBuildHasher>,
    /// Modes set with `set_mode`, by agent (the config's otherwise).
    modes: DashMap<Arc<str>, Mode, FxBuildHasher>,
    /// Bumped when a mode is set.
    modes_generation: AtomicU64,
    loops: LoopGuard,
    limits: RateLimits,
    cache: cache::ResultCache,
    audit: Option<AuditLog>,
    events: Events,
    /// Calls counted by tool and outcome, for the metrics.
    call_stats: call_stats::CallStats,
    spill: Spill,
    /// Nothing to do for typed calls (see [`GovernanceConfig::is_off`]), unless approvals
    /// were stored by an earlier, governed run.
    passive: bool,
    /// The hourly housekeeping task, stopped with governance.
    housekeeping: std::sync::OnceLock<tokio::task::AbortHandle>,
}

impl Drop for Governance {
    fn drop(&mut self) {
        if let Some(task) = self.housekeeping.get() {
            task.abort();
        }
    }
}

/// Remembered decisions kept at most: far beyond a swarm's callers times its tools (one
/// entry, about 80 bytes, per pair), so reaching it means something churns.
const DECISIONS_KEPT: usize = 65_536;

/// How often old spill files and idle rate-limit state are cleared.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(3600);

/// Now and every hour: deletes old spill files, forgets agents whose rate limits have
/// fully recovered, and forgets what was remembered of departed agents and tools, so none
/// of it grows over weeks of agents and servers coming and going.
async fn housekeeping(governance: std::sync::Weak<Governance>) {
    let mut every = tokio::time::interval(HOUSEKEEPING_EVERY);
    loop {
        every.tick().await;
        let Some(live) = governance.upgrade() else {
            return;
        };
        live.limits.forget_idle();
        live.forget_departed();
        let spill = live.spill.clone();
        drop(live);
        let _ = tokio::task::spawn_blocking(move || spill.sweep()).await;
    }
}

/// What a server sharing the store announces when it grants a lasting approval.
const APPROVALS: &str = "approvals";

/// The lasting approvals in `store`, by agent.
fn read_lasting(store: &dyn Store) -> Result<HashMap<String, Vec<Rule>>, StoreError> {
    let mut lasting: HashMap<String, Vec<Rule>> = HashMap::new();
    store::scan_values(store, Table::Approvals, &[], |key, rule: Rule| {
        let agent = key.split(|b| *b == 0).next().unwrap_or_default();
        lasting
            .entry(String::from_utf8_lossy(agent).into_owned())
            .or_default()
            .push(rule);
    })?;
    Ok(lasting)
}

impl Governance {
    pub(crate) fn start(
        config: GovernanceConfig,
        office: Arc<PostOffice>,
        contexts: Arc<ContextHub>,
        store: Arc<dyn Store>,
        data_dir: Option<PathBuf>,
        events: Events,
    ) -> Result<Arc<Self>, StoreError> {
        let lasting = read_lasting(&*store)?;
        let spill_dir = config.spill_dir.clone().unwrap_or_else(|| {
            data_dir.map_or_else(
                || std::env::temp_dir().join("guildhall-spill"),
                |d| d.join("spill"),
            )
        });
        let spill = Spill::new(spill_dir, config.spill_retention);
        let limits = RateLimits::new(
            config
                .tools
                .iter()
                .filter_map(|(tool, p)| p.rate.map(|r| (tool.clone(), r))),
            config.agent_rate,
        );
        let audit = config
            .audit
            .then(|| AuditLog::start(Arc::clone(&store), config.audit_retention));
        let passive = config.is_off() && lasting.is_empty();
        let governance = Arc::new(Self {
            housekeeping: std::sync::OnceLock::new(),
            passive,
            hooks: Hooks::new(config.hooks.iter().cloned()),
            loops: LoopGuard::new(config.doom_loop),
            limits,
            config,
            office,
            contexts,
            store,
            lasting: RwLock::new(lasting),
            session: DashMap::default(),
            any_session_approval: std::sync::atomic::AtomicBool::new(false),
            approvals_generation: AtomicU64::new(0),
            decided: DashMap::default(),
            modes: DashMap::default(),
            modes_generation: AtomicU64::new(0),
            cache: cache::ResultCache::default(),
            audit,
            events,
            call_stats: call_stats::CallStats::default(),
            spill,
        });
        let task = tokio::spawn(housekeeping(Arc::downgrade(&governance)));
        let _ = governance.housekeeping.set(task.abort_handle());
        Ok(governance)
    }

    /// Whether a typed call may go straight to its tool's pipeline: nothing is configured,
    /// nobody listens to events and no metrics count calls, so no stage would do anything.
    pub(crate) fn lets_typed_calls_pass(&self) -> bool {
        self.passive && !self.events.has_subscribers() && !self.call_stats.counting()
    }

    /// The audit log, unless auditing is off.
    pub fn audit(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }

    /// Subscribes to tool lifecycle events.
    pub fn events(&self) -> EventStream {
        self.events.subscribe()
    }

    /// Calls counted by tool and outcome, once [`start_counting`](Self::start_counting)
    /// was called.
    pub fn call_stats(&self) -> &call_stats::CallStats {
        &self.call_stats
    }

    /// The other events counted (restarts, breakers, messages, …), once
    /// [`start_counting`](Self::start_counting) was called.
    pub fn event_tally(&self) -> &crate::events::Tally {
        self.events.tally()
    }

    /// Starts counting calls in [`call_stats`](Self::call_stats) (each call then adds to
    /// two or three counters of its tool) and the other events in
    /// [`event_tally`](Self::event_tally), for the metrics.
    pub fn start_counting(&self) {
        self.call_stats.start();
        self.events.tally().start();
    }

    pub(crate) fn emit(&self, make: impl FnOnce() -> ToolEvent) {
        self.events.emit(make);
    }

    /// Emits a call's own event, built only if a subscriber that takes calls is awake.
    pub(crate) fn emit_call(&self, make: impl FnOnce() -> ToolEvent) {
        self.events.emit_call(make);
    }

    /// Where the pipeline's own layers (the breaker) publish events.
    pub(crate) fn events_sender(&self) -> Events {
        self.events.clone()
    }

    /// The settings of tool `name`.
    pub(crate) fn tool_policy(&self, name: &str) -> Option<&ToolPolicy> {
        self.config.tools.get(name)
    }

    fn generation(&self) -> u64 {
        // All only grow, so their sum changes whenever any does.
        self.office.directory.generation()
            + self.approvals_generation.load(Ordering::Acquire)
            + self.modes_generation.load(Ordering::Acquire)
    }

    /// The working mode of `agent`: set with `set_mode`, else the config's for it or its
    /// role, else `build`.
    pub fn mode(&self, agent: &str) -> Mode {
        if let Some(mode) = self.modes.get(agent) {
            return *mode;
        }
        if let Some(mode) = self.config.modes.get(agent) {
            return *mode;
        }
        self.office
            .directory
            .get(agent)
            .and_then(|e| {
                let role = format!("role:{}", e.record().role);
                self.config.modes.get(&role).copied()
            })
            .unwrap_or_default()
    }

    /// Switches `agent` to `mode` (decisions made before are made again).
    pub fn set_mode(&self, agent: &str, mode: Mode) {
        self.modes.insert(Arc::from(agent), mode);
        self.modes_generation.fetch_add(1, Ordering::Release);
    }

    /// `verdict` as `agent`'s mode leaves it: in `plan` and `explore` a tool that is not
    /// read-only is denied (but `set_mode`), and in `explore` an `ask` is a denial.
    fn in_mode(&self, agent: &str, tool: &ToolSpec, verdict: Verdict) -> Verdict {
        let mode = self.mode(agent);
        if !mode.is_read_only() || tool.name == mode::SET_MODE || verdict.action == Action::Deny {
            return verdict;
        }
        let rule = if !tool.annotations.read_only_hint {
            format!(
                "{}: read-only tools only; `set_mode` with `build` switches to work",
                mode.as_str()
            )
        } else if mode == Mode::Explore && verdict.action == Action::Ask {
            "explore: nothing waits on a person".to_owned()
        } else {
            return verdict;
        };
        let reason = rules::Reason {
            scope: rules::Scope::Mode,
            rule,
        };
        Verdict {
            action: Action::Deny,
            label: Arc::from(reason.to_string()),
            reason,
            asking_rule: None,
        }
    }

    /// The trust, role rules and agent rules (with lasting approvals) of a caller.
    fn principal(&self, agent: Option<&str>) -> (Trust, Vec<Rule>, Vec<Rule>) {
        let Some(agent) = agent else {
            return (Trust::Autonomous, Vec::new(), Vec::new());
        };
        let own = self.config.agents.get(agent);
        let claimed = self
            .office
            .directory
            .get(agent)
            .map(|e| e.record().role.clone());
        let given = claimed
            .as_deref()
            .is_some_and(|claimed| own.and_then(|p| p.role.as_deref()) == Some(claimed));
        let role = claimed.and_then(|r| self.config.roles.get(&r));
        let role_trust = role
            .and_then(|p| p.trust)
            .map(|t| if given { t } else { t.min(self.config.trust) });
        let trust = own
            .and_then(|p| p.trust)
            .or(role_trust)
            .unwrap_or(self.config.trust);
        let mut agent_rules = own.map(|p| p.rules.clone()).unwrap_or_default();
        if let Some(approved) = self
            .lasting
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
        {
            agent_rules.extend(approved.iter().cloned());
        }
        let role_rules = role.map_or_else(Vec::new, |p| {
            p.rules
                .iter()
                .filter(|r| given || r.action != Action::Allow)
                .cloned()
                .collect()
        });
        (trust, role_rules, agent_rules)
    }

    /// Decides a call. `args` gives the arguments as JSON, asked for only if a rule reads
    /// them.
    pub(crate) fn decide(
        &self,
        agent: Option<&Arc<str>>,
        session: Option<&Arc<str>>,
        tool: &ToolSpec,
        tool_id: u64,
        args: &mut dyn FnMut() -> Option<Value>,
    ) -> Ruling {
        let any_session = self.any_session_approval.load(Ordering::Acquire);
        let session_rules = agent.filter(|_| any_session).and_then(|a| {
            self.session
                .get(&(Arc::clone(a), session.cloned()))
                .map(|r| r.value().clone())
        });
        let key = (tool_id, caller_hash(agent));
        let generation = self.generation();
        if session_rules.is_none()
            && let Some(hit) = self.decided.get(&key)
            && hit.generation == generation
            && hit.agent.as_deref() == agent.map(|a| &**a)
        {
            return Ruling::of(&hit.verdict);
        }
        let (trust, role, agent_rules) = self.principal(agent.map(|a| &**a));
        let session_rules = session_rules.unwrap_or_default();
        let scoped = ScopedRules {
            config: &self.config.rules,
            role: &role,
            agent: &agent_rules,
            session: &session_rules,
        };
        let verdict = scoped.decide(trust, tool, args);
        let verdict = match agent {
            Some(agent) => self.in_mode(agent, tool, verdict),
            None => verdict,
        };
        let ruling = Ruling::of(&verdict);
        let reads_args = [&self.config.rules, &role, &agent_rules]
            .iter()
            .any(|rules| {
                rules
                    .iter()
                    .any(|r| r.arg.is_some() && r.tool.matches(&tool.name))
            });
        if session_rules.is_empty() && !reads_args {
            // Two callers whose ids hash alike take turns in the entry: misses, never a
            // wrong decision.
            let replaced = self.decided.insert(
                key,
                Remembered {
                    agent: agent.cloned(),
                    generation,
                    verdict: Arc::new(verdict),
                },
            );
            // Counted (a look at every shard) only when the map grew: a decision made again
            // after a registration or an approval replaces its entry.
            if replaced.is_none() && self.decided.len() > DECISIONS_KEPT {
                // Only a swarm far larger than any seen gets here: start over rather than
                // grow (the next call of each caller decides afresh).
                self.decided.clear();
            }
        }
        ruling
    }

    /// Forgets what was remembered of agents that left and tools that are gone: every
    /// remembered decision (each is made again on the caller's next call; an entry names
    /// its tool by a number no new tool reuses, so one of a tool that went would stay for
    /// ever) and the loop-guard streaks of agents no longer registered.
    pub(crate) fn forget_departed(&self) {
        self.decided.clear();
        let directory = &self.office.directory;
        self.loops.retain(|agent| directory.get(agent).is_some());
    }

    /// The role the config gives `agent`, if any: a client may not register it in another.
    pub fn given_role(&self, agent: &str) -> Option<&str> {
        self.config.agents.get(agent)?.role.as_deref()
    }

    /// The most restrictive trust the config names (the default, any role's, any agent's):
    /// what a caller that names no agent over MCP is judged by.
    pub fn most_restrictive_trust(&self) -> Trust {
        self.config
            .roles
            .values()
            .chain(self.config.agents.values())
            .filter_map(|p| p.trust)
            .fold(self.config.trust, Trust::min)
    }

    /// The names of those of `tools` that are denied to `agent` whatever the arguments
    /// (they are hidden from the agent's tool list).
    /// Without an agent, the tools hidden from a caller that names none over MCP: judged
    /// by the most restrictive trust the config names.
    pub fn hidden<'t>(&self, agent: Option<&str>, tools: &'t [ToolSpec]) -> Vec<&'t str> {
        let (trust, role, agent_rules) = match agent {
            Some(_) => self.principal(agent),
            None => (self.most_restrictive_trust(), Vec::new(), Vec::new()),
        };
        let rules = ScopedRules {
            config: &self.config.rules,
            role: &role,
            agent: &agent_rules,
            session: &[],
        };
        tools
            .iter()
            .filter(|tool| rules.denies_outright(trust, tool))
            .map(|tool| tool.name.as_str())
            .collect()
    }

    /// Grants what an asker approved: `rule` (an allow covering what was asked) for the
    /// session or from now on.
    pub(crate) async fn grant(
        &self,
        agent: &Arc<str>,
        session: Option<&Arc<str>>,
        rule: Rule,
        approval: Approval,
    ) -> Result<(), StoreError> {
        match approval {
            Approval::Session => {
                self.session
                    .entry((Arc::clone(agent), session.cloned()))
                    .or_default()
                    .push(rule);
                self.any_session_approval.store(true, Ordering::Release);
            }
            Approval::Always => {
                let mut key = agent.as_bytes().to_vec();
                key.push(0);
                key.extend_from_slice(rule.to_string().as_bytes());
                let mut batch = Batch::new();
                batch.put(Table::Approvals, key, codec::encode(&rule));
                batch.notify(None, Notice::Changed(APPROVALS.into()));
                store::commit(&*self.store, batch).await?;
                let mut lasting = self.lasting.write().unwrap_or_else(PoisonError::into_inner);
                let approved = lasting.entry(agent.to_string()).or_default();
                // The store keys an approval by its rule: the same approval twice is one.
                if !approved.contains(&rule) {
                    approved.push(rule);
                }
                self.approvals_generation.fetch_add(1, Ordering::Release);
            }
            Approval::Once | Approval::Deny => {}
        }
        Ok(())
    }

    /// Acts on what another server sharing the store said: it granted a lasting approval,
    /// or anything may have changed.
    pub(crate) async fn on_notice(self: &Arc<Self>, notice: &Notice) {
        match notice {
            Notice::Changed(what) if &**what == APPROVALS => {}
            Notice::Resync => {}
            _ => return,
        }
        let governance = Arc::clone(self);
        // The store's reads block their caller.
        let _ = tokio::task::spawn_blocking(move || governance.reload_approvals()).await;
    }

    /// Reads the lasting approvals again.
    fn reload_approvals(&self) {
        match read_lasting(&*self.store) {
            Ok(lasting) => {
                let mut current = self.lasting.write().unwrap_or_else(PoisonError::into_inner);
                // Unchanged (a resync that found nothing new): the cached decisions stand.
                if *current != lasting {
                    *current = lasting;
                    self.approvals_generation.fetch_add(1, Ordering::Release);
                }
            }
            Err(err) => {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "lasting approvals could not be read again")
            }
        }
    }

    /// How many times the context a cached result depends on has changed.
    fn context_generation(&self, session: Option<&str>) -> u64 {
        self.contexts.generation(session)
    }

    /// Waits for the audit log to be written.
    pub(crate) async fn flush(&self) {
        if let Some(audit) = &self.audit
            && let Err(err) = audit.flush().await
        {
            tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "audit records could not be flushed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use guildhall_actors::{Annotations, Concurrency};
    use serde_json::json;

    /// A tool with no arguments to read, as rules see it.
    fn noop_spec() -> ToolSpec {
        ToolSpec {
            name: "noop".into(),
            description: String::new(),
            input_schema: Arc::new(json!({"type": "object"})),
            output_schema: Arc::new(json!({"type": "object"})),
            annotations: Annotations::default(),
            concurrency: Concurrency::Sequential,
        }
    }

    #[tokio::test]
    async fn a_remembered_decision_is_only_ever_its_own_callers() {
        let rule = |action| Rule::new("noop", action).expect("valid rule");
        let mut config = GovernanceConfig::default();
        for (agent, action) in [("a", Action::Allow), ("b", Action::Deny)] {
            config.agents.insert(
                agent.into(),
                Principal {
                    rules: vec![rule(action)],
                    ..Principal::default()
                },
            );
        }
        let rt = crate::Runtime::builder()
            .governance(config)
            .build()
            .await
            .expect("runtime starts");
        let gov = rt.governance();
        let spec = noop_spec();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let decide = |agent: &Arc<str>| gov.decide(Some(agent), None, &spec, 7, &mut || None);
        assert_eq!(decide(&a).action, Action::Allow);
        assert_eq!(decide(&b).action, Action::Deny);
        // The two ids as if they hashed alike: `a`'s decision under `b`'s key.
        let planted = gov
            .decided
            .remove(&(7, caller_hash(Some(&a))))
            .expect("a's kept")
            .1;
        gov.decided.insert((7, caller_hash(Some(&b))), planted);
        assert_eq!(
            decide(&b).action,
            Action::Deny,
            "b is judged as b, not as a"
        );
        assert_eq!(decide(&a).action, Action::Allow);
        assert_eq!(decide(&b).action, Action::Deny);
        rt.shutdown().await;
    }

    #[tokio::test]
    async fn what_was_remembered_of_a_departed_agent_is_forgotten() {
        let rt = crate::Runtime::builder()
            .governance(GovernanceConfig::default())
            .build()
            .await
            .expect("runtime starts");
        let gov = rt.governance();
        let spec = noop_spec();
        for id in ["stays", "leaves"] {
            rt.register_agent(crate::AgentSpec::new(id, "worker"))
                .await
                .expect("registers");
        }
        let (stays, leaves): (Arc<str>, Arc<str>) = (Arc::from("stays"), Arc::from("leaves"));
        // Each one call short of tripping the loop guard (three in a row).
        for agent in [&stays, &leaves] {
            gov.decide(Some(agent), None, &spec, 7, &mut || None);
            for _ in 0..2 {
                assert_eq!(gov.loops.count(agent, 7, 1), None);
            }
        }
        assert_eq!(gov.decided.len(), 2);
        // Tools that come and go (a server reconnecting) leave entries until the sweep, but
        // never more than the bound.
        for tool in 100..100 + DECISIONS_KEPT as u64 {
            gov.decide(Some(&stays), None, &spec, tool, &mut || None);
        }
        assert!(gov.decided.len() <= DECISIONS_KEPT);
        rt.deregister_agent("leaves").await.expect("deregisters");
        gov.forget_departed();
        assert_eq!(gov.decided.len(), 0, "decisions are made again, not kept");
        assert_eq!(
            gov.loops.count(&stays, 7, 1),
            Some(3),
            "a staying streak goes on"
        );
        assert_eq!(
            gov.loops.count(&leaves, 7, 1),
            None,
            "a departed agent's streak starts over"
        );
        rt.shutdown().await;
    }
}
