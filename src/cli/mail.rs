//! `guildhall agents`, `guildhall send` and `guildhall inbox`: agents and mailboxes from a
//! terminal, on the store in the data directory.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use futures::StreamExt;
use guildhall::agents::tools::MessageView;
use guildhall::agents::{AgentRecord, parse_message_id};
use guildhall::mcp::local::{self, Hello, LocalError};
use guildhall::{AgentSpec, InboxQuery, MailboxConfig, Outgoing, Priority, Runtime};
use serde::Deserialize;

type CliResult = Result<(), Box<dyn std::error::Error>>;

async fn open(data_dir: &Path) -> Result<Runtime, Box<dyn std::error::Error>> {
    Ok(super::offline::offline_runtime(data_dir)?
        .mailbox_config(MailboxConfig::default())
        .build()
        .await?)
}

#[derive(Debug, Args)]
pub(crate) struct AgentsArgs {
    #[command(subcommand)]
    which: AgentsCommand,
}

#[derive(Debug, Subcommand)]
enum AgentsCommand {
    /// Register an agent (or update its role, parent and metadata).
    Register {
        /// The agent's id.
        id: String,
        /// Its role (`tl`, `pm`, `dev`, ...).
        #[arg(long)]
        role: String,
        /// The agent it reports to.
        #[arg(long)]
        parent: Option<String>,
        /// Metadata, as a JSON object.
        #[arg(long, value_parser = parse_json)]
        metadata: Option<serde_json::Value>,
    },
    /// List registered agents.
    List {
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove an agent with its mailbox and messages.
    Remove {
        /// The agent's id.
        id: String,
    },
}

pub(super) fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| {
        format!(
            "not JSON ({e}); text is a JSON string in quotes: --value '{}'",
            serde_json::Value::String(s.to_owned())
        )
    })
}

/// Runs this process's command line inside the server for `data_dir`, which holds the store
/// while it runs, and prints what it printed; `None` when no server runs.
pub(super) async fn through_server(data_dir: &Path) -> Option<CliResult> {
    let hello = Hello::Admin {
        args: std::env::args_os()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: std::env::current_dir().unwrap_or_default(),
        token: std::env::var(guildhall::agents::TOKEN_ENV).ok(),
    };
    match local::connect(data_dir, &hello).await {
        Ok(connected) => Some((|| {
            write!(
                std::io::stdout(),
                "{}",
                connected.value.as_str().unwrap_or_default()
            )?;
            Ok(())
        })()),
        Err(LocalError::NotRunning { .. }) => None,
        Err(err) => Some(Err(err.into())),
    }
}

pub(crate) async fn agents(args: AgentsArgs, data_dir: &Path) -> CliResult {
    if let Some(done) = through_server(data_dir).await {
        return done;
    }
    super::offline::require_store(data_dir, args.reads_only())?;
    let rt = open(data_dir).await?;
    let result = agents_with(&rt, args, &mut std::io::stdout()).await;
    rt.shutdown().await;
    result
}

impl AgentsArgs {
    /// Whether the command only reads (so it must not create a store).
    fn reads_only(&self) -> bool {
        matches!(self.which, AgentsCommand::List { .. })
    }
}

/// Runs an `agents` command on `rt`, printing to `out`.
pub(crate) async fn agents_with(
    rt: &Runtime,
    args: AgentsArgs,
    out: &mut (dyn Write + Send),
) -> CliResult {
    {
        match args.which {
            AgentsCommand::Register {
                id,
                role,
                parent,
                metadata,
            } => {
                let mut spec = AgentSpec::new(id, role);
                spec.parent = parent;
                spec.metadata = metadata.unwrap_or_default();
                let agent = rt.register_agent(spec).await?;
                writeln!(out, "registered {}", agent.id())?;
            }
            AgentsCommand::List { json } => {
                let agents = rt.agents();
                if agents.is_empty() && !json {
                    writeln!(out, "no agents registered")?;
                }
                for record in agents {
                    if json {
                        writeln!(out, "{}", serde_json::to_string(&*record)?)?;
                    } else {
                        writeln!(out, "{}", agent_line(&record))?;
                    }
                }
            }
            AgentsCommand::Remove { id } => {
                rt.deregister_agent(&id).await?;
                writeln!(out, "removed {id}")?;
            }
        }
        Ok(())
    }
}

