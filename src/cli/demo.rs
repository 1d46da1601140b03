//! `guildhall demo`: supervised tools at work, narrated on stdout.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use guildhall::supervision::Backoff;
use guildhall::{AgentSpec, CallContext, CallOptions, InitState, Runtime, Tool, ToolOptions};

use super::tree::print_tree;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// How long the stuck call may run before it times out, in milliseconds.
    #[arg(long, default_value_t = 200)]
    timeout_ms: u64,
}

/// Keeps a running tally per actor.
struct Tally;

/// Input of `tally`.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct TallyInput {
    /// Amount to add to the tally.
    add: i64,
    /// Panic instead of adding (to show a restart).
    #[serde(default)]
    crash: bool,
    /// Ignore cancellation and never finish (to show a stuck call being replaced).
    #[serde(default)]
    hang: bool,
}

/// Output of `tally`.
#[derive(Serialize, JsonSchema)]
struct TallyOutput {
    /// The tally after adding.
    total: i64,
}

impl Tool for Tally {
    type Input = TallyInput;
    type Output = TallyOutput;
    type Error = std::convert::Infallible;
    type State = i64;

    fn name(&self) -> &str {
        "tally"
    }

    fn description(&self) -> &str {
        "Adds to a running tally kept by the tool's actor."
    }

    async fn call(
        &self,
        total: &mut i64,
        input: TallyInput,
        _: CallContext,
    ) -> Result<TallyOutput, Self::Error> {
        assert!(!input.crash, "tally asked to crash");
        if input.hang {
            std::future::pending::<()>().await;
        }
        *total += input.add;
        Ok(TallyOutput { total: *total })
    }
}

impl InitState for Tally {
    async fn init(&self) -> Result<i64, Self::Error> {
        Ok(0)
    }
}

/// Runs the demonstration in `data_dir` when the user chose one, else in a temporary store
/// removed afterwards (its agents do not join the project's).
pub(crate) async fn run(
    args: DemoArgs,
    data_dir: Option<&std::path::Path>,
) -> Result<(), Box<dyn std::error::Error>> {
    let temporary = match data_dir {
        Some(_) => None,
        None => Some(tempfile::tempdir()?),
    };
    let data_dir =
        data_dir.unwrap_or_else(|| temporary.as_ref().map_or(".".as_ref(), |t| t.path()));
    let timeout = Duration::from_millis(args.timeout_ms);
    let options = ToolOptions::default()
        .timeout(timeout)
        .grace(timeout)
        .backoff(Backoff::none());
    let rt = Runtime::builder()
        .tool_with(Tally, options)
        .data_dir(data_dir)
        .build()
        .await?;
    let mut out = std::io::stdout().lock();
    let call = |args: serde_json::Value| {
        let rt = rt.clone();
        async move { rt.call_json("tally", args, CallOptions::new()).await }
    };

    writeln!(
        out,
        "tools: {}",
        serde_json::to_string(&rt.tools().iter().map(|t| &t.name).collect::<Vec<_>>())?
    )?;
    writeln!(out, "add 2      -> {}", show(call(json!({"add": 2})).await))?;
    writeln!(out, "add 3      -> {}", show(call(json!({"add": 3})).await))?;
    writeln!(
        out,
        "bad args   -> {}",
        show(call(json!({"add": "three"})).await)
    )?;
    writeln!(
        out,
        "crash      -> {}",
        show(call(json!({"add": 1, "crash": true})).await)
    )?;
    writeln!(
        out,
        "add 4      -> {}  (fresh state after the restart)",
        show(call(json!({"add": 4})).await)
    )?;
    writeln!(
        out,
        "hang       -> {}",
        show(call(json!({"add": 1, "hang": true})).await)
    )?;
    // The stuck call had its token cancelled at the deadline; after the grace period its
    // actor is replaced. Calls queued behind it wait for the replacement.
    while worker_restarts(&rt).await? < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    writeln!(
        out,
        "add 5      -> {}  (served by the replacement actor)",
        show(call(json!({"add": 5})).await)
    )?;
    mail(&rt, &mut out, data_dir).await?;
    context(&rt, &mut out).await?;
    writeln!(out, "\nsupervision tree:")?;
    print_tree(&mut out, &rt.tree().await?, 0)?;
    rt.shutdown().await;
    writeln!(out, "\nshut down cleanly")?;
    Ok(())
}

