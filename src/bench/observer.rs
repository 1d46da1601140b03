//! The measurements behind `guildhall bench observer`: the dashboard's first screen and the
//! mail search on a durable store holding a large swarm's history.
//!
//! The store is filled through the runtime as a swarm would fill it: messages sent by 100
//! agents to one another (words drawn from a vocabulary of 5,000, the first hundred common,
//! as in prose), and tasks on the board, some finished. Then:
//! - **First screen**: the requests the page makes when it opens (the page, the status, the
//!   sessions, the two task board listings, the newest mail), all at once over HTTP, until
//!   the last answer is read. The baseline is the same on an empty store, in the same run.
//! - **Search**: queries of five kinds (a common word, a rare one, two words, a prefix, a
//!   sender and a word) through [`Runtime::search_mail`], each answer's messages read from
//!   the store. The first builds the index (timed apart). The baseline is a scan of the
//!   same texts held in memory, lower-cased, for the same words, which is what searching
//!   without an index costs at the least.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Stage, median, percentile, tempfile_in};
use crate::agents::MailSearch;
use crate::tasks::{TaskChange, TaskConfig, TaskLimits, TaskSpec, TaskStatus};
use crate::{Agent, AgentSpec, MailboxConfig, Outgoing, Runtime};

/// Settings of `guildhall bench observer`.
#[derive(Debug, Clone, Copy)]
pub struct ObserverBenchConfig {
    /// Messages in the store.
    pub messages: usize,
    /// Tasks on the board.
    pub tasks: usize,
    /// Searches timed.
    pub searches: usize,
    /// Times the first screen is loaded, on each store.
    pub rounds: usize,
}

impl Default for ObserverBenchConfig {
    fn default() -> Self {
        Self {
            messages: 100_000,
            tasks: 10_000,
            searches: 500,
            rounds: 5,
        }
    }
}

/// What `guildhall bench observer` measured.
#[derive(Debug, Clone, Serialize)]
pub struct ObserverReport {
    /// Messages in the store.
    pub messages: usize,
    /// Tasks on the board.
    pub tasks: usize,
    /// Seconds to send them all (durable, acknowledged), and to make the tasks.
    pub fill_secs: f64,
    /// The first screen on an empty store: median over rounds (ms). The baseline.
    pub empty_first_screen_ms: f64,
    /// The first screen on the full store, the first time the server is asked (ms).
    pub cold_first_screen_ms: f64,
    /// The first screen on the full store: median over rounds (ms). Bound: ≤ 1,000.
    pub first_screen_ms: f64,
    /// The slowest of those rounds (ms).
    pub first_screen_max_ms: f64,
    /// The first search, which makes the index from the store (ms).
    pub index_build_ms: f64,
    /// What the index holds: messages, distinct words, and about how many bytes.
    pub index_messages: usize,
    /// Distinct words indexed.
    pub index_words: usize,
    /// Bytes the index holds, about.
    pub index_bytes: usize,
    /// Searches timed after the first.
    pub searches: usize,
    /// Their latency, p50 and p95 (ms). Bound: p95 ≤ 50.
    pub search_p50_ms: f64,
    /// p95 (ms).
    pub search_p95_ms: f64,
    /// The slowest (ms).
    pub search_max_ms: f64,
    /// The baseline: the same searches as a scan of the texts in memory, p95 (ms).
    pub scan_p95_ms: f64,
    /// `search_p95_ms / scan_p95_ms`.
    pub search_ratio: f64,
}

/// Words of the vocabulary.
const VOCABULARY: usize = 5_000;
/// Agents sending.
const AGENTS: usize = 100;

