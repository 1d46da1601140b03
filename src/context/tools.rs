//! The context tools: `context_get`, `context_update` and `context_history`.
//!
//! `context_update` records the calling agent ([`CallOptions::agent`](crate::CallOptions),
//! or the identity an MCP connection is bound to) as the author, and creates the session
//! if it does not exist. Calls are detached from the tool actor, so sessions are served in
//! parallel.

use std::sync::Arc;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::hub::ContextHub;
use super::model::{Applied, Change, Entry, EntryKind, Strategy};
use super::query::Select;
use super::{ContextError, HistoryQuery};
use crate::time::rfc3339;

/// Entries one `context_get` returns by default, and at most.
const DEFAULT_ENTRIES: u32 = 100;
const MAX_ENTRIES: u32 = 1_000;
/// Batches one `context_history` returns by default, and at most.
const DEFAULT_BATCHES: u32 = 20;
const MAX_BATCHES: u32 = 500;

fn limit(given: Option<u32>, default: u32, max: u32) -> Result<usize, ContextError> {
    match given.unwrap_or(default) {
        0 => Err(ContextError::InvalidArgument {
            name: "limit",
            reason: "it must be at least 1".into(),
        }),
        n if n > max => Err(ContextError::InvalidArgument {
            name: "limit",
            reason: format!("{n} is over the maximum of {max}"),
        }),
        n => Ok(n as usize),
    }
}

/// `context_get`.
pub struct ContextGet(pub(crate) Arc<ContextHub>);

/// Input of `context_get`. Give at most one of `keys`, `prefix` and `query`; with none, every
/// entry is read.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetInput {
    /// The session.
    pub session: String,
    /// Read these keys.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
    /// Read the keys that start with this.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Read the entries most relevant to this text, best first.
    #[serde(default)]
    pub query: Option<String>,
    /// At most this many entries (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Read the session as it was at this version.
    #[serde(default)]
    pub as_of_version: Option<u64>,
}

/// An entry as tools show it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EntryView {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: Value,
    /// What it holds.
    pub kind: EntryKind,
    /// 1 when created, one more at every change: pass it as `expected_version`.
    pub version: u64,
    /// The agent that last changed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// When it last changed (RFC 3339).
    pub updated: String,
    /// Relevance to the query, with `query`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

impl EntryView {
    fn of(entry: Entry, score: Option<f64>) -> Self {
        Self {
            key: entry.key,
            value: entry.value,
            kind: entry.kind,
            version: entry.version,
            author: entry.author.map(|a| a.to_string()),
            updated: rfc3339(entry.updated_ms),
            score,
        }
    }
}

/// Output of `context_get`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct GetOutput {
    /// The session.
    pub session: String,
    /// The session version read.
    pub version: u64,
    /// The entries.
    pub entries: Vec<EntryView>,
    /// How many matched, before the limit.
    pub total: usize,
    /// Keys asked for that have no entry.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

impl Tool for ContextGet {
    type Input = GetInput;
    type Output = GetOutput;
    type Error = ContextError;
    type State = ();

    fn is_transient(error: &ContextError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "context_get"
    }

    fn description(&self) -> &str {
        "Read a session's shared context: given `keys`, keys under a `prefix`, the entries \
         most relevant to a `query`, or everything. Each entry has a `version` to pass as \
         `expected_version` when updating it. `as_of_version` reads an earlier state."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Read session context")
    }

    fn detach(&self, _: &(), _: &GetInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: GetInput,
        _: CallContext,
    ) -> Result<GetOutput, ContextError> {
        let limit = limit(input.limit, DEFAULT_ENTRIES, MAX_ENTRIES)?;
        let select = match (input.keys, input.prefix, input.query) {
            (None, None, None) => Select::All,
            (Some(keys), None, None) => Select::Keys(keys),
            (None, Some(prefix), None) => Select::Prefix(prefix),
            (None, None, Some(query)) => Select::Relevant(query),
            _ => {
                return Err(ContextError::InvalidArgument {
                    name: "keys",
                    reason: "give at most one of `keys`, `prefix` and `query`".into(),
                });
            }
        };
        let entry = self.0.session(&input.session).await?;
        let view = match input.as_of_version {
            Some(version) => self.0.read_as_of(&entry, version, select, limit).await?,
            None => self.0.read(&entry, select, limit).await?,
        };
        let mut scores = view.scores.into_iter();
        Ok(GetOutput {
            session: input.session,
            version: view.version,
            entries: view
                .entries
                .into_iter()
                .map(|e| EntryView::of(e, scores.next()))
                .collect(),
            total: view.total,
            missing: view.missing,
        })
    }
}

/// `context_update`.
pub struct ContextUpdate(pub(crate) Arc<ContextHub>);

/// Input of `context_update`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateInput {
    /// The session; created if it does not exist.
    pub session: String,
    /// The changes, applied in order as one batch: all of them or none.
    pub changes: Vec<Change>,
}