fn agent_line(record: &AgentRecord) -> String {
    let parent = record.parent.as_ref().map_or("-", |p| p.as_str());
    format!("{:<24} {:<12} parent: {parent}", record.id, record.role)
}

#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// The sending agent (registered).
    #[arg(long)]
    from: String,
    /// The address: an agent id, `role:<name>`, `parent`, `children` or `*`.
    #[arg(long, required_unless_present_any = ["jsonl", "reply_to"])]
    to: Option<String>,
    /// Subject line.
    #[arg(long, default_value = "")]
    subject: String,
    /// Body text (`-` reads it from stdin).
    #[arg(long, default_value = "")]
    body: String,
    /// Priority.
    #[arg(long, value_parser = parse_priority, default_value = "normal")]
    priority: Priority,
    /// Id of the message this answers.
    #[arg(long)]
    reply_to: Option<String>,
    /// Read messages from stdin, one JSON object per line (`{"to", "subject", "body",
    /// "priority"}`), and print one JSON receipt per line as each is acknowledged.
    #[arg(long, conflicts_with_all = ["to", "reply_to"])]
    jsonl: bool,
    /// With `--jsonl`: how many sends may be in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
}

fn parse_priority(s: &str) -> Result<Priority, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| "expected low, normal, high or urgent".to_owned())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    to: String,
    #[serde(default)]
    subject: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    priority: Priority,
}

/// Calls `tool` as `agent` on the server running for `data_dir`, if one answers: the store
/// is then the server's, and only it may open it. `None` when no server runs.
async fn on_server(
    data_dir: &Path,
    agent: &str,
    tool: &str,
    arguments: serde_json::Value,
) -> Option<Result<serde_json::Value, Box<dyn std::error::Error>>> {
    let hello = Hello::Call {
        agent: Some(agent.to_owned()),
        token: std::env::var(guildhall::agents::TOKEN_ENV).ok(),
        tool: tool.to_owned(),
        arguments,
    };
    match local::connect(data_dir, &hello).await {
        Ok(connected) => Some(Ok(connected.value)),
        Err(LocalError::NotRunning { .. }) => None,
        Err(err) => Some(Err(err.into())),
    }
}

pub(crate) async fn send(mut args: SendArgs, data_dir: &Path) -> CliResult {
    if !args.jsonl {
        if args.body == "-" {
            args.body = std::io::read_to_string(std::io::stdin())?;
        }
        let mut arguments = serde_json::json!({
            "subject": args.subject,
            "body": args.body,
            "priority": args.priority,
        });
        if let Some(to) = &args.to {
            arguments["to"] = to.clone().into();
        }
        if let Some(reply_to) = &args.reply_to {
            arguments["reply_to"] = reply_to.clone().into();
        }
        if let Some(receipt) = on_server(data_dir, &args.from, "send_message", arguments).await {
            writeln!(std::io::stdout(), "{}", serde_json::to_string(&receipt?)?)?;
            return Ok(());
        }
    }
    if args.jsonl && local::connect(data_dir, &Hello::Status).await.is_ok() {
        return send_lines_through_server(data_dir, &args).await;
    }
    let rt = open(data_dir).await?;
    let result = send_with(&rt, args).await;
    rt.shutdown().await;
    result
}

/// `send --jsonl` while a server holds the store: each line is a `send_message` call
/// through its socket, up to `concurrency` at once, each receipt printed as it comes.
async fn send_lines_through_server(data_dir: &Path, args: &SendArgs) -> CliResult {
    let (lines, reader) = stdin_lines(args.concurrency.max(1));
    let sends = lines
        .map(|(n, line)| async move {
            let parsed: Line =
                serde_json::from_str(&line).map_err(|e| format!("line {n}: not a message: {e}"))?;
            let arguments = serde_json::json!({
                "to": parsed.to,
                "subject": parsed.subject,
                "body": parsed.body,
                "priority": parsed.priority,
            });
            match on_server(data_dir, &args.from, "send_message", arguments).await {
                Some(Ok(mut receipt)) => {
                    receipt["line"] = n.into();
                    Ok(receipt)
                }
                Some(Err(err)) => Err(format!("line {n}: {err}")),
                None => Err(format!("line {n}: the server stopped")),
            }
        })
        .buffer_unordered(args.concurrency.max(1));
    print_outcomes(sends, reader, "messages were not sent").await
}