/// Two agents talk through the mailbox tools, as MCP clients will; with fault injection
/// (feature `test-util`, as the tests build it) one mailbox crashes and comes back with its
/// messages.
async fn mail(
    rt: &Runtime,
    out: &mut impl Write,
    data_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    writeln!(out, "\nmailboxes (store: {}):", data_dir.display())?;
    let tl = rt.register_agent(AgentSpec::new("demo-tl", "tl")).await?;
    let pm = rt
        .register_agent(AgentSpec::new("demo-pm", "pm").parent("demo-tl"))
        .await?;
    let as_tl = || CallOptions::new().as_agent(&tl);
    let as_pm = || CallOptions::new().as_agent(&pm);
    let earlier = rt.call_json("check_inbox", json!({}), as_pm()).await?;
    writeln!(
        out,
        "demo-pm unread from earlier runs: {}",
        earlier["unread"]
    )?;
    let sent = rt
        .call_json(
            "send_message",
            json!({"to": "role:pm", "subject": "plan the sprint", "body": "Split it into tasks.", "priority": "high"}),
            as_tl(),
        )
        .await?;
    writeln!(out, "demo-tl -> role:pm  {sent}")?;
    // A shipped binary has no fault injection: there the demo shows the inbox as stored.
    #[cfg(feature = "test-util")]
    let crashed = pm.crash_mailbox();
    #[cfg(not(feature = "test-util"))]
    let crashed = false;
    let inbox = rt
        .call_json("check_inbox", json!({"full": true}), as_pm())
        .await?;
    let what = if crashed {
        "mailbox crashed and restarted; inbox still holds"
    } else {
        "inbox holds"
    };
    writeln!(out, "demo-pm {what} {} unread", inbox["unread"])?;
    let ids: Vec<serde_json::Value> = inbox["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| m["id"].clone()).collect())
        .unwrap_or_default();
    let reply = rt
        .call_json(
            "send_message",
            json!({"reply_to": sent["id"], "body": "Three tasks, starting now."}),
            as_pm(),
        )
        .await?;
    writeln!(out, "demo-pm -> reply     {reply}")?;
    rt.call_json("mark_read", json!({"ids": ids, "ack": true}), as_pm())
        .await?;
    let tl_inbox = rt
        .call_json("check_inbox", json!({"full": true}), as_tl())
        .await?;
    if let Some(first) = tl_inbox["messages"].get(0) {
        writeln!(
            out,
            "demo-tl reads       {}: {}",
            first["subject"], first["body"]
        )?;
        rt.call_json("read_message", json!({"id": first["id"]}), as_tl())
            .await?;
    }
    Ok(())
}

/// The two agents share a session's context through the context tools: an update, a
/// conflicting one refused whole, and the history (which grows with every run of the demo).
async fn context(rt: &Runtime, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    writeln!(out, "\nshared context (session demo-sprint):")?;
    let (tl, pm) = (rt.agent("demo-tl")?, rt.agent("demo-pm")?);
    let as_tl = || CallOptions::new().as_agent(&tl);
    let as_pm = || CallOptions::new().as_agent(&pm);
    let now = rt
        .call_json(
            "context_get",
            json!({"session": "demo-sprint", "keys": ["plan"]}),
            CallOptions::new(),
        )
        .await
        .ok();
    let version = now
        .as_ref()
        .and_then(|v| v["entries"][0]["version"].as_u64())
        .unwrap_or(0);
    let applied = rt
        .call_json(
            "context_update",
            json!({"session": "demo-sprint", "changes": [
                {"key": "plan", "strategy": "merge", "value": {"goal": "ship", "tasks": 3}, "expected_version": version},
                {"key": "log", "strategy": "append", "value": "demo-tl planned\n"}
            ]}),
            as_tl(),
        )
        .await?;
    writeln!(out, "demo-tl merges plan  {applied}")?;
    let stale = rt
        .call_json(
            "context_update",
            json!({"session": "demo-sprint", "changes": [
                {"key": "log", "strategy": "append", "value": "demo-pm took a task\n"},
                {"key": "plan", "strategy": "merge", "value": {"tasks": 2}, "expected_version": version}
            ]}),
            as_pm(),
        )
        .await;
    writeln!(out, "demo-pm, stale read  -> {}", show(stale))?;
    let history = rt
        .call_json(
            "context_history",
            json!({"session": "demo-sprint", "limit": 3}),
            CallOptions::new(),
        )
        .await?;
    writeln!(
        out,
        "history: session at version {}, latest by {}",
        history["version"],
        history["batches"][history["batches"]
            .as_array()
            .map_or(0, |b| b.len().saturating_sub(1))]["author"]
    )?;
    Ok(())
}

async fn worker_restarts(rt: &Runtime) -> Result<u32, guildhall::supervision::SupervisorError> {
    let tree = rt.tree().await?;
    Ok(tree.find(&["tools", "tally"]).map_or(0, |w| w.restarts))
}

fn show(result: Result<serde_json::Value, guildhall::CallError>) -> String {
    match result {
        Ok(v) => format!("ok {v}"),
        Err(e) => format!(
            "{} error: {e}",
            serde_json::to_string(&e.kind()).unwrap_or_default()
        ),
    }
}
