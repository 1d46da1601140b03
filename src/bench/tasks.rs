//! The measurements behind `guildhall bench tasks`: durable claims from the task board by
//! many workers at once, against durable mailbox sends by as many agents in the same run.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::mail::{drain, one_way, swarm};
use super::tempfile_in;
use super::{Stage, median};
use crate::tasks::{ClaimFilter, TaskConfig, TaskLimits, TaskSpec, Tasks};
use crate::{MailboxConfig, Runtime};

/// Settings of `guildhall bench tasks`.
#[derive(Debug, Clone, Copy)]
pub struct TasksBenchConfig {
    /// Workers claiming at once (each also a sender in the baseline).
    pub claimers: usize,
    /// Tasks put on the board, and claimed, per round.
    pub tasks: usize,
    /// Measurement rounds; figures are medians.
    pub rounds: usize,
}

impl Default for TasksBenchConfig {
    fn default() -> Self {
        Self {
            claimers: 100,
            tasks: 5_000,
            rounds: 5,
        }
    }
}

/// What `guildhall bench tasks` measured (medians over rounds).
#[derive(Debug, Clone, Serialize)]
pub struct TasksReport {
    /// Workers claiming at once.
    pub claimers: usize,
    /// Tasks claimed per round.
    pub tasks: usize,
    /// Tasks created per second by as many creators at once (durable, acknowledged).
    pub creates_per_sec: f64,
    /// Tasks claimed per second by `claimers` workers at once (durable, acknowledged).
    pub claims_per_sec: f64,
    /// Baseline: durable one-way sends per second by `claimers` agents at once, the same
    /// number of messages, in the same store.
    pub durable_msgs_per_sec: f64,
    /// `claims_per_sec / durable_msgs_per_sec`.
    pub claims_ratio: f64,
    /// `claims_per_sec` of each round, in order.
    pub claim_rounds: Vec<f64>,
    /// `durable_msgs_per_sec` of each round, in order.
    pub send_rounds: Vec<f64>,
    /// From `spawn_agent` to the launched agent's first MCP call (`guildhall bench tasks`
    /// measures it with [`launch`](super::launch)).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub launch: Option<super::LaunchReport>,
}

/// Runs every measurement of `guildhall bench tasks`; the durable store goes in `dir`.
///
/// # Panics
/// If the runtime fails to start, or a create, claim or send fails.
pub async fn tasks(config: TasksBenchConfig, dir: &Path, stage: &dyn Stage) -> TasksReport {
    let claimers = config.claimers.max(1);
    let per_claimer = config.tasks.div_ceil(claimers).max(1);
    let total = per_claimer * claimers;
    let rounds = config.rounds.max(1);
    let dir = tempfile_in(dir);
    // Every round's tasks stay held: the board must take them all, and a worker as many as
    // it claims (the bench measures the board, not the per-agent cap).
    let task_config = TaskConfig {
        limits: TaskLimits {
            max_tasks: total * rounds + 1,
            max_held: usize::MAX,
            ..TaskLimits::default()
        },
        lease: Duration::from_secs(3600),
        ..TaskConfig::default()
    };
    let rt = Runtime::builder()
        .data_dir(&dir)
        .mailbox_config(MailboxConfig {
            capacity: per_claimer * 20 + 1_000,
            ..MailboxConfig::default()
        })
        .task_config(task_config)
        .build()
        .await
        .expect("durable runtime starts");
    stage.phase("agents", 1);
    let agents = swarm(&rt, claimers).await;
    let ids: Arc<Vec<String>> = Arc::new(agents.iter().map(|a| a.id().to_string()).collect());
    stage.step();

    stage.phase("rounds", rounds as u64);
    let board = rt.tasks().expect("task_config adds the task board");
    let (mut creates, mut claims, mut sends) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        creates.push(create_all(&board, claimers, per_claimer, round).await);
        claims.push(claim_all(&board, &ids, total).await);
        sends.push(one_way(&agents, per_claimer, round as u64).await);
        drain(&agents).await;
        stage.step();
    }
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);

    let (claim_rounds, send_rounds) = (claims.clone(), sends.clone());
    let claims_per_sec = median(&mut claims);
    let durable_msgs_per_sec = median(&mut sends);
    TasksReport {
        claimers,
        tasks: total,
        creates_per_sec: median(&mut creates),
        claims_per_sec,
        durable_msgs_per_sec,
        claims_ratio: claims_per_sec / durable_msgs_per_sec,
        claim_rounds,
        send_rounds,
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        launch: None,
    }
}

/// `creators` tasks at once create `each` tasks apiece; returns tasks per second.
async fn create_all(board: &Tasks, creators: usize, each: usize, round: usize) -> f64 {
    let start = Instant::now();
    let jobs: Vec<_> = (0..creators)
        .map(|c| {
            let board = board.clone();
            tokio::spawn(async move {
                for n in 0..each {
                    board
                        .create(
                            None,
                            TaskSpec {
                                title: format!("r{round}-c{c}-{n}"),
                                ..TaskSpec::default()
                            },
                        )
                        .await
                        .expect("bench task is created");
                }
            })
        })
        .collect();
    for job in jobs {
        job.await.expect("creator finishes");
    }
    (creators * each) as f64 / start.elapsed().as_secs_f64()
}

/// Every worker claims until the board has nothing left; returns claims per second.
async fn claim_all(board: &Tasks, workers: &Arc<Vec<String>>, expected: usize) -> f64 {
    let start = Instant::now();
    let jobs: Vec<_> = (0..workers.len())
        .map(|w| {
            let board = board.clone();
            let workers = Arc::clone(workers);
            tokio::spawn(async move {
                let mut taken = 0usize;
                while board
                    .claim(&workers[w], ClaimFilter::default(), None)
                    .await
                    .expect("bench claim succeeds")
                    .is_some()
                {
                    taken += 1;
                }
                taken
            })
        })
        .collect();
    let mut taken = 0;
    for job in jobs {
        taken += job.await.expect("claimer finishes");
    }
    assert_eq!(taken, expected, "every task claimed once");
    taken as f64 / start.elapsed().as_secs_f64()
}
