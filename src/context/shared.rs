//! What every context actor of a runtime shares: the store, the limits, the supervisors they
//! run under and the clock of idleness.

use std::sync::Arc;

use super::ContextConfig;
use crate::changes::Changes;
use crate::store::Store;
use guildhall_supervision::lazy::{CoarseClock, Partitions};

/// What context actors share.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: ContextConfig,
    pub(crate) partitions: Arc<Partitions>,
    pub(crate) clock: CoarseClock,
    /// Told of committed changes, for whoever listens.
    pub(crate) changes: Arc<Changes>,
}
