//! Durable sends and context updates killed with SIGKILL at random points: every acknowledged
//! message or batch is in the store afterwards, exactly once (batches whole), and the store
//! reopens cleanly each time.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;

use guildhall::Runtime;

use crate::support::guildhall;

const ROUNDS: usize = 20;
/// Lines offered per round; fewer than a mailbox's default capacity (1,000).
const LINES: usize = 900;

fn register(dir: &Path, id: &str) {
    let status = guildhall(dir)
        .args(["agents", "register", id, "--role", "dev"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Runs `guildhall <args>` fed `lines` on stdin, kills it after `kill_after` lines of output
/// (at once for 0), and returns every output line it wrote (read to the end after the kill),
/// each a JSON value.
fn run_and_kill(
    dir: &Path,
    args: &[&str],
    lines: Vec<String>,
    kill_after: usize,
) -> Vec<serde_json::Value> {
    let mut child = guildhall(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        for line in lines {
            if stdin.write_all(line.as_bytes()).is_err() {
                return; // killed
            }
        }
    });
    let mut acked = Vec::new();
    if kill_after == 0 {
        child.kill().unwrap();
    }
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        acked.push(serde_json::from_str(&line.unwrap()).unwrap());
        if acked.len() == kill_after {
            child.kill().unwrap();
        }
    }
    child.wait().unwrap();
    feeder.join().unwrap();
    acked
}

/// Starts a durable sender, kills it after `kill_after` acknowledgements, and returns every
/// message id it acknowledged.
fn send_and_kill(dir: &Path, round: usize, kill_after: usize) -> Vec<String> {
    let lines = (0..LINES)
        .map(|n| format!("{{\"to\":\"b\",\"subject\":\"r{round}\",\"body\":\"r{round}-{n}\"}}\n"))
        .collect();
    let args = ["send", "--from", "a", "--jsonl", "--concurrency", "48"];
    run_and_kill(dir, &args, lines, kill_after)
        .into_iter()
        .map(|receipt| receipt["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn acknowledged_messages_survive_sigkill_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_owned();
    send_rounds(dir.path(), ROUNDS, &move || {
        Runtime::builder().data_dir(&data)
    });
}

/// The same on PostgreSQL: the sender (the CLI, reading `[store] url` from the data
/// directory's config) is killed with its commits in flight. Its sends store each message
/// into the recipient's inbox without starting the recipient's mailbox (it runs nowhere),
/// so the next opener loads them from the database.
#[cfg(feature = "postgres")]
#[test]
fn acknowledged_messages_survive_sigkill_exactly_once_on_postgres() {
    let url = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(crate::pg::fresh_database());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("guildhall.toml"),
        format!("[store]\nurl = \"{url}\"\nlease = \"1s\"\n"),
    )
    .unwrap();
    send_rounds(dir.path(), 10, &move || {
        Runtime::builder()
            .store_url(&url)
            .store_lease(std::time::Duration::from_secs(1))
    });
}

/// `rounds` rounds of a durable sender killed at a random point, each checked by a runtime
/// `open` makes on the same store.
fn send_rounds(dir: &Path, rounds: usize, open: &dyn Fn() -> guildhall::RuntimeBuilder) {
    register(dir, "a");
    register(dir, "b");
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut rng = fastrand::Rng::with_seed(seed);
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let mut killed_mid_stream = 0;
    for round in 0..rounds {
        let kill_after = if round == 0 {
            0
        } else {
            rng.usize(1..LINES - 100)
        };
        let acked = send_and_kill(dir, round, kill_after);
        if acked.len() < LINES {
            killed_mid_stream += 1;
        }
        tokio.block_on(async {
            let rt = reopen(open, round).await;
            let b = rt.agent("b").unwrap();
            // Take this round's messages, so the next round starts with an empty inbox.
            let inbox = crate::support::take_all(&b).await;
            let stored: HashSet<String> = inbox.messages.iter().map(|m| m.id.to_string()).collect();
            let bodies: HashSet<&str> = inbox.messages.iter().map(|m| &*m.body).collect();
            assert_eq!(
                bodies.len(),
                inbox.messages.len(),
                "round {round}: a message is duplicated"
            );
            assert!(
                inbox
                    .messages
                    .iter()
                    .all(|m| *m.subject == format!("r{round}")),
                "round {round}: a message of another round is still unread"
            );
            let lost: Vec<&String> = acked.iter().filter(|id| !stored.contains(*id)).collect();
            assert!(
                lost.is_empty(),
                "round {round}: acknowledged but lost: {lost:?}"
            );
            rt.shutdown().await;
        });
    }
    // The kills landed mid-stream, not after everything was sent.
    assert_eq!(killed_mid_stream, rounds);
}

/// The runtime `open` makes.
async fn reopen(open: &dyn Fn() -> guildhall::RuntimeBuilder, round: usize) -> Runtime {
    open()
        .build()
        .await
        .unwrap_or_else(|e| panic!("round {round}: the store did not reopen: {e}"))
}

/// Context batches per round.
const BATCHES: usize = 600;
const CONTEXT_ROUNDS: usize = 10;

/// Starts a durable context writer, kills it after `kill_after` commits, and returns the
/// line numbers it acknowledged.
fn update_and_kill(dir: &Path, round: usize, kill_after: usize) -> Vec<u64> {
    // Three changes per line that must land together or not at all.
    let lines = (1..=BATCHES)
        .map(|n| {
            format!(
                "[{{\"key\":\"a{round}-{n}\",\"strategy\":\"replace\",\"value\":{n}}},\
                 {{\"key\":\"b{round}-{n}\",\"strategy\":\"replace\",\"value\":{n}}},\
                 {{\"key\":\"log\",\"strategy\":\"append\",\"value\":[\"{round}-{n}\"]}}]\n"
            )
        })
        .collect();
    let args = ["context", "update", "s", "--jsonl", "--concurrency", "16"];
    run_and_kill(dir, &args, lines, kill_after)
        .into_iter()
        .map(|done| done["line"].as_u64().unwrap())
        .collect()
}

#[test]
fn context_batches_killed_mid_update_leave_no_partial_state() {
    use guildhall::context::Select;

    let dir = tempfile::tempdir().unwrap();
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(11);
    let mut rng = fastrand::Rng::with_seed(seed);
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let mut applied_total = 0usize;
    let mut killed_mid_stream = 0;
    for round in 0..CONTEXT_ROUNDS {
        let kill_after = if round == 0 {
            0
        } else {
            rng.usize(1..BATCHES - 100)
        };
        let acked = update_and_kill(dir.path(), round, kill_after);
        if acked.len() < BATCHES {
            killed_mid_stream += 1;
        }
        tokio.block_on(async {
            let rt = Runtime::builder()
                .data_dir(dir.path())
                .build()
                .await
                .unwrap_or_else(|e| panic!("round {round}: the store did not reopen: {e}"));
            let Ok(ctx) = rt.sessions().context("s") else {
                // Killed before the session was created: nothing was acknowledged.
                assert!(acked.is_empty(), "round {round}");
                rt.shutdown().await;
                return;
            };
            let view = ctx.read(Select::All, usize::MAX).await.unwrap();
            let keys: HashSet<&str> = view.entries.iter().map(|e| e.key.as_str()).collect();
            let log: Vec<String> = view
                .entries
                .iter()
                .find(|e| e.key == "log")
                .and_then(|e| e.value.as_array().cloned())
                .unwrap_or_default()
                .into_iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            let logged: HashSet<&str> = log.iter().map(String::as_str).collect();
            assert_eq!(
                logged.len(),
                log.len(),
                "round {round}: a batch applied twice"
            );
            for n in 1..=BATCHES {
                let (a, b) = (format!("a{round}-{n}"), format!("b{round}-{n}"));
                let tag = format!("{round}-{n}");
                let parts = [
                    keys.contains(a.as_str()),
                    keys.contains(b.as_str()),
                    logged.contains(tag.as_str()),
                ];
                assert!(
                    parts.iter().all(|p| *p) || parts.iter().all(|p| !p),
                    "round {round}: batch {n} is partly applied: {parts:?}"
                );
            }
            for n in &acked {
                assert!(
                    keys.contains(format!("a{round}-{n}").as_str()),
                    "round {round}: batch {n} was acknowledged but is lost"
                );
            }
            applied_total = log.len();
            // One version per batch, every one of them in the log entry.
            assert_eq!(view.version as usize, applied_total, "round {round}");
            rt.shutdown().await;
        });
    }
    assert_eq!(killed_mid_stream, CONTEXT_ROUNDS);
    assert!(applied_total > 0, "some batches were applied");
}

/// Task board lines per round (creations, then as many notes).
const TASK_LINES: usize = 300;
const TASK_ROUNDS: usize = 10;

#[test]
fn acknowledged_task_changes_survive_sigkill_once_with_their_whole_history() {
    use guildhall::tasks::{Action, TaskQuery};

    let dir = tempfile::tempdir().unwrap();
    register(dir.path(), "tl");
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(13);
    let mut rng = fastrand::Rng::with_seed(seed);
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let mut killed_mid_stream = 0;
    let mut noted_total = 0;
    // Ids of tasks created so far (acknowledged or not), kept to note the next round.
    let mut known: Vec<u64> = Vec::new();
    for round in 0..TASK_ROUNDS {
        // Creations, killed part way.
        let lines = (1..=TASK_LINES)
            .map(|n| format!("{{\"title\":\"r{round}-{n}\"}}\n"))
            .collect();
        let args = [
            "tasks",
            "add",
            "--jsonl",
            "--as",
            "tl",
            "--concurrency",
            "16",
        ];
        let kill_after = rng.usize(1..TASK_LINES - 50);
        let created: Vec<(u64, u64)> = run_and_kill(dir.path(), &args, lines, kill_after)
            .into_iter()
            .map(|ack| (ack["line"].as_u64().unwrap(), ack["id"].as_u64().unwrap()))
            .collect();
        // Notes on the tasks there are, killed part way: each line's note is unique.
        let targets: Vec<u64> = known
            .iter()
            .chain(created.iter().map(|(_, id)| id))
            .copied()
            .collect();
        let lines = (1..=TASK_LINES)
            .map(|n| {
                let id = targets[n % targets.len()];
                format!("{{\"id\":{id},\"note\":\"r{round}-n{n}\"}}\n")
            })
            .collect();
        let args = [
            "tasks",
            "update",
            "--jsonl",
            "--as",
            "tl",
            "--concurrency",
            "16",
        ];
        let kill_after = rng.usize(1..TASK_LINES - 50);
        let noted: Vec<u64> = run_and_kill(dir.path(), &args, lines, kill_after)
            .into_iter()
            .map(|ack| ack["line"].as_u64().unwrap())
            .collect();
        if created.len() < TASK_LINES && noted.len() < TASK_LINES {
            killed_mid_stream += 1;
        }
        noted_total += noted.len();
        tokio.block_on(async {
            let rt = Runtime::builder()
                .data_dir(dir.path())
                .build()
                .await
                .unwrap_or_else(|e| panic!("round {round}: the store did not reopen: {e}"));
            let tasks = rt.tasks().expect("the task board");
            let (all, _) = tasks
                .list(TaskQuery {
                    limit: usize::MAX,
                    ..TaskQuery::default()
                })
                .await
                .unwrap();
            let titles: HashSet<&str> = all.iter().map(|t| t.title.as_str()).collect();
            assert_eq!(
                titles.len(),
                all.len(),
                "round {round}: a task created twice"
            );
            for (line, id) in &created {
                let task = all.iter().find(|t| t.id == *id);
                assert_eq!(
                    task.map(|t| t.title.clone()),
                    Some(format!("r{round}-{line}")),
                    "round {round}: task {id} was acknowledged but is lost"
                );
            }
            let mut notes: Vec<&str> = all
                .iter()
                .flat_map(|t| t.notes.iter().map(|n| n.text.as_str()))
                .filter(|text| text.starts_with(&format!("r{round}-n")))
                .collect();
            let count = notes.len();
            notes.sort_unstable();
            notes.dedup();
            assert_eq!(notes.len(), count, "round {round}: a note applied twice");
            for line in &noted {
                let text = format!("r{round}-n{line}");
                assert!(
                    notes.binary_search(&text.as_str()).is_ok(),
                    "round {round}: note {line} was acknowledged but is lost"
                );
            }
            // Each task's history: versions 1, 2, … with no gap, its creation first, one
            // note event per note it holds.
            for task in &all {
                let history = tasks.history(task.id).await.unwrap();
                let versions: Vec<u64> = history.iter().map(|e| e.version).collect();
                assert_eq!(
                    versions,
                    (1..=task.version).collect::<Vec<_>>(),
                    "round {round}: task {}",
                    task.id
                );
                assert_eq!(history[0].action, Action::Created, "round {round}");
                let noted_events = history.iter().filter(|e| e.note.is_some()).count();
                assert_eq!(
                    noted_events,
                    task.notes.len(),
                    "round {round}: task {}",
                    task.id
                );
            }
            known = all.iter().map(|t| t.id).collect();
            rt.shutdown().await;
        });
    }
    assert_eq!(killed_mid_stream, TASK_ROUNDS);
    assert!(noted_total > 0, "some notes were acknowledged");
}
