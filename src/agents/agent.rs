use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use uuid::Uuid;

use super::MailError;
use super::directory::{AgentEntry, AgentRecord};
use super::ids::AgentId;
use super::message::{
    DeliveryState, Inbox, InboxQuery, Message, Outgoing, Receipt, RecipientView, StatusView,
};
use super::office::{PostOffice, unexpected};
#[cfg(feature = "test-util")]
use super::protocol::MailboxOwn;
use super::protocol::{Op, Reply};
#[cfg(feature = "test-util")]
use crate::durable::Msg;
use crate::time::rfc3339;

/// A process-wide id for a waiting `check_inbox`.
fn next_waiter() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A registered agent, as seen by itself: it sends as this agent and reads this agent's
/// mailbox. Cheap to clone. Get one from [`Runtime::register_agent`](crate::Runtime::register_agent)
/// or [`Runtime::agent`](crate::Runtime::agent).
#[derive(Clone)]
pub struct Agent {
    office: Arc<PostOffice>,
    entry: Arc<AgentEntry>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("id", &self.entry.id).finish()
    }
}

impl Agent {
    pub(crate) fn new(office: Arc<PostOffice>, entry: Arc<AgentEntry>) -> Self {
        Self { office, entry }
    }

    pub(crate) fn entry(&self) -> &Arc<AgentEntry> {
        &self.entry
    }

    /// The agent's id.
    pub fn id(&self) -> &AgentId {
        &self.entry.id
    }

    /// The agent's current record.
    pub fn record(&self) -> Arc<AgentRecord> {
        self.entry.record()
    }

    /// Sends a message. Returns once every recipient's mailbox has it committed.
    ///
    /// # Errors
    /// [`MailError`] for a bad address, no recipients, an oversized message, an unknown
    /// `reply_to`, a full mailbox (single recipient) or a store failure. A fan-out that
    /// reaches some recipients succeeds and lists the others in [`Receipt::rejected`].
    ///
    /// # Cancel safety
    /// Dropping the future may leave the message delivered to some recipients.
    pub async fn send(&self, message: Outgoing) -> Result<Receipt, MailError> {
        self.office.send(&self.entry, message).await
    }

    /// Replies to `original`, a message this agent received: the reply joins its thread and,
    /// unless `reply` names another address, goes to its sender. Unlike
    /// [`Outgoing::reply`] by id, the original need not be looked up in the mailbox.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    ///
    /// # Cancel safety
    /// As [`send`](Self::send): dropping the future may leave the reply delivered.
    pub async fn reply(
        &self,
        original: &Arc<Message>,
        reply: Outgoing,
    ) -> Result<Receipt, MailError> {
        self.office
            .reply(&self.entry, reply, Arc::clone(original))
            .await
    }

    /// Lists the inbox. With [`InboxQuery::wait`], an empty answer waits until a matching
    /// message arrives or the time is up (then it is empty).
    ///
    /// # Errors
    /// [`MailError::Store`] when listing read messages fails.
    ///
    /// # Cancel safety
    /// Cancel safe: messages taken with `mark_read` are marked only once handed over.
    pub async fn check_inbox(&self, query: InboxQuery) -> Result<Inbox, MailError> {
        let wait = query
            .wait
            .filter(|w| !w.is_zero())
            .map(|w| (w, next_waiter()));
        let op = Op::Check(query, wait.map_or(0, |(_, id)| id));
        match self.office.request_waiting(&self.entry, op, wait).await? {
            Reply::Inbox(inbox) => Ok(inbox),
            other => Err(self.failure(other)),
        }
    }