/// Sends with the store opened here: `args.body` is the text itself (`send` has read `-`).
async fn send_with(rt: &Runtime, args: SendArgs) -> CliResult {
    let agent = rt.agent(&args.from)?;
    if !args.jsonl {
        let out = Outgoing {
            to: args.to.unwrap_or_default(),
            subject: args.subject,
            body: args.body,
            payload: None,
            priority: args.priority,
            reply_to: args.reply_to.as_deref().map(parse_message_id).transpose()?,
            expires_in: None,
            request_id: None,
            trace: None,
        };
        let receipt = agent.send(out).await?;
        writeln!(std::io::stdout(), "{}", serde_json::to_string(&receipt)?)?;
        return Ok(());
    }
    // Sends run with up to `concurrency` in flight; each receipt is printed (and flushed) the
    // moment its send is acknowledged.
    let (lines, reader) = stdin_lines(args.concurrency.max(1));
    let agent = Arc::new(agent);
    let sends = lines
        .map(|(n, line)| {
            let agent = Arc::clone(&agent);
            async move {
                let parsed: Line = serde_json::from_str(&line)
                    .map_err(|e| format!("line {n}: not a message: {e}"))?;
                let out = Outgoing::to(parsed.to)
                    .subject(parsed.subject)
                    .body(parsed.body)
                    .priority(parsed.priority);
                agent
                    .send(out)
                    .await
                    .map(|receipt| (n, receipt))
                    .map_err(|e| format!("line {n}: {e}"))
            }
        })
        .buffer_unordered(args.concurrency.max(1));
    let receipts = sends.map(|outcome| {
        let (n, receipt) = outcome?;
        let mut line = serde_json::to_value(&receipt).map_err(|e| e.to_string())?;
        line["line"] = n.into();
        Ok(line)
    });
    print_outcomes(receipts, reader, "messages were not sent").await
}

/// Prints each outcome's JSON line the moment it arrives (flushed, so a pipe sees it at
/// once) and logs each failure; fails at the end saying how many `failed` (e.g. "messages
/// were not sent") once `reader` has finished.
pub(super) async fn print_outcomes(
    outcomes: impl futures::Stream<Item = Result<serde_json::Value, String>>,
    reader: tokio::task::JoinHandle<()>,
    failed: &str,
) -> CliResult {
    let mut outcomes = std::pin::pin!(outcomes);
    // Not held locked across the awaits: the future stays `Send`.
    let mut stdout = std::io::stdout();
    let mut failures = 0usize;
    while let Some(outcome) = outcomes.next().await {
        match outcome {
            Ok(line) => {
                writeln!(stdout, "{line}")?;
                stdout.flush()?;
            }
            Err(err) => {
                failures += 1;
                tracing::error!("{err}");
            }
        }
    }
    let _ = reader.await;
    if failures > 0 {
        return Err(format!("{failures} {failed} (see the log above)").into());
    }
    Ok(())
}

/// Stdin's lines, numbered from 1, read on a blocking thread at most `buffer` ahead of
/// whoever consumes them; the handle ends with the input.
pub(super) fn stdin_lines(
    buffer: usize,
) -> (
    impl futures::Stream<Item = (usize, String)>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<(usize, String)>(buffer);
    let reader = tokio::task::spawn_blocking(move || {
        for (n, line) in std::io::stdin().lock().lines().enumerate() {
            let Ok(line) = line else { break };
            if tx.blocking_send((n + 1, line)).is_err() {
                break;
            }
        }
    });
    let lines =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) });
    (lines, reader)
}

#[derive(Debug, Args)]
pub(crate) struct InboxArgs {
    /// Whose inbox.
    #[arg(long, required_unless_present = "human", conflicts_with = "human")]
    agent: Option<String>,
    /// The inbox of the first of `[humans] ids` in guildhall.toml: questions agents asked.
    #[arg(long)]
    human: bool,
    /// Include read messages.
    #[arg(long)]
    all: bool,
    /// Show full bodies.
    #[arg(long)]
    full: bool,
    /// At most this many messages.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Wait up to this many seconds for a message if there is none.
    #[arg(long)]
    wait: Option<f64>,
    /// Mark the listed messages read.
    #[arg(long)]
    take: bool,
    /// One JSON object per message instead of text.
    #[arg(long)]
    json: bool,
}

