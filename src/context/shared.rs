//! What every context actor of a runtime shares: the store, the limits, and its family (the
//! supervisors they run under and the clock of idleness).

use std::sync::Arc;

use super::ContextConfig;
use crate::changes::Changes;
use crate::durable::Family;
use crate::store::Store;

/// What context actors share.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: ContextConfig,
    pub(crate) family: Family,
    /// Told of committed changes, for whoever listens.
    pub(crate) changes: Arc<Changes>,
}
