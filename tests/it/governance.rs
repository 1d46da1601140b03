use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use guildhall::config::Config;
use guildhall::governance::{
    Action, Approval, AskRequest, Asker, AuditQuery, GovernanceConfig, Mode, Outcome, Principal,
    Rule, ToolEvent, ToolPolicy, Trust,
};
use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::supervision::BreakerConfig;
use guildhall::{
    AgentSpec, Annotations, CallContext, CallError, CallOptions, ErrorKind, Runtime, Tool,
    ToolOptions,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::support::{Act, Chaos, ChaosInput, as_agent, input};

/// Echoes the command it is given (runs nothing): a stand-in for a shell tool.
struct Shell(&'static str);

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct ShellInput {
    command: String,
}

impl Tool for Shell {
    type Input = ShellInput;
    type Output = String;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        "Pretends to run a command."
    }
    async fn call(
        &self,
        _: &mut (),
        input: ShellInput,
        _: CallContext,
    ) -> Result<String, Self::Error> {
        Ok(format!("ran: {}", input.command))
    }
}

/// A read-only lookup that counts its runs.
struct Lookup(Arc<AtomicUsize>);

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct LookupInput {
    key: String,
}

#[derive(Debug, Serialize, JsonSchema)]
struct LookupOutput {
    key: String,
    runs: usize,
}

impl Tool for Lookup {
    type Input = LookupInput;
    type Output = LookupOutput;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        "lookup"
    }
    fn description(&self) -> &str {
        "Looks a key up."
    }
    fn annotations(&self) -> Annotations {
        Annotations::read_only()
    }
    async fn call(
        &self,
        _: &mut (),
        input: LookupInput,
        _: CallContext,
    ) -> Result<LookupOutput, Self::Error> {
        let runs = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(LookupOutput {
            key: input.key,
            runs,
        })
    }
}

/// Returns `n` numbered lines.
struct Lines;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct LinesInput {
    n: usize,
}

impl Tool for Lines {
    type Input = LinesInput;
    type Output = String;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        "lines"
    }
    fn description(&self) -> &str {
        "Prints numbered lines."
    }
    async fn call(
        &self,
        _: &mut (),
        input: LinesInput,
        _: CallContext,
    ) -> Result<String, Self::Error> {
        Ok((1..=input.n).map(|i| format!("line {i}\n")).collect())
    }
}

fn rule(tool: &str, action: Action) -> Rule {
    Rule::new(tool, action).unwrap()
}

fn shell(command: &str) -> Value {
    json!({ "command": command })
}

fn denied_reason(result: Result<Value, CallError>) -> String {
    match result {
        Err(CallError::Denied { reason, .. }) => reason,
        other => panic!("expected a denial, got {other:?}"),
    }
}

async fn runtime(config: GovernanceConfig, agents: &[(&str, &str)]) -> Runtime {
    let rt = Runtime::builder()
        .governance(config)
        .tool(Shell("shell"))
        .tool(Lookup(Arc::default()))
        .build()
        .await
        .unwrap();
    for (id, role) in agents {
        rt.register_agent(AgentSpec::new(*id, *role)).await.unwrap();
    }
    rt
}

/// An asker that answers from a script and counts the questions.
#[derive(Default)]
pub(crate) struct Scripted {
    answers: Mutex<VecDeque<Approval>>,
    pub(crate) asked: AtomicUsize,
}

impl Scripted {
    pub(crate) fn new(answers: &[Approval]) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.iter().copied().collect()),
            asked: AtomicUsize::new(0),
        })
    }
}

impl Asker for Scripted {
    fn ask(&self, _: AskRequest) -> BoxFuture<'static, Approval> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .expect("an unexpected question");
        Box::pin(async move { answer })
    }
}

