//! Which agent an MCP client is, recorded in the data directory for the client's other
//! commands: `guildhall mcp`, bound to its agent, writes `clients/<pid>.<start>` (the
//! client's process id and its start time, so a reused pid never matches) holding the
//! agent's id; `guildhall hook`, started by the same client without `GUILDHALL_AGENT` (a
//! person's Claude Code whose `.mcp.json` names the agent), finds it by walking up its own
//! ancestors. Linux's `/proc` tells parents and start times; elsewhere nothing is recorded
//! or found.

use std::path::{Path, PathBuf};

/// The directory of the records, in the data directory.
const CLIENTS: &str = "clients";
/// Ancestors a hook looks through (a shell or two between the client and the hook).
const ANCESTORS: usize = 16;
/// Records looked at for pruning when one is written.
const PRUNED: usize = 1_000;

/// The record of the client that started this process, while it lives: removed when
/// dropped.
pub(crate) struct Record(PathBuf);

impl Drop for Record {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Records that this process's parent (the MCP client) is `agent`, pruning the records of
/// clients that ended. `None` when it cannot (no `/proc`, a data directory not writable):
/// the record is a convenience for hooks, never a reason to fail.
pub(crate) fn record(data_dir: &Path, agent: &str) -> Option<Record> {
    let client = process(std::os::unix::process::parent_id())?;
    let dir = data_dir.join(CLIENTS);
    guildhall::private_fs::create_dir_all(&dir).ok()?;
    prune(&dir);
    let path = dir.join(client.name());
    guildhall::private_fs::write(&path, agent.as_bytes()).ok()?;
    Some(Record(path))
}

/// The agent recorded for the nearest of this process's ancestors that is an MCP client.
pub(crate) fn find(data_dir: &Path) -> Option<String> {
    let dir = data_dir.join(CLIENTS);
    let mut pid = std::os::unix::process::parent_id();
    for _ in 0..ANCESTORS {
        let ancestor = process(pid)?;
        if let Ok(agent) = std::fs::read_to_string(dir.join(ancestor.name()))
            && guildhall::agents::AgentId::parse(agent.trim()).is_ok()
        {
            return Some(agent.trim().to_owned());
        }
        if ancestor.parent <= 1 {
            return None;
        }
        pid = ancestor.parent;
    }
    None
}

/// A process as `/proc/<pid>/stat` says.
struct Process {
    pid: u32,
    parent: u32,
    /// Clock ticks after boot.
    start: u64,
}

impl Process {
    fn name(&self) -> String {
        format!("{}.{}", self.pid, self.start)
    }
}

fn process(pid: u32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold anything: the fields are after its end.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    Some(Process {
        pid,
        parent: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// Removes the records of clients no longer running (at most [`PRUNED`] looked at).
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten().take(PRUNED) {
        let name = entry.file_name();
        let Some((pid, start)) = name.to_str().and_then(|n| n.split_once('.')) else {
            continue;
        };
        let alive = pid
            .parse()
            .ok()
            .and_then(process)
            .is_some_and(|p| p.start.to_string() == start);
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
