//! The launcher: spawns, stops and lists the agents a runtime launched, each under the
//! `launched` supervisor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use guildhall_supervision::{ChildSpec, Restart, RestartIntensity, RestartWindow, Supervisor};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::actor::LaunchedActor;
use super::config::{LaunchConfig, Profile};
use super::launched::{Confined, Family, Launch, LaunchInfo, LaunchState, Status};
use super::request::{LaunchError, MAX_PROMPT, SpawnRequest};
use super::wake::{Woken, wait_for_mail};
use crate::agents::{AgentSpec, ProcessReport};
use crate::output_log::OutputLog;
use crate::runtime::{Runtime, WeakRuntime};
use crate::tasks::TaskChange;

/// The supervisor's id under the root.
const LAUNCHED: &str = "launched";
/// A launched agent's log is rotated at this size.
const LOG_BYTES: u64 = 4 << 20;

/// Opens the socket a launched agent in a sandbox reaches its server through, serving that
/// agent alone (the binary's MCP server provides it: the runtime below does not speak the
/// socket's protocol). Listening stops when the returned guard is dropped.
pub trait AgentSockets: Send + Sync {
    /// Opens a socket at `path` for `agent`.
    ///
    /// # Errors
    /// Why it could not be opened.
    fn open(&self, agent: &str, path: &Path) -> std::io::Result<Box<dyn Send + Sync>>;
}

/// The agents a runtime launched: spawn, stop and list them.
pub struct Launcher {
    /// Itself, for the tasks it starts when an agent ends.
    me: std::sync::Weak<Launcher>,
    runtime: WeakRuntime,
    config: LaunchConfig,
    /// Where relative `cwd`s are taken from.
    base_dir: PathBuf,
    /// The runtime's data directory: logs, MCP configs and worktrees go under it, and the
    /// agents connect back to it.
    data_dir: Option<PathBuf>,
    /// The `guildhall` program the agents connect back through.
    program: PathBuf,
    launched: tokio::sync::Mutex<BTreeMap<String, Arc<Launch>>>,
    supervisor: Arc<RwLock<Option<Supervisor>>>,
    sockets: std::sync::OnceLock<Arc<dyn AgentSockets>>,
    /// The parent of every idle agent's wait for mail: cancelled when the launcher goes.
    waits: CancellationToken,
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.waits.cancel();
    }
}

