//! Agents sharing a session's context: a TL sets the plan, two PMs update it at once with
//! expected versions (one wins, the other re-reads and retries), and the history shows who
//! did what. Run with `cargo run --example shared_context`.

// An example talks to its reader on stdout.
#![allow(clippy::print_stdout)]

use guildhall::context::{Change, ContextError, HistoryQuery, Select, Strategy};
use guildhall::{AgentSpec, Runtime};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // In memory; `.data_dir(".guildhall")` would keep the session across restarts.
    let runtime = Runtime::builder().build().await?;
    let tl = runtime.register_agent(AgentSpec::new("tl", "tl")).await?;
    let sessions = runtime.sessions();
    let plan = sessions.open_as("sprint-12", &tl).await?; // created if missing
    plan.replace("goal", json!("ship the parser")).await?;
    plan.replace("tasks", json!({"lexer": "todo", "parser": "todo"}))
        .await?;

    // Two PMs mark tasks done at once, each guarding on the version it read.
    let mut pms = Vec::new();
    for (id, task) in [("pm-1", "lexer"), ("pm-2", "parser")] {
        let pm = runtime
            .register_agent(AgentSpec::new(id, "pm").parent("tl"))
            .await?;
        let sessions = runtime.sessions();
        pms.push(tokio::spawn(async move {
            let ctx = sessions.open_as("sprint-12", &pm).await?;
            loop {
                let read = ctx.get("tasks").await?.map_or(0, |e| e.version);
                let change =
                    Change::new("tasks", Strategy::Merge, json!({ task: "done" })).expect(read);
                match ctx.update(vec![change]).await {
                    Ok(applied) => {
                        println!("{id}: {task} done (session version {})", applied.version);
                        return Ok::<_, ContextError>(());
                    }
                    Err(ContextError::Conflict { actual, .. }) => {
                        println!("{id}: tasks changed meanwhile (now v{actual}); retrying");
                    }
                    Err(other) => return Err(other),
                }
            }
        }));
    }
    for pm in pms {
        pm.await??;
    }
    plan.append("log", json!("lexer and parser done\n")).await?;

    let found = plan.read(Select::Relevant("parser done".into()), 3).await?;
    for (entry, score) in found.entries.iter().zip(&found.scores) {
        println!(
            "relevant: {} = {} (score {score:.2})",
            entry.key, entry.value
        );
    }
    let history = plan.history(&HistoryQuery::default()).await?;
    for batch in &history.batches {
        let who = batch.author.as_ref().map_or("-", |a| a.as_str());
        let keys: Vec<&str> = batch.changes.iter().map(|c| c.key.as_str()).collect();
        println!("v{} by {who}: {keys:?}", batch.version);
    }
    let first = plan
        .read_as_of(2, Select::Keys(vec!["tasks".into()]), 1)
        .await?;
    println!("tasks as of version 2: {}", first.entries[0].value);
    runtime.shutdown().await;
    Ok(())
}
