//! `guildhall bench cluster`: the PostgreSQL store against PostgreSQL itself.
//!
//! - **Durable sends.** Agents send one message at a time each, all at once, through a
//!   runtime whose store is the database: every send acknowledged only once committed.
//! - **The floor.** The same rows (read back from the store after each round) inserted by
//!   a plain loop of multi-row `INSERT` + `COMMIT` on one connection, as many rows per
//!   transaction as there are senders (the most a group commit can gather when each sender
//!   has one message in flight), into a table of the same shape. Both tables grow alike:
//!   no round reads or deletes what an earlier one wrote (a table left full of rows deleted
//!   and not yet vacuumed would slow the store's inserts and not the floor's).
//!
//! - **Round trips.** A request and its reply between two agents whose mailboxes run on
//!   two servers sharing the database, against the same between two agents on one server
//!   of it: what crossing servers (a commit, a NOTIFY, a load) adds.
//! - **Takeover.** A server holding an agent's mailbox (a `guildhall inbox --wait`) is
//!   SIGKILLed; from then until a message sent to the agent reaches it on another server,
//!   which must wait out the dead server's lease first.
//!
//! Everything happens in a database of its own (`guildhall_bench_<pid>`), made on the
//! server the URL names and dropped afterwards.

use std::time::Instant;

use serde::Serialize;
use tokio_postgres::{Client, NoTls};

use super::mail::{one_way, swarm};
use super::{Stage, median, percentile};
use crate::agents::InboxQuery;
use crate::{AgentSpec, MailboxConfig, Outgoing, Runtime};

/// Settings of `guildhall bench cluster`.
#[derive(Debug, Clone)]
pub struct ClusterBenchConfig {
    /// A PostgreSQL connection string; the user must be allowed to create databases.
    pub url: String,
    /// Agents, each also a sender.
    pub agents: usize,
    /// Durable messages each agent sends per round.
    pub per_agent: usize,
    /// Rounds; figures are medians.
    pub rounds: usize,
    /// Request/reply round trips timed, each way of placing the two agents.
    pub round_trips: usize,
    /// SIGKILLed holders timed.
    pub takeovers: usize,
    /// The `guildhall` program, to run the holder that is killed; no takeover figures
    /// without it.
    pub program: Option<std::path::PathBuf>,
}

/// What `guildhall bench cluster` measured (medians over rounds).
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// Senders at once.
    pub agents: usize,
    /// Durable sends acknowledged per second, on PostgreSQL with group commit.
    pub durable_msgs_per_sec: f64,
    /// The same rows by a plain multi-row `INSERT` + `COMMIT` loop, per second.
    pub pg_floor_msgs_per_sec: f64,
    /// `durable_msgs_per_sec / pg_floor_msgs_per_sec`.
    pub ratio: f64,
    /// Messages per group commit, on average.
    pub msgs_per_commit: f64,
    /// A group commit's time on the writer, from sending it to PostgreSQL's answer, mean
    /// (µs).
    pub commit_mean_us: f64,
    /// Request/reply round trip, both agents on one server, median (µs).
    pub rtt_one_server_p50_us: f64,
    /// The same, 99th percentile (µs).
    pub rtt_one_server_p99_us: f64,
    /// Request/reply round trip, the agents on two servers, median (µs).
    pub rtt_two_servers_p50_us: f64,
    /// The same, 99th percentile (µs).
    pub rtt_two_servers_p99_us: f64,
    /// The lease the takeover waits out (ms).
    pub lease_ms: f64,
    /// From SIGKILL of a mailbox's server to a message delivered on another, median (ms).
    pub takeover_p50_ms: Option<f64>,
    /// The same, 99th percentile (ms).
    pub takeover_p99_ms: Option<f64>,
}