impl Launcher {
    /// Starts the `launched` supervisor under `runtime`'s root, for a launcher of
    /// `config` (see [`Launcher::start`], which also registers its tools).
    pub(super) async fn open(
        runtime: &Runtime,
        config: LaunchConfig,
        base_dir: PathBuf,
        data_dir: Option<PathBuf>,
        program: PathBuf,
    ) -> Result<Arc<Self>, LaunchError> {
        config.validate().map_err(LaunchError::Profile)?;
        // An agent's crash loop must never escalate to the root: each agent's own intensity
        // gives it up instead.
        let supervisor = runtime.supervise_subsystem(LAUNCHED).await?;
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            runtime: runtime.downgrade(),
            config,
            base_dir,
            data_dir,
            program,
            launched: tokio::sync::Mutex::default(),
            supervisor,
            sockets: std::sync::OnceLock::new(),
            waits: CancellationToken::new(),
        }))
    }

    /// Opens each sandboxed agent's own socket with `sockets` (once; later calls do
    /// nothing). Without it, a profile whose agents would be sandboxed cannot launch.
    pub fn serve_agents_with(&self, sockets: Arc<dyn AgentSockets>) {
        let _ = self.sockets.set(sockets);
    }

    /// The profiles' names.
    pub fn profiles(&self) -> Vec<String> {
        self.config.profiles.keys().cloned().collect()
    }

    /// Launches an agent: registers it, prepares its directory and MCP config, and starts
    /// its process under supervision. `caller` is the agent asking (the parent by default),
    /// `None` for the embedding program.
    ///
    /// # Errors
    /// [`LaunchError`] naming what is wrong; nothing is started then.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the agent registered, or launched.
    pub async fn spawn(
        self: &Arc<Self>,
        caller: Option<&str>,
        request: SpawnRequest,
    ) -> Result<LaunchInfo, LaunchError> {
        let runtime = self.runtime()?;
        let (profile_name, profile) = self.profile(request.profile.as_deref())?;
        let parent = self.check_request(&runtime, caller, &request)?;
        let agent = match &request.id {
            Some(id) => id.clone(),
            None => format!(
                "{}-{}",
                request.role,
                &uuid::Uuid::now_v7().simple().to_string()[24..]
            ),
        };
        crate::agents::check_name(&agent)
            .map_err(|reason| LaunchError::InvalidArgument { name: "id", reason })?;
        let mut launched = self.launched.lock().await;
        self.check_room(&launched, &agent, parent.as_deref())?;
        if let Some(existing) = runtime.lookup_agent(&agent)
            && existing.role != request.role
        {
            return Err(LaunchError::InvalidArgument {
                name: "id",
                reason: format!(
                    "agent `{agent}` exists with role `{}`, not `{}`",
                    existing.role, request.role
                ),
            });
        }
        let mut spec = AgentSpec::new(&agent, &request.role);
        if let Some(parent) = &parent {
            spec = spec.parent(parent);
        }
        runtime.register_agent(spec).await?;
        let prompt = brief(&runtime, caller, &agent, &request).await?;
        let confiner = runtime
            .confiner()
            .filter(|c| profile.sandbox.enabled && c.sandbox.config().enabled)
            .cloned();
        let prepared =
            self.prepare(&agent, &request.role, parent.as_deref(), &profile, confiner)?;
        let (fields, env) =
            self.command_line(&agent, &request, parent.as_deref(), &profile, &prepared);
        let argv = render(&profile.template(), &fields, prompt)?;
        let launch = Arc::new(Launch {
            agent: agent.clone(),
            role: request.role.clone(),
            parent,
            profile_name,
            argv: Mutex::new(argv),
            fields,
            env,
            cwd: prepared.cwd,
            log: Arc::new(OutputLog::new(prepared.log, LOG_BYTES)),
            runtime: self.runtime.clone(),
            family: Arc::downgrade(self) as std::sync::Weak<dyn Family>,
            status: Mutex::new(Status {
                state: LaunchState::Restarting,
                pid: None,
                started_ms: None,
                starts: 0,
                last_exit: None,
                restarts: RestartWindow::new(RestartIntensity::new(
                    profile.max_restarts,
                    profile.period,
                )),
                waiting: None,
                woken: false,
            }),
            profile,
            confined: prepared.confined,
        });
        let supervisor = self.supervisor()?;
        if let Some(before) = launched.get(&agent) {
            // Launched before under this id and ended (or idle, no longer waiting): OTP
            // keeps an ended transient child's spec; this launch replaces it.
            before.stop_waiting();
            let _ = supervisor.terminate_child(agent.clone()).await;
        }
        supervisor.start_child(child_spec(&launch)).await?;
        runtime.attach_process(&agent, Arc::clone(&launch) as Arc<dyn ProcessReport>);
        launched.insert(agent, Arc::clone(&launch));
        Ok(launch.info())
    }

    /// Stops launched agent `agent` (its process group killed) and, with
    /// `stop_with_parent`, the agents it launched. `caller` must be above it in the agent
    /// tree (`None`: the embedding program, which may stop any).
    ///
    /// # Errors
    /// [`LaunchError::Unknown`], [`LaunchError::NotAbove`].
    ///
    /// # Cancel safety
    /// Dropping the future may leave it stopped, and some of its children.
    pub async fn stop(&self, caller: Option<&str>, agent: &str) -> Result<LaunchInfo, LaunchError> {
        let launch = self
            .launched
            .lock()
            .await
            .get(agent)
            .cloned()
            .ok_or_else(|| LaunchError::Unknown(agent.to_owned()))?;
        if let Some(caller) = caller
            && !self.is_above(caller, agent)
        {
            return Err(LaunchError::NotAbove {
                caller: caller.to_owned(),
                agent: agent.to_owned(),
            });
        }
        self.end(&launch, "stopped by stop_agent").await;
        Ok(launch.info())
    }

    /// Every launched agent, alive or not, by id.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list(&self) -> Vec<LaunchInfo> {
        self.launched
            .lock()
            .await
            .values()
            .map(|l| l.info())
            .collect()
    }

    /// Ends `launch` for good: its actor stopped (which kills its group), then the agents
    /// it launched that stop with it. Iterative, so a deep tree cannot overflow.
    pub(crate) async fn end(&self, launch: &Arc<Launch>, why: &str) {
        let mut queue = vec![Arc::clone(launch)];
        while let Some(next) = queue.pop() {
            let was_alive = {
                let mut status = next.status();
                let alive = status.state.is_alive();
                if alive || status.state == LaunchState::Idle {
                    status.state = LaunchState::Ended;
                    status.last_exit.get_or_insert_with(|| why.to_owned());
                    status.stop_waiting();
                }
                alive
            };
            if was_alive && let Ok(supervisor) = self.supervisor() {
                let _ = supervisor.terminate_child(next.agent.clone()).await;
            }
            queue.extend(self.children_of(&next.agent).await);
        }
    }

    /// Drops the supervisor's spec of `agent`, which ended for good, so ended agents do not
    /// pile up in the tree (its listing entry stays).
    pub(crate) async fn forget(&self, agent: &str) {
        if let Ok(supervisor) = self.supervisor() {
            let _ = supervisor.terminate_child(agent.to_owned()).await;
        }
    }

    /// Drops the supervisor's spec of `launch`, which went idle, unless it is no longer
    /// idle or no longer the launch under its id.
    async fn forget_idle(&self, launch: &Arc<Launch>) {
        let launched = self.launched.lock().await;
        let current = launched
            .get(&launch.agent)
            .is_some_and(|l| Arc::ptr_eq(l, launch));
        if current
            && launch.status().state == LaunchState::Idle
            && let Ok(supervisor) = self.supervisor()
        {
            let _ = supervisor.terminate_child(launch.agent.clone()).await;
        }
    }

    /// Starts idle `launch` again with its profile's `resume` command, `prompt` naming the
    /// mail that woke it: a restart, counted against its intensity, within the limits.
    async fn wake(&self, launch: &Arc<Launch>, prompt: String) -> Woken {
        let launched = self.launched.lock().await;
        let current = launched
            .get(&launch.agent)
            .is_some_and(|l| Arc::ptr_eq(l, launch));
        if !current || launch.status().state != LaunchState::Idle {
            return Woken::Done;
        }
        if let Err(why) = self.check_room(&launched, &launch.agent, launch.parent.as_deref()) {
            tracing::info!(agent = %launch.agent, "mail came for an idle agent, which waits for room: {why}");
            return Woken::NoRoom;
        }
        let argv = render(
            &launch.profile.resume_template(),
            &launch.fields,
            Some(prompt),
        );
        let started = match (argv, self.supervisor()) {
            (Ok(argv), Ok(supervisor)) => {
                *launch.argv.lock().unwrap_or_else(PoisonError::into_inner) = argv;
                {
                    let mut status = launch.status();
                    status.state = LaunchState::Restarting;
                    status.waiting = None;
                    status.woken = true;
                }
                supervisor
                    .start_child(child_spec(launch))
                    .await
                    .map_err(LaunchError::from)
            }
            (Err(err), _) | (_, Err(err)) => Err(err),
        };
        match started {
            Ok(()) => tracing::info!(agent = %launch.agent, "an idle agent was woken by mail"),
            Err(err) => {
                tracing::warn!(agent = %launch.agent, error = %err, "could not wake an idle agent");
                {
                    let mut status = launch.status();
                    status.state = LaunchState::Ended;
                    status.last_exit = Some(format!("could not be woken: {err}"));
                }
                // Ended for good, as any agent that ends: the agents it launched that stop
                // with it go too, and its spec leaves the tree (in a task of its own, as
                // this holds the list of launched agents).
                Family::ended(self, &launch.agent);
            }
        }
        Woken::Done
    }

    /// The alive launched agents `parent` started that stop with it.
    pub(crate) async fn children_of(&self, parent: &str) -> Vec<Arc<Launch>> {
        self.launched
            .lock()
            .await
            .values()
            .filter(|l| {
                l.parent.as_deref() == Some(parent)
                    && l.profile.stop_with_parent
                    && l.status().state.is_alive()
            })
            .cloned()
            .collect()
    }

    fn is_above(&self, caller: &str, agent: &str) -> bool {
        let Some(runtime) = self.runtime.upgrade() else {
            return false;
        };
        let mut at = runtime
            .lookup_agent(agent)
            .and_then(|r| r.parent.as_ref().map(ToString::to_string));
        // Bounded: a parent chain longer than the directory is a cycle.
        for _ in 0..10_000 {
            match at {
                Some(ref p) if p == caller => return true,
                Some(p) => {
                    at = runtime
                        .lookup_agent(&p)
                        .and_then(|r| r.parent.as_ref().map(ToString::to_string))
                }
                None => return false,
            }
        }
        false
    }

    fn profile(&self, name: Option<&str>) -> Result<(String, Profile), LaunchError> {
        let profiles = &self.config.profiles;
        let names = || {
            let names: Vec<&str> = profiles.keys().map(String::as_str).collect();
            if names.is_empty() {
                "there are none: add `[launch.profiles.NAME]` to guildhall.toml".to_owned()
            } else {
                format!("there are {}", names.join(", "))
            }
        };
        match name {
            Some(name) => profiles
                .get(name)
                .map(|p| (name.to_owned(), p.clone()))
                .ok_or_else(|| {
                    LaunchError::Profile(format!("no launch profile `{name}`; {}", names()))
                }),
            None if profiles.len() == 1 => Ok(profiles
                .iter()
                .next()
                .map(|(n, p)| (n.clone(), p.clone()))
                .expect("one profile")),
            None => Err(LaunchError::Profile(format!(
                "name a launch profile; {}",
                names()
            ))),
        }
    }

    /// Checks what a spawn asks before anything is done: the role's name, the prompt's size,
    /// and the parent (the caller's own, unless it names one below itself). The parent.
    fn check_request(
        &self,
        runtime: &Runtime,
        caller: Option<&str>,
        request: &SpawnRequest,
    ) -> Result<Option<String>, LaunchError> {
        crate::agents::check_name(&request.role).map_err(|reason| {
            LaunchError::InvalidArgument {
                name: "role",
                reason,
            }
        })?;
        if let Some(prompt) = &request.prompt
            && prompt.len() > MAX_PROMPT
        {
            return Err(LaunchError::InvalidArgument {
                name: "prompt",
                reason: format!(
                    "{} bytes; at most {MAX_PROMPT} (put a long brief in a file, or in a board \
                     task's description, and point to it)",
                    prompt.len()
                ),
            });
        }
        let parent = request.parent.clone().or_else(|| caller.map(str::to_owned));
        if let Some(parent) = &parent {
            runtime.agent(parent)?;
            // An agent launches for itself or for an agent below it: never in another's
            // name, which would spend that agent's `max_per_parent` and fill its inbox.
            if let Some(caller) = caller
                && caller != parent
                && !self.is_above(caller, parent)
            {
                return Err(LaunchError::InvalidArgument {
                    name: "parent",
                    reason: format!(
                        "`{caller}` may launch agents for itself or for agents below it, \
                         not for `{parent}`"
                    ),
                });
            }
        }
        Ok(parent)
    }

    /// Whether `agent` may be launched now: not alive already, and within `max_agents` and
    /// its parent's `max_per_parent`.
    fn check_room(
        &self,
        launched: &BTreeMap<String, Arc<Launch>>,
        agent: &str,
        parent: Option<&str>,
    ) -> Result<(), LaunchError> {
        if launched
            .get(agent)
            .is_some_and(|l| l.status().state.is_alive())
        {
            return Err(LaunchError::Duplicate(agent.to_owned()));
        }
        let alive: Vec<&Arc<Launch>> = launched
            .values()
            .filter(|l| l.status().state.is_alive())
            .collect();
        if alive.len() >= self.config.max_agents {
            return Err(LaunchError::Limit(format!(
                "{} launched agents are alive, the most there may be (`[launch] max_agents`); \
                 stop one first",
                alive.len()
            )));
        }
        let siblings = alive
            .iter()
            .filter(|l| l.parent.as_deref() == parent)
            .count();
        if parent.is_some() && siblings >= self.config.max_per_parent {
            return Err(LaunchError::Limit(format!(
                "`{}` has {siblings} launched agents alive, the most one agent may have \
                 (`[launch] max_per_parent`); stop one first",
                parent.unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// The values of the launched process's placeholders but `{prompt}` (see [`render`]),
    /// and its environment.
    fn command_line(
        &self,
        agent: &str,
        request: &SpawnRequest,
        parent: Option<&str>,
        profile: &Profile,
        prepared: &Prepared,
    ) -> (Map<String, Value>, Vec<(String, String)>) {
        let mut fields = Map::new();
        fields.insert("agent".into(), json!(agent));
        fields.insert("role".into(), json!(request.role));
        fields.insert("parent".into(), json!(parent));
        fields.insert("task".into(), json!(request.task));
        fields.insert("mcp_config".into(), json!(prepared.mcp_config));
        fields.insert("data_dir".into(), json!(self.data_dir));
        fields.insert("guildhall".into(), json!(self.program));
        let mut env = vec![
            ("GUILDHALL_AGENT".to_owned(), agent.to_owned()),
            ("GUILDHALL_ROLE".to_owned(), request.role.clone()),
        ];
        if let Some(parent) = parent {
            env.push(("GUILDHALL_PARENT".into(), parent.to_owned()));
        }
        match &prepared.socket {
            Some(socket) => env.push((
                crate::agents::SOCKET_ENV.to_owned(),
                socket.display().to_string(),
            )),
            None => {
                if let Some(dir) = &self.data_dir {
                    env.push(("GUILDHALL_DATA_DIR".into(), dir.display().to_string()));
                }
            }
        }
        env.extend(profile.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        (fields, env)
    }

    /// The agent's working directory, log file and MCP config; and, confined, its socket
    /// and its sandbox's reach.
    fn prepare(
        &self,
        agent: &str,
        role: &str,
        parent: Option<&str>,
        profile: &Profile,
        confiner: Option<crate::sandbox::Confiner>,
    ) -> Result<Prepared, LaunchError> {
        let failed = |reason: String| LaunchError::Prepare {
            agent: agent.to_owned(),
            reason,
        };
        let cwd = match &profile.cwd {
            Some(dir) => self.base_dir.join(dir),
            None => self.base_dir.clone(),
        };
        let Some(data_dir) = &self.data_dir else {
            return Ok(Prepared {
                cwd,
                log: None,
                mcp_config: None,
                socket: None,
                confined: None,
            });
        };
        let dir = data_dir.join("launched");
        crate::private_fs::create_dir_all(&dir)
            .map_err(|e| failed(format!("{}: {e}", dir.display())))?;
        let log = Some(dir.join(format!("{agent}.log")));
        let mut args = vec![
            "--data-dir".to_owned(),
            data_dir.display().to_string(),
            "mcp".into(),
            "--agent".into(),
            agent.to_owned(),
            "--role".into(),
            role.to_owned(),
        ];
        if let Some(parent) = parent {
            args.extend(["--parent".to_owned(), parent.to_owned()]);
        }
        let mut prepared = Prepared {
            cwd,
            log,
            mcp_config: None,
            socket: None,
            confined: None,
        };
        match confiner {
            None => self.unconfined(agent, profile, &dir, data_dir, &args, &mut prepared),
            Some(confiner) => self.confined(agent, profile, confiner, args, &mut prepared),
        }
        .map_err(failed)?;
        Ok(prepared)
    }

    /// An agent with the server's rights: its MCP config beside its log, its worktree (if
    /// its profile asks for one) in the data directory.
    fn unconfined(
        &self,
        agent: &str,
        profile: &Profile,
        dir: &Path,
        data_dir: &Path,
        args: &[String],
        prepared: &mut Prepared,
    ) -> Result<(), String> {
        let mcp_config = dir.join(format!("{agent}.mcp.json"));
        self.write_mcp_config(&mcp_config, args, None)?;
        if profile.worktree {
            prepared.cwd = worktree(&prepared.cwd, &data_dir.join("worktrees").join(agent))?;
        }
        prepared.mcp_config = Some(mcp_config);
        Ok(())
    }

    /// An agent in the sandbox: its own directory outside the data directory (its HOME and
    /// TMPDIR inside) with its socket and its MCP config, and what its profile lets it
    /// reach besides its roots.
    fn confined(
        &self,
        agent: &str,
        profile: &Profile,
        confiner: crate::sandbox::Confiner,
        mut args: Vec<String>,
        prepared: &mut Prepared,
    ) -> Result<(), String> {
        if profile.worktree {
            return Err(
                "its worktree would live in the data directory, which its sandbox cannot reach: \
                 give the profile worktree = false, or sandbox = { enabled = false }"
                    .into(),
            );
        }
        let Some(sockets) = self.sockets.get() else {
            return Err(
                "it would run in the sandbox, and this embedding opens no socket of its own for \
                 it to connect back through (Launcher::serve_agents_with): give the profile \
                 sandbox = { enabled = false }"
                    .into(),
            );
        };
        let private = confiner
            .sandbox
            .private_dir(Some(agent))
            .map_err(|e| e.to_string())?;
        let socket = private.join("guildhall.sock");
        let opened = sockets
            .open(agent, &socket)
            .map_err(|e| format!("its socket {}: {e}", socket.display()))?;
        let mcp_config = private.join("guildhall.mcp.json");
        // Named in the arguments too: some clients give a server only the variables they
        // know of.
        args.extend(["--socket".to_owned(), socket.display().to_string()]);
        self.write_mcp_config(&mcp_config, &args, Some(&socket))?;
        let program = profile
            .command
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let guildhall = self.program.display().to_string();
        let extra = profile.sandbox.reach(
            &confiner.sandbox,
            &self.base_dir,
            &prepared.cwd,
            &[program, &guildhall],
            profile.command.get(1..).unwrap_or_default(),
            true,
        )?;
        prepared.mcp_config = Some(mcp_config);
        prepared.socket = Some(socket);
        prepared.confined = Some(Confined {
            confiner,
            extra,
            _socket: opened,
        });
        Ok(())
    }

    /// Writes the MCP config that makes a client connect back through `guildhall mcp` with
    /// `args` (and the agent's own socket in its environment, when it has one).
    fn write_mcp_config(
        &self,
        path: &Path,
        args: &[String],
        socket: Option<&Path>,
    ) -> Result<(), String> {
        let mut server = json!({ "command": self.program, "args": args });
        if let Some(socket) = socket {
            server["env"] = json!({ crate::agents::SOCKET_ENV: socket });
        }
        let config = json!({ "mcpServers": { "guildhall": server } });
        crate::private_fs::write(
            path,
            &serde_json::to_vec_pretty(&config).unwrap_or_default(),
        )
        .map_err(|e| format!("{}: {e}", path.display()))
    }

    fn runtime(&self) -> Result<Runtime, LaunchError> {
        self.runtime
            .upgrade()
            .ok_or_else(|| LaunchError::Unavailable("the runtime has stopped".into()))
    }

    fn supervisor(&self) -> Result<Supervisor, LaunchError> {
        self.supervisor
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                LaunchError::Unavailable("the `launched` supervisor is not running".into())
            })
    }
}

/// What a launched agent is told: the prompt given, or, for a board task (assigned to it
/// here), a brief naming the task and how to take, finish and report it.
async fn brief(
    runtime: &Runtime,
    caller: Option<&str>,
    agent: &str,
    request: &SpawnRequest,
) -> Result<Option<String>, LaunchError> {
    let Some(task) = request.task else {
        return Ok(request.prompt.clone());
    };
    let change = TaskChange {
        assignee: Some(Some(agent.to_owned())),
        ..TaskChange::default()
    };
    let board = runtime
        .tasks()
        .ok_or_else(|| crate::tasks::TaskError::Unavailable {
            reason: "this runtime has no task board".into(),
        })?;
    let given = board.update(caller, task, change).await?;
    Ok(Some(request.prompt.clone().unwrap_or_else(|| {
        format!(
            "You are agent `{agent}` (role `{}`). Your task is task {} on the guildhall task \
             board: {}\n\n{}\n\nTake it with task_claim, finish it with task_update, and \
             report to your parent by mail.",
            request.role, given.id, given.title, given.description
        )
    })))
}

/// A command line: `template` (a profile's `command` or `resume`) filled in with `fields`
/// and `prompt`.
fn render(
    template: &Result<Vec<crate::commands::template::Arg>, String>,
    fields: &Map<String, Value>,
    prompt: Option<String>,
) -> Result<Vec<String>, LaunchError> {
    let template = template
        .as_ref()
        .map_err(|e| LaunchError::Profile(e.clone()))?;
    let mut fields = fields.clone();
    fields.insert("prompt".into(), json!(prompt));
    crate::commands::template::render(template, &fields).map_err(|reason| {
        LaunchError::InvalidArgument {
            name: "prompt",
            reason,
        }
    })
}

struct Prepared {
    cwd: PathBuf,
    log: Option<PathBuf>,
    mcp_config: Option<PathBuf>,
    socket: Option<PathBuf>,
    confined: Option<Confined>,
}

/// A fresh worktree of the repository at `repo`, detached at its `HEAD`, at `at` (an
/// existing one is reused: the agent was launched before under this id).
fn worktree(repo: &Path, at: &Path) -> Result<PathBuf, String> {
    if at.join(".git").exists() {
        return Ok(at.to_owned());
    }
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["worktree", "add", "--detach"])
        .arg(at)
        .output()
        .map_err(|e| format!("could not run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`git worktree add` in {} failed: {}",
            repo.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(at.to_owned())
}

/// The child spec of one launched agent: transient (its actor applies the profile's
/// restart type), its group killed within five seconds when it is stopped.
fn child_spec(launch: &Arc<Launch>) -> ChildSpec {
    let launch = Arc::clone(launch);
    ChildSpec::actor(launch.agent.clone(), move || {
        (LaunchedActor(Arc::clone(&launch)), ())
    })
    .restart(Restart::Transient)
}

impl Family for Launcher {
    /// Drops `launch`'s spec from the supervisor, then waits for mail to wake it (see
    /// [`super::wake`]).
    fn idle(&self, launch: Arc<Launch>) {
        let Some(launcher) = self.me.upgrade() else {
            return;
        };
        let waiting = self.waits.child_token();
        launch.status().waiting = Some(waiting.clone());
        tokio::spawn(async move {
            launcher.forget_idle(&launch).await;
            let weak = Arc::downgrade(&launcher);
            drop(launcher);
            let wake = move |launch: Arc<Launch>, prompt: String| {
                let weak = weak.clone();
                async move {
                    match weak.upgrade() {
                        Some(launcher) => launcher.wake(&launch, prompt).await,
                        None => Woken::Done,
                    }
                }
            };
            wait_for_mail(launch, waiting, wake).await;
        });
    }

    /// Ends the agents `agent` launched that stop with it, then drops its spec from the
    /// supervisor. In a task of its own: the actor telling it runs inside its supervisor's
    /// restart or stop, and both wait on that supervisor (and on the launcher, which may be
    /// waiting on it too).
    fn ended(&self, agent: &str) {
        let Some(launcher) = self.me.upgrade() else {
            return;
        };
        let parent = agent.to_owned();
        tokio::spawn(async move {
            let why = format!("its parent `{parent}` ended");
            for child in launcher.children_of(&parent).await {
                launcher.end(&child, &why).await;
            }
            launcher.forget(&parent).await;
        });
    }
}
