//! Dividing work on the task board: a PM puts tasks up, one waiting on another; three
//! workers claim and finish them in dependency order; one worker walks away from its task,
//! whose lease ends so another finishes it; the PM hears of each task done by mail. Run with
//! `cargo run --example task_board`.

// An example talks to its reader on stdout.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use guildhall::tasks::{ClaimFilter, TaskChange, TaskSpec, TaskStatus};
use guildhall::{AgentSpec, InboxQuery, Runtime};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = Runtime::builder().build().await?;
    let pm = runtime.register_agent(AgentSpec::new("pm", "pm")).await?;
    for worker in ["dev-1", "dev-2", "dev-3"] {
        runtime
            .register_agent(AgentSpec::new(worker, "dev").parent("pm"))
            .await?;
    }
    let board = runtime.tasks().ok_or("no task board")?;
    let spec = |title: &str| TaskSpec {
        title: title.into(),
        assignee: Some("role:dev".into()),
        ..TaskSpec::default()
    };
    let parse = board.create(Some("pm"), spec("parse the logs")).await?;
    board.create(Some("pm"), spec("fix the flaky test")).await?;
    let docs = TaskSpec {
        blocked_by: vec![parse.id],
        ..spec("document the format")
    };
    board.create(Some("pm"), docs).await?;

    // dev-1 claims the most urgent ready task for a short lease, then goes silent.
    let short = Some(Duration::from_millis(200));
    let lost = board.claim("dev-1", ClaimFilter::default(), short).await?;
    println!("dev-1 took {:?} and walked away", lost.map(|t| t.title));

    // dev-2 and dev-3 work until every task is done; the lost one comes back to the pool.
    let done = TaskChange {
        status: Some(TaskStatus::Done),
        ..TaskChange::default()
    };
    let mut finished = 0;
    for _ in 0..100 {
        if finished == 3 {
            break;
        }
        for worker in ["dev-2", "dev-3"] {
            if let Some(task) = board.claim(worker, ClaimFilter::default(), None).await? {
                board.update(Some(worker), task.id, done.clone()).await?;
                println!("{worker} finished task {}: {}", task.id, task.title);
                finished += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The PM is mailed as each task is done (a notice goes out just after its commit).
    let mut heard = 0;
    for _ in 0..3 {
        if heard == 3 {
            break;
        }
        let wait = InboxQuery {
            wait: Some(Duration::from_secs(5)),
            mark_read: true,
            ..InboxQuery::default()
        };
        for message in pm.check_inbox(wait).await?.messages {
            println!("pm's inbox: {} (from {})", message.subject, message.from);
            heard += 1;
        }
    }
    runtime.shutdown().await;
    Ok(())
}
