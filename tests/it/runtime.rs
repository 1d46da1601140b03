use std::sync::Arc;
use std::time::Duration;

use guildhall::{
    AgentSpec, BuildError, CallContext, CallObserver, CallOptions, ErrorKind, Progress,
    RegistrationError, Runtime, Tool,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::support::{Act, Chaos, input};

#[tokio::test]
async fn tools_are_listed_sorted_and_looked_up_by_name() {
    let (b, _) = Chaos::new("beta");
    let (a, _) = Chaos::new("alpha");
    let rt = Runtime::builder().tool(b).tool(a).build().await.unwrap();
    let names: Vec<_> = rt.tools().into_iter().map(|t| t.name).collect();
    // The mailbox, directory, context and task tools are built in.
    assert_eq!(
        names,
        [
            "alpha",
            "beta",
            "check_inbox",
            "context_get",
            "context_history",
            "context_update",
            "list_agents",
            "mark_read",
            "message_status",
            "read_message",
            "send_message",
            "set_mode",
            "task_claim",
            "task_create",
            "task_get",
            "task_heartbeat",
            "task_list",
            "task_release",
            "task_update",
            "whoami"
        ]
    );
    assert_eq!(
        rt.tool("beta").unwrap().description,
        "Does what it is told."
    );
    assert!(rt.tool("gamma").is_none());
    rt.shutdown().await;
}

#[tokio::test]
async fn duplicate_and_invalid_names_are_rejected_at_registration() {
    let (a1, _) = Chaos::new("same");
    let (a2, _) = Chaos::new("same");
    let err = Runtime::builder()
        .tool(a1)
        .tool(a2)
        .build()
        .await
        .err()
        .unwrap();
    assert!(matches!(
        err,
        BuildError::Registration(RegistrationError::DuplicateName { .. })
    ));
    assert_eq!(err.to_string(), "a tool named `same` is already registered");

    let (bad, _) = Chaos::new("no spaces");
    let err = Runtime::builder().tool(bad).build().await.err().unwrap();
    assert!(
        err.to_string().contains("invalid tool name `no spaces`"),
        "{err}"
    );

    let (ok, _) = Chaos::new("ok");
    let rt = Runtime::builder().tool(ok).build().await.unwrap();
    let (again, _) = Chaos::new("ok");
    assert!(rt.register(again).await.is_err());
    let (late, _) = Chaos::new("late");
    rt.register(late).await.unwrap();
    assert!(rt.call::<Chaos>("late", input(Act::Ok)).await.is_ok());
    let tree = rt.tree().await.unwrap();
    assert!(tree.find(&["tools", "late"]).is_some());
    rt.shutdown().await;
}

#[tokio::test]
async fn calls_after_shutdown_are_refused_clearly() {
    let (t, _) = Chaos::new("t");
    let rt = Runtime::builder().tool(t).build().await.unwrap();
    rt.shutdown().await;
    let err = rt.call::<Chaos>("t", input(Act::Ok)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(rt.tree().await.is_err());
}

/// Reports progress and checks the ids it is handed.
struct Steps;

#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct StepsInput {
    steps: u32,
}

#[derive(Serialize, JsonSchema)]
struct Seen {
    agent: Option<String>,
    session: Option<String>,
    call_id_version: usize,
}

impl Tool for Steps {
    type Input = StepsInput;
    type Output = Seen;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        "steps"
    }

    fn description(&self) -> &str {
        "Reports progress for each step."
    }

    async fn call(
        &self,
        _: &mut (),
        input: StepsInput,
        ctx: CallContext,
    ) -> Result<Seen, Self::Error> {
        for i in 1..=input.steps {
            ctx.progress(f64::from(i), Some(f64::from(input.steps)), Some("step"));
        }
        ctx.emit("finished", json!({"steps": input.steps}));
        Ok(Seen {
            agent: ctx.agent().map(str::to_owned),
            session: ctx.session().map(str::to_owned),
            call_id_version: ctx.call_id().get_version_num(),
        })
    }
}

