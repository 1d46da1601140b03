//! Output truncation: a result too long for a model's context is cut, and the whole of it
//! is written to a spill file under the data directory that the model is pointed at.
//!
//! Limits are in lines and bytes (defaults 2,000 lines, 50 KiB; per tool in config). The
//! text measured is the result as a model sees it: a string result as is, anything else as
//! JSON. A spilled result is written pretty-printed, one value per line, so line ranges of
//! it make sense. Spill files older than the retention (7 days by default) are deleted by
//! governance's hourly housekeeping.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::Value;

/// Truncation limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Lines a model sees at most.
    pub max_lines: usize,
    /// Bytes a model sees at most.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_lines: 2000,
            max_bytes: 50 * 1024,
        }
    }
}

/// A result that was cut.
#[derive(Debug, Clone, PartialEq)]
pub struct Truncated {
    /// What the model sees: the first part and a note saying where the rest is.
    pub text: String,
    /// For an object result, the same object shortened to the limit in bytes with its shape
    /// kept (long strings and lists cut), so that it still matches the
    /// tool's output schema; `text` is then its JSON. `None` for other results, and for an
    /// object that could not be shortened that far.
    pub structured: Option<Value>,
    /// The file holding the whole result.
    pub path: PathBuf,
}

/// Bytes of the limit left for the note that follows a shortened object.
const NOTE_ROOM: usize = 512;

/// Where spill files go.
#[derive(Debug, Clone)]
pub struct Spill {
    dir: PathBuf,
    retention: Duration,
}

impl Spill {
    /// Spills into `dir` (created on first use), keeping files for `retention`.
    pub fn new(dir: PathBuf, retention: Duration) -> Self {
        Self { dir, retention }
    }

    /// The spill directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Cuts `value`'s text to `limits` if it is over them, writing the whole to a file
    /// named after the call. `text` is the value's compact text, already made.
    ///
    /// # Errors
    /// The file could not be written; the caller then returns the whole result.
    ///
    /// # Cancel safety
    /// Dropping the future may leave a partly written spill file; the directory's clean-up
    /// removes it with the others.
    pub async fn apply(
        &self,
        limits: Limits,
        tool: &str,
        call_id: uuid::Uuid,
        value: &Value,
        text: &str,
    ) -> std::io::Result<Option<Truncated>> {
        let full = match value {
            Value::String(s) if fits(s, limits) => return Ok(None),
            Value::String(s) => s.clone(),
            _ if fits(text, limits) => return Ok(None),
            _ => serde_json::to_string_pretty(value).unwrap_or_else(|_| text.to_owned()),
        };
        let path = self.dir.join(format!("{tool}-{call_id}.txt"));
        let (dir, file, body) = (self.dir.clone(), path.clone(), full.clone());
        tokio::task::spawn_blocking(move || {
            crate::private_fs::create_dir_all(&dir)?;
            crate::private_fs::write(&file, body.as_bytes())
        })
        .await
        .map_err(std::io::Error::other)??;
        let structured = value
            .is_object()
            .then(|| super::shorten::shorten(value, limits.max_bytes.saturating_sub(NOTE_ROOM)))
            .flatten();
        let text = match &structured {
            Some(short) => {
                let short = short.to_string();
                format!(
                    "{short}\n\n[output shortened: long strings (ending in …) and long lists are cut, \
                     showing {} of {} bytes. The full output is in {}. Read it with a \
                     file-reading tool at an offset, or e.g. `grep -n PATTERN {}`.]",
                    short.len(),
                    full.len(),
                    path.display(),
                    path.display(),
                )
            }
            None => {
                let (head, shown_lines) = cut(&full, limits);
                let total_lines = full.lines().count();
                format!(
                    "{head}\n\n[output truncated: showing lines 1-{shown_lines} of {total_lines} ({} of {} bytes). \
                     The full output is in {}. Read more of it with a file-reading tool at an offset, \
                     or e.g. `sed -n '{}, {}p' {}` or `grep -n PATTERN {}`.]",
                    head.len(),
                    full.len(),
                    path.display(),
                    shown_lines + 1,
                    shown_lines + limits.max_lines.max(1),
                    path.display(),
                    path.display(),
                )
            }
        };
        Ok(Some(Truncated {
            text,
            structured,
            path,
        }))
    }

