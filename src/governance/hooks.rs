//! Hooks: code that sees every matching call before it runs (and may allow, deny, ask, or
//! rewrite its arguments) and after it ran (and may add a note for the model).
//!
//! Hooks match by tool-name glob and run in priority order, lowest first; before-hooks run
//! one after another, each seeing the arguments as the previous one left them. A hook that
//! fails (an error, a non-zero exit, or its timeout) counts as its `on_failure` action:
//! `deny` unless configured otherwise.
//!
//! A command hook is any program: it gets the call as one JSON object on stdin
//! ([`HookInput`]) and answers with one JSON object on stdout ([`HookReply`]), or nothing
//! to let the call go on unchanged.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use guildhall_actors::CallContext;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::rules::{Action, Glob};

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the call, after the rate limit and before the permission rules.
    Before,
    /// After the call, with its result.
    After,
}

/// What a hook is given.
#[derive(Debug, Clone, Serialize)]
pub struct HookInput {
    /// Before or after the call.
    pub phase: Phase,
    /// The call's id.
    pub call_id: String,
    /// The tool.
    pub tool: Arc<str>,
    /// The calling agent, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<Arc<str>>,
    /// The call's session, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<Arc<str>>,
    /// The arguments (as rewritten by earlier hooks).
    pub arguments: Value,
    /// After the call: its outcome (`ok`, `tool_error`, `timeout`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<&'static str>,
    /// After a successful call: its result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// After a failed call: its error message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HookInput {
    /// What a hook of `phase` is given of a call to `tool` with `arguments`, before its
    /// outcome is known.
    pub fn new(phase: Phase, tool: Arc<str>, ctx: &CallContext, arguments: Value) -> Self {
        Self {
            phase,
            call_id: ctx.call_id().to_string(),
            tool,
            agent: ctx.agent_shared().cloned(),
            session: ctx.session_shared().cloned(),
            arguments,
            outcome: None,
            result: None,
            error: None,
        }
    }
}

/// What a hook answers. Every field is optional; an empty answer lets the call go on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookReply {
    /// Before-hooks only: allow (skipping an `ask` of the rules, never a `deny`), ask, or
    /// deny the call.
    #[serde(default)]
    pub decision: Option<Action>,
    /// Why, shown to the model with a denial.
    #[serde(default)]
    pub message: Option<String>,
    /// Before-hooks only: the arguments to call the tool with instead.
    #[serde(default)]
    pub arguments: Option<Value>,
    /// A note added to what the model sees of the result.
    #[serde(default)]
    pub note: Option<String>,
}

/// A hook's code.
///
/// # Examples
/// A before-hook that refuses `bash` commands removing whole trees, in-process (a closure
/// is a hook):
/// ```
/// use std::sync::Arc;
///
/// use futures::FutureExt;
/// use guildhall::governance::{
///     Action, GovernanceConfig, HookInput, HookReply, Phase, RegisteredHook,
/// };
///
/// let guard = |input: Arc<HookInput>| {
///     let command = input.arguments["command"].as_str().unwrap_or_default();
///     let refused = command.contains("rm -rf");
///     async move {
///         Ok::<_, String>(HookReply {
///             decision: refused.then_some(Action::Deny),
///             message: refused.then(|| "remove files one by one, by name".to_owned()),
///             ..HookReply::default()
///         })
///     }
///     .boxed()
/// };
/// let hook = RegisteredHook::new("no-rm-rf", Phase::Before, "bash", guard)?;
/// let config = GovernanceConfig { hooks: vec![hook], ..GovernanceConfig::default() };
/// # let _ = config;
/// # Ok::<(), String>(())
/// ```
pub trait Hook: Send + Sync + 'static {
    /// Looks at one call. An `Err` counts as the hook's `on_failure` action.
    fn run(&self, input: Arc<HookInput>) -> BoxFuture<'static, Result<HookReply, String>>;
}

impl<F> Hook for F
where
    F: Fn(Arc<HookInput>) -> BoxFuture<'static, Result<HookReply, String>> + Send + Sync + 'static,
{
    fn run(&self, input: Arc<HookInput>) -> BoxFuture<'static, Result<HookReply, String>> {
        self(input)
    }
}

