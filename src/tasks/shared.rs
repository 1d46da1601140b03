//! What the board actor and its hub share: the store, the settings, where the actor runs,
//! and the post office its notices go through.

use std::sync::Arc;

use super::TaskConfig;
use super::protocol::BoardMsg;
use crate::agents::PostOffice;
use crate::durable::Family;
use crate::store::Store;
use guildhall_supervision::lazy::Slot;

/// The child id of the board actor (and the key of its partition).
pub(crate) const BOARD: &str = "board";

pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: TaskConfig,
    /// The supervisors the board actor runs under and the clock of its idleness.
    pub(crate) family: Family,
    pub(crate) slot: Slot<BoardMsg>,
    pub(crate) office: Arc<PostOffice>,
}
