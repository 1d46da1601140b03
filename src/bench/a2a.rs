//! `guildhall bench a2a`: one exchange with an agent, over A2A and over MCP, in one run.
//!
//! - **A2A**: a blocking `SendMessage` to `role:tl` (JSON-RPC over HTTP): a board task, mail
//!   to tl, tl's reply asking for input, the answer once the reply is in.
//! - **MCP**, the baseline: a `send_message` to tl with `wait_reply_secs` over Streamable
//!   HTTP (stateless era): the mail, tl's reply, the answer with it.
//!
//! The same responder answers both: agent tl, in the process, waiting on its inbox and
//! replying to each message. The two kinds alternate in rounds; each figure is the median
//! over rounds of that round's p50 (or p99), so a noisy moment weighs on both.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::mcp::{answer_in, stateless_call};
use super::{Stage, median, percentile};
use crate::{AgentSpec, CallOptions, Runtime};

/// What `bench a2a` does.
#[derive(Debug, Clone, Copy)]
pub struct A2aBenchConfig {
    /// Exchanges of each kind per round.
    pub exchanges: usize,
    /// Rounds.
    pub rounds: usize,
}

impl Default for A2aBenchConfig {
    fn default() -> Self {
        Self {
            exchanges: 100,
            rounds: 5,
        }
    }
}

/// The figures, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct A2aReport {
    /// Exchanges of each kind measured.
    pub exchanges: usize,
    /// A2A `SendMessage` → mail → reply → answer, median.
    pub a2a_p50_ms: f64,
    /// The same, 99th percentile.
    pub a2a_p99_ms: f64,
    /// MCP `send_message` with `wait_reply_secs` → mail → reply → answer, median.
    pub mcp_p50_ms: f64,
    /// The same, 99th percentile.
    pub mcp_p99_ms: f64,
    /// `a2a_p50_ms / mcp_p50_ms`.
    pub ratio: f64,
}

/// Runs the exchanges in a temporary data directory (the embedded store).
///
/// # Errors
/// What failed: the server's start, or an exchange answered with an error.
///
/// # Cancel safety
/// Dropping the future leaves the in-process server to stop with its runtime.
pub async fn a2a(config: A2aBenchConfig, stage: &dyn Stage) -> Result<A2aReport, String> {
    let dir = tempfile::tempdir().map_err(|err| err.to_string())?;
    let rt = Runtime::builder()
        .data_dir(dir.path())
        .build()
        .await
        .map_err(|err| err.to_string())?;
    let result = measure(&rt, config, stage).await;
    rt.shutdown().await;
    result
}

async fn measure(
    rt: &Runtime,
    config: A2aBenchConfig,
    stage: &dyn Stage,
) -> Result<A2aReport, String> {
    let tl = rt
        .register_agent(AgentSpec::new("tl", "tl"))
        .await
        .map_err(|err| err.to_string())?;
    rt.register_agent(AgentSpec::new("bench-mcp", "bench"))
        .await
        .map_err(|err| err.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|err| err.to_string())?;
    let addr = listener.local_addr().map_err(|err| err.to_string())?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let base = format!("http://{addr}");
    let exposed = crate::a2a::A2aConfig {
        expose: vec!["role:tl".into()],
        ..crate::a2a::A2aConfig::default()
    };
    let routes = crate::a2a::routes(rt, &exposed, &base, false, stop.clone())?;
    let router = crate::mcp::http::router(
        crate::mcp::McpServer::new(rt.clone()),
        addr,
        crate::mcp::http::HttpOptions {
            edge: Some(routes),
            ..crate::mcp::http::HttpOptions::default()
        },
        stop.clone(),
    )
    .map_err(|err| err.to_string())?;
    tokio::spawn(crate::mcp::http::serve(listener, router, stop.clone()));
    tokio::spawn(respond(
        rt.clone(),
        CallOptions::new().as_agent(&tl),
        stop.clone(),
    ));

    crate::tls::install();
    let client = reqwest::Client::builder()
        .timeout(EXCHANGE_LIMIT)
        .build()
        .map_err(|err| err.to_string())?;
    let a2a_url = format!("{base}/a2a/role/tl");
    let mcp_url = format!("{base}{}", crate::mcp::http::PATH);
    let exchanges = config.exchanges.max(1);
    let rounds = config.rounds.max(1);
    stage.phase("exchanges", (2 * exchanges * rounds) as u64);
    let (mut a2a50, mut a2a99, mut mcp50, mut mcp99) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let mut a2a_times = Vec::with_capacity(exchanges);
        let mut mcp_times = Vec::with_capacity(exchanges);
        for i in 0..exchanges {
            let started = Instant::now();
            a2a_exchange(&client, &a2a_url, &format!("bench-{round}-{i}")).await?;
            a2a_times.push(started.elapsed().as_secs_f64() * 1e3);
            stage.step();
            let started = Instant::now();
            mcp_exchange(&client, &mcp_url, round * exchanges + i).await?;
            mcp_times.push(started.elapsed().as_secs_f64() * 1e3);
            stage.step();
        }
        for times in [&mut a2a_times, &mut mcp_times] {
            times.sort_by(f64::total_cmp);
        }
        a2a50.push(percentile(&a2a_times, 0.50));
        a2a99.push(percentile(&a2a_times, 0.99));
        mcp50.push(percentile(&mcp_times, 0.50));
        mcp99.push(percentile(&mcp_times, 0.99));
    }
    let (a2a_p50_ms, mcp_p50_ms) = (median(&mut a2a50), median(&mut mcp50));
    Ok(A2aReport {
        exchanges: exchanges * rounds,
        a2a_p50_ms,
        a2a_p99_ms: median(&mut a2a99),
        mcp_p50_ms,
        mcp_p99_ms: median(&mut mcp99),
        ratio: a2a_p50_ms / mcp_p50_ms,
    })
}

