//! The task board's hub: its actor, started on demand and passivated when idle, and the
//! requests sent to it.

use std::sync::Arc;

use guildhall_supervision::ChildSpec;
use guildhall_supervision::lazy::{self, Lazy, RequestError, Slot, SlotVisitor};

use super::actor::BoardActor;
use super::protocol::{BoardMsg, Op, Reply};
use super::shared::{ARCHIVE_READS, BOARD, Shared};
use super::{TaskConfig, TaskError};
use crate::agents::PostOffice;
use crate::durable::{self, Family, Owner};
use crate::store::Store;

/// The id of the supervisor of the board actor, under root.
pub(crate) const TASKS: &str = "tasks";

pub(crate) struct TaskBoard {
    pub(crate) shared: Arc<Shared>,
}

impl TaskBoard {
    pub(crate) fn open(
        store: Arc<dyn Store>,
        config: TaskConfig,
        office: Arc<PostOffice>,
    ) -> Arc<Self> {
        Arc::new(Self {
            shared: Arc::new(Shared {
                family: Family::new(config.idle),
                store,
                config,
                slot: Slot::default(),
                office,
                archive_reads: Arc::new(tokio::sync::Semaphore::new(ARCHIVE_READS)),
            }),
        })
    }

    /// The child spec of the `tasks` supervisor.
    pub(crate) fn supervisor_spec(&self) -> ChildSpec {
        self.shared.family.supervisor_spec(TASKS)
    }

    pub(crate) fn stop_sweep(&self) {
        self.shared.family.stop_sweep();
    }

    /// What another server sharing the store says: hand the board over.
    pub(crate) async fn on_notice(&self, notice: &crate::store::Notice) {
        if let crate::store::Notice::Release(subject) = notice
            && &**subject == super::actor::BOARD_SUBJECT
        {
            // Its state goes with it, and its hold is released after its changes.
            lazy::stop(&self.shared.family.partitions, BOARD).await;
        }
    }

    /// Whether the board's actor runs now.
    pub(crate) fn is_active(&self) -> bool {
        self.shared.slot.actor().is_some()
    }

    /// Runs `op` in the board actor, starting or waiting for it as needed, and re-sending
    /// the request if the actor died before answering.
    pub(crate) async fn request(&self, op: Op) -> Result<Reply, TaskError> {
        let lazy = Lazy {
            slot: &self.shared.slot,
            partitions: &self.shared.family.partitions,
            key: BOARD,
            spec: || self.child_spec(),
        };
        let reply = lazy
            .request(op, BoardMsg::Request, |rx, _| rx, |_| {})
            .await
            .map_err(|err| TaskError::Unavailable {
                reason: match err {
                    RequestError::Unavailable(reason) => reason,
                    other => format!("{other:?}"),
                },
            })?;
        match reply {
            Reply::Failed(err) => Err(err),
            other => Ok(other),
        }
    }

    fn child_spec(&self) -> ChildSpec {
        let shared = Arc::clone(&self.shared);
        durable::child_spec(Arc::from(BOARD), move || BoardActor {
            shared: Arc::clone(&shared),
        })
    }
}

impl Owner for TaskBoard {
    type Behaviour = BoardActor;

    fn family(&self) -> &Family {
        &self.shared.family
    }

    fn each_slot(&self, visit: &mut SlotVisitor<'_, BoardMsg>) {
        visit(&self.shared.slot);
    }
}

pub(crate) fn failed(reply: Reply) -> TaskError {
    match reply {
        Reply::Failed(err) => err,
        other => TaskError::Unavailable {
            reason: format!("unexpected answer from the board: {other:?}"),
        },
    }
}