#[tokio::test]
async fn rules_by_scope_decide_calls() {
    let mut config = GovernanceConfig {
        rules: vec![rule("shell", Action::Ask)],
        ..GovernanceConfig::default()
    };
    config.roles.insert(
        "dev".into(),
        Principal {
            trust: None,
            rules: vec![
                rule("shell", Action::Allow)
                    .with_arg("command", "git *")
                    .unwrap(),
            ],
            role: None,
        },
    );
    config.agents.insert(
        "dev-2".into(),
        Principal {
            trust: None,
            rules: vec![rule("shell", Action::Deny)],
            role: Some("dev".into()),
        },
    );
    // The config gives dev-1 its role, so the role's allow rules are its own.
    config.agents.insert(
        "dev-1".into(),
        Principal {
            role: Some("dev".into()),
            ..Principal::default()
        },
    );
    let rt = runtime(config, &[("dev-1", "dev"), ("dev-2", "dev")]).await;

    let ran = rt
        .call_json("shell", shell("git status"), as_agent(&rt, "dev-1"))
        .await
        .unwrap();
    assert_eq!(ran, json!("ran: git status"));
    // The role's argument rule does not match: the config rule asks, and nobody can be asked.
    let why = denied_reason(
        rt.call_json("shell", shell("ls"), as_agent(&rt, "dev-1"))
            .await,
    );
    assert!(why.contains("config rule `shell → ask`"), "{why}");
    assert!(
        why.contains("[[agents.dev-1.rules]]"),
        "the message says how to allow it: {why}"
    );
    // The agent's own deny wins over its role's allow.
    let why = denied_reason(
        rt.call_json("shell", shell("git status"), as_agent(&rt, "dev-2"))
            .await,
    );
    assert!(why.contains("agent rule `shell → deny`"), "{why}");
    // Typed calls pass the same rules.
    let typed = rt.handle::<Shell>("shell").unwrap();
    let err = typed
        .call_with(
            ShellInput {
                command: "git log".into(),
            },
            as_agent(&rt, "dev-2"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied);
    rt.shutdown().await;
}

#[tokio::test]
async fn plan_and_explore_modes_allow_only_read_only_tools_until_switched() {
    let mut config = GovernanceConfig::default();
    config.modes.insert("role:planner".into(), Mode::Plan);
    config.rules.push(rule("context_get", Action::Ask));
    let rt = runtime(config, &[("p", "planner"), ("b", "dev")]).await;
    // Plan: a tool that does not declare itself read-only is refused, naming the mode.
    let err = denied_reason(rt.call_json("shell", shell("ls"), as_agent(&rt, "p")).await);
    assert!(err.contains("plan: read-only tools only"), "{err}");
    rt.call_json("list_agents", json!({}), as_agent(&rt, "p"))
        .await
        .unwrap();
    // Another agent, in build, is not affected.
    rt.call_json("shell", shell("ls"), as_agent(&rt, "b"))
        .await
        .unwrap();
    let switched = rt
        .call_json("set_mode", json!({"mode": "build"}), as_agent(&rt, "p"))
        .await
        .unwrap();
    assert_eq!(switched, json!({"was": "plan", "mode": "build"}));
    rt.call_json("shell", shell("ls"), as_agent(&rt, "p"))
        .await
        .unwrap();
    // Explore: read-only, and a rule's `ask` is a denial, without asking anyone.
    rt.call_json("set_mode", json!({"mode": "explore"}), as_agent(&rt, "p"))
        .await
        .unwrap();
    let nobody = Scripted::new(&[]);
    let options = as_agent(&rt, "p").asker(Arc::clone(&nobody) as Arc<dyn Asker>);
    let err = denied_reason(
        rt.call_json("context_get", json!({"session": "s"}), options)
            .await,
    );
    assert!(err.contains("explore: nothing waits on a person"), "{err}");
    assert_eq!(nobody.asked.load(Ordering::SeqCst), 0);
    let err = denied_reason(rt.call_json("shell", shell("ls"), as_agent(&rt, "p")).await);
    assert!(err.contains("explore: read-only tools only"), "{err}");
    // A mode belongs to an agent: one without an identity cannot set one.
    assert!(
        rt.call_json("set_mode", json!({"mode": "plan"}), CallOptions::new())
            .await
            .is_err()
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn trust_levels_deny_and_hide_tools() {
    let mut config = GovernanceConfig {
        rules: vec![
            rule("lookup", Action::Ask)
                .with_arg("key", "secret*")
                .unwrap(),
            rule("check_inbox", Action::Deny),
        ],
        ..GovernanceConfig::default()
    };
    config.roles.insert(
        "reader".into(),
        Principal {
            trust: Some(Trust::ReadOnly),
            // A read-only agent stays read-only whatever else its rules say.
            rules: vec![rule("shell", Action::Allow)],
            role: None,
        },
    );
    let rt = runtime(config, &[("reader-1", "reader"), ("dev-1", "dev")]).await;

    let why = denied_reason(
        rt.call_json("shell", shell("ls"), as_agent(&rt, "reader-1"))
            .await,
    );
    assert!(why.contains("trust rule `read_only`"), "{why}");
    rt.call_json("lookup", json!({"key": "a"}), as_agent(&rt, "reader-1"))
        .await
        .unwrap();
    rt.call_json("shell", shell("ls"), as_agent(&rt, "dev-1"))
        .await
        .unwrap();

    let server = McpServer::new(rt.clone());
    let names = |agent: &str| -> HashSet<String> {
        server
            .connection(Some(Arc::from(agent)), ToolFilter::all())
            .visible_tools()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect()
    };
    let reader = names("reader-1");
    assert!(!reader.contains("shell"), "denied outright: hidden");
    assert!(
        !reader.contains("send_message"),
        "not read-only: hidden from a reader"
    );
    assert!(reader.contains("lookup"), "an argument rule hides nothing");
    assert!(!reader.contains("check_inbox"), "denied by a config rule");
    let dev = names("dev-1");
    assert!(dev.contains("shell") && dev.contains("send_message") && !dev.contains("check_inbox"));
    rt.shutdown().await;
}

/// Governance under which every call of the role `dev` is asked about (`suggest` trust).
fn devs_are_asked() -> GovernanceConfig {
    let mut config = GovernanceConfig::default();
    config.roles.insert(
        "dev".into(),
        Principal {
            trust: Some(Trust::Suggest),
            ..Principal::default()
        },
    );
    config
}

#[tokio::test]
async fn approvals_once_for_the_session_and_always_which_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let build = || async {
        Runtime::builder()
            .data_dir(dir.path())
            .governance(devs_are_asked())
            .tool(Shell("shell"))
            .build()
            .await
            .unwrap()
    };
    let rt = build().await;
    rt.register_agent(AgentSpec::new("dev-1", "dev"))
        .await
        .unwrap();
    let asker = Scripted::new(&[
        Approval::Once,
        Approval::Session,
        Approval::Deny,
        Approval::Always,
    ]);
    let call = |n: u32, session: &str, asker: Option<Arc<Scripted>>| {
        let mut options = as_agent(&rt, "dev-1").session(session.to_owned());
        if let Some(asker) = asker {
            options = options.asker(asker);
        }
        let rt = rt.clone();
        async move {
            rt.call_json("shell", shell(&format!("step {n}")), options)
                .await
        }
    };

    call(1, "s1", Some(asker.clone())).await.unwrap();
    assert_eq!(asker.asked.load(Ordering::SeqCst), 1);
    // "Once" covered one call: the next is asked about again, and approved for the session.
    call(2, "s1", Some(asker.clone())).await.unwrap();
    assert_eq!(asker.asked.load(Ordering::SeqCst), 2);
    call(3, "s1", Some(asker.clone())).await.unwrap();
    assert_eq!(
        asker.asked.load(Ordering::SeqCst),
        2,
        "approved for the session"
    );
    // Another session is asked again; a refusal denies.
    let why = denied_reason(call(4, "s2", Some(asker.clone())).await);
    assert!(why.contains("approval was refused"), "{why}");
    call(5, "s2", Some(asker.clone())).await.unwrap();
    assert_eq!(asker.asked.load(Ordering::SeqCst), 4, "approved always");
    call(6, "s3", None).await.unwrap();
    rt.shutdown().await;

    // "Always" is in the store: a new runtime lets the call through with nobody to ask.
    let rt = build().await;
    let ran = rt
        .call_json(
            "shell",
            shell("after restart"),
            as_agent(&rt, "dev-1").session("s9"),
        )
        .await
        .unwrap();
    assert_eq!(ran, json!("ran: after restart"));
    rt.shutdown().await;
}

#[tokio::test]
async fn command_hooks_deny_rewrite_note_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| std::fs::write(dir.path().join(name), body).unwrap();
    write(
        "no-rm.sh",
        "input=$(cat)\ncase \"$input\" in\n  *'rm -rf'*) echo '{\"decision\": \"deny\", \"message\": \"rm -rf is not allowed here\"}' ;;\nesac\n",
    );
    write(
        "rewrite.sh",
        "cat > /dev/null\necho '{\"arguments\": {\"command\": \"echo rewritten\"}, \"note\": \"the command was rewritten\"}'\n",
    );
    write(
        "after.sh",
        "grep -q '\"outcome\":\"ok\"' && echo '{\"note\": \"checked after\"}'\n",
    );
    // An after-hook alone sees the arguments the tool got (and the outcome).
    write(
        "after-args.sh",
        "grep -q '\"arguments\":{\"command\":\"date\"}' && echo '{\"note\": \"saw the arguments\"}'\n",
    );
    write("hang.sh", "sleep 30\n");
    write("broken.sh", "echo oops >&2\nexit 3\n");
    let toml = r#"
[[hooks]]
tools = "shell"
phase = "before"
command = ["sh", "no-rm.sh"]

[[hooks]]
tools = "shell_rw"
phase = "before"
command = ["sh", "rewrite.sh"]

[[hooks]]
tools = "shell_rw"
phase = "after"
command = ["sh", "after.sh"]

[[hooks]]
tools = "shell_after"
phase = "after"
command = ["sh", "after-args.sh"]

[[hooks]]
tools = "shell_slow*"
phase = "before"
command = ["sh", "hang.sh"]
timeout = "200ms"

[[hooks]]
tools = "shell_slow_tolerated"
phase = "before"
command = ["sh", "hang.sh"]
timeout = "200ms"
on_failure = "allow"
priority = -1

[[hooks]]
tools = "shell_broken"
phase = "before"
command = ["sh", "broken.sh"]
"#;
    let path = dir.path().join("guildhall.toml");
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(&path, true).unwrap();
    let rt = Runtime::builder()
        .governance(config.governance())
        .tool(Shell("shell"))
        .tool(Shell("shell_rw"))
        .tool(Shell("shell_after"))
        .tool(Shell("shell_slow"))
        .tool(Shell("shell_slow_tolerated"))
        .tool(Shell("shell_broken"))
        .build()
        .await
        .unwrap();
    let anyone = CallOptions::new;

    assert_eq!(
        rt.call_json("shell", shell("ls -l"), anyone())
            .await
            .unwrap(),
        json!("ran: ls -l")
    );
    let why = denied_reason(
        rt.call_json("shell", shell("cd / && rm -rf tmp"), anyone())
            .await,
    );
    assert_eq!(why, "hook `sh no-rm.sh`: rm -rf is not allowed here");

    let reply = rt
        .call_reply("shell_rw", shell("whatever"), anyone())
        .await
        .unwrap();
    assert_eq!(reply.value, json!("ran: echo rewritten"));
    assert_eq!(
        reply.notes,
        vec!["the command was rewritten", "checked after"]
    );

    let reply = rt
        .call_reply("shell_after", shell("date"), anyone())
        .await
        .unwrap();
    assert_eq!(reply.notes, vec!["saw the arguments"]);

    // A hung hook times out and counts as its `on_failure`: deny by default...
    let why = denied_reason(rt.call_json("shell_slow", shell("x"), anyone()).await);
    assert!(why.contains("timed out after 200ms"), "{why}");
    // ...though the hung hook at priority -1 of `shell_slow_tolerated` is configured to
    // allow, its other (deny) hook still decides: deny wins.
    let why = denied_reason(
        rt.call_json("shell_slow_tolerated", shell("x"), anyone())
            .await,
    );
    assert!(why.contains("timed out"), "{why}");
    let why = denied_reason(rt.call_json("shell_broken", shell("x"), anyone()).await);
    assert!(why.contains("exited with exit status: 3: oops"), "{why}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_hook_failure_configured_to_allow_lets_the_call_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hang.sh"), "sleep 30\n").unwrap();
    let path = dir.path().join("guildhall.toml");
    std::fs::write(
        &path,
        "[[hooks]]\ntools = \"shell\"\nphase = \"before\"\ncommand = [\"sh\", \"hang.sh\"]\ntimeout = \"100ms\"\non_failure = \"allow\"\n",
    )
    .unwrap();
    let rt = Runtime::builder()
        .governance(Config::load(&path, true).unwrap().governance())
        .tool(Shell("shell"))
        .build()
        .await
        .unwrap();
    let ran = rt
        .call_json("shell", shell("x"), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(ran, json!("ran: x"));
    rt.shutdown().await;
}

#[tokio::test]
async fn the_loop_guard_trips_on_the_third_identical_call_but_not_on_waiting_checks() {
    let rt = runtime(GovernanceConfig::default(), &[("a", "dev"), ("b", "dev")]).await;
    for _ in 0..2 {
        rt.call_json("shell", shell("make"), as_agent(&rt, "a"))
            .await
            .unwrap();
    }
    // Another agent's identical call is its own streak.
    rt.call_json("shell", shell("make"), as_agent(&rt, "b"))
        .await
        .unwrap();
    let why = denied_reason(
        rt.call_json("shell", shell("make"), as_agent(&rt, "a"))
            .await,
    );
    assert!(
        why.contains("called 3 times in a row by `a` with the same arguments"),
        "{why}"
    );
    // Changing the arguments is the way out.
    rt.call_json("shell", shell("make test"), as_agent(&rt, "a"))
        .await
        .unwrap();
    // The program's own calls (no agent) are not guarded.
    for _ in 0..4 {
        rt.call_json("shell", shell("make"), CallOptions::new())
            .await
            .unwrap();
    }
    // A waiting inbox check repeats by design.
    for _ in 0..4 {
        rt.call_json(
            "check_inbox",
            json!({"wait_secs": 0.01}),
            as_agent(&rt, "a"),
        )
        .await
        .unwrap();
    }
    // Without a wait it is an ordinary read: the same answer three times is a loop.
    for _ in 0..2 {
        rt.call_json("check_inbox", json!({}), as_agent(&rt, "a"))
            .await
            .unwrap();
    }
    let why = denied_reason(
        rt.call_json("check_inbox", json!({}), as_agent(&rt, "a"))
            .await,
    );
    assert!(why.contains("gave the same result each time"), "{why}");
    rt.shutdown().await;
}

/// A write that fails while its outage lasts (one call less each time); `transient` says
/// whether it calls that failure one that may pass, as a store unreachable is.
struct Deploy(Arc<AtomicUsize>);

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct DeployInput {
    target: String,
    transient: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("the target is down")]
struct DeployError {
    transient: bool,
}

impl Tool for Deploy {
    type Input = DeployInput;
    type Output = String;
    type Error = DeployError;
    type State = ();

    fn name(&self) -> &str {
        "deploy"
    }
    fn description(&self) -> &str {
        "Deploys to a target, which may be down."
    }
    fn is_transient(error: &DeployError) -> bool {
        error.transient
    }
    async fn call(
        &self,
        _: &mut (),
        input: DeployInput,
        _: CallContext,
    ) -> Result<String, DeployError> {
        let down = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if down {
            return Err(DeployError {
                transient: input.transient,
            });
        }
        Ok(format!("deployed to {}", input.target))
    }
}

/// A call retried while what it needs is down for now (an error the tool calls transient)
/// is a retry, not a loop: the guard lets it through as often as it fails so, and it
/// succeeds once the outage ends. The same failure called permanent is a loop.
#[tokio::test]
async fn the_loop_guard_lets_a_call_be_retried_while_its_failure_may_pass() {
    let outage = Arc::new(AtomicUsize::new(5));
    let rt = Runtime::builder()
        .governance(GovernanceConfig::default())
        .tool(Deploy(Arc::clone(&outage)))
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("a", "dev")).await.unwrap();
    let deploy = |transient| json!({ "target": "prod", "transient": transient });
    for attempt in 1..=5 {
        match rt
            .call_json("deploy", deploy(true), as_agent(&rt, "a"))
            .await
        {
            Err(CallError::Tool { transient, .. }) => assert!(transient, "attempt {attempt}"),
            other => panic!("attempt {attempt}: expected the outage's error, got {other:?}"),
        }
    }
    assert_eq!(
        rt.call_json("deploy", deploy(true), as_agent(&rt, "a"))
            .await
            .unwrap(),
        json!("deployed to prod")
    );
    // A failure that will not pass counts: the third identical call is refused.
    outage.store(5, Ordering::SeqCst);
    for _ in 0..2 {
        let failed = rt
            .call_json("deploy", deploy(false), as_agent(&rt, "a"))
            .await;
        assert!(
            matches!(
                failed,
                Err(CallError::Tool {
                    transient: false,
                    ..
                })
            ),
            "{failed:?}"
        );
    }
    let why = denied_reason(
        rt.call_json("deploy", deploy(false), as_agent(&rt, "a"))
            .await,
    );
    assert!(why.contains("called 3 times in a row"), "{why}");
    // A send with a `request_id` is made once however often it is sent again (its client
    // timed out, reconnected): a repeat is a retry, and answers the first receipt.
    rt.register_agent(AgentSpec::new("b", "dev")).await.unwrap();
    let send = json!({ "to": "b", "body": "built", "request_id": "build-7" });
    let first = rt
        .call_json("send_message", send.clone(), as_agent(&rt, "a"))
        .await
        .unwrap();
    for _ in 0..3 {
        let again = rt
            .call_json("send_message", send.clone(), as_agent(&rt, "a"))
            .await
            .unwrap();
        assert_eq!(again["id"], first["id"], "{again}");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn a_loop_guard_set_to_ask_asks_and_one_set_to_allow_lets_the_repeat_run() {
    let mut config = GovernanceConfig::default();
    config.doom_loop.action = Action::Ask;
    let rt = runtime(config, &[("a", "dev")]).await;
    let asker = Scripted::new(&[Approval::Once, Approval::Deny]);
    let call = || {
        rt.call_json(
            "shell",
            shell("make"),
            as_agent(&rt, "a").asker(asker.clone()),
        )
    };
    for _ in 0..2 {
        call().await.unwrap();
    }
    assert_eq!(asker.asked.load(Ordering::SeqCst), 0);
    // The third is asked about; allowed, it runs and the streak starts over.
    assert_eq!(call().await.unwrap(), json!("ran: make"));
    assert_eq!(asker.asked.load(Ordering::SeqCst), 1);
    for _ in 0..2 {
        call().await.unwrap();
    }
    let why = denied_reason(call().await);
    assert!(why.contains("approval was refused"), "{why}");
    assert_eq!(asker.asked.load(Ordering::SeqCst), 2);
    rt.shutdown().await;

    let mut config = GovernanceConfig::default();
    config.doom_loop.action = Action::Allow;
    let rt = runtime(config, &[("a", "dev")]).await;
    for _ in 0..5 {
        let ran = rt
            .call_json("shell", shell("make"), as_agent(&rt, "a"))
            .await;
        assert_eq!(ran.unwrap(), json!("ran: make"));
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn polling_the_inbox_is_not_a_loop_while_new_mail_arrives() {
    let rt = runtime(GovernanceConfig::default(), &[("a", "dev"), ("b", "dev")]).await;
    let poll = || rt.call_json("check_inbox", json!({"limit": 5}), as_agent(&rt, "a"));
    for i in 0..6 {
        let inbox = poll().await.expect("a poll after new mail is answered");
        assert_eq!(inbox["unread"], i, "{inbox}");
        rt.call_json(
            "send_message",
            json!({"to": "a", "body": format!("news {i}")}),
            as_agent(&rt, "b"),
        )
        .await
        .unwrap();
    }
    // Nothing new: the third identical answer in a row is refused.
    poll().await.unwrap();
    poll().await.unwrap();
    denied_reason(poll().await);
    // A read whose result changes is never a loop: the same listing of a read-only tool
    // whose answers differ (a counter) goes on being served.
    for _ in 0..5 {
        rt.call_json("lookup", json!({"key": "k"}), as_agent(&rt, "b"))
            .await
            .unwrap();
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn long_results_are_cut_and_kept_whole_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GovernanceConfig {
        spill_dir: Some(dir.path().join("spill")),
        ..GovernanceConfig::default()
    };
    config.tools.insert(
        "lines".into(),
        ToolPolicy {
            truncate: Some(guildhall::governance::truncate::Limits {
                max_lines: 10,
                max_bytes: 50 * 1024,
            }),
            ..ToolPolicy::default()
        },
    );
    let rt = Runtime::builder()
        .governance(config)
        .tool(Lines)
        .build()
        .await
        .unwrap();

    let short = rt
        .call_reply("lines", json!({"n": 10}), CallOptions::new())
        .await
        .unwrap();
    assert!(short.truncated.is_none());
    let long = rt
        .call_reply("lines", json!({"n": 500}), CallOptions::new())
        .await
        .unwrap();
    let cut = long.truncated.expect("cut");
    assert!(cut.path.starts_with(dir.path().join("spill")));
    let whole: String = (1..=500).map(|i| format!("line {i}\n")).collect();
    assert_eq!(std::fs::read_to_string(&cut.path).unwrap(), whole);
    assert!(cut.text.contains("line 10\n") && !cut.text.contains("line 11\n"));
    assert!(
        cut.text.contains("showing lines 1-10 of 500"),
        "{}",
        cut.text
    );
    assert!(
        cut.text.contains(&cut.path.display().to_string()),
        "the hint points at the file"
    );
    // Rust callers get the whole value.
    assert_eq!(long.value, json!(whole));
    rt.shutdown().await;
}

#[tokio::test]
async fn deterministic_results_are_cached_until_the_context_changes() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut config = GovernanceConfig::default();
    config.tools.insert(
        "lookup".into(),
        ToolPolicy {
            cache_ttl: Some(Duration::from_secs(60)),
            ..ToolPolicy::default()
        },
    );
    let rt = Runtime::builder()
        .governance(config)
        .tool(Lookup(Arc::clone(&runs)))
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("a", "dev")).await.unwrap();
    let in_s1 = || CallOptions::new().session("s1");
    let first = rt
        .call_json("lookup", json!({"key": "k"}), in_s1())
        .await
        .unwrap();
    let again = rt
        .call_json("lookup", json!({"key": "k"}), in_s1())
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second call was served from the cache"
    );
    rt.call_json("lookup", json!({"key": "other"}), in_s1())
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "other arguments");
    rt.call_json(
        "lookup",
        json!({"key": "k"}),
        CallOptions::new().session("s2"),
    )
    .await
    .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3, "another session");
    // The session's context changes: its cached results are stale.
    let ctx = rt.sessions().open("s1", Some("a")).await.unwrap();
    ctx.replace("k", json!(1)).await.unwrap();
    rt.call_json("lookup", json!({"key": "k"}), in_s1())
        .await
        .unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "invalidated by the context change"
    );
    rt.call_json("lookup", json!({"key": "k"}), in_s1())
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    rt.shutdown().await;
}

