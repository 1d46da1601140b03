//! An agent that left with work in hand: when its last connection closes while it holds
//! claimed tasks or has unread urgent mail, and it has not come back within
//! [`Departures::GRACE`] (a client restarting, a bridge reconnecting), its parent is mailed
//! `agent_left`, from the agent: when, the tasks it holds, its unread and urgent counts. So
//! nothing falls between agents when one goes quiet, as a launched agent's exit is mailed.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::json;

use crate::agents::{InboxQuery, Outgoing, Priority};
use crate::error::BuildError;
use crate::runtime::{BoxFuture, Runtime, Subsystem, WeakRuntime};
use crate::tasks::TaskStatus;

/// Tasks named in the mail at most (the rest are counted).
const TASKS_NAMED: usize = 20;
/// Tasks and urgent messages looked at, at most.
const LOOKED_AT: usize = 1_000;

/// Tells an agent's parent when the agent left with work in hand.
#[derive(Default)]
pub struct Departures {
    runtime: OnceLock<WeakRuntime>,
}

impl Departures {
    /// How long an agent may be without a connection before its parent is told.
    pub const GRACE: Duration = Duration::from_secs(2);
}

impl Subsystem for Departures {
    fn name(&self) -> &'static str {
        "departures"
    }

    fn install<'a>(
        &'a self,
        _: &'a mut crate::runtime::Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async { Ok(()) })
    }

    fn started<'a>(&'a self, runtime: &'a Runtime) -> BoxFuture<'a, Result<(), BuildError>> {
        let _ = self.runtime.set(runtime.downgrade());
        Box::pin(async { Ok(()) })
    }

    fn agent_left(&self, agent: &str) {
        let Some(weak) = self.runtime.get().cloned() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let agent = agent.to_owned();
        handle.spawn(async move {
            tokio::time::sleep(Departures::GRACE).await;
            let Some(runtime) = weak.upgrade() else {
                return;
            };
            if runtime.connections_of(&agent) > 0 {
                return;
            }
            if let Err(why) = tell_parent(&runtime, &agent).await {
                tracing::warn!(%agent, %why, "could not tell the parent that the agent left");
            }
        });
    }
}

/// Mails `agent`'s parent, from the agent, what it left holding; nothing when it holds
/// nothing or has no parent.
async fn tell_parent(runtime: &Runtime, agent: &str) -> Result<(), String> {
    let Some(record) = runtime.lookup_agent(agent) else {
        return Ok(());
    };
    let Some(parent) = record.parent.clone() else {
        return Ok(());
    };
    let mailbox = runtime.agent(agent).map_err(|e| e.to_string())?;
    let held = match runtime.tasks() {
        Some(tasks) => tasks
            .held_by(
                agent,
                &[TaskStatus::Open, TaskStatus::InProgress],
                LOOKED_AT,
            )
            .await
            .map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    let urgent = mailbox
        .check_inbox(InboxQuery {
            limit: LOOKED_AT,
            min_priority: Priority::Urgent,
            ..InboxQuery::default()
        })
        .await
        .map_err(|e| e.to_string())?
        .messages
        .len();
    if held.is_empty() && urgent == 0 {
        return Ok(());
    }
    let unread = mailbox.unread().await.map_err(|e| e.to_string())?;
    let left_ms = crate::time::now_ms().saturating_sub(Departures::GRACE.as_millis() as u64);
    let mut body = format!(
        "Agent `{agent}` has had no connection since {}",
        crate::time::rfc3339(left_ms)
    );
    if !held.is_empty() {
        let named: Vec<String> = held
            .iter()
            .take(TASKS_NAMED)
            .map(|t| format!("#{} \"{}\" ({})", t.id, t.title, t.status.as_str()))
            .collect();
        body.push_str(&format!(
            ", holding {} task(s): {}",
            held.len(),
            named.join("; ")
        ));
        if held.len() > TASKS_NAMED {
            body.push_str(&format!(" and {} more", held.len() - TASKS_NAMED));
        }
    }
    body.push_str(&format!(
        ". It has {unread} unread message(s), {urgent} of them urgent. Its claims lapse when \
         their leases end unless it comes back."
    ));
    let tasks: Vec<u64> = held.iter().map(|t| t.id).collect();
    let message = Outgoing::to(parent.as_str())
        .subject(format!("agent {agent} left"))
        .body(body)
        .payload(json!({
            "event": "agent_left",
            "agent": agent,
            "left_ms": left_ms,
            "tasks": tasks,
            "unread": unread,
            "urgent": urgent,
        }));
    mailbox.send(message).await.map_err(|e| e.to_string())?;
    Ok(())
}