/// How long a hook may take unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A hook with where and when it runs.
#[derive(Clone)]
pub struct RegisteredHook {
    /// A name for messages and the audit log.
    pub name: String,
    /// Before or after.
    pub phase: Phase,
    /// The tools it sees.
    pub tools: Glob,
    /// Lower runs first.
    pub priority: i32,
    /// How long it may take.
    pub timeout: Duration,
    /// What a failure or timeout means (before-hooks; after-hooks only log it).
    pub on_failure: Action,
    /// The code.
    pub hook: Arc<dyn Hook>,
}

impl RegisteredHook {
    /// A hook on `tools` (a glob) with priority 0, a 10 s timeout, and `deny` on failure.
    ///
    /// # Errors
    /// An invalid glob.
    pub fn new(
        name: impl Into<String>,
        phase: Phase,
        tools: &str,
        hook: impl Hook,
    ) -> Result<Self, String> {
        Ok(Self {
            name: name.into(),
            phase,
            tools: Glob::new(tools)?,
            priority: 0,
            timeout: DEFAULT_TIMEOUT,
            on_failure: Action::Deny,
            hook: Arc::new(hook),
        })
    }

    /// Sets the priority.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets what a failure means.
    #[must_use]
    pub fn on_failure(mut self, action: Action) -> Self {
        self.on_failure = action;
        self
    }

    /// Runs the hook within its timeout.
    async fn call(&self, input: Arc<HookInput>) -> Result<HookReply, String> {
        match tokio::time::timeout(self.timeout, self.hook.run(input)).await {
            Ok(reply) => reply,
            Err(_) => Err(format!("timed out after {:?}", self.timeout)),
        }
    }
}

impl std::fmt::Debug for RegisteredHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredHook")
            .field("name", &self.name)
            .field("phase", &self.phase)
            .field("tools", &self.tools)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// Every hook, sorted for running.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    before: Vec<RegisteredHook>,
    after: Vec<RegisteredHook>,
}

/// What the before-hooks made of a call.
#[derive(Debug, Default)]
pub struct Before {
    /// The strongest decision (deny over ask over allow) and the hook and message behind it.
    pub decision: Option<(Action, String)>,
    /// Rewritten arguments, if a hook rewrote them.
    pub arguments: Option<Value>,
    /// Notes for the model.
    pub notes: Vec<String>,
}

impl Hooks {
    /// Builds the set; order of registration breaks priority ties.
    pub fn new(hooks: impl IntoIterator<Item = RegisteredHook>) -> Self {
        let (mut before, mut after): (Vec<_>, Vec<_>) =
            hooks.into_iter().partition(|h| h.phase == Phase::Before);
        before.sort_by_key(|h| h.priority);
        after.sort_by_key(|h| h.priority);
        Self { before, after }
    }

    /// Whether any hook of `phase` sees `tool`.
    pub fn any(&self, phase: Phase, tool: &str) -> bool {
        let hooks = match phase {
            Phase::Before => &self.before,
            Phase::After => &self.after,
        };
        hooks.iter().any(|h| h.tools.matches(tool))
    }

    /// Runs the before-hooks for a call, stopping at the first denial.
    ///
    /// # Cancel safety
    /// Dropping the future kills the hook commands it started (they run with `kill_on_drop`).
    pub async fn before(&self, mut input: HookInput) -> Before {
        let mut out = Before::default();
        let tool = Arc::clone(&input.tool);
        for hook in self.before.iter().filter(|h| h.tools.matches(&tool)) {
            let shared = Arc::new(input);
            let reply = hook.call(Arc::clone(&shared)).await;
            input = Arc::unwrap_or_clone(shared);
            let reply = match reply {
                Ok(reply) => reply,
                Err(err) => {
                    tracing::warn!(hook = %hook.name, tool = %input.tool, %err, "before-hook failed");
                    HookReply {
                        decision: Some(hook.on_failure),
                        message: Some(format!("failed: {err}")),
                        ..HookReply::default()
                    }
                }
            };
            if let Some(note) = reply.note {
                out.notes.push(note);
            }
            if let Some(arguments) = reply.arguments {
                input.arguments = arguments.clone();
                out.arguments = Some(arguments);
            }
            if let Some(action) = reply.decision {
                let why = match reply.message {
                    Some(message) => format!("hook `{}`: {message}", hook.name),
                    None => format!("hook `{}` said {}", hook.name, action.as_str()),
                };
                let stronger = out
                    .decision
                    .as_ref()
                    .is_none_or(|(held, _)| rank(action) > rank(*held));
                if stronger {
                    out.decision = Some((action, why));
                }
                if action == Action::Deny {
                    break;
                }
            }
        }
        out
    }

