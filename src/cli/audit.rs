//! `guildhall audit`: the audit log, from a running server or straight from the store.

use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use guildhall::governance::Glob;
use guildhall::governance::audit::{self, AuditQuery, AuditRecord, Outcome};
use guildhall::mcp::local::{self, Hello, LocalError};

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Only this agent's calls.
    #[arg(long)]
    agent: Option<String>,
    /// Only calls to tools matching this name or glob.
    #[arg(long, value_parser = |s: &str| Glob::new(s))]
    tool: Option<Glob>,
    /// Only calls that ended so: ok, tool_error, invalid_arguments, crashed, timeout,
    /// denied, circuit_open, rate_limited, unavailable, cancelled.
    #[arg(long)]
    outcome: Option<Outcome>,
    /// Only calls since this time: a duration ago (`1h`, `30min`) or a timestamp
    /// (`2026-11-21T09:00:00Z`).
    #[arg(long, value_parser = parse_time)]
    since: Option<u64>,
    /// Only calls before this time (same forms as --since).
    #[arg(long, value_parser = parse_time)]
    until: Option<u64>,
    /// The most recent this many.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Print the records as JSON lines.
    #[arg(long)]
    json: bool,
}

/// A time as ms since the epoch: `1h` means an hour ago.
fn parse_time(text: &str) -> Result<u64, String> {
    let at = match humantime::parse_duration(text) {
        Ok(ago) => SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("`{text}` ago is before the epoch"))?,
        Err(_) => humantime::parse_rfc3339_weak(text).map_err(|err| {
            format!("`{text}` is neither a duration (`1h`) nor a timestamp (`2026-11-21T09:00:00Z`): {err}")
        })?,
    };
    let ms = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    Ok(u64::try_from(ms).unwrap_or(u64::MAX))
}

pub(crate) async fn run(args: AuditArgs, data_dir: &Path) -> CliResult {
    let query = AuditQuery {
        agent: args.agent,
        tool: args.tool,
        outcome: args.outcome,
        since_ms: args.since,
        until_ms: args.until,
        limit: Some(args.limit),
    };
    let records: Vec<AuditRecord> = match local::connect(
        data_dir,
        &Hello::Audit {
            query: query.clone(),
        },
    )
    .await
    {
        Ok(connected) => serde_json::from_value(connected.value)?,
        Err(LocalError::NotRunning { .. }) => {
            let store = super::offline::offline_store(data_dir)?;
            let records = audit::query(&*store, &query)?;
            store.close();
            records
        }
        Err(err) => return Err(err.into()),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        for record in &records {
            // JSON says times in RFC 3339 (UTC) everywhere; `at_ms` stays for programs.
            let mut line = serde_json::to_value(record)?;
            line["at"] = guildhall::time::rfc3339(record.at_ms).into();
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    if records.is_empty() {
        writeln!(out, "no calls match")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<26} {:<14} {:<18} {:<17} {:>10}  rule",
        "time", "agent", "tool", "outcome", "duration"
    )?;
    for r in &records {
        writeln!(
            out,
            "{:<26} {:<14} {:<18} {:<17} {:>10}  {}",
            super::clock::local_time(r.at_ms),
            r.agent.as_deref().unwrap_or("-"),
            r.tool,
            r.outcome.as_str(),
            format!("{:.1} ms", r.duration_us as f64 / 1000.0),
            r.rule
        )?;
    }
    Ok(())
}
