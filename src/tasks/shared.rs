//! What the board actor and its hub share: the store (and the ended tasks in it), the
//! settings, where the actor runs, and the post office its notices go through.

use std::sync::Arc;

use super::TaskConfig;
use super::model::{Archive, Task};
use super::protocol::BoardMsg;
use super::status::TaskId;
use crate::agents::PostOffice;
use crate::durable::Family;
use crate::store::{self, Store, StoreError, Table, codec};
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
    /// Listings reading the stored board ([`StoredTasks`]) at once: each reads every task,
    /// on a blocking thread, so their CPU and threads are bounded here, not by how many
    /// callers list at once.
    pub(crate) archive_reads: Arc<tokio::sync::Semaphore>,
}

/// Listings that may read the stored board at once.
pub(crate) const ARCHIVE_READS: usize = 2;

/// The board's archive: the tasks as the store holds them.
pub(crate) struct StoredTasks(pub(crate) Arc<dyn Store>);

impl Archive for StoredTasks {
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        match self.0.get(Table::Tasks, &super::keys::task(id))? {
            Some(bytes) => Ok(Some(codec::decode(Table::Tasks, &bytes)?)),
            None => Ok(None),
        }
    }

    fn each(&self, visit: &mut dyn FnMut(Task)) -> Result<(), StoreError> {
        store::scan_values(&*self.0, Table::Tasks, &[], |_, task: Task| visit(task))
    }
}
