//! The measurements behind `guildhall bench mailbox`, `bench swarm` and `bench fanout`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};
use serde::{Deserialize, Serialize};

use super::{RawCall, RawEcho, Resident, Stage, median};
use crate::{Agent, AgentSpec, InboxQuery, MailboxConfig, Outgoing, Runtime};

/// Settings of `guildhall bench mailbox`.
#[derive(Debug, Clone, Copy)]
pub struct MailboxBenchConfig {
    /// Agents, each also a sender.
    pub agents: usize,
    /// Messages each agent sends per round (one-way).
    pub per_agent: usize,
    /// Measurement rounds; figures are medians.
    pub rounds: usize,
    /// Request/reply pairs running at once.
    pub pairs: usize,
    /// Round trips per pair per round.
    pub trips: usize,
    /// Durable messages each agent sends per round.
    pub durable_per_agent: usize,
}

impl Default for MailboxBenchConfig {
    fn default() -> Self {
        Self {
            agents: 1_000,
            per_agent: 200,
            rounds: 5,
            pairs: 500,
            trips: 200,
            durable_per_agent: 50,
        }
    }
}

/// What `guildhall bench mailbox` measured (medians over rounds).
#[derive(Debug, Clone, Serialize)]
pub struct MailboxReport {
    /// One-way sends across `agents` agents, in memory, each acknowledged.
    pub inmem_msgs_per_sec: f64,
    /// Baseline: request/acknowledge messages to bare ractor actors at the same concurrency.
    pub raw_ractor_msgs_per_sec: f64,
    /// `raw_ractor_msgs_per_sec / inmem_msgs_per_sec`: how much slower a mailbox send is.
    pub inmem_slowdown: f64,
    /// Request/reply round trips (send, wake the waiting receiver, reply, wake the sender).
    pub roundtrip_msgs_per_sec: f64,
    /// The same, with the dashboard open and `guildhall watch` attached (two watchers taking
    /// every event as JSON lines), measured in the same rounds.
    pub roundtrip_watched_msgs_per_sec: f64,
    /// The share of round trips watching costs: `1 - watched / unwatched` of each round's
    /// pair, measured back to back (which of the two first alternates), the median over
    /// rounds. Paired so that the machine's load drifting between rounds cancels out.
    pub roundtrip_watched_drop: f64,
    /// Events the two watchers showed over all the watched round trips, summed over both:
    /// what watching cost this much for.
    pub roundtrip_watched_events: u64,
    /// Events they lost by falling behind (each told in a `missed` line), summed over both.
    pub roundtrip_watched_missed: u64,
    /// Durable sends acknowledged per second (each one committed and synced).
    pub durable_msgs_per_sec: f64,
    /// Group commits (one fsync each) per second during the durable run.
    pub fsyncs_per_sec: f64,
    /// Messages per group commit, on average.
    pub msgs_per_fsync: f64,
    /// `inmem_msgs_per_sec` of each round, in order: a trend over the run shows here.
    pub inmem_rounds: Vec<f64>,
    /// `raw_ractor_msgs_per_sec` of each round, in order.
    pub raw_ractor_rounds: Vec<f64>,
    /// Each round's round trips (msgs/s), unwatched.
    pub roundtrip_rounds: Vec<f64>,
    /// Each round's round trips (msgs/s), watched, paired with the same round unwatched.
    pub roundtrip_watched_rounds: Vec<f64>,
}

fn config(capacity: usize) -> MailboxConfig {
    MailboxConfig {
        capacity,
        ..MailboxConfig::default()
    }
}

pub(super) async fn swarm(rt: &Runtime, n: usize) -> Vec<Agent> {
    let mut agents = Vec::with_capacity(n);
    for i in 0..n {
        agents.push(
            rt.register_agent(AgentSpec::new(format!("a{i}"), "bench"))
                .await
                .expect("bench agent registers"),
        );
    }
    rt.activate_agents(&agents).await.expect("mailboxes start");
    agents
}