#[tokio::test]
async fn audit_records_exactly_one_entry_per_call_for_every_outcome() {
    let mut config = GovernanceConfig {
        rules: vec![rule("forbidden", Action::Deny)],
        ..GovernanceConfig::default()
    };
    config.tools.insert(
        "limited".into(),
        ToolPolicy {
            rate: Some("1/hour".parse().unwrap()),
            ..ToolPolicy::default()
        },
    );
    let quick = ToolOptions::default()
        .timeout(Duration::from_millis(100))
        .grace(Duration::from_millis(20))
        .max_retries(0)
        .breaker(BreakerConfig {
            max_failures: 1,
            reset_timeout: Duration::from_secs(60),
            ..BreakerConfig::default()
        });
    let lenient = ToolOptions::default().max_retries(0);
    let rt = Runtime::builder()
        .governance(config)
        .tool_with(Chaos::new("chaos").0, lenient.clone())
        .tool_with(Chaos::new("fragile").0, quick.clone())
        .tool_with(Chaos::new("slow").0, quick)
        .tool_with(Chaos::new("forbidden").0, lenient.clone())
        .tool_with(Chaos::new("limited").0, lenient)
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("auditor", "dev"))
        .await
        .unwrap();
    let call = |tool: &'static str, act: Act, id: u64| {
        let rt = rt.clone();
        async move {
            rt.call_json(
                tool,
                json!({"act": act, "id": id}),
                as_agent(&rt, "auditor"),
            )
            .await
        }
    };
    let mut expected: HashMap<Outcome, usize> = HashMap::new();
    let mut expect = |outcome: Outcome, result: Result<Value, CallError>| {
        let kind = result.as_ref().err().map(CallError::kind);
        let got = match &result {
            Ok(_) => Outcome::Ok,
            Err(err) => Outcome::of(err),
        };
        assert_eq!(got, outcome, "{kind:?}: {result:?}");
        *expected.entry(outcome).or_default() += 1;
    };
    expect(Outcome::Ok, call("chaos", Act::Ok, 1).await);
    expect(Outcome::ToolError, call("chaos", Act::Fail, 2).await);
    expect(
        Outcome::InvalidArguments,
        rt.call_json("chaos", json!({"act": "dance"}), as_agent(&rt, "auditor"))
            .await,
    );
    expect(Outcome::Crashed, call("fragile", Act::Panic, 3).await);
    expect(Outcome::CircuitOpen, call("fragile", Act::Ok, 4).await);
    expect(Outcome::Timeout, call("slow", Act::Hang, 5).await);
    expect(Outcome::Denied, call("forbidden", Act::Ok, 6).await);
    expect(Outcome::Ok, call("limited", Act::Ok, 7).await);
    let limited = call("limited", Act::Ok, 8).await;
    match &limited {
        Err(CallError::RateLimited { retry_after, .. }) => {
            assert!(*retry_after > Duration::from_secs(60))
        }
        other => panic!("{other:?}"),
    }
    expect(Outcome::RateLimited, limited);
    // A caller that goes away: the dropped call is recorded as cancelled.
    let typed = rt.handle::<Chaos>("chaos").unwrap();
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        typed.call_with(
            ChaosInput {
                act: Act::WaitForCancel,
                id: 9,
            },
            as_agent(&rt, "auditor"),
        ),
    )
    .await;
    assert!(dropped.is_err());
    *expected.entry(Outcome::Cancelled).or_default() += 1;
    // A typed call is audited like a JSON one.
    typed
        .call_with(input(Act::Ok), as_agent(&rt, "auditor"))
        .await
        .unwrap();
    *expected.entry(Outcome::Ok).or_default() += 1;

    let audit = rt.governance().audit().expect("auditing is on");
    audit.flush().await.unwrap();
    let records = audit
        .query(&AuditQuery {
            agent: Some("auditor".into()),
            ..AuditQuery::default()
        })
        .unwrap();
    let mut counted: HashMap<Outcome, usize> = HashMap::new();
    for r in &records {
        *counted.entry(r.outcome).or_default() += 1;
    }
    assert_eq!(counted, expected, "{records:#?}");
    let ids: HashSet<_> = records.iter().map(|r| r.call_id).collect();
    assert_eq!(ids.len(), records.len(), "one record per call");
    let denied = records
        .iter()
        .find(|r| r.outcome == Outcome::Denied)
        .unwrap();
    assert_eq!(
        (denied.decision, denied.tool.as_str()),
        (Action::Deny, "forbidden")
    );
    assert_eq!(denied.rule, "config rule `forbidden → deny`");
    let ok = records
        .iter()
        .find(|r| r.tool == "chaos" && r.outcome == Outcome::Ok)
        .unwrap();
    assert_eq!(ok.rule, "trust rule `autonomous`");
    assert_eq!(ok.args_digest.len(), 16);
    // Equal arguments, equal digests.
    let same = records
        .iter()
        .filter(|r| r.tool == "limited")
        .map(|r| r.args_digest.clone())
        .collect::<Vec<_>>();
    assert_ne!(same[0], same[1], "the ids differ, so the arguments do");
    // Filters.
    let only = audit
        .query(&AuditQuery {
            outcome: Some(Outcome::Denied),
            ..AuditQuery::default()
        })
        .unwrap();
    assert_eq!(only.len(), 1);
    let last_two = audit
        .query(&AuditQuery {
            tool: Some(guildhall::governance::Glob::new("f*").unwrap()),
            limit: Some(2),
            ..AuditQuery::default()
        })
        .unwrap();
    assert_eq!(
        last_two.iter().map(|r| r.tool.as_str()).collect::<Vec<_>>(),
        vec!["fragile", "forbidden"]
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn events_report_each_call_restarts_and_the_circuit() {
    let config = GovernanceConfig {
        rules: vec![rule("forbidden", Action::Deny)],
        ..GovernanceConfig::default()
    };
    let fragile = ToolOptions::default()
        .max_retries(0)
        .breaker(BreakerConfig {
            max_failures: 1,
            reset_timeout: Duration::from_secs(60),
            ..BreakerConfig::default()
        });
    let rt = Runtime::builder()
        .governance(config)
        .tool_with(Chaos::new("chaos").0, fragile)
        .tool(Chaos::new("forbidden").0)
        .build()
        .await
        .unwrap();
    let mut events = rt.governance().events();
    rt.call_json("chaos", json!({"act": "ok"}), CallOptions::new())
        .await
        .unwrap();
    rt.call_json("forbidden", json!({"act": "ok"}), CallOptions::new())
        .await
        .unwrap_err();
    rt.call_json("chaos", json!({"act": "panic"}), CallOptions::new())
        .await
        .unwrap_err();

    let mut seen = Vec::new();
    while seen.len() < 8 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("events keep coming")
            .expect("open");
        seen.push(match event {
            ToolEvent::Invoked { tool, .. } => format!("invoked {tool}"),
            ToolEvent::Completed { tool, .. } => format!("completed {tool}"),
            ToolEvent::Denied { tool, .. } => format!("denied {tool}"),
            ToolEvent::Failed { tool, kind, .. } => format!("failed {tool} {kind}"),
            ToolEvent::Restarted { tool, .. } => format!("restarted {tool}"),
            ToolEvent::CircuitOpened { tool } => format!("opened {tool}"),
            ToolEvent::CircuitClosed { tool } => format!("closed {tool}"),
            other => format!("{other:?}"),
        });
    }
    let seen: HashSet<_> = seen.into_iter().collect();
    for wanted in [
        "invoked chaos",
        "completed chaos",
        "invoked forbidden",
        "denied forbidden",
        "failed chaos crashed",
        "restarted chaos",
        "opened chaos",
    ] {
        assert!(seen.contains(wanted), "{wanted} missing from {seen:?}");
    }
    assert_eq!(events.missed(), 0);
    rt.shutdown().await;
}

