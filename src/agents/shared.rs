//! What every mailbox actor of a runtime shares: the store, the limits, the supervisors they
//! run under, the clock of idleness and the gate that orders large fan-outs with loads.

use std::sync::Arc;

use super::MailboxConfig;
use crate::changes::Changes;
use crate::durable::Family;
use crate::store::Store;

/// What mailbox actors share.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: MailboxConfig,
    /// The dynamic supervisors mailboxes live under (keyed by agent id) and the clock of
    /// their idleness.
    pub(crate) family: Family,
    /// Held (shared) by every mailbox while it loads, from its barrier to its publishing;
    /// held alone by a large fan-out while it sorts recipients into active and inactive and
    /// submits the inactive ones' writes. So a mailbox either was active then (and is sent
    /// the message) or loads after those writes (and finds it).
    pub(crate) fan_out_gate: tokio::sync::RwLock<()>,
    /// Told of new mail and of directory changes, for whoever listens.
    pub(crate) changes: Arc<Changes>,
}
