//! `guildhall bench cluster`: the PostgreSQL store against PostgreSQL itself.
//!
//! - **Durable sends.** Agents send one message at a time each, all at once, through a
//!   runtime whose store is the database: every send acknowledged only once committed.
//! - **The floor.** The same rows (read back from the store after each round) inserted by
//!   a plain loop of multi-row `INSERT` + `COMMIT` on one connection, as many rows per
//!   transaction as there are senders (the most a group commit can gather when each sender
//!   has one message in flight), into a table of the same shape.
//!
//! Everything happens in a database of its own (`guildhall_bench_<pid>`), made on the
//! server the URL names and dropped afterwards.

use std::time::Instant;

use serde::Serialize;
use tokio_postgres::{Client, NoTls};

use super::mail::{drain, one_way, swarm};
use super::{Stage, median};
use crate::{MailboxConfig, Runtime};

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
}

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
            capacity: config.per_agent * config.agents + 1,
            ..MailboxConfig::default()
        })
        .build()
        .await?;
    let agents = swarm(&rt, config.agents).await;
    client
        .batch_execute("CREATE TABLE floor (LIKE guildhall_kv INCLUDING ALL)")
        .await?;
    stage.phase("rounds", config.rounds as u64);
    let (mut durable, mut floor, mut commits, mut sent) = (Vec::new(), Vec::new(), 0u64, 0u64);
    for round in 0..config.rounds {
        let before = crate::store::Store::stats(&*store);
        durable.push(one_way(&agents, config.per_agent, round as u64).await);
        let after = crate::store::Store::stats(&*store);
        commits += after.commits - before.commits;
        sent += (config.agents * config.per_agent) as u64;
        // The rows this round wrote: every inbox row (the inboxes were empty before it).
        let rows = client
            .query(
                "SELECT tbl, key, value FROM guildhall_kv WHERE tbl = $1",
                &[&crate::store::table_code(crate::store::Table::Inbox)],
            )
            .await?;
        floor.push(insert_loop(&client, &rows, config.agents.max(1)).await?);
        drain(&agents).await;
        stage.step();
    }
    rt.shutdown().await;
    let durable_msgs_per_sec = median(&mut durable);
    let pg_floor_msgs_per_sec = median(&mut floor);
    Ok(ClusterReport {
        agents: config.agents,
        durable_msgs_per_sec,
        pg_floor_msgs_per_sec,
        ratio: durable_msgs_per_sec / pg_floor_msgs_per_sec,
        msgs_per_commit: sent as f64 / commits.max(1) as f64,
    })
}

/// `rows` inserted into `floor`, `per_commit` to a transaction; rows per second.
async fn insert_loop(
    client: &Client,
    rows: &[tokio_postgres::Row],
    per_commit: usize,
) -> Result<f64, tokio_postgres::Error> {
    client.batch_execute("TRUNCATE floor").await?;
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