/// Runs `guildhall bench observer`; the durable stores go in `dir`.
///
/// # Panics
/// If a runtime fails to start, a send or a task change fails, or the HTTP listener
/// cannot bind loopback.
pub async fn observer(
    config: ObserverBenchConfig,
    dir: &Path,
    stage: &dyn Stage,
) -> ObserverReport {
    let rounds = config.rounds.max(1);
    let words = vocabulary();

    stage.phase("empty store", rounds as u64);
    let empty_dir = tempfile_in(dir);
    let empty = open(&empty_dir, 1).await;
    let empty_first_screen_ms = first_screens(&empty, rounds, stage).await.1;
    empty.shutdown().await;
    let _ = std::fs::remove_dir_all(&empty_dir);

    let full_dir = tempfile_in(dir);
    let rt = open(&full_dir, config.messages).await;
    let started = Instant::now();
    let (texts, senders) = fill_mail(&rt, &words, config.messages, stage).await;
    fill_tasks(&rt, config.tasks, stage).await;
    let fill_secs = started.elapsed().as_secs_f64();
    // As a server started on this store finds it.
    rt.shutdown().await;
    let rt = open(&full_dir, config.messages).await;

    stage.phase("first screen", rounds as u64);
    let (cold, first_screen_ms, first_screen_max_ms) = first_screens(&rt, rounds, stage).await;

    let queries = queries(&words, &senders, config.searches.max(1));
    let built = Instant::now();
    rt.search_mail(MailSearch::new(&*queries[0].text, 50))
        .await
        .expect("the first search");
    let index_build_ms = ms(built.elapsed());
    let size = rt.mail_index_size().expect("a search made the index");

    stage.phase("searches", queries.len() as u64);
    let mut searched = Vec::with_capacity(queries.len());
    let mut scanned = Vec::with_capacity(queries.len());
    for query in &queries {
        let start = Instant::now();
        let found = rt
            .search_mail(MailSearch::new(&*query.text, 50))
            .await
            .expect("a bench search");
        searched.push(ms(start.elapsed()));
        std::hint::black_box(found);
        let start = Instant::now();
        std::hint::black_box(scan(&texts, query));
        scanned.push(ms(start.elapsed()));
        stage.step();
    }
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&full_dir);
    searched.sort_by(f64::total_cmp);
    scanned.sort_by(f64::total_cmp);
    let search_p95_ms = percentile(&searched, 0.95);
    let scan_p95_ms = percentile(&scanned, 0.95);
    ObserverReport {
        messages: config.messages,
        tasks: config.tasks,
        fill_secs,
        empty_first_screen_ms,
        cold_first_screen_ms: cold,
        first_screen_ms,
        first_screen_max_ms,
        index_build_ms,
        index_messages: size.messages,
        index_words: size.words,
        index_bytes: size.bytes,
        searches: searched.len(),
        search_p50_ms: percentile(&searched, 0.5),
        search_p95_ms,
        search_max_ms: searched.last().copied().unwrap_or_default(),
        scan_p95_ms,
        search_ratio: search_p95_ms / scan_p95_ms.max(1e-9),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A durable runtime in `dir` whose mailboxes hold `messages` unread, with a task board.
async fn open(dir: &Path, messages: usize) -> Runtime {
    Runtime::builder()
        .data_dir(dir)
        .mailbox_config(MailboxConfig {
            capacity: messages.max(1),
            ..MailboxConfig::default()
        })
        .task_config(TaskConfig {
            limits: TaskLimits {
                max_tasks: usize::MAX,
                max_held: usize::MAX,
                ..TaskLimits::default()
            },
            ..TaskConfig::default()
        })
        .build()
        .await
        .expect("durable runtime starts")
}

/// Made-up words of two to four syllables, each once.
fn vocabulary() -> Vec<String> {
    const SYLLABLES: [&str; 24] = [
        "ka", "lo", "mi", "ne", "tor", "pa", "ri", "sen", "du", "vel", "ba", "qui", "ost", "ren",
        "fa", "gul", "he", "jo", "wim", "zu", "cra", "dex", "ly", "mor",
    ];
    let mut rng = fastrand::Rng::with_seed(7);
    let mut seen = std::collections::HashSet::new();
    let mut words = Vec::with_capacity(VOCABULARY);
    while words.len() < VOCABULARY {
        let n = rng.usize(2..=4);
        let word: String = (0..n)
            .map(|_| SYLLABLES[rng.usize(..SYLLABLES.len())])
            .collect();
        if seen.insert(word.clone()) {
            words.push(word);
        }
    }
    words
}

/// A word as prose draws them: a few often, most rarely.
fn draw<'w>(rng: &mut fastrand::Rng, words: &'w [String]) -> &'w str {
    let skewed = rng.f64().powi(3);
    &words[((skewed * words.len() as f64) as usize).min(words.len() - 1)]
}

fn sentence(rng: &mut fastrand::Rng, words: &[String], n: usize) -> String {
    let mut text = String::new();
    for i in 0..n {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(draw(rng, words));
    }
    text
}

/// Sends `count` messages among [`AGENTS`] agents, each agent's one at a time; returns each
/// message's text (lower case), agent by agent in order, and the agents' ids.
async fn fill_mail(
    rt: &Runtime,
    words: &[String],
    count: usize,
    stage: &dyn Stage,
) -> (Vec<String>, Vec<String>) {
    let mut agents: Vec<Agent> = Vec::with_capacity(AGENTS);
    for i in 0..AGENTS {
        agents.push(
            rt.register_agent(AgentSpec::new(format!("agent-{i}"), "bench"))
                .await
                .expect("bench agent registers"),
        );
    }
    let senders: Vec<String> = agents.iter().map(|a| a.id().to_string()).collect();
    let per_agent = count.div_ceil(AGENTS);
    stage.phase("mail", count as u64);
    let words = Arc::new(words.to_vec());
    let jobs: Vec<_> = agents
        .into_iter()
        .enumerate()
        .map(|(i, agent)| {
            let words = Arc::clone(&words);
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(i as u64);
                let mut texts = Vec::with_capacity(per_agent);
                for _ in 0..per_agent {
                    let subject = sentence(&mut rng, &words, 6);
                    let body = sentence(&mut rng, &words, 40);
                    let to = format!("agent-{}", rng.usize(..AGENTS));
                    texts.push(format!("{subject} {body}"));
                    agent
                        .send(Outgoing::to(to).subject(subject).body(body))
                        .await
                        .expect("bench message is sent");
                }
                texts
            })
        })
        .collect();
    let mut texts = Vec::with_capacity(per_agent * AGENTS);
    for job in jobs {
        texts.extend(job.await.expect("sender finishes"));
        for _ in 0..per_agent {
            stage.step();
        }
    }
    (texts, senders)
}

