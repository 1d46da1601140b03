//! What mailbox actors are sent and answer: the requests callers make, the commit outcomes
//! the store's writer hands back, and the actor's own timers. Kept apart from the actor so
//! the directory (which holds each mailbox's address) and the post office (which sends to
//! it) depend on the messages, not on the actor.

use std::sync::Arc;

use uuid::Uuid;

use super::MailError;
use super::message::{Inbox, InboxQuery, Message};
use crate::durable::Msg;
use crate::store::StoreError;
use guildhall_supervision::lazy;

/// What a mailbox does for a caller.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Deliver(Arc<Message>),
    /// Lists; with a wait, the caller names the waiter so it can end the wait itself.
    Check(InboxQuery, u64),
    /// Returns a message and marks it read.
    Read(Uuid),
    /// Returns a message, changing nothing.
    Get(Uuid),
    Mark {
        ids: Vec<Uuid>,
        ack: bool,
    },
    /// A `since: "last"` listing showed these: the reading moves past them.
    Shown(Vec<Uuid>),
}

/// A mailbox's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Delivered,
    Inbox(Inbox),
    Message(Arc<Message>),
    Marked(usize),
    Failed(MailError),
}

/// Where a mailbox answers a request.
pub(crate) type Responder = lazy::Responder<Reply, Op>;

/// A delivery's commit outcome, on its way back to the mailbox, which makes the message
/// visible and then answers the sender. Dropped on the way (the mailbox died), it answers
/// the sender itself: the commit happened, and the restarted mailbox loads the message.
pub(crate) struct Committed {
    pub(super) id: Uuid,
    pub(super) result: Result<(), StoreError>,
    pub(super) reply: Option<Responder>,
}

impl Committed {
    /// Answers the sender with the commit's outcome (once).
    pub(super) fn answer(&mut self) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(match &self.result {
                Ok(()) => Reply::Delivered,
                Err(err) => Reply::Failed(err.clone().into()),
            });
        }
    }
}

impl Drop for Committed {
    fn drop(&mut self) {
        self.answer();
    }
}

/// A mailbox actor's own messages.
pub(crate) enum MailboxOwn {
    /// A delivery's commit finished.
    Committed(Committed),
    /// A background write finished; the messages it moved to the archive.
    WriteDone(Vec<Arc<Message>>),
    /// The caller of a waiting `check_inbox` ran out of time: answer it now. (The caller
    /// keeps the timer, so a satisfied wait leaves nothing behind.)
    WaitExpired(u64),
    /// Messages another server stored into this inbox are waiting in the agent's
    /// [`Arrivals`]: load them.
    Arrived,
    /// Panic (fault injection for tests).
    #[cfg(feature = "test-util")]
    Crash,
}

/// Messages a mailbox actor handles: requests, passivation and its own.
pub(crate) type MailboxMsg = Msg<Op, Reply, MailboxOwn>;

/// Messages other servers stored into an agent's inbox while its mailbox runs (or loads)
/// on this server, as their notices named them: the mailbox loads them from the store.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    pub(crate) ids: Vec<Uuid>,
    /// Notices may have been missed: look through the whole inbox.
    pub(crate) rescan: bool,
}