/// Every agent sends `per_agent` messages to random others, one at a time; returns
/// messages per second.
pub(super) async fn one_way(agents: &[Agent], per_agent: usize, seed: u64) -> f64 {
    let n = agents.len();
    // Recipients' ids are at hand, as an agent's would be: no formatting in the timed loop.
    let ids: Arc<Vec<String>> = Arc::new(agents.iter().map(|a| a.id().to_string()).collect());
    let start = Instant::now();
    let tasks: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            let agent = agent.clone();
            let ids = Arc::clone(&ids);
            let mut rng = fastrand::Rng::with_seed(seed ^ i as u64);
            tokio::spawn(async move {
                for _ in 0..per_agent {
                    let to = ids[rng.usize(..n)].clone();
                    agent
                        .send(Outgoing::to(to).subject("x"))
                        .await
                        .expect("bench send succeeds");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("sender finishes");
    }
    (n * per_agent) as f64 / start.elapsed().as_secs_f64()
}

/// Empties every inbox (not timed).
pub(super) async fn drain(agents: &[Agent]) {
    for agent in agents {
        agent
            .check_inbox(InboxQuery {
                limit: usize::MAX,
                mark_read: true,
                ..InboxQuery::default()
            })
            .await
            .expect("drain");
    }
}

/// The same traffic to bare ractor actors: a request and its acknowledgement.
async fn raw_one_way(n: usize, per_agent: usize, seed: u64) -> f64 {
    let (mut actors, mut handles) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (actor, handle) = Actor::spawn(None, RawEcho, ()).await.expect("raw actor");
        actors.push(actor);
        handles.push(handle);
    }
    let actors: Arc<Vec<ActorRef<RawCall>>> = Arc::new(actors);
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let actors = Arc::clone(&actors);
            let mut rng = fastrand::Rng::with_seed(seed ^ i as u64);
            tokio::spawn(async move {
                for k in 0..per_agent {
                    let to: &ActorRef<RawCall> = &actors[rng.usize(..n)];
                    super::raw_call(to, k as u64).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("raw sender finishes");
    }
    let rate = (n * per_agent) as f64 / start.elapsed().as_secs_f64();
    super::stop_all(&actors, handles).await;
    rate
}

/// `pairs` pairs: one asks, the other waits for the question, takes it and answers; the
/// asker waits for the answer. Returns round trips per second.
async fn round_trips(agents: &[Agent], pairs: usize, trips: usize) -> f64 {
    let take = InboxQuery {
        wait: Some(Duration::from_secs(30)),
        mark_read: true,
        limit: 1,
        ..InboxQuery::default()
    };
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(pairs * 2);
    for p in 0..pairs {
        let (asker, answerer) = (agents[2 * p].clone(), agents[2 * p + 1].clone());
        let to = answerer.id().to_string();
        let q = take.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..trips {
                asker
                    .send(Outgoing::to(to.clone()).subject("ping"))
                    .await
                    .expect("ask");
                let answer = asker.check_inbox(q.clone()).await.expect("answer");
                assert_eq!(answer.messages.len(), 1, "an answer arrives");
            }
        }));
        let q = take.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..trips {
                let question = answerer.check_inbox(q.clone()).await.expect("question");
                answerer
                    .reply(&question.messages[0], Outgoing::default().subject("pong"))
                    .await
                    .expect("reply");
            }
        }));
    }
    for t in tasks {
        t.await.expect("pair finishes");
    }
    (pairs * trips) as f64 / start.elapsed().as_secs_f64()
}

