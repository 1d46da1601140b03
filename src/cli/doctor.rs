//! `guildhall doctor`: checks a store and reports every damaged part by name; `--repair`
//! copies what is intact into a new store, keeping the original.

use std::io::Write;
use std::path::Path;

use clap::Args;
use guildhall::context::Select;
use guildhall::mcp::local::{self, Hello, LocalError};
use guildhall::store::doctor::{self, Inspection, Integrity};
use guildhall::{ErrorChain, InboxQuery, Runtime};
use serde::Serialize;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Copy every intact entry into a new store that takes the original's place; the
    /// original is kept as `guildhall.redb.damaged-<time>`.
    #[arg(long)]
    repair: bool,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    json: bool,
}

/// Everything the doctor found.
#[derive(Debug, Serialize)]
struct Findings {
    inspection: Inspection,
    /// Parts the runtime could not serve: `inbox of tl: …`, `session s1: …`.
    damaged: Vec<String>,
    /// What `--repair` did, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    repair: Option<doctor::Repair>,
    healthy: bool,
    /// What this machine's kernel lets the sandbox apply.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    sandbox: guildhall::sandbox::Level,
}

pub(crate) async fn run(args: DoctorArgs, data_dir: &Path) -> CliResult {
    match local::connect(data_dir, &Hello::Status).await {
        Err(LocalError::NotRunning { .. }) => {}
        _ => {
            return Err(format!(
                "a server is running for {}: stop it first (`kill` its pid, shown by \
                 `guildhall status`), since the doctor needs the store to itself",
                data_dir.display()
            )
            .into());
        }
    }
    if super::offline::store_section(data_dir).is_ok_and(|store| store.url.is_some()) {
        return Err(format!(
            "the store of {} is a PostgreSQL database (`[store] url` in its config): the \
             doctor checks and repairs a redb file; check the database with PostgreSQL's own \
             tools (`pg_amcheck`, its backups)",
            data_dir.display()
        )
        .into());
    }
    let mut findings = examine(data_dir).await?;
    if args.repair && !findings.healthy {
        let repair = doctor::repair(data_dir)?;
        let mut after = examine(data_dir).await?;
        after.repair = Some(repair);
        findings = after;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&findings)?)?;
    } else {
        print(&mut out, &findings)?;
    }
    if findings.healthy {
        Ok(())
    } else {
        Err("the store is damaged (see above); `guildhall doctor --repair` copies what is intact into a new store".into())
    }
}

/// The file's check, then every agent's inbox and every session through the runtime.
async fn examine(data_dir: &Path) -> Result<Findings, Box<dyn std::error::Error>> {
    let inspection = doctor::inspect(data_dir)?;
    let mut damaged = Vec::new();
    if !matches!(inspection.integrity, Integrity::Unreadable(_)) {
        match Runtime::builder().data_dir(data_dir).build().await {
            Err(err) => damaged.push(format!("the store does not open: {}", ErrorChain(&err))),
            Ok(rt) => {
                for record in rt.agents() {
                    let id = record.id.as_str();
                    let listed = match rt.agent(id) {
                        Ok(agent) => agent
                            .check_inbox(InboxQuery {
                                unread_only: false,
                                limit: usize::MAX,
                                ..InboxQuery::default()
                            })
                            .await
                            .map(drop)
                            .map_err(|e| ErrorChain(&e).to_string()),
                        Err(err) => Err(ErrorChain(&err).to_string()),
                    };
                    if let Err(err) = listed {
                        damaged.push(format!("inbox of `{id}`: {err}"));
                    }
                }
                let sessions = rt.sessions();
                for record in sessions.list() {
                    let id = record.id.as_str();
                    let read = match sessions.open(id, None).await {
                        Ok(ctx) => ctx.read(Select::All, usize::MAX).await.map(drop),
                        Err(err) => Err(err),
                    };
                    if let Err(err) = read {
                        damaged.push(format!("session `{id}`: {}", ErrorChain(&err)));
                    }
                }
                rt.shutdown().await;
            }
        }
    }
    let healthy = inspection.is_healthy() && damaged.is_empty();
    Ok(Findings {
        inspection,
        damaged,
        repair: None,
        healthy,
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        sandbox: guildhall::sandbox::Level::probe(),
    })
}

fn print(out: &mut impl Write, findings: &Findings) -> std::io::Result<()> {
    let inspection = &findings.inspection;
    writeln!(out, "store: {}", inspection.path.display())?;
    if let Some(repair) = &findings.repair {
        writeln!(
            out,
            "repaired: {} entries copied, {} left behind; the original is kept as {}",
            repair.copied,
            repair.dropped,
            repair.original.display()
        )?;
    }
    match &inspection.integrity {
        Integrity::Intact => writeln!(out, "pages: every checksum matches")?,
        Integrity::Repaired => writeln!(
            out,
            "pages: damage found and repaired by redb; what the damaged pages held may be gone"
        )?,
        Integrity::Unreadable(reason) => writeln!(out, "pages: unreadable: {reason}")?,
    }
    for table in &inspection.tables {
        write!(out, "  {:<18} {:>9} entries", table.table, table.entries)?;
        if table.undecodable > 0 {
            write!(out, ", {} undecodable", table.undecodable)?;
        }
        if let Some(reason) = &table.unreadable {
            write!(out, ", reading stopped: {reason}")?;
        }
        writeln!(out)?;
    }
    for part in &findings.damaged {
        writeln!(out, "damaged: {part}")?;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    writeln!(out, "sandbox: {}", findings.sandbox)?;
    writeln!(
        out,
        "{}",
        if findings.healthy {
            "healthy"
        } else {
            "DAMAGED"
        }
    )
}
