//! A swarm at work, for watching it: `serve --bench-agents N --bench-load RATE` registers N
//! agents as a tree (a tech lead, one project manager per 100 workers, the workers) and makes
//! calls of `echo` as random agents at RATE events per second (two per call), with a message
//! from a worker to its manager every 50th call. The dashboard's browser test runs it to
//! show that the page keeps up with 1,000 agents at 5,000 events/s.

use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{AgentSpec, CallOptions, Outgoing, Runtime};

/// Workers per project manager.
const TEAM: usize = 100;
/// A message every this many calls.
const MAIL_EVERY: u64 = 50;

/// Registers `agents` agents (`tl`, `pm-{i}`, `w-{i}`) under a tech lead.
///
/// # Errors
/// An agent that cannot be registered (one of these ids exists with another role).
pub async fn register_swarm(runtime: &Runtime, agents: usize) -> Result<Vec<String>, String> {
    let register = |spec: AgentSpec| async move {
        let id = spec.id.clone();
        runtime
            .register_agent(spec)
            .await
            .map(|_| id)
            .map_err(|err| format!("registering the bench swarm: {err}"))
    };
    let mut ids = vec![register(AgentSpec::new("tl", "tl")).await?];
    let workers = agents.saturating_sub(1 + agents.div_ceil(TEAM + 1));
    let managers = agents.saturating_sub(1 + workers);
    for m in 0..managers {
        ids.push(register(AgentSpec::new(format!("pm-{m}"), "pm").parent("tl")).await?);
    }
    for w in 0..workers {
        let pm = format!("pm-{}", w % managers.max(1));
        ids.push(register(AgentSpec::new(format!("w-{w}"), "dev").parent(pm.as_str())).await?);
    }
    Ok(ids)
}

/// Makes calls of `echo` as the workers of `ids` at `rate` events per second, in 10 ms ticks,
/// until the guard is dropped. Calls that fail (the runtime stopping) are ignored.
pub fn load(runtime: Runtime, ids: Vec<String>, rate: u32) -> DropGuard {
    let stop = CancellationToken::new();
    let until = stop.clone();
    tokio::spawn(async move {
        let workers: Vec<&String> = ids.iter().filter(|id| id.starts_with("w-")).collect();
        if workers.is_empty() {
            return;
        }
        let per_tick = (f64::from(rate) / 2.0 / 100.0).ceil().max(1.0) as u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut n = 0u64;
        loop {
            tokio::select! {
                () = until.cancelled() => return,
                _ = tick.tick() => {}
            }
            for _ in 0..per_tick {
                n += 1;
                let worker = workers[fastrand::usize(..workers.len())].as_str();
                let args = serde_json::json!({ "text": format!("call {n}") });
                let _ = runtime
                    .call_json("echo", args, CallOptions::new().agent_id(worker))
                    .await;
                if n.is_multiple_of(MAIL_EVERY)
                    && let Ok(agent) = runtime.agent(worker)
                {
                    let report = Outgoing::to("parent").subject(format!("progress {n}"));
                    let _ = agent.send(report).await;
                }
            }
        }
    });
    stop.drop_guard()
}