/// Runs every measurement of `guildhall bench mailbox`; the durable store goes in `dir`.
///
/// # Panics
/// If a runtime fails to start or a send fails.
pub async fn mailbox(config: MailboxBenchConfig, dir: &Path, stage: &dyn Stage) -> MailboxReport {
    let n = config.agents.max(2);
    let rounds = config.rounds.max(1);
    let rt = Runtime::builder()
        .mailbox_config(config_for(n, config.per_agent))
        .build()
        .await
        .expect("runtime starts");
    stage.phase("agents", 1);
    let agents = swarm(&rt, n).await;
    stage.step();

    stage.phase("one-way", rounds as u64);
    let (mut inmem, mut raw) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        raw.push(raw_one_way(n, config.per_agent, r as u64).await);
        inmem.push(one_way(&agents, config.per_agent, r as u64).await);
        drain(&agents).await;
        stage.step();
    }

    stage.phase("round trips", rounds as u64);
    let pairs = config.pairs.min(n / 2).max(1);
    let (mut trips, mut watched, mut drops) = (Vec::new(), Vec::new(), Vec::new());
    let mut seen = super::watchers::Watched::default();
    for round in 0..rounds {
        let unwatched_first = round % 2 == 0;
        if unwatched_first {
            trips.push(round_trips(&agents, pairs, config.trips).await);
        }
        let watching = super::watchers::dashboard_and_watch(&rt);
        watched.push(round_trips(&agents, pairs, config.trips).await);
        seen += watching.stop().await;
        if !unwatched_first {
            trips.push(round_trips(&agents, pairs, config.trips).await);
        }
        drops.push(1.0 - watched[round] / trips[round]);
        stage.step();
    }
    rt.shutdown().await;

    stage.phase("durable", rounds as u64);
    let dir = super::tempfile_in(dir);
    let rt = Runtime::builder()
        .data_dir(&dir)
        .mailbox_config(config_for(n, config.durable_per_agent))
        .build()
        .await
        .expect("durable runtime starts");
    let agents = swarm(&rt, n).await;
    let (mut durable, mut fsyncs, mut per_fsync) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let before = rt.store().stats();
        let start = Instant::now();
        durable.push(one_way(&agents, config.durable_per_agent, r as u64).await);
        let secs = start.elapsed().as_secs_f64();
        let after = rt.store().stats();
        let commits = (after.commits - before.commits) as f64;
        fsyncs.push(commits / secs);
        per_fsync.push((n * config.durable_per_agent) as f64 / commits.max(1.0));
        drain(&agents).await;
        stage.step();
    }
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);

    let (inmem_rounds, raw_ractor_rounds) = (inmem.clone(), raw.clone());
    let (roundtrip_rounds, roundtrip_watched_rounds) = (trips.clone(), watched.clone());
    let (trips, watched) = (median(&mut trips), median(&mut watched));
    let inmem = median(&mut inmem);
    let raw = median(&mut raw);
    MailboxReport {
        inmem_msgs_per_sec: inmem,
        raw_ractor_msgs_per_sec: raw,
        inmem_slowdown: raw / inmem,
        roundtrip_msgs_per_sec: trips,
        roundtrip_watched_msgs_per_sec: watched,
        roundtrip_watched_drop: median(&mut drops),
        roundtrip_watched_events: seen.taken,
        roundtrip_watched_missed: seen.missed,
        durable_msgs_per_sec: median(&mut durable),
        fsyncs_per_sec: median(&mut fsyncs),
        msgs_per_fsync: median(&mut per_fsync),
        inmem_rounds,
        raw_ractor_rounds,
        roundtrip_rounds,
        roundtrip_watched_rounds,
    }
}

/// A capacity no random spread of one round can fill.
fn config_for(agents: usize, per_agent: usize) -> MailboxConfig {
    let _ = agents;
    config(per_agent * 20 + 1_000)
}

/// What `guildhall bench swarm` measured.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SwarmReport {
    /// Agents registered and activated.
    pub agents: usize,
    /// Registering them (directory and store, in memory).
    pub register_secs: f64,
    /// Starting every agent's mailbox actor.
    pub spawn_secs: f64,
    /// Anonymous resident memory (heap and stacks) added per agent by registering and
    /// activating it; code pages, paid once per process, are left out.
    pub bytes_per_agent: f64,
    /// Of which the mailbox actor (activation only).
    pub bytes_per_mailbox: f64,
}

/// Registers and activates `count` agents, timing both and measuring memory. Run in a fresh
/// process for a clean memory figure.
///
/// # Panics
/// If the runtime fails to start or an agent fails to register or start.
pub async fn swarm_bench(count: usize, stage: &dyn Stage) -> SwarmReport {
    let count = count.max(1);
    let rt = Runtime::builder()
        .mailbox_config(MailboxConfig {
            idle: Duration::from_secs(3600),
            ..MailboxConfig::default()
        })
        .build()
        .await
        .expect("runtime starts");
    let ids: Vec<String> = (0..count).map(|i| format!("agent-{i}")).collect();
    let base = Resident::now();
    stage.phase("register", count as u64);
    let start = Instant::now();
    let mut agents = Vec::with_capacity(count);
    for id in &ids {
        agents.push(
            rt.register_agent(AgentSpec::new(id.as_str(), "dev"))
                .await
                .expect("agent registers"),
        );
        stage.step();
    }
    let register_secs = start.elapsed().as_secs_f64();
    let registered = Resident::now();
    stage.phase("activate", 1);
    let start = Instant::now();
    rt.activate_agents(&agents).await.expect("mailboxes start");
    let spawn_secs = start.elapsed().as_secs_f64();
    stage.step();
    let active = Resident::now();
    assert_eq!(rt.active_mailboxes(), count, "every mailbox is running");
    let report = SwarmReport {
        agents: count,
        register_secs,
        spawn_secs,
        bytes_per_agent: active.since(base).anonymous as f64 / count as f64,
        bytes_per_mailbox: active.since(registered).anonymous as f64 / count as f64,
    };
    drop(ids);
    drop(agents);
    rt.shutdown().await;
    report
}