    /// Runs the after-hooks for a call and returns their notes.
    ///
    /// # Cancel safety
    /// As [`before`](Self::before).
    pub async fn after(&self, input: HookInput) -> Vec<String> {
        let input = Arc::new(input);
        let mut notes = Vec::new();
        for hook in self.after.iter().filter(|h| h.tools.matches(&input.tool)) {
            match hook.call(Arc::clone(&input)).await {
                Ok(reply) => notes.extend(reply.note),
                Err(err) => {
                    tracing::warn!(hook = %hook.name, tool = %input.tool, %err, "after-hook failed");
                }
            }
        }
        notes
    }
}

fn rank(action: Action) -> u8 {
    match action {
        Action::Allow => 0,
        Action::Ask => 1,
        Action::Deny => 2,
    }
}

/// A hook that runs a program per call: the call as JSON on stdin, the answer as JSON on
/// stdout. The program is killed if the hook times out.
#[derive(Debug, Clone)]
pub struct CommandHook {
    program: PathBuf,
    args: Vec<String>,
    dir: Option<PathBuf>,
}

/// How much of a failing hook's stderr goes into the error.
const STDERR_SHOWN: usize = 2048;

impl CommandHook {
    /// Runs `program` with `args`.
    pub fn new(program: impl Into<PathBuf>, args: impl IntoIterator<Item = String>) -> Self {
        Self {
            program: program.into(),
            args: args.into_iter().collect(),
            dir: None,
        }
    }

    /// Runs the program in `dir` (a config file's hooks run in the file's directory).
    #[must_use]
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    async fn exec(self, input: Arc<HookInput>) -> Result<HookReply, String> {
        let Self { program, args, dir } = self;
        let mut command = tokio::process::Command::new(&program);
        if let Some(dir) = &dir {
            command.current_dir(dir);
        }
        let mut child = command
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| format!("cannot run `{}`: {err}", program.display()))?;
        let json = serde_json::to_vec(&*input).map_err(|err| err.to_string())?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let mut stdout = child.stdout.take().ok_or("no stdout")?;
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        // A hook may answer without reading its input: a closed pipe is not an error.
        let write = async move {
            let _ = stdin.write_all(&json).await;
            let _ = stdin.shutdown().await;
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (_, read_out, read_err) = tokio::join!(
            write,
            stdout.read_to_end(&mut out),
            stderr.read_to_end(&mut err)
        );
        read_out.map_err(|e| e.to_string())?;
        read_err.map_err(|e| e.to_string())?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if !status.success() {
            let mut stderr = String::from_utf8_lossy(&err).trim().to_owned();
            if stderr.len() > STDERR_SHOWN {
                let cut = (0..=STDERR_SHOWN)
                    .rev()
                    .find(|&i| stderr.is_char_boundary(i))
                    .unwrap_or(0);
                stderr.truncate(cut);
            }
            return Err(format!(
                "`{}` exited with {status}: {stderr}",
                program.display()
            ));
        }
        if out.iter().all(u8::is_ascii_whitespace) {
            return Ok(HookReply::default());
        }
        serde_json::from_slice(&out).map_err(|err| {
            format!(
                "`{}` answered something that is not a hook reply ({err}); expected e.g. {{\"decision\": \"deny\", \"message\": \"...\"}}",
                program.display()
            )
        })
    }
}