/// Agent tl: replies to every message it gets, asking for input on A2A ones (what ends a
/// blocking `SendMessage`), until `stop`.
async fn respond(rt: Runtime, tl: CallOptions, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let check = rt.call_json(
            "check_inbox",
            json!({ "wait_secs": 1, "limit": 50, "full": true }),
            tl.clone(),
        );
        let inbox = tokio::select! {
            inbox = check => inbox,
            () = stop.cancelled() => return,
        };
        let Ok(inbox) = inbox else { continue };
        let messages = inbox["messages"].as_array().cloned().unwrap_or_default();
        let mut ids = Vec::with_capacity(messages.len());
        for mail in &messages {
            ids.push(mail["id"].clone());
            // The board's notice of the task an A2A message made is not a message to answer.
            if mail["payload"].get("event").is_some() {
                continue;
            }
            let mut reply = json!({ "to": mail["from"], "reply_to": mail["id"], "body": "yes?" });
            if mail["payload"].get("a2a").is_some() {
                reply["payload"] = json!({ "input_required": true });
            }
            let _ = rt.call_json("send_message", reply, tl.clone()).await;
        }
        if !ids.is_empty() {
            let _ = rt
                .call_json("mark_read", json!({ "ids": ids, "ack": true }), tl.clone())
                .await;
        }
    }
}

async fn a2a_exchange(client: &reqwest::Client, url: &str, id: &str) -> Result<(), String> {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": { "message": { "messageId": id, "role": "ROLE_USER",
                                 "parts": [{ "text": "Can you review this?" }] } } });
    let answer: Value = client
        .post(url)
        .header("a2a-version", "1.0")
        .json(&body)
        .send()
        .await
        .map_err(|err| err.to_string())?
        .json()
        .await
        .map_err(|err| err.to_string())?;
    match answer["result"]["task"]["status"]["state"].as_str() {
        Some("TASK_STATE_INPUT_REQUIRED") => Ok(()),
        _ => Err(format!(
            "an A2A exchange did not come back with tl's reply: {answer}"
        )),
    }
}

async fn mcp_exchange(client: &reqwest::Client, url: &str, n: usize) -> Result<(), String> {
    let args = json!({ "to": "tl", "body": format!("Can you review this? ({n})"),
                       "wait_reply_secs": 30 });
    let text = stateless_call(client, url, "bench-a2a", "bench-mcp", "send_message", args)
        .send()
        .await
        .map_err(|err| err.to_string())?
        .text()
        .await
        .map_err(|err| err.to_string())?;
    let answer = answer_in(&text).ok_or_else(|| format!("no MCP answer in {text}"))?;
    if answer["result"]["structuredContent"]["reply"].is_object() {
        Ok(())
    } else {
        Err(format!(
            "an MCP exchange did not come back with tl's reply: {answer}"
        ))
    }
}

/// How long one exchange may take before the bench calls it failed.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(30);