/// What `guildhall bench fanout` measured.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct FanOutReport {
    /// Recipients of the one message (every registered agent but the sender).
    pub recipients: usize,
    /// Registering them in the durable store (concurrently, so group commit batches them).
    pub register_secs: f64,
    /// One `send` to `*`, until it is committed (acknowledged).
    pub fan_out_secs: f64,
    /// Anonymous resident memory the send added (heap, stacks).
    pub fan_out_added_bytes: f64,
    /// The floor: the same number of inbox records of the same message written by hand in
    /// one batch to a store of its own, in this run.
    pub floor_secs: f64,
    /// `fan_out_secs / floor_secs`.
    pub fan_out_ratio: f64,
}

/// Registers `count` agents in a durable store under `dir` and sends one message to all of
/// them, against the floor of writing those inbox records directly.
///
/// # Panics
/// If a runtime or store fails to start, or the send fails.
pub async fn fan_out_bench(count: usize, dir: &Path, stage: &dyn Stage) -> FanOutReport {
    use crate::store::{self, Batch, Table, codec};
    let count = count.max(1);
    let scratch = super::tempfile_in(dir);
    let rt = Runtime::builder()
        .data_dir(scratch.join("swarm"))
        .mailbox_config(MailboxConfig {
            max_fan_out: count,
            ..MailboxConfig::default()
        })
        .build()
        .await
        .expect("runtime starts");
    let sender = rt
        .register_agent(AgentSpec::new("tl", "tl"))
        .await
        .expect("sender registers");
    stage.phase("register", count as u64);
    let start = Instant::now();
    for chunk in (0..count).collect::<Vec<_>>().chunks(1_000) {
        let registrations = chunk.iter().map(|i| {
            let rt = rt.clone();
            async move {
                rt.register_agent(AgentSpec::new(format!("agent-{i}"), "dev"))
                    .await
                    .expect("agent registers")
            }
        });
        futures::future::join_all(registrations).await;
        for _ in chunk {
            stage.step();
        }
    }
    let register_secs = start.elapsed().as_secs_f64();
    stage.phase("fan out", 1);
    let before = Resident::now();
    let start = Instant::now();
    let receipt = sender
        .send(
            Outgoing::to("*")
                .subject("all hands")
                .body("standup in five minutes"),
        )
        .await
        .expect("the fan-out is delivered");
    let fan_out_secs = start.elapsed().as_secs_f64();
    let fan_out_added_bytes = Resident::now().since(before).anonymous as f64;
    assert_eq!(receipt.delivered_to.len(), count, "every agent is reached");
    stage.step();
    // The floor: the same records, encoded once each, in one batch of a bare store.
    stage.phase("floor", 1);
    let floor = store::open(&scratch.join("floor")).expect("floor store opens");
    let message = rt
        .agent("agent-0")
        .expect("registered")
        .check_inbox(InboxQuery::default())
        .await
        .expect("inbox")
        .messages
        .remove(0);
    let start = Instant::now();
    let encoded = codec::encode(&*message);
    let mut batch = Batch::new();
    for i in 0..count {
        let mut key = format!("agent-{i}").into_bytes();
        key.push(0);
        key.extend_from_slice(message.id.as_bytes());
        batch.put(Table::Inbox, key, encoded.clone());
    }
    store::commit(&*floor, batch).await.expect("floor commits");
    let floor_secs = start.elapsed().as_secs_f64();
    stage.step();
    drop(receipt);
    rt.shutdown().await;
    floor.close();
    drop(floor);
    let _ = std::fs::remove_dir_all(&scratch);
    FanOutReport {
        recipients: count,
        register_secs,
        fan_out_secs,
        fan_out_added_bytes,
        floor_secs,
        fan_out_ratio: fan_out_secs / floor_secs,
    }
}
