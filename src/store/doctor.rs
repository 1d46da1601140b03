//! Checking a store file, and copying what is intact into a new one.
//!
//! [`inspect`] asks redb to verify every page's checksum, then reads every table and tries
//! every value's encoding. [`repair`] copies every entry that reads and decodes into a new
//! store, puts it in the original's place and keeps the original beside it, renamed. What
//! the domains can cross-check on top (an agent's inbox, a session's replayed log) is
//! `guildhall doctor`'s business: this module knows only tables of bytes.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase};
use serde::Serialize;

use super::redb_store::{FILE_NAME, definition, io_error, is_rollback};
use super::{Batch, Store, StoreError, Table, codec};

/// What [`inspect`] found.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// The store file.
    pub path: PathBuf,
    /// redb's verdict on the file's pages.
    pub integrity: Integrity,
    /// Each table's entries.
    pub tables: Vec<TableReport>,
}

impl Inspection {
    /// Whether nothing is wrong.
    pub fn is_healthy(&self) -> bool {
        self.integrity == Integrity::Intact && self.tables.iter().all(TableReport::is_healthy)
    }
}

/// redb's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum Integrity {
    /// Every page's checksum matches.
    Intact,
    /// Damage was found and redb's repair let it open (what the damaged pages held may be
    /// gone: the tables say what is left).
    Repaired,
    /// The check failed; the tables say what could still be read.
    Unreadable(String),
}

/// One table's entries.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableReport {
    /// The table.
    pub table: &'static str,
    /// Entries read whole.
    pub entries: u64,
    /// Entries whose value does not decode.
    pub undecodable: u64,
    /// Why reading the table stopped early, if it did.
    pub unreadable: Option<String>,
}

impl TableReport {
    fn is_healthy(&self) -> bool {
        self.undecodable == 0 && self.unreadable.is_none()
    }
}

/// What [`repair`] did.
#[derive(Debug, Clone, Serialize)]
pub struct Repair {
    /// The store as it was before the copy.
    pub inspection: Inspection,
    /// Entries copied into the new store.
    pub copied: u64,
    /// Entries left behind (unreadable or undecodable).
    pub dropped: u64,
    /// Where the original file now is.
    pub original: PathBuf,
}

/// Checks the store in `dir`, changing nothing but what redb's check repairs in place.
///
/// # Errors
/// [`StoreError::Locked`] when another process has it open; [`StoreError::Io`] when there is
/// no store file.
pub fn inspect(dir: &Path) -> Result<Inspection, StoreError> {
    inspect_with(dir, false)
}

/// [`inspect`]; with `roll_back`, a damaged newest commit is given up for the one before it
/// (redb's repair), which changes the file.
fn inspect_with(dir: &Path, roll_back: bool) -> Result<Inspection, StoreError> {
    let path = dir.join(FILE_NAME);
    if !path.try_exists().map_err(|e| io_error(&path, e))? {
        return Err(io_error(
            &path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no store file here"),
        ));
    }
    let (db, integrity) = open(&path, roll_back)?;
    let Some(db) = db else {
        return Ok(Inspection {
            path,
            integrity,
            tables: Vec::new(),
        });
    };
    let tables = Table::ALL
        .iter()
        .map(|&table| scan(&db, table, |_, _| {}))
        .collect();
    Ok(Inspection {
        path,
        integrity,
        tables,
    })
}

