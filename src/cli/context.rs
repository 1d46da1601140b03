//! `guildhall context`: sessions and their context from a terminal, on the store in the data
//! directory.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use futures::StreamExt;
use guildhall::Runtime;
use guildhall::context::{Change, Context, HistoryQuery, Select, SessionExport, Strategy};

use super::mail::{parse_json, print_outcomes, stdin_lines};

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Args)]
pub(crate) struct ContextArgs {
    #[command(subcommand)]
    which: ContextCommand,
}

#[derive(Debug, Subcommand)]
enum ContextCommand {
    /// List sessions.
    List {
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a session's entries as JSON: all, some keys, a prefix, or the most relevant.
    Show {
        /// The session.
        session: String,
        /// Only this key (repeatable).
        #[arg(long = "key", conflicts_with_all = ["prefix", "query"])]
        keys: Vec<String>,
        /// Only keys starting with this.
        #[arg(long, conflicts_with = "query")]
        prefix: Option<String>,
        /// The entries most relevant to this text, best first.
        #[arg(long)]
        query: Option<String>,
        /// As the session was at this version.
        #[arg(long)]
        as_of: Option<u64>,
        /// At most this many entries.
        #[arg(long, default_value_t = usize::MAX)]
        limit: usize,
    },
    /// Change a session (created if missing): one change, or batches as JSON lines on stdin.
    Update {
        /// The session.
        session: String,
        /// The agent making the change (registered).
        #[arg(long = "as")]
        author: Option<String>,
        /// The entry's key.
        #[arg(long, required_unless_present = "jsonl")]
        key: Option<String>,
        /// `replace`, `merge` or `append`.
        #[arg(long, value_parser = parse_strategy, default_value = "replace")]
        strategy: Strategy,
        /// The value, as JSON (`"text"`, `{"a": 1}`, ...).
        #[arg(long, value_parser = parse_json, required_unless_present = "jsonl")]
        value: Option<serde_json::Value>,
        /// Apply only if the entry is at this version (0: must not exist).
        #[arg(long)]
        expect: Option<u64>,
        /// Read batches from stdin, one JSON array of changes per line, and print one JSON
        /// line (`{"line", "version"}`) as each is committed.
        #[arg(long, conflicts_with_all = ["key", "value", "expect"])]
        jsonl: bool,
        /// With `--jsonl`: how many batches may be in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
    /// Who changed what, and when.
    History {
        /// The session.
        session: String,
        /// Only batches that changed this key.
        #[arg(long)]
        key: Option<String>,
        /// Batches after this version (default: the latest ones).
        #[arg(long)]
        after: Option<u64>,
        /// At most this many batches.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Write a session as JSON (to stdout, or a file).
    Export {
        /// The session.
        session: String,
        /// Include its history (every batch still kept).
        #[arg(long)]
        history: bool,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Create a session from an export (`-` reads stdin).
    Import {
        /// The export file.
        file: PathBuf,
        /// Create it under this id instead of the exported one.
        #[arg(long = "as")]
        id: Option<String>,
    },
    /// Close a session: it can be read, no longer changed.
    Close {
        /// The session.
        session: String,
    },
    /// Delete a session and everything stored for it.
    Delete {
        /// The session.
        session: String,
    },
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| "expected replace, merge or append".to_owned())
}

pub(crate) async fn run(args: ContextArgs, data_dir: &Path) -> CliResult {
    if let Some(done) = super::mail::through_server(data_dir).await {
        return done;
    }
    super::offline::require_store(data_dir, args.reads_only())?;
    let rt = super::offline::offline_runtime(data_dir)?.build().await?;
    let cwd = std::env::current_dir()?;
    let result = run_with(&rt, args, &mut std::io::stdout(), &cwd).await;
    rt.shutdown().await;
    result
}

impl ContextArgs {
    /// Whether the command only reads (so it must not create a store).
    fn reads_only(&self) -> bool {
        matches!(
            self.which,
            ContextCommand::List { .. }
                | ContextCommand::Show { .. }
                | ContextCommand::History { .. }
                | ContextCommand::Export { .. }
        )
    }

    /// Why the command cannot run inside a server, if it cannot: it reads this process's
    /// stdin.
    pub(crate) fn needs_own_stdin(&self) -> Option<&'static str> {
        match &self.which {
            ContextCommand::Update { jsonl: true, .. } => Some("context update --jsonl"),
            ContextCommand::Import { file, .. } if file.as_os_str() == "-" => {
                Some("context import -")
            }
            _ => None,
        }
    }
}

/// Runs a `context` command on `rt`, printing to `out`; relative paths are taken from `cwd`.
pub(crate) async fn run_with(
    rt: &Runtime,
    args: ContextArgs,
    out: &mut (dyn Write + Send),
    cwd: &Path,
) -> CliResult {
    let sessions = rt.sessions();
    match args.which {
        ContextCommand::List { json } => {
            let list = sessions.list();
            if list.is_empty() && !json {
                writeln!(out, "no sessions")?;
            }
            for record in list {
                if json {
                    writeln!(out, "{}", serde_json::to_string(&*record)?)?;
                } else {
                    let state = if record.closed_ms.is_some() {
                        "closed"
                    } else {
                        "open"
                    };
                    writeln!(out, "{:<40} {state:<6} {}", record.id, record.title)?;
                }
            }
        }
        ContextCommand::Show {
            session,
            keys,
            prefix,
            query,
            as_of,
            limit,
        } => {
            let select = match (keys.is_empty(), prefix, query) {
                (false, _, _) => Select::Keys(keys),
                (true, Some(prefix), _) => Select::Prefix(prefix),
                (true, None, Some(query)) => Select::Relevant(query),
                (true, None, None) => Select::All,
            };
            let ctx = sessions.context(&session)?;
            let view = match as_of {
                Some(version) => ctx.read_as_of(version, select, limit).await?,
                None => ctx.read(select, limit).await?,
            };
            writeln!(out, "{}", serde_json::to_string_pretty(&view)?)?;
        }
        ContextCommand::Update {
            session,
            author,
            key,
            strategy,
            value,
            expect,
            jsonl,
            concurrency,
        } => {
            let ctx = sessions.open(&session, author.as_deref()).await?;
            if jsonl {
                return update_lines(&ctx, concurrency.max(1)).await;
            }
            let (Some(key), Some(value)) = (key, value) else {
                return Err("give --key and --value, or --jsonl".into());
            };
            let mut change = Change::new(key, strategy, value);
            change.expected_version = expect;
            let applied = ctx.update(vec![change]).await?;
            writeln!(out, "{}", serde_json::to_string(&applied)?)?;
        }
        ContextCommand::History {
            session,
            key,
            after,
            limit,
        } => {
            let history = sessions
                .context(&session)?
                .history(&HistoryQuery {
                    after,
                    key,
                    limit: limit.max(1),
                })
                .await?;
            writeln!(out, "{}", serde_json::to_string_pretty(&history)?)?;
        }
        ContextCommand::Export {
            session,
            history,
            out: file,
        } => {
            let export = sessions.export(&session, history).await?;
            match file {
                Some(path) => {
                    let path = cwd.join(path);
                    let mut file = std::io::BufWriter::new(std::fs::File::create(&path)?);
                    serde_json::to_writer_pretty(&mut file, &export)?;
                    file.flush()?;
                }
                None => writeln!(out, "{}", serde_json::to_string_pretty(&export)?)?,
            }
        }
        ContextCommand::Import { file, id } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(cwd.join(&file))
                    .map_err(|e| format!("cannot read {}: {e}", file.display()))?
            };
            let export: SessionExport = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not a session export: {e}", file.display()))?;
            let record = sessions.import(export, id.as_deref()).await?;
            writeln!(out, "imported {}", record.id)?;
        }
        ContextCommand::Close { session } => {
            sessions.close(&session).await?;
            writeln!(out, "closed {session}")?;
        }
        ContextCommand::Delete { session } => {
            sessions.delete(&session).await?;
            writeln!(out, "deleted {session}")?;
        }
    }
    Ok(())
}

/// Applies one batch per stdin line, up to `concurrency` at once, printing each as it commits.
async fn update_lines(ctx: &Context, concurrency: usize) -> CliResult {
    let (lines, reader) = stdin_lines(concurrency);
    let updates = lines
        .map(|(n, line)| async move {
            let changes: Vec<Change> = serde_json::from_str(&line)
                .map_err(|e| format!("line {n}: not an array of changes: {e}"))?;
            ctx.update(changes)
                .await
                .map(|applied| (n, applied.version))
                .map_err(|e| format!("line {n}: {e}"))
        })
        .buffer_unordered(concurrency);
    let lines = updates.map(|outcome| {
        outcome.map(|(line, version)| serde_json::json!({ "line": line, "version": version }))
    });
    print_outcomes(lines, reader, "batches were not applied").await
}