/// The first human `[humans]` names in the data directory's guildhall.toml.
fn first_human(data_dir: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let config =
        guildhall::config::Config::load(&data_dir.join(guildhall::config::CONFIG_FILE), false)?;
    config
        .humans
        .and_then(|h| h.ids.into_iter().next())
        .ok_or_else(|| "no humans are configured: add `[humans] ids = [\"you\"]` to guildhall.toml, or name one".into())
}

#[derive(Debug, Args)]
pub(crate) struct AnswerArgs {
    /// The question's id (the message's id in the human's inbox).
    id: String,
    /// The answer: text, a JSON object for a form, or `decline`.
    text: String,
    /// The human answering (default: the first of `[humans] ids`).
    #[arg(long = "as")]
    human: Option<String>,
}

/// `guildhall answer`: a reply to a question, from a human, in its thread.
pub(crate) async fn answer(args: AnswerArgs, data_dir: &Path) -> CliResult {
    let human = match args.human {
        Some(human) => human,
        None => first_human(data_dir)?,
    };
    let text = args.text.trim();
    let payload = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(object @ serde_json::Value::Object(_)) => Some(serde_json::json!({ "answer": object })),
        _ if text.eq_ignore_ascii_case("decline") => None,
        _ => Some(serde_json::json!({ "answer": text })),
    };
    let arguments = serde_json::json!({
        "reply_to": args.id,
        "body": text,
        "payload": payload,
    });
    if let Some(receipt) = on_server(data_dir, &human, "send_message", arguments).await {
        receipt?;
        // Answered: the question leaves the human's unread questions.
        let read = serde_json::json!({ "ids": [args.id] });
        if let Some(marked) = on_server(data_dir, &human, "mark_read", read).await {
            marked?;
        }
        writeln!(std::io::stdout(), "answered {} as {human}", args.id)?;
        return Ok(());
    }
    super::offline::require_store(data_dir, true)?;
    let rt = open(data_dir).await?;
    let result = async {
        let id = parse_message_id(&args.id)?;
        let mut reply = Outgoing::reply(id).body(text);
        if let Some(payload) = payload {
            reply = reply.payload(payload);
        }
        let human_agent = rt.agent(&human)?;
        human_agent.send(reply).await?;
        human_agent.mark_read(&[id], false).await?;
        writeln!(std::io::stdout(), "answered {} as {human}", args.id)?;
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .await;
    rt.shutdown().await;
    result
}

