//! A session as JSON, for `guildhall context export` / `import` and embedders.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::log::LoggedBatch;
use super::model::Entry;
use super::session::SessionRecord;

/// The format tag of a [`SessionExport`].
pub const EXPORT_FORMAT: &str = "guildhall.session/1";

/// A session as JSON: its record and entries, and optionally its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionExport {
    /// [`EXPORT_FORMAT`].
    pub format: String,
    /// The session's record.
    pub session: SessionRecord,
    /// The session version exported.
    pub version: u64,
    /// Every entry at `version`.
    pub entries: Vec<Entry>,
    /// The version history starts at (`version` when exported without history).
    pub base: u64,
    /// Every entry at `base` (empty when `base` is 0 or without history).
    #[serde(default)]
    pub base_entries: Vec<Entry>,
    /// Every batch from `base` to `version` (empty without history).
    #[serde(default)]
    pub history: Vec<LoggedBatch>,
}
