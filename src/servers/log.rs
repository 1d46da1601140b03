//! A server's stderr: appended to a log file that is rotated at a size (one older file
//! kept), with its last lines kept in memory for error messages and `status`.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// Lines kept in memory.
const TAIL: usize = 20;
/// A line longer than this is cut: a server writing one endless line must not grow memory.
const MAX_LINE: usize = 4096;

/// Where one server's stderr goes.
pub(crate) struct StderrLog {
    /// The log file; `None` keeps only the tail (a runtime without a data directory).
    path: Option<PathBuf>,
    /// Rotated when it would grow past this.
    max_bytes: u64,
    tail: Mutex<VecDeque<String>>,
}

impl StderrLog {
    pub(crate) fn new(path: Option<PathBuf>, max_bytes: u64) -> Self {
        Self {
            path,
            max_bytes,
            tail: Mutex::new(VecDeque::with_capacity(TAIL)),
        }
    }

    pub(crate) fn path(&self) -> Option<&PathBuf> {
        self.path.as_ref()
    }

    /// Forgets the lines kept in memory: a new process of the server starts, and what its
    /// last one wrote no longer explains anything (the file keeps it).
    pub(crate) fn clear_tail(&self) {
        self.tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Reads `stderr` line by line until it closes, in a task of its own, which ends then.
    pub(crate) fn follow(
        self: &std::sync::Arc<Self>,
        stderr: tokio::process::ChildStderr,
    ) -> tokio::task::JoinHandle<()> {
        let log = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut lines)
                    .take(MAX_LINE as u64)
                    .read_until(b'\n', &mut line)
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => log.write(&String::from_utf8_lossy(&line)),
                }
            }
        })
    }

    fn write(&self, line: &str) {
        let line = line.trim_end_matches(['\n', '\r']);
        {
            let mut tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
            if tail.len() == TAIL {
                tail.pop_front();
            }
            tail.push_back(line.to_owned());
        }
        if let Some(path) = &self.path
            && let Err(err) = self.append(path, line)
        {
            tracing::debug!(%err, path = %path.display(), "could not write a server's stderr log");
        }
    }

    fn append(&self, path: &PathBuf, line: &str) -> std::io::Result<()> {
        if std::fs::metadata(path).is_ok_and(|m| m.len() + line.len() as u64 > self.max_bytes) {
            std::fs::rename(path, path.with_extension("log.1"))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(file, "{line}")
    }

    /// The last `n` lines (at most the 20 kept), oldest first.
    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        let tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
        tail.iter()
            .skip(tail.len().saturating_sub(n))
            .cloned()
            .collect()
    }
}