#[derive(Default)]
struct Collect {
    progress: std::sync::Mutex<Vec<Progress>>,
    events: std::sync::Mutex<Vec<String>>,
}

impl CallObserver for Collect {
    fn on_progress(&self, _: &CallContext, p: Progress) {
        self.progress.lock().unwrap().push(p);
    }

    fn on_event(&self, e: guildhall::CallEvent) {
        self.events.lock().unwrap().push(e.name);
    }
}

#[tokio::test]
async fn call_context_carries_ids_progress_and_events() {
    let rt = Runtime::builder().tool(Steps).build().await.unwrap();
    let pm = rt
        .register_agent(AgentSpec::new("pm-1", "pm"))
        .await
        .unwrap();
    let observer = Arc::new(Collect::default());
    let opts = CallOptions::new()
        .as_agent(&pm)
        .session("s-9")
        .timeout(Duration::from_secs(5))
        .observer(observer.clone());
    let out = rt
        .call_json("steps", json!({"steps": 3}), opts)
        .await
        .unwrap();
    assert_eq!(
        out,
        json!({"agent": "pm-1", "session": "s-9", "call_id_version": 7})
    );
    let progress: Vec<f64> = observer
        .progress
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.progress)
        .collect();
    assert_eq!(progress, [1.0, 2.0, 3.0]);
    assert_eq!(*observer.events.lock().unwrap(), ["finished"]);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_absurd_timeout_means_no_deadline_rather_than_a_panic() {
    let (t, _) = Chaos::new("t");
    let rt = Runtime::builder().tool(t).build().await.unwrap();
    let h = rt.handle::<Chaos>("t").unwrap();
    let out = h
        .call_with(input(Act::Ok), CallOptions::new().timeout(Duration::MAX))
        .await;
    assert!(out.is_ok());
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_runtime_stops_its_tools() {
    let (t, record) = Chaos::new("t");
    let rt = Runtime::builder().tool(t).build().await.unwrap();
    let h = rt.handle::<Chaos>("t").unwrap();
    h.call(input(Act::Ok)).await.unwrap();
    drop(rt);
    let err = h.call(input(Act::Ok)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(record.runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn events_tell_of_mail_sent_and_of_agents_connecting_and_leaving() {
    use guildhall::mcp::{McpServer, ToolFilter};
    use guildhall::{AgentSpec, Outgoing, ToolEvent};
    let rt = Runtime::builder().build().await.unwrap();
    for (agent, role) in [("pm", "pm"), ("dev", "dev")] {
        rt.register_agent(AgentSpec::new(agent, role))
            .await
            .unwrap();
    }
    let mut events = rt.governance().events();
    let server = McpServer::new(rt.clone());
    let first = server.connection(Some(Arc::from("dev")), ToolFilter::all());
    // A second connection of a connected agent is no news.
    let second = server.connection(Some(Arc::from("dev")), ToolFilter::all());
    let pm = rt.agent("pm").unwrap();
    let sent = pm
        .send(Outgoing::to("dev").subject("parse").body("go"))
        .await
        .unwrap();
    drop(first);
    drop(second);
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("events keep coming")
            .expect("open");
        seen.push(event);
    }
    assert_eq!(
        seen[0],
        ToolEvent::AgentConnected {
            agent: Arc::from("dev")
        }
    );
    assert_eq!(
        seen[1],
        ToolEvent::Mailed {
            id: sent.id,
            thread: sent.thread,
            from: Arc::from("pm"),
            to: Arc::from("dev"),
            subject: Arc::from("parse"),
            recipients: 1,
        }
    );
    assert_eq!(
        seen[2],
        ToolEvent::AgentLeft {
            agent: Arc::from("dev")
        }
    );
    rt.shutdown().await;
}
