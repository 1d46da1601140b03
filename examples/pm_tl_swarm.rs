//! Run: `cargo run --example pm_tl_swarm`
//!
//! A tech lead, three project managers and ten subagents per PM coordinate through
//! mailboxes: the TL hands each PM a feature, each PM splits it into tasks for its
//! subagents, the subagents report back to their PM, and each PM reports to the TL. Every
//! agent is its own task; they find each other only by address (`role:pm`, `children`,
//! `parent`, replies). Add `--data-dir DIR` to keep everything in a durable store.

// An example talks to its reader on stdout.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::Duration;

use guildhall::{Agent, AgentSpec, InboxQuery, Outgoing, Priority, Runtime};
use serde_json::json;

const PMS: usize = 3;
const DEVS_PER_PM: usize = 10;

/// Waits for the next message (or up to `n` of them) and takes it.
async fn receive(agent: &Agent, n: usize) -> Vec<std::sync::Arc<guildhall::agents::Message>> {
    let inbox = agent
        .check_inbox(InboxQuery {
            limit: n,
            wait: Some(Duration::from_secs(30)),
            mark_read: true,
            ..InboxQuery::default()
        })
        .await
        .unwrap();
    inbox.messages
}

async fn developer(me: Agent) -> u32 {
    let task = receive(&me, 1).await.remove(0);
    // Pretend to work: the "effort" is the length of the task description.
    let effort = task.body.len() as u32 % 7 + 1;
    me.reply(
        &task,
        Outgoing::default()
            .body(format!("done: {}", task.subject))
            .payload(json!({ "effort": effort })),
    )
    .await
    .unwrap();
    effort
}

async fn project_manager(me: Agent) {
    let feature = receive(&me, 1).await.remove(0);
    println!(
        "{:<6} got feature {:?} from {}",
        me.id(),
        feature.subject,
        feature.from
    );
    let receipt = me
        .send(
            Outgoing::to("children")
                .subject(format!("part of {}", feature.subject))
                .body(format!("Implement your slice of {}", feature.body)),
        )
        .await
        .unwrap();
    println!(
        "{:<6} assigned {} tasks",
        me.id(),
        receipt.delivered_to.len()
    );
    let mut effort = 0;
    let mut reports = 0;
    while reports < receipt.delivered_to.len() {
        for report in receive(&me, DEVS_PER_PM).await {
            effort += report
                .payload
                .as_ref()
                .and_then(|p| p["effort"].as_u64())
                .unwrap_or(0);
            reports += 1;
        }
    }
    me.reply(
        &feature,
        Outgoing::default()
            .priority(Priority::High)
            .body(format!("{reports} tasks done"))
            .payload(json!({ "tasks": reports, "effort": effort })),
    )
    .await
    .unwrap();
    println!(
        "{:<6} reported {reports} tasks, effort {effort}, to its parent",
        me.id()
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = Runtime::builder();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--data-dir" {
            builder = builder.data_dir(args.next().ok_or("--data-dir needs a directory")?);
        }
    }
    let rt = builder.build().await?;

    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await?;
    let mut workers = Vec::new();
    for p in 0..PMS {
        let pm = rt
            .register_agent(AgentSpec::new(format!("pm-{p}"), "pm").parent("tl"))
            .await?;
        for d in 0..DEVS_PER_PM {
            let dev = rt
                .register_agent(
                    AgentSpec::new(format!("dev-{p}-{d}"), "dev").parent(pm.id().as_str()),
                )
                .await?;
            workers.push(tokio::spawn(async move { developer(dev).await }));
        }
        tokio::spawn(project_manager(pm));
    }
    println!(
        "{} agents registered: 1 TL, {PMS} PMs, {} subagents",
        rt.agents().len(),
        PMS * DEVS_PER_PM
    );

    let features = ["search", "billing", "onboarding"];
    for (p, feature) in features.iter().enumerate() {
        tl.send(
            Outgoing::to(format!("pm-{p}"))
                .subject(*feature)
                .body(format!("the {feature} feature")),
        )
        .await?;
    }
    println!("tl     sent {} features", features.len());

    let (mut tasks, mut effort) = (0, 0);
    let mut summaries = 0;
    while summaries < PMS {
        for summary in receive(&tl, PMS).await {
            let payload = summary.payload.as_deref().cloned().unwrap_or_default();
            println!(
                "tl     heard from {}: {} ({:?})",
                summary.from, summary.body, summary.subject
            );
            tasks += payload["tasks"].as_u64().unwrap_or(0);
            effort += payload["effort"].as_u64().unwrap_or(0);
            summaries += 1;
        }
    }
    let dev_effort: u32 = futures::future::join_all(workers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .sum();
    println!(
        "tally: {summaries} PM reports, {tasks} tasks done, effort {effort} (subagents counted {dev_effort})"
    );
    assert_eq!(u64::from(dev_effort), effort);
    assert_eq!(tasks as usize, PMS * DEVS_PER_PM);
    rt.shutdown().await;
    Ok(())
}