impl Hook for CommandHook {
    fn run(&self, input: Arc<HookInput>) -> BoxFuture<'static, Result<HookReply, String>> {
        Box::pin(self.clone().exec(input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(tool: &str, arguments: Value) -> HookInput {
        HookInput {
            phase: Phase::Before,
            call_id: "c".into(),
            tool: Arc::from(tool),
            agent: None,
            session: None,
            arguments,
            outcome: None,
            result: None,
            error: None,
        }
    }

    fn answer(reply: HookReply) -> impl Hook {
        move |_: Arc<HookInput>| -> BoxFuture<'static, Result<HookReply, String>> {
            let reply = reply.clone();
            Box::pin(async move { Ok(reply) })
        }
    }

    #[tokio::test]
    async fn before_hooks_run_in_priority_order_and_a_denial_stops_them() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = |name: &'static str| {
            let seen = Arc::clone(&seen);
            move |input: Arc<HookInput>| -> BoxFuture<'static, Result<HookReply, String>> {
                seen.lock()
                    .expect("lock")
                    .push((name, input.arguments.clone()));
                Box::pin(async { Ok(HookReply::default()) })
            }
        };
        let rewrite = answer(HookReply {
            arguments: Some(json!({"n": 2})),
            ..HookReply::default()
        });
        let deny = answer(HookReply {
            decision: Some(Action::Deny),
            message: Some("no".into()),
            ..HookReply::default()
        });
        let hooks = Hooks::new([
            RegisteredHook::new("late", Phase::Before, "*", record("late"))
                .expect("hook")
                .priority(9),
            RegisteredHook::new("deny", Phase::Before, "t", deny)
                .expect("hook")
                .priority(5),
            RegisteredHook::new("rewrite", Phase::Before, "t*", rewrite)
                .expect("hook")
                .priority(1),
            RegisteredHook::new("first", Phase::Before, "*", record("first"))
                .expect("hook")
                .priority(-1),
            RegisteredHook::new("other", Phase::Before, "x", record("other")).expect("hook"),
        ]);
        let out = hooks.before(input("t", json!({"n": 1}))).await;
        assert_eq!(
            out.decision,
            Some((Action::Deny, "hook `deny`: no".to_owned()))
        );
        assert_eq!(out.arguments, Some(json!({"n": 2})));
        assert_eq!(
            *seen.lock().expect("lock"),
            vec![("first", json!({"n": 1}))]
        );
        // Without the denial, later hooks see the rewritten arguments.
        let out = hooks.before(input("tx", json!({"n": 1}))).await;
        assert_eq!(out.decision, None);
        assert_eq!(
            seen.lock().expect("lock").last(),
            Some(&("late", json!({"n": 2})))
        );
    }

    #[tokio::test]
    async fn a_failing_or_slow_hook_counts_as_its_configured_action() {
        let fail = |_: Arc<HookInput>| -> BoxFuture<'static, Result<HookReply, String>> {
            Box::pin(async { Err("broken".to_owned()) })
        };
        let hang = |_: Arc<HookInput>| -> BoxFuture<'static, Result<HookReply, String>> {
            Box::pin(std::future::pending())
        };
        let hooks =
            Hooks::new([RegisteredHook::new("fail", Phase::Before, "*", fail).expect("hook")]);
        let out = hooks.before(input("t", json!({}))).await;
        let (action, why) = out.decision.expect("decided");
        assert_eq!(action, Action::Deny);
        assert_eq!(why, "hook `fail`: failed: broken");

        let hooks = Hooks::new([RegisteredHook::new("hang", Phase::Before, "*", hang)
            .expect("hook")
            .timeout(Duration::from_millis(20))
            .on_failure(Action::Allow)]);
        let out = hooks.before(input("t", json!({}))).await;
        let (action, why) = out.decision.expect("decided");
        assert_eq!(action, Action::Allow);
        assert!(why.contains("timed out"), "{why}");
    }

    #[tokio::test]
    async fn ask_outranks_allow_and_after_hooks_collect_notes() {
        let hooks = Hooks::new([
            RegisteredHook::new(
                "allow",
                Phase::Before,
                "*",
                answer(HookReply {
                    decision: Some(Action::Allow),
                    ..HookReply::default()
                }),
            )
            .expect("hook"),
            RegisteredHook::new(
                "ask",
                Phase::Before,
                "*",
                answer(HookReply {
                    decision: Some(Action::Ask),
                    note: Some("careful".into()),
                    ..HookReply::default()
                }),
            )
            .expect("hook"),
            RegisteredHook::new(
                "after",
                Phase::After,
                "*",
                answer(HookReply {
                    note: Some("seen".into()),
                    ..HookReply::default()
                }),
            )
            .expect("hook"),
        ]);
        let out = hooks.before(input("t", json!({}))).await;
        assert_eq!(out.decision.map(|d| d.0), Some(Action::Ask));
        assert_eq!(out.notes, vec!["careful".to_owned()]);
        let mut after = input("t", json!({}));
        after.phase = Phase::After;
        assert_eq!(hooks.after(after).await, vec!["seen".to_owned()]);
        assert!(hooks.any(Phase::After, "t") && hooks.any(Phase::Before, "t"));
    }
}
