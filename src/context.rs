//! Session context: entries that agents read and update together.
//!
//! This module holds the context model: entries, the three update strategies, atomic
//! batches with optimistic concurrency, and the record of each batch that makes a session
//! replayable. The context actor, its persistence and its tools build on it.

mod model;

pub use model::{
    Applied, Change, ContextError, ContextLimits, Entry, EntryChange, EntryKind, SessionContext,
    Strategy,
};