/// Output of `context_update`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct UpdateOutput {
    /// The session.
    pub session: String,
    /// What the batch did.
    #[serde(flatten)]
    pub applied: Applied,
}

impl Tool for ContextUpdate {
    type Input = UpdateInput;
    type Output = UpdateOutput;
    type Error = ContextError;
    type State = ();

    fn is_transient(error: &ContextError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "context_update"
    }

    fn description(&self) -> &str {
        "Change a session's shared context in one atomic batch. Each change names a `key`, a \
         `strategy` (`replace`; `merge`: JSON merge patch, null deletes; `append`: text to \
         text, items to an array) and a `value`. Give `expected_version` (0: must not exist) \
         to apply only if nobody changed the entry since you read it; on a conflict nothing \
         is applied."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Update session context")
            .destructive(false)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &UpdateInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: UpdateInput,
        ctx: CallContext,
    ) -> Result<UpdateOutput, ContextError> {
        let author = ctx.agent().map(|a| self.0.author(a)).transpose()?;
        let entry = self.0.open_session(&input.session, author.as_ref()).await?;
        let applied = self
            .0
            .update(&entry, Arc::from(input.changes), author)
            .await?;
        Ok(UpdateOutput {
            session: input.session,
            applied,
        })
    }
}

/// `context_history`.
pub struct ContextHistory(pub(crate) Arc<ContextHub>);

/// Input of `context_history`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryInput {
    /// The session.
    pub session: String,
    /// Only batches that changed this key.
    #[serde(default)]
    pub key: Option<String>,
    /// Batches after this version, oldest first; without it, the latest ones.
    #[serde(default)]
    pub after_version: Option<u64>,
    /// At most this many batches (default 20, at most 500).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Include each change's value (default false).
    #[serde(default)]
    pub values: Option<bool>,
}

/// One change in a history listing.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ChangeView {
    /// The entry.
    pub key: String,
    /// How it was changed.
    pub strategy: Strategy,
    /// Its version before (0: absent).
    pub before: u64,
    /// Its version after (0: deleted).
    pub after: u64,
    /// The value, patch or items given (with `values`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// One batch in a history listing.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct BatchView {
    /// The session version it made.
    pub version: u64,
    /// Who made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// When (RFC 3339).
    pub at: String,
    /// Its changes.
    pub changes: Vec<ChangeView>,
}

/// Output of `context_history`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HistoryOutput {
    /// The session.
    pub session: String,
    /// The session's version.
    pub version: u64,
    /// The oldest version still kept.
    pub oldest_version: u64,
    /// The batches, oldest first.
    pub batches: Vec<BatchView>,
    /// Batches that matched but were left out to keep the answer under 40 KiB: the oldest
    /// of the latest ones, or the newest of those after `after_version` (read on from the
    /// last version shown).
    #[serde(skip_serializing_if = "crate::paged::none_left")]
    pub left_out: usize,
}

impl Tool for ContextHistory {
    type Input = HistoryInput;
    type Output = HistoryOutput;
    type Error = ContextError;
    type State = ();

    fn is_transient(error: &ContextError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "context_history"
    }

    fn description(&self) -> &str {
        "List who changed a session's context, when, and how: the latest batches, or those \
         after a version, optionally only those that touched one key. Read an earlier state \
         with `context_get` and `as_of_version`."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Session context history")
    }

    fn detach(&self, _: &(), _: &HistoryInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: HistoryInput,
        _: CallContext,
    ) -> Result<HistoryOutput, ContextError> {
        let query = HistoryQuery {
            after: input.after_version,
            key: input.key,
            limit: limit(input.limit, DEFAULT_BATCHES, MAX_BATCHES)?,
        };
        let values = input.values.unwrap_or(false);
        let entry = self.0.session(&input.session).await?;
        let history = self.0.history(&entry, &query).await?;
        let batches: Vec<BatchView> = history
            .batches
            .into_iter()
            .map(|batch| BatchView {
                version: batch.version,
                author: batch.author.map(|a| a.to_string()),
                at: rfc3339(batch.at_ms),
                changes: batch
                    .changes
                    .into_iter()
                    .zip(batch.versions)
                    .map(|(c, [before, after])| ChangeView {
                        key: c.key,
                        strategy: c.strategy,
                        before,
                        after,
                        value: values.then_some(c.value),
                    })
                    .collect(),
            })
            .collect();
        let keep = if query.after.is_some() {
            crate::paged::Keep::First
        } else {
            crate::paged::Keep::Last
        };
        let (batches, left_out) = crate::paged::within(batches, crate::paged::ANSWER_BYTES, keep);
        Ok(HistoryOutput {
            session: input.session,
            version: history.version,
            oldest_version: history.oldest,
            batches,
            left_out,
        })
    }
}
