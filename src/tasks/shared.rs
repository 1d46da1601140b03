//! What the board actor and its hub share: the store, the settings, where the actor runs,
//! and the post office its notices go through.

use std::sync::Arc;

use super::TaskConfig;
use super::protocol::BoardMsg;
use crate::agents::PostOffice;
use crate::store::Store;
use guildhall_supervision::lazy::{CoarseClock, Partitions, Slot};

/// The child id of the board actor (and the key of its partition).
pub(crate) const BOARD: &str = "board";

pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: TaskConfig,
    pub(crate) partitions: Arc<Partitions>,
    pub(crate) slot: Slot<BoardMsg>,
    pub(crate) clock: CoarseClock,
    pub(crate) office: Arc<PostOffice>,
}