/// Copies every intact entry of the store in `dir` into a new store, which takes the
/// original's name; the original is kept as `guildhall.redb.damaged-<unix seconds>`.
///
/// # Errors
/// As [`inspect`]; also when the file cannot be opened at all (nothing can be copied) or
/// the new store cannot be written.
pub fn repair(dir: &Path) -> Result<Repair, StoreError> {
    let path = dir.join(FILE_NAME);
    let inspection = inspect_with(dir, true)?;
    let (Some(db), _) = open(&path, true)? else {
        return Err(StoreError::Corrupt {
            path,
            reason: "redb cannot open it at all, so nothing can be copied out of it: restore \
                     a backup"
                .into(),
        });
    };
    let fresh_dir = dir.join(format!("{FILE_NAME}.repairing"));
    let _ = std::fs::remove_dir_all(&fresh_dir);
    let fresh = super::RedbStore::open(&fresh_dir)?;
    let (mut copied, mut dropped) = (0, 0);
    for &table in &Table::ALL {
        let mut batch = Batch::new();
        let report = scan(&db, table, |key, value| {
            batch.put(table, key.to_vec(), value.to_vec());
        });
        copied += report.entries;
        dropped += report.undecodable + u64::from(report.unreadable.is_some());
        if table == Table::Meta {
            // The new store stamped its own format already; the rest of Meta is copied.
            continue;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        fresh.submit(
            batch,
            Box::new(move |result| {
                let _ = tx.send(result);
            }),
        );
        rx.recv().unwrap_or(Err(StoreError::Closed))?;
    }
    fresh.close();
    drop(fresh);
    drop(db);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let original = dir.join(format!("{FILE_NAME}.damaged-{stamp}"));
    std::fs::rename(&path, &original).map_err(|e| io_error(&path, e))?;
    std::fs::rename(fresh_dir.join(FILE_NAME), &path).map_err(|e| io_error(&path, e))?;
    let _ = std::fs::remove_dir_all(&fresh_dir);
    Ok(Repair {
        inspection,
        copied,
        dropped,
        original,
    })
}

/// Opens `path` and runs redb's integrity check. When the check fails, the file is opened
/// again without it, so that what is still readable can be reported and copied (each
/// table's reads guarded against panics); `None`: not even that. Without `roll_back`, a
/// damaged newest commit is reported rather than given up.
fn open(path: &Path, roll_back: bool) -> Result<(Option<Database>, Integrity), StoreError> {
    let builder = || {
        let mut builder = Database::builder();
        builder.set_repair_callback(move |session| {
            if is_rollback(session) && !roll_back {
                session.abort();
            }
        });
        builder
    };
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut db = builder().open(path)?;
        let intact = db.check_integrity()?;
        Ok::<_, redb::DatabaseError>((db, intact))
    }));
    let reason = match checked {
        Ok(Ok((db, true))) => return Ok((Some(db), Integrity::Intact)),
        Ok(Ok((db, false))) => return Ok((Some(db), Integrity::Repaired)),
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
            return Err(StoreError::Locked {
                path: path.to_owned(),
            });
        }
        Ok(Err(redb::DatabaseError::RepairAborted)) => {
            "its newest commit is damaged; `--repair` gives it up for the commit before it"
                .to_owned()
        }
        Ok(Err(err)) => err.to_string(),
        Err(panic) => format!(
            "redb failed reading it: {}",
            guildhall_actors::panic_message(panic.as_ref())
        ),
    };
    let salvage = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder().open(path)));
    Ok((
        salvage.ok().and_then(Result::ok),
        Integrity::Unreadable(reason),
    ))
}

/// Reads every entry of `table`, handing each that decodes to `keep`.
fn scan(db: &Database, table: Table, mut keep: impl FnMut(&[u8], &[u8])) -> TableReport {
    let mut report = TableReport {
        table: table.name(),
        ..TableReport::default()
    };
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let txn = db.begin_read().map_err(|e| e.to_string())?;
        let t = match txn.open_table(definition(table)) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        for entry in t.range::<&[u8]>(..).map_err(|e| e.to_string())? {
            let (k, v) = entry.map_err(|e| e.to_string())?;
            if codec::check(table, v.value()).is_ok() {
                report.entries += 1;
                keep(k.value(), v.value());
            } else {
                report.undecodable += 1;
            }
        }
        Ok(())
    }));
    report.unreadable = match read {
        Ok(Ok(())) => None,
        Ok(Err(reason)) => Some(reason),
        Err(panic) => Some(format!(
            "redb failed reading it: {}",
            guildhall_actors::panic_message(panic.as_ref())
        )),
    };
    report
}