    /// Deletes spill files older than the retention (blocking file I/O).
    pub(crate) fn sweep(&self) -> usize {
        sweep(&self.dir, self.retention)
    }
}

/// Whether a result (its `value`, and `text`, its compact text) is over `limits`: what
/// [`Spill::apply`] would cut.
pub(crate) fn exceeds(limits: Limits, value: &Value, text: &str) -> bool {
    match value {
        Value::String(s) => !fits(s, limits),
        _ => !fits(text, limits),
    }
}

fn fits(text: &str, limits: Limits) -> bool {
    text.len() <= limits.max_bytes && text.lines().count() <= limits.max_lines
}

/// The longest prefix of whole lines within both limits (at least part of the first line,
/// cut at a character boundary), and how many lines it holds.
fn cut(text: &str, limits: Limits) -> (&str, usize) {
    let mut end = 0;
    let mut lines = 0;
    for line in text.split_inclusive('\n') {
        if lines == limits.max_lines || end + line.len() > limits.max_bytes {
            break;
        }
        end += line.len();
        lines += 1;
    }
    if lines == 0 {
        let mut end = limits.max_bytes.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        return (&text[..end], 1);
    }
    (text[..end].trim_end_matches('\n'), lines)
}

/// Deletes the files in `dir` last modified more than `retention` ago; returns how many.
pub fn sweep(dir: &Path, retention: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age >= retention);
        if old && entry.path().is_file() && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn long_output_is_cut_and_kept_whole_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spill = Spill::new(dir.path().join("spill"), Duration::from_secs(60));
        let limits = Limits {
            max_lines: 10,
            max_bytes: 1000,
        };
        let id = uuid::Uuid::now_v7();
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        let value = Value::String(text.clone());
        let cut = spill
            .apply(limits, "shell", id, &value, "")
            .await
            .expect("written")
            .expect("cut");
        assert!(cut.text.starts_with("line 1\n"), "{}", cut.text);
        assert!(
            cut.text
                .contains("line 10\n\n[output truncated: showing lines 1-10 of 100")
        );
        assert!(!cut.text.contains("line 11"));
        assert!(cut.text.contains(&cut.path.display().to_string()));
        assert!(cut.text.contains("sed -n '11, 20p'"), "{}", cut.text);
        assert_eq!(std::fs::read_to_string(&cut.path).expect("spill"), text);

        // Bytes: one long line is cut at a character boundary.
        let long = Value::String("é".repeat(1000));
        let cut = spill
            .apply(limits, "t", id, &long, "")
            .await
            .expect("ok")
            .expect("cut");
        assert!(cut.text.starts_with(&"é".repeat(500)));

        // JSON over the limit is spilled pretty-printed.
        let big = json!({"items": (0..400).collect::<Vec<_>>()});
        let compact = big.to_string();
        let cut = spill
            .apply(limits, "t", uuid::Uuid::now_v7(), &big, &compact)
            .await
            .expect("ok")
            .expect("cut");
        let on_disk = std::fs::read_to_string(&cut.path).expect("spill");
        assert_eq!(serde_json::from_str::<Value>(&on_disk).expect("json"), big);
        assert!(on_disk.lines().count() > 400);

        let small = json!({"ok": true});
        assert!(
            spill
                .apply(limits, "t", id, &small, &small.to_string())
                .await
                .expect("ok")
                .is_none()
        );

        // The sweep keeps recent files.
        assert_eq!(sweep(spill.dir(), Duration::from_secs(60)), 0);
        assert_eq!(sweep(spill.dir(), Duration::ZERO), 3);
    }
}