/// `count` tasks, a fifth of them finished.
async fn fill_tasks(rt: &Runtime, count: usize, stage: &dyn Stage) {
    let board = rt.tasks().expect("the bench runtime has a task board");
    stage.phase("tasks", count as u64);
    for n in 0..count {
        let task = board
            .create(
                None,
                TaskSpec {
                    title: format!("task {n}"),
                    ..TaskSpec::default()
                },
            )
            .await
            .expect("bench task is created");
        if n % 5 == 0 {
            board
                .update(
                    None,
                    task.id,
                    TaskChange {
                        status: Some(TaskStatus::Done),
                        ..TaskChange::default()
                    },
                )
                .await
                .expect("bench task is finished");
        }
        stage.step();
    }
}

/// Loads the first screen `rounds` times over HTTP: the first load's time, the median and
/// the slowest (ms).
async fn first_screens(rt: &Runtime, rounds: usize, stage: &dyn Stage) -> (f64, f64, f64) {
    use crate::mcp::http;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("loopback binds");
    let addr = listener.local_addr().expect("a bound address");
    let stop = tokio_util::sync::CancellationToken::new();
    let options = http::HttpOptions {
        dashboard: Some(crate::mcp::local::Control::default()),
        ..http::HttpOptions::default()
    };
    let router = http::router(
        crate::mcp::McpServer::new(rt.clone()),
        addr,
        options,
        stop.clone(),
    )
    .expect("the observer's routes");
    let served = tokio::spawn(http::serve(listener, router, stop.clone()));
    #[cfg(feature = "tls")]
    crate::tls::install();
    let client = reqwest::Client::new();
    let base = format!("http://{addr}");
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let paths = [
            http::DASHBOARD_PATH.to_owned(),
            http::STATUS_PATH.to_owned(),
            http::SESSIONS_PATH.to_owned(),
            format!("{}?status=open,in_progress&limit=500", http::TASKS_PATH),
            format!(
                "{}?status=done,failed,cancelled&limit=30&newest=true",
                http::TASKS_PATH
            ),
            format!("{}?limit=100", http::MAIL_PATH),
        ];
        let loads = paths.iter().map(|path| {
            let client = client.clone();
            let url = format!("{base}{path}");
            async move {
                let response = client.get(&url).send().await.expect("the server answers");
                assert!(
                    response.status().is_success(),
                    "{url}: {}",
                    response.status()
                );
                response.bytes().await.expect("the answer is read").len()
            }
        });
        std::hint::black_box(futures::future::join_all(loads).await);
        times.push(ms(start.elapsed()));
        stage.step();
    }
    stop.cancel();
    let _ = served.await;
    let cold = times[0];
    let max = times.iter().copied().fold(0.0, f64::max);
    (cold, median(&mut times), max)
}

/// One timed search.
struct Query {
    text: String,
    /// Lower-cased words the text must hold, for the baseline scan.
    words: Vec<String>,
    /// The sender it must have, for the baseline scan.
    from: Option<usize>,
}

/// `n` searches, the five kinds in turn.
fn queries(words: &[String], senders: &[String], n: usize) -> Vec<Query> {
    let mut rng = fastrand::Rng::with_seed(11);
    (0..n)
        .map(|i| match i % 5 {
            0 => {
                let word = words[rng.usize(..20)].clone();
                Query {
                    text: word.clone(),
                    words: vec![word],
                    from: None,
                }
            }
            1 => {
                let word = words[rng.usize(words.len() / 2..words.len())].clone();
                Query {
                    text: word.clone(),
                    words: vec![word],
                    from: None,
                }
            }
            2 => {
                let (a, b) = (
                    draw(&mut rng, words).to_owned(),
                    draw(&mut rng, words).to_owned(),
                );
                Query {
                    text: format!("{a} {b}"),
                    words: vec![a, b],
                    from: None,
                }
            }
            3 => {
                let word = &words[rng.usize(..words.len())];
                let prefix: String = word.chars().take(5).collect();
                Query {
                    text: format!("{prefix}*"),
                    words: vec![prefix],
                    from: None,
                }
            }
            _ => {
                let word = draw(&mut rng, words).to_owned();
                let from = rng.usize(..senders.len());
                Query {
                    text: format!("from:{} {word}", senders[from]),
                    words: vec![word],
                    from: Some(from),
                }
            }
        })
        .collect()
}

/// The baseline: how many of `texts` hold every word of `query` (as substrings), and are
/// from its sender when it names one.
fn scan(texts: &[String], query: &Query) -> usize {
    let per_agent = texts.len().div_ceil(AGENTS).max(1);
    texts
        .iter()
        .enumerate()
        .filter(|(i, _)| query.from.is_none_or(|from| i / per_agent == from))
        .filter(|(_, text)| query.words.iter().all(|w| text.contains(w.as_str())))
        .count()
}