    /// How many unread messages wait in this agent's inbox. An active mailbox is asked; a
    /// passive one is counted in the store without starting it, so a directory listing
    /// never wakes every inbox. A passive count includes messages whose time to live ran
    /// out since the mailbox last ran (they are dropped when it next starts).
    ///
    /// # Errors
    /// [`MailError::Store`] when the store cannot be read.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn unread(&self) -> Result<usize, MailError> {
        if self.entry.mailbox().is_none() {
            return self.office.stored_unread(&self.entry);
        }
        let query = InboxQuery {
            limit: 1,
            ..InboxQuery::default()
        };
        Ok(self.check_inbox(query).await?.unread)
    }

    /// Reads a message and marks it read.
    ///
    /// # Errors
    /// [`MailError::UnknownMessage`] when it is not in this agent's mailbox.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the message marked read without returning it;
    /// [`check_inbox`](Self::check_inbox) with read messages included finds it again.
    pub async fn read(&self, id: Uuid) -> Result<Arc<Message>, MailError> {
        match self.request(Op::Read(id)).await? {
            Reply::Message(message) => Ok(message),
            other => Err(self.failure(other)),
        }
    }

    /// Marks messages read, or acknowledged with `ack`, and waits for that to be stored.
    /// Returns how many changed.
    ///
    /// # Errors
    /// [`MailError::UnknownMessage`] for the first unknown id (nothing changes).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the messages marked.
    pub async fn mark_read(&self, ids: &[Uuid], ack: bool) -> Result<usize, MailError> {
        let op = Op::Mark {
            ids: ids.to_vec(),
            ack,
        };
        match self.request(op).await? {
            Reply::Marked(n) => Ok(n),
            other => Err(self.failure(other)),
        }
    }

    /// Moves this agent's `since: "last"` reading past `ids`, what a listing made with
    /// [`InboxQuery::since_last`] showed (the next such listing gives what came after them,
    /// and what arrived late).
    ///
    /// # Errors
    /// The store failed, or the mailbox is unavailable.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the reading moved.
    pub async fn shown(&self, ids: &[Uuid]) -> Result<(), MailError> {
        match self.request(Op::Shown(ids.to_vec())).await? {
            Reply::Marked(_) => Ok(()),
            other => Err(self.failure(other)),
        }
    }

    /// What became of message `id` this agent sent: each recipient's copy, delivered
    /// (unread), read or acknowledged, and when.
    ///
    /// # Errors
    /// [`MailError::UnknownSent`] when this agent sent no message `id` that a recipient
    /// still has.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn message_status(&self, id: Uuid) -> Result<StatusView, MailError> {
        // Two point reads per registered agent: off the async workers.
        let (office, sender) = (Arc::clone(&self.office), self.entry.id.clone());
        let copies = tokio::task::spawn_blocking(move || office.copies(&sender, id))
            .await
            .map_err(|err| MailError::Unavailable {
                agent: self.entry.id.to_string(),
                reason: err.to_string(),
            })??;
        let count = |state| copies.iter().filter(|(_, m)| m.state == state).count();
        let (delivered, acknowledged) = (
            count(DeliveryState::Delivered),
            count(DeliveryState::Acknowledged),
        );
        let first = &copies[0].1;
        Ok(StatusView {
            id: id.to_string(),
            to: first.to.to_string(),
            subject: first.subject.to_string(),
            sent: rfc3339(first.created_ms),
            delivered,
            read: copies.len() - delivered,
            acknowledged,
            recipients: copies
                .iter()
                .map(|(agent, m)| RecipientView {
                    agent: agent.to_string(),
                    state: m.state,
                    read_at: m.read_ms.map(rfc3339),
                    acknowledged_at: m.acked_ms.map(rfc3339),
                })
                .collect(),
        })
    }

    /// Makes the mailbox actor panic (fault injection for tests).
    #[cfg(feature = "test-util")]
    pub fn crash_mailbox(&self) -> bool {
        self.entry.mailbox().is_some_and(|m| {
            m.get_status() == ractor::ActorStatus::Running
                && m.cast(Msg::Own(MailboxOwn::Crash)).is_ok()
        })
    }

    /// Whether the mailbox actor is running now.
    pub fn is_active(&self) -> bool {
        self.entry.mailbox().is_some()
    }

    async fn request(&self, op: Op) -> Result<Reply, MailError> {
        self.office.request(&self.entry, op).await
    }

    fn failure(&self, reply: Reply) -> MailError {
        match reply {
            Reply::Failed(err) => err,
            other => unexpected(&self.entry.id, &other),
        }
    }
}
