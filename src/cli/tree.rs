//! Printing a supervision tree for people (`--json` prints the snapshot itself).

use std::io::Write;

use guildhall::supervision::ChildKind;
use guildhall::{BreakerStatus, ChildSnapshot, ChildStatus};

/// One line per node, indented by depth: id, then only what is worth a look (a supervisor's
/// child count, a status other than running, restarts, a breaker that is not closed or has
/// failures). Supervisors of idle shards (no children) are left out, with their number said.
pub(crate) fn print_tree(
    out: &mut impl Write,
    node: &ChildSnapshot,
    depth: usize,
) -> std::io::Result<()> {
    let mut notes = Vec::new();
    if node.kind == ChildKind::Supervisor {
        notes.push(match node.children.len() {
            1 => "1 child".to_owned(),
            n => format!("{n} children"),
        });
    }
    match node.status {
        ChildStatus::Running => {}
        ChildStatus::Restarting => notes.push("RESTARTING".into()),
        ChildStatus::Stopped => notes.push("STOPPED".into()),
    }
    if node.restarts > 0 {
        notes.push(format!("restarts {}", node.restarts));
    }
    match node.breaker {
        None | Some(BreakerStatus::Closed { failures: 0 }) => {}
        Some(BreakerStatus::Closed { failures }) => {
            notes.push(format!("breaker closed, {failures} recent failures"));
        }
        Some(BreakerStatus::Open { retry_after, .. }) => notes.push(format!(
            "breaker OPEN, next probe in {}",
            humantime::format_duration(std::time::Duration::from_millis(
                u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX)
            ))
        )),
        Some(BreakerStatus::HalfOpen) => notes.push("breaker half-open (probing)".into()),
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!("  ({})", notes.join(", "))
    };
    writeln!(out, "{:indent$}{}{notes}", "", node.id, indent = depth * 2)?;
    let idle = |c: &ChildSnapshot| c.kind == ChildKind::Supervisor && c.children.is_empty();
    for child in node.children.iter().filter(|c| !idle(c) || depth == 0) {
        print_tree(out, child, depth + 1)?;
    }
    let hidden = node.children.iter().filter(|c| idle(c)).count();
    if hidden > 0 && depth > 0 {
        writeln!(
            out,
            "{:indent$}({hidden} idle shard supervisor{} not shown)",
            "",
            if hidden == 1 { "" } else { "s" },
            indent = (depth + 1) * 2
        )?;
    }
    Ok(())
}
