//! What a child process writes (a proxied server's stderr, a launched agent's stdout and
//! stderr): appended to a log file that is rotated at a size (one older file kept), with
//! its last lines kept in memory for error messages and `status`.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// Lines kept in memory.
const TAIL: usize = 20;
/// A line longer than this is cut: a process writing one endless line must not grow memory.
const MAX_LINE: usize = 4096;

/// Where one process's output goes.
pub(crate) struct OutputLog {
    /// The log file; `None` keeps only the tail (a runtime without a data directory).
    path: Option<PathBuf>,
    /// Rotated when it would grow past this.
    max_bytes: u64,
    tail: Mutex<VecDeque<String>>,
}

impl OutputLog {
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

    /// Forgets the lines kept in memory: a new process starts, and what the last one wrote
    /// no longer explains anything (the file keeps it).
    pub(crate) fn clear_tail(&self) {
        self.tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Reads `output` line by line until it closes, in a task of its own, which ends then.
    /// The file is opened once per stream and reopened only when rotated.
    pub(crate) fn follow(
        self: &std::sync::Arc<Self>,
        output: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let log = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            let mut lines = BufReader::new(output);
            let mut line = Vec::new();
            let mut file = None;
            loop {
                line.clear();
                match (&mut lines)
                    .take(MAX_LINE as u64)
                    .read_until(b'\n', &mut line)
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => log.write(&String::from_utf8_lossy(&line), &mut file),
                }
            }
        })
    }

    fn write(&self, line: &str, file: &mut Option<(std::fs::File, u64)>) {
        let line = line.trim_end_matches(['\n', '\r']);
        {
            let mut tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
            if tail.len() == TAIL {
                tail.pop_front();
            }
            tail.push_back(line.to_owned());
        }
        if let Some(path) = &self.path
            && let Err(err) = self.append(path, line, file)
        {
            *file = None;
            tracing::debug!(error = %guildhall_actors::ErrorChain(&err), path = %path.display(), "could not write a process's output log");
        }
    }

    /// Appends `line` to the open log file (opening it first), rotating it when it would
    /// grow past the limit.
    fn append(
        &self,
        path: &PathBuf,
        line: &str,
        file: &mut Option<(std::fs::File, u64)>,
    ) -> std::io::Result<()> {
        let grows = line.len() as u64 + 1;
        if file
            .as_ref()
            .is_some_and(|(_, size)| size + grows > self.max_bytes)
        {
            *file = None;
            std::fs::rename(path, path.with_extension("log.1"))?;
        }
        let (out, size) = match file {
            Some(open) => open,
            None => {
                let out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                let size = out.metadata()?.len();
                file.insert((out, size))
            }
        };
        writeln!(out, "{line}")?;
        *size += grows;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_rotates_at_its_size_and_the_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        let log = OutputLog::new(Some(path.clone()), 100);
        let mut file = None;
        for i in 0..30 {
            log.write(&format!("line {i:02}\n"), &mut file);
        }
        let current = std::fs::read_to_string(&path).unwrap();
        let older = std::fs::read_to_string(path.with_extension("log.1")).unwrap();
        assert!(
            current.len() <= 100 && older.len() <= 100,
            "{current:?} {older:?}"
        );
        assert!(current.ends_with("line 29\n"), "{current:?}");
        assert_eq!(log.tail(2), ["line 28", "line 29"]);
        assert_eq!(log.tail(100).len(), TAIL);
    }
}