/// The lease the servers of the round trips and the takeover run with.
const LEASE: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs the measurement.
///
/// # Errors
/// The database's error when the bench database cannot be made or used.
///
/// # Panics
/// If a send fails.
pub async fn cluster(
    config: ClusterBenchConfig,
    stage: &dyn Stage,
) -> Result<ClusterReport, Box<dyn std::error::Error + Send + Sync>> {
    let admin = connect(&config.url).await?;
    let name = format!("guildhall_bench_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let mut url: tokio_postgres::Config = config.url.parse()?;
    url.dbname(&name);
    let result = measure(&config, &url, stage).await;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await?;
    result
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn measure(
    config: &ClusterBenchConfig,
    url: &tokio_postgres::Config,
    stage: &dyn Stage,
) -> Result<ClusterReport, Box<dyn std::error::Error + Send + Sync>> {
    let (client, connection) = url.connect(NoTls).await?;
    tokio::spawn(connection);
    let store = std::sync::Arc::new(crate::store::PostgresStore::open_with(
        url.clone(),
        crate::store::DEFAULT_LEASE,
    )?);
    let rt = Runtime::builder()
        .store(store.clone())
        .mailbox_config(MailboxConfig {
            // Nothing is read between rounds: room for every message of every round.
            capacity: config.per_agent * config.agents * config.rounds + 1,
            ..MailboxConfig::default()
        })
        .build()
        .await?;
    let agents = swarm(&rt, config.agents).await;
    client
        .batch_execute("CREATE TABLE floor (LIKE guildhall_kv INCLUDING ALL)")
        .await?;
    stage.phase("rounds", config.rounds as u64);
    let (mut durable, mut floor) = (Vec::new(), Vec::new());
    let (mut commits, mut commit_micros, mut sent) = (0u64, 0u64, 0u64);
    let mut seen = std::collections::HashSet::new();
    for round in 0..config.rounds {
        let before = crate::store::Store::stats(&*store);
        durable.push(one_way(&agents, config.per_agent, round as u64).await);
        let after = crate::store::Store::stats(&*store);
        commits += after.commits - before.commits;
        commit_micros += after.commit_micros - before.commit_micros;
        sent += (config.agents * config.per_agent) as u64;
        // The rows this round wrote: the inbox rows no earlier round wrote.
        let rows: Vec<_> = client
            .query(
                "SELECT tbl, key, value FROM guildhall_kv WHERE tbl = $1",
                &[&crate::store::table_code(crate::store::Table::Inbox)],
            )
            .await?
            .into_iter()
            .filter(|row| seen.insert(row.get::<_, Vec<u8>>(1)))
            .collect();
        floor.push(insert_loop(&client, &rows, config.agents.max(1)).await?);
        stage.step();
    }
    rt.shutdown().await;
    let durable_msgs_per_sec = median(&mut durable);
    let pg_floor_msgs_per_sec = median(&mut floor);
    let (one, two) = round_trips(url, config.round_trips.max(1), stage).await?;
    let takeover = match &config.program {
        Some(program) => Some(takeovers(url, program, config.takeovers.max(1), stage).await?),
        None => None,
    };
    Ok(ClusterReport {
        agents: config.agents,
        durable_msgs_per_sec,
        pg_floor_msgs_per_sec,
        ratio: durable_msgs_per_sec / pg_floor_msgs_per_sec,
        msgs_per_commit: sent as f64 / commits.max(1) as f64,
        commit_mean_us: commit_micros as f64 / commits.max(1) as f64,
        rtt_one_server_p50_us: percentile(&one, 0.5),
        rtt_one_server_p99_us: percentile(&one, 0.99),
        rtt_two_servers_p50_us: percentile(&two, 0.5),
        rtt_two_servers_p99_us: percentile(&two, 0.99),
        lease_ms: LEASE.as_secs_f64() * 1e3,
        takeover_p50_ms: takeover.as_ref().map(|t| percentile(t, 0.5)),
        takeover_p99_ms: takeover.as_ref().map(|t| percentile(t, 0.99)),
    })
}

/// A server of the database `url`, with the short lease.
async fn server(url: &tokio_postgres::Config) -> Result<Runtime, BoxError> {
    let store = crate::store::PostgresStore::open_with(url.clone(), LEASE)?;
    Ok(Runtime::builder()
        .store(std::sync::Arc::new(store))
        .build()
        .await?)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Round trips (µs, sorted) between two agents on one server, then on two.
async fn round_trips(
    url: &tokio_postgres::Config,
    n: usize,
    stage: &dyn Stage,
) -> Result<(Vec<f64>, Vec<f64>), BoxError> {
    let (a, b) = (server(url).await?, server(url).await?);
    stage.phase("round trips", 2 * n as u64);
    let mut figures = Vec::new();
    for (name, answerer) in [("one", &a), ("two", &b)] {
        let asker = a
            .register_agent(AgentSpec::new(format!("ask-{name}"), "bench"))
            .await?;
        let replier = answerer
            .register_agent(AgentSpec::new(format!("answer-{name}"), "bench"))
            .await?;
        // Each mailbox runs where its agent is: a first check starts it there.
        asker.check_inbox(InboxQuery::default()).await?;
        replier.check_inbox(InboxQuery::default()).await?;
        let answering = tokio::spawn(answer(replier, n));
        let mut times = Vec::with_capacity(n);
        for i in 0..n {
            let started = Instant::now();
            asker
                .send(Outgoing::to(format!("answer-{name}")).subject(format!("q{i}")))
                .await?;
            let mut got = 0;
            while got == 0 {
                got = asker.check_inbox(waiting()).await?.messages.len();
            }
            times.push(started.elapsed().as_secs_f64() * 1e6);
            stage.step();
        }
        answering.await??;
        times.sort_by(f64::total_cmp);
        figures.push(times);
    }
    a.shutdown().await;
    b.shutdown().await;
    let two = figures.pop().unwrap_or_default();
    let one = figures.pop().unwrap_or_default();
    Ok((one, two))
}

fn waiting() -> InboxQuery {
    InboxQuery {
        wait: Some(std::time::Duration::from_secs(10)),
        mark_read: true,
        ..InboxQuery::default()
    }
}

/// Answers `n` requests, each with a reply to its sender.
async fn answer(replier: crate::Agent, n: usize) -> Result<(), crate::agents::MailError> {
    let mut answered = 0;
    while answered < n {
        for message in replier.check_inbox(waiting()).await?.messages {
            replier
                .send(Outgoing::to(message.from.to_string()).subject("a"))
                .await?;
            answered += 1;
        }
    }
    Ok(())
}

/// Takeover times (ms, sorted): a `guildhall inbox --wait` process holding agent `t`'s
/// mailbox is killed; then a message is sent to `t`, whose next check, on this server, waits for the
/// dead server's lease to run out, takes the mailbox over and finds the message.
async fn takeovers(
    url: &tokio_postgres::Config,
    program: &std::path::Path,
    n: usize,
    stage: &dyn Stage,
) -> Result<Vec<f64>, BoxError> {
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("guildhall.toml"),
        format!(
            "[store]\nurl = \"{}\"\nlease = \"{}ms\"\n",
            libpq_string(url),
            LEASE.as_millis()
        ),
    )?;
    let rt = server(url).await?;
    let store = rt.store();
    let from = rt.register_agent(AgentSpec::new("from", "bench")).await?;
    let target = rt.register_agent(AgentSpec::new("t", "bench")).await?;
    stage.phase("takeovers", n as u64);
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        // The holder: `t` waiting for mail in another process, so its mailbox runs
        // there (handed over from this server).
        let mut holder = std::process::Command::new(program)
            .arg("--data-dir")
            .arg(dir.path())
            .args(["inbox", "--agent", "t", "--wait", "60", "--take", "--json"])
            .env("RUST_LOG", "off")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let cluster = store.cluster().ok_or("the store is not shared")?;
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while cluster.holder("mail:t")?.is_none() {
            if Instant::now() > deadline {
                let _ = holder.kill();
                let _ = holder.wait();
                return Err("the holder did not take the mailbox".into());
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let killed = Instant::now();
        holder.kill()?;
        holder.wait()?;
        from.send(Outgoing::to("t").subject(format!("after {i}")))
            .await?;
        let mut found = false;
        while !found {
            found = target
                .check_inbox(waiting())
                .await?
                .messages
                .iter()
                .any(|m| *m.subject == format!("after {i}"));
        }
        times.push(killed.elapsed().as_secs_f64() * 1e3);
        stage.step();
    }
    rt.shutdown().await;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// `config` as a key=value connection string, for a config file.
pub(super) fn libpq_string(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let mut parts = Vec::new();
    if let Some(Host::Tcp(host)) = config.get_hosts().first() {
        parts.push(format!("host={host}"));
    }
    if let Some(port) = config.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = config.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(password) = config.get_password() {
        parts.push(format!("password={}", String::from_utf8_lossy(password)));
    }
    if let Some(db) = config.get_dbname() {
        parts.push(format!("dbname={db}"));
    }
    parts.join(" ")
}

/// `rows` added to `floor`, `per_commit` to a transaction; rows per second.
async fn insert_loop(
    client: &Client,
    rows: &[tokio_postgres::Row],
    per_commit: usize,
) -> Result<f64, tokio_postgres::Error> {
    let insert = client
        .prepare(
            "INSERT INTO floor (tbl, key, value) \
             SELECT * FROM unnest($1::int2[], $2::bytea[], $3::bytea[])",
        )
        .await?;
    let start = Instant::now();
    for chunk in rows.chunks(per_commit) {
        let tbl: Vec<i16> = chunk.iter().map(|r| r.get(0)).collect();
        let key: Vec<&[u8]> = chunk.iter().map(|r| r.get(1)).collect();
        let value: Vec<&[u8]> = chunk.iter().map(|r| r.get(2)).collect();
        client.batch_execute("BEGIN").await?;
        client.execute(&insert, &[&tbl, &key, &value]).await?;
        client.batch_execute("COMMIT").await?;
    }
    Ok(rows.len() as f64 / start.elapsed().as_secs_f64())
}