pub(crate) async fn inbox(mut args: InboxArgs, data_dir: &Path) -> CliResult {
    let agent = match args.agent.take() {
        Some(agent) => agent,
        None => first_human(data_dir)?,
    };
    args.agent = Some(agent.clone());
    let mut arguments = serde_json::json!({
        "unread_only": !args.all,
        "limit": args.limit,
        "full": args.full,
    });
    if let Some(wait) = args.wait {
        arguments["wait_secs"] = wait.into();
    }
    if let Some(listed) = on_server(data_dir, &agent, "check_inbox", arguments).await {
        return print_served_inbox(data_dir, &args, listed?).await;
    }
    super::offline::require_store(data_dir, true)?;
    let rt = open(data_dir).await?;
    let result = async {
        let agent = rt.agent(&agent)?;
        let wait = match args.wait {
            Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => return Err(format!("--wait must be a number of seconds, not {s}").into()),
            None => None,
        };
        let inbox = agent
            .check_inbox(InboxQuery {
                unread_only: !args.all,
                limit: args.limit,
                wait,
                mark_read: args.take,
                ..InboxQuery::default()
            })
            .await?;
        // The same view a running server's `check_inbox` gives, so the output is the same
        // with a server or without.
        let listed = serde_json::json!({
            "messages": inbox
                .messages
                .iter()
                .map(|m| MessageView::of(m, args.full))
                .collect::<Vec<_>>(),
            "unread": inbox.unread,
        });
        print_listing(&args, &listed, inbox.unread)?;
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .await;
    rt.shutdown().await;
    result
}

/// Prints an inbox listed by a running server (the `check_inbox` tool's view), and with
/// `--take` marks what it printed as read there.
async fn print_served_inbox(
    data_dir: &Path,
    args: &InboxArgs,
    listed: serde_json::Value,
) -> CliResult {
    let empty = Vec::new();
    let messages = listed["messages"].as_array().unwrap_or(&empty);
    let mut unread = listed["unread"].as_u64().unwrap_or(0);
    if args.take && !messages.is_empty() {
        let ids: Vec<&serde_json::Value> = messages.iter().map(|m| &m["id"]).collect();
        if let Some(marked) = on_server(
            data_dir,
            args.agent.as_deref().unwrap_or_default(),
            "mark_read",
            serde_json::json!({ "ids": ids }),
        )
        .await
        {
            // Taken: what is left unread is what the listing said, less what changed.
            unread = unread.saturating_sub(marked?["changed"].as_u64().unwrap_or(0));
        }
    }
    print_listing(args, &listed, usize::try_from(unread).unwrap_or(usize::MAX))?;
    Ok(())
}

/// Prints a `check_inbox` listing: its messages as JSON lines, or one line each for people
/// with the unread count after it.
fn print_listing(args: &InboxArgs, listed: &serde_json::Value, unread: usize) -> CliResult {
    let mut out = std::io::stdout().lock();
    for m in listed["messages"].as_array().into_iter().flatten() {
        if args.json {
            writeln!(out, "{m}")?;
        } else {
            let field = |key: &str| m[key].as_str().unwrap_or("");
            let text = m["body"].as_str().unwrap_or(field("preview"));
            let line = inbox_line(
                [field("id"), field("priority"), field("from"), field("to")],
                field("subject"),
                text,
                args.full,
            );
            writeln!(out, "{line}")?;
        }
    }
    if !args.json {
        writeln!(out, "{unread} unread")?;
    }
    Ok(())
}

/// One inbox listing line: `id [priority] from → to: subject — ` and the body in full, or
/// its first line cut to 80 characters.
fn inbox_line(
    [id, priority, from, to]: [&str; 4],
    subject: &str,
    body: &str,
    full: bool,
) -> String {
    let body = if full {
        format!("\n{body}\n")
    } else {
        body.lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(80)
            .collect()
    };
    let subject = if subject.is_empty() {
        "(no subject)"
    } else {
        subject
    };
    format!("{id} [{priority}] {from} → {to}: {subject} — {body}")
}

#[derive(Debug, Args)]
pub(crate) struct SentArgs {
    /// The message's id (a `send` receipt's `id`).
    id: String,
    /// The agent that sent it (only its sender may ask).
    #[arg(long)]
    from: String,
    /// The status as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `guildhall sent ID --from AGENT`: what became of a message, through the running server
/// when there is one (the `message_status` tool), else on the store.
pub(crate) async fn sent(args: SentArgs, data_dir: &Path) -> CliResult {
    let arguments = serde_json::json!({ "id": args.id });
    let status = match on_server(data_dir, &args.from, "message_status", arguments.clone()).await {
        Some(status) => status?,
        None => {
            super::offline::require_store(data_dir, true)?;
            let rt = open(data_dir).await?;
            let status = async {
                let sender = rt.agent(&args.from)?;
                let options = guildhall::CallOptions::new().as_agent(&sender);
                Ok::<_, Box<dyn std::error::Error>>(
                    rt.call_json("message_status", arguments, options).await?,
                )
            }
            .await;
            rt.shutdown().await;
            status?
        }
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{status}")?;
        return Ok(());
    }
    let text = |key: &str| status[key].as_str().unwrap_or_default().to_owned();
    writeln!(
        out,
        "message {} to {}: \"{}\" (sent {})",
        text("id"),
        text("to"),
        text("subject"),
        text("sent")
    )?;
    for recipient in status["recipients"].as_array().into_iter().flatten() {
        let mut line = format!(
            "  {:<20} {:<13}",
            recipient["agent"].as_str().unwrap_or_default(),
            recipient["state"].as_str().unwrap_or_default()
        );
        if let Some(at) = recipient["read_at"].as_str() {
            line.push_str(&format!(" read {at}"));
        }
        if let Some(at) = recipient["acknowledged_at"].as_str() {
            line.push_str(&format!(", acknowledged {at}"));
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    writeln!(
        out,
        "{} unread, {} read, {} acknowledged",
        status["delivered"], status["read"], status["acknowledged"]
    )?;
    Ok(())
}
