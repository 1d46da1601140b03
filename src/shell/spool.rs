//! A background command's output: the first part in memory, the rest spilled to an unnamed
//! temporary file, all of it bounded. Read back from any offset, so a reader that comes
//! late still gets everything that was kept.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;

/// Output kept in memory before it spills to disk.
const IN_MEMORY: usize = 64 * 1024;

/// Output kept so far, and what was not.
pub(super) struct Spool {
    memory: Vec<u8>,
    disk: Option<File>,
    /// Bytes kept (in memory or on disk).
    kept: u64,
    /// Bytes past `limit`, counted, not kept.
    dropped: u64,
    limit: u64,
}

impl Spool {
    /// A spool keeping at most `limit` bytes.
    pub(super) fn new(limit: u64) -> Self {
        Self {
            memory: Vec::new(),
            disk: None,
            kept: 0,
            dropped: 0,
            limit,
        }
    }

    /// Appends `bytes`, as much as the limit allows. A failing disk drops the rest (counted)
    /// rather than failing the command.
    pub(super) fn push(&mut self, bytes: &[u8]) {
        let room = usize::try_from(self.limit.saturating_sub(self.kept)).unwrap_or(usize::MAX);
        let (keep, lose) = bytes.split_at(bytes.len().min(room));
        self.dropped += lose.len() as u64;
        if keep.is_empty() {
            return;
        }
        if self.disk.is_none() && self.memory.len() + keep.len() <= IN_MEMORY {
            self.memory.extend_from_slice(keep);
            self.kept += keep.len() as u64;
            return;
        }
        let disk = match &mut self.disk {
            Some(disk) => disk,
            None => match tempfile::tempfile() {
                Ok(mut file) => {
                    if file.write_all(&self.memory).is_err() {
                        self.fail(keep.len());
                        return;
                    }
                    self.memory = Vec::new();
                    self.disk.insert(file)
                }
                Err(err) => {
                    tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "background shell output could not spill to disk");
                    self.fail(keep.len());
                    return;
                }
            },
        };
        if disk.write_all(keep).is_ok() {
            self.kept += keep.len() as u64;
        } else {
            self.fail(keep.len());
        }
    }

    /// Stops keeping: what comes from now on is dropped.
    fn fail(&mut self, lost: usize) {
        self.dropped += lost as u64;
        self.limit = self.kept;
    }

    /// Bytes kept.
    pub(super) fn kept(&self) -> u64 {
        self.kept
    }

    /// Bytes not kept.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Up to `max` kept bytes from `offset`.
    pub(super) fn read(&self, offset: u64, max: usize) -> Vec<u8> {
        let end = self.kept.min(offset.saturating_add(max as u64));
        let Some(len) = end
            .checked_sub(offset)
            .and_then(|l| usize::try_from(l).ok())
        else {
            return Vec::new();
        };
        match &self.disk {
            None => {
                // Without a disk file everything kept is in memory, so both fit a usize.
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                self.memory
                    .get(start..start.saturating_add(len))
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
            }
            Some(disk) => {
                let mut out = vec![0; len];
                match disk.read_exact_at(&mut out, offset) {
                    Ok(()) => out,
                    Err(_) => Vec::new(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_across_the_spill_and_stops_at_the_limit() {
        let mut spool = Spool::new(IN_MEMORY as u64 + 10);
        let line: Vec<u8> = (0..=255).collect();
        let mut written = Vec::new();
        while written.len() < IN_MEMORY + 100 {
            spool.push(&line);
            written.extend_from_slice(&line);
        }
        assert_eq!(spool.kept(), IN_MEMORY as u64 + 10);
        assert_eq!(spool.dropped(), written.len() as u64 - spool.kept());
        let mut back = Vec::new();
        let mut at = 0;
        loop {
            let chunk = spool.read(at, 1000);
            if chunk.is_empty() {
                break;
            }
            at += chunk.len() as u64;
            back.extend(chunk);
        }
        assert_eq!(back, written[..IN_MEMORY + 10]);
        assert!(spool.read(u64::MAX, 10).is_empty(), "past the end");
    }
}