#[tokio::test]
async fn guildhall_audit_lists_and_filters_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .data_dir(dir.path())
        .governance(GovernanceConfig {
            rules: vec![rule("shell", Action::Ask)],
            ..GovernanceConfig::default()
        })
        .tool(Shell("shell"))
        .tool(Lookup(Arc::default()))
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev-1", "dev"))
        .await
        .unwrap();
    rt.call_json("lookup", json!({"key": "a"}), as_agent(&rt, "dev-1"))
        .await
        .unwrap();
    rt.call_json("shell", shell("ls"), as_agent(&rt, "dev-1"))
        .await
        .unwrap_err();
    rt.call_json("lookup", json!({"key": "b"}), CallOptions::new())
        .await
        .unwrap();
    // Shutting down writes what the audit log holds.
    rt.shutdown().await;

    let audit = |args: &[&str]| {
        let args: Vec<&str> = ["audit"].iter().chain(args).copied().collect();
        crate::support::guildhall_ok(dir.path(), &args)
    };
    let lines: Vec<Value> = audit(&["--json", "--agent", "dev-1"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Calls within one millisecond have no order among themselves (see the semantics).
    let mut seen: Vec<_> = lines
        .iter()
        .map(|l| (l["tool"].as_str().unwrap(), l["outcome"].as_str().unwrap()))
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        vec![("lookup", "ok"), ("shell", "denied")],
        "{lines:?}"
    );
    let table = audit(&["--outcome", "denied", "--since", "1h"]);
    assert!(
        table.contains("shell") && table.contains("config rule `shell → ask`"),
        "{table}"
    );
    assert!(!table.contains("lookup"), "{table}");
    // People read local time (a POSIX TZ needs no zone database); JSON keeps RFC 3339 UTC.
    let local = crate::support::guildhall(dir.path())
        .args(["audit", "--since", "1h"])
        .env("TZ", "XYZ-3")
        .output()
        .unwrap();
    let local = String::from_utf8_lossy(&local.stdout);
    assert!(
        local.lines().nth(1).is_some_and(|l| l.contains(" +03:00 ")),
        "{local}"
    );
    assert!(
        lines[0]["at"].as_str().is_some_and(|at| at.ends_with('Z')),
        "{lines:?}"
    );
    assert_eq!(audit(&["--tool", "look*", "--json"]).lines().count(), 2);
    assert!(audit(&["--until", "1h"]).contains("no calls match"));
    // A bad filter is refused with a message naming it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_guildhall"))
        .args(["audit", "--outcome", "exploded"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown outcome `exploded`"));
}

/// Servers sharing a database: an "always" approved on one lets the call through on the
/// other, which reads it again when told, not at its next start.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn an_always_approval_granted_on_one_server_holds_on_another() {
    let url = crate::pg::fresh_database().await;
    let server = || async {
        Runtime::builder()
            .store_url(&url)
            .governance(devs_are_asked())
            .tool(Shell("shell"))
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (server().await, server().await);
    a.register_agent(AgentSpec::new("dev-1", "dev"))
        .await
        .unwrap();
    // B hears of the agent within milliseconds; bounded, in case the notice is slow.
    crate::support::eventually_some(Duration::from_secs(5), "B hears of dev-1", async || {
        b.agent("dev-1").ok()
    })
    .await;
    let call = |rt: &Runtime, asker: Option<Arc<Scripted>>| {
        let mut options = as_agent(rt, "dev-1");
        if let Some(asker) = asker {
            options = options.asker(asker);
        }
        let rt = rt.clone();
        async move { rt.call_json("shell", shell("ls"), options).await }
    };
    // Nobody to ask on B: refused.
    let why = denied_reason(call(&b, None).await);
    assert!(why.contains("approv"), "{why}");
    let asker = Scripted::new(&[Approval::Always]);
    call(&a, Some(asker.clone())).await.unwrap();
    assert_eq!(asker.asked.load(Ordering::SeqCst), 1);
    // B hears of it within milliseconds; bounded, in case the notice is slow.
    let ran = crate::support::eventually_some(
        Duration::from_secs(5),
        "B admits what A approved",
        async || call(&b, None).await.ok(),
    )
    .await;
    assert_eq!(ran, json!("ran: ls"));
    a.shutdown().await;
    b.shutdown().await;
}
