//! Messages, addresses and the shapes of mailbox requests and answers.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::MailError;
use super::ids::{AgentId, check_name};

/// How urgent a message is. Inbox listings put higher priorities first.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Whenever convenient.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Before normal work.
    High,
    /// Drop everything.
    Urgent,
}

impl Priority {
    /// How a listing for a model marks a message this urgent: `[urgent] `, `[high] `, or
    /// nothing.
    pub fn tag(self) -> &'static str {
        match self {
            Self::Urgent => "[urgent] ",
            Self::High => "[high] ",
            Self::Normal | Self::Low => "",
        }
    }
}

/// Where a message is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// In the recipient's inbox, not yet read.
    Delivered,
    /// Read by the recipient.
    Read,
    /// Read and acknowledged: done with.
    Acknowledged,
}

/// One message as delivered to one recipient (every recipient of a fan-out shares one
/// `Arc<Message>`). The text is owned (`Box<str>`): a send moves it from the [`Outgoing`]
/// without copying or allocating.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// UUID v7: ids sort by creation time.
    pub id: Uuid,
    /// The sender.
    pub from: AgentId,
    /// The address as the sender wrote it (`pm-1`, `role:dev`, `parent`, `*`, ...). Every
    /// recipient of a fan-out shares the message, its id included.
    pub to: Arc<str>,
    /// A one-line summary.
    pub subject: Box<str>,
    /// The text.
    pub body: Box<str>,
    /// Optional structured data.
    #[serde(default)]
    pub payload: Option<Arc<Value>>,
    /// The thread: the id of the message that started it.
    pub thread: Uuid,
    /// The message this one answers.
    #[serde(default)]
    pub reply_to: Option<Uuid>,
    /// How urgent it is.
    pub priority: Priority,
    /// When it was sent, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When it stops being delivered, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub expires_ms: Option<u64>,
    /// Delivered, read or acknowledged.
    pub state: DeliveryState,
    /// When the recipient read it (or took it), in milliseconds since the Unix epoch.
    #[serde(default)]
    pub read_ms: Option<u64>,
    /// When the recipient acknowledged it: said it is done with it, which is more than
    /// having read it.
    #[serde(default)]
    pub acked_ms: Option<u64>,
    /// The sender's span when it sent this (W3C trace context): what the recipient does
    /// about it can join the sender's trace. Last, so records written before it read
    /// without it.
    #[serde(default)]
    pub trace: Option<guildhall_actors::TraceParent>,
}

impl Message {
    /// Whether the message has expired at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_ms.is_some_and(|at| now_ms >= at)
    }

    /// `message` in another delivery state: changed in place when nothing else holds it,
    /// as a copy when something does (the recipients of a fan-out share one message).
    /// Reading and acknowledging note when (the first time); back to delivered (a taker
    /// that gave up) forgets it.
    pub(crate) fn in_state(mut message: Arc<Message>, state: DeliveryState) -> Arc<Message> {
        let now = super::ids::now_ms();
        let m = Arc::make_mut(&mut message);
        m.state = state;
        match state {
            DeliveryState::Delivered => (m.read_ms, m.acked_ms) = (None, None),
            DeliveryState::Read => {
                m.read_ms.get_or_insert(now);
            }
            DeliveryState::Acknowledged => {
                m.read_ms.get_or_insert(now);
                m.acked_ms.get_or_insert(now);
            }
        }
        message
    }
}

/// Who a message goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// One agent.
    Agent(AgentId),
    /// Every agent in a role (`role:<name>`), except the sender.
    Role(String),
    /// The sender's parent (`parent`).
    Parent,
    /// The sender's children (`children`).
    Children,
    /// Every other agent (`*`).
    Everyone,
}

impl Address {
    /// Parses `id`, `role:<name>`, `parent`, `children` or `*`.
    ///
    /// # Errors
    /// [`MailError::InvalidAddress`] naming the problem.
    pub fn parse(address: &str) -> Result<Self, MailError> {
        let invalid = |reason: String| MailError::InvalidAddress {
            address: address.to_owned(),
            reason,
        };
        match address.trim() {
            "parent" => Ok(Self::Parent),
            "children" => Ok(Self::Children),
            "*" => Ok(Self::Everyone),
            a => match a.split_once(':') {
                Some(("role", role)) => check_name(role)
                    .map(|()| Self::Role(role.to_owned()))
                    .map_err(|r| invalid(format!("the role {r}"))),
                Some((scheme, _)) => Err(invalid(format!("unknown prefix `{scheme}:`"))),
                None => AgentId::parse(a)
                    .map(Self::Agent)
                    .map_err(|e| invalid(e.to_string())),
            },
        }
    }

    /// Whether the address can name more than one agent.
    pub fn is_fan_out(&self) -> bool {
        matches!(self, Self::Role(_) | Self::Children | Self::Everyone)
    }
}

/// A message to send; build it with [`Outgoing::to`] or [`Outgoing::reply`].
#[derive(Debug, Clone, Default)]
pub struct Outgoing {
    /// The address; may be empty for a reply (then it goes to the original's sender).
    pub to: String,
    /// A one-line summary. A reply without one gets `Re: <original subject>`.
    pub subject: String,
    /// The text.
    pub body: String,
    /// Optional structured data.
    pub payload: Option<Value>,
    /// How urgent it is.
    pub priority: Priority,
    /// The message this answers; the reply joins its thread.
    pub reply_to: Option<Uuid>,
    /// How long it stays deliverable.
    pub expires_in: Option<Duration>,
    /// A client-chosen id that makes the send idempotent: a send again with the same id
    /// within a day answers the first one's receipt and delivers nothing twice.
    pub request_id: Option<String>,
    /// The sender's trace context, handed on with the message (`send_message` sets its
    /// call's span).
    pub trace: Option<guildhall_actors::TraceParent>,
}

impl Outgoing {
    /// A message to `address`.
    pub fn to(address: impl Into<String>) -> Self {
        Self {
            to: address.into(),
            ..Self::default()
        }
    }

    /// A reply to message `id`, addressed to its sender.
    pub fn reply(id: Uuid) -> Self {
        Self {
            reply_to: Some(id),
            ..Self::default()
        }
    }

    /// Sets the subject.
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = subject.into();
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<String>) -> Self {
        self.body = body.into();
        self
    }

    /// Attaches structured data.
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Lets the message expire.
    pub fn expires_in(mut self, ttl: Duration) -> Self {
        self.expires_in = Some(ttl);
        self
    }

    /// Makes the send idempotent under `id` (see [`Outgoing::request_id`]).
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }
}

/// What a send did.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Receipt {
    /// The message id (shared by every recipient's copy).
    pub id: Uuid,
    /// The thread it belongs to.
    pub thread: Uuid,
    /// Recipients whose mailbox accepted it (and, for a durable store, committed it).
    pub delivered_to: Vec<AgentId>,
    /// Recipients of a fan-out that refused it, and why. A single-recipient send that is
    /// refused is an error instead.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<Rejected>,
    /// Recipients expected but not registered yet (the sender's parent, an agent the config
    /// names): the message is held in the store and is theirs when they register.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<AgentId>,
}

/// A recipient that refused a fan-out message.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Rejected {
    /// The recipient.
    pub agent: AgentId,
    /// Why.
    pub reason: String,
}

/// Which messages [`check_inbox`](super::Agent::check_inbox) lists.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxQuery {
    /// Only messages not yet read (the default); otherwise read ones too.
    pub unread_only: bool,
    /// At most this many, highest priority first, then oldest first.
    pub limit: usize,
    /// Only messages newer than this message id.
    pub since: Option<Uuid>,
    /// Only messages in this thread.
    pub thread: Option<Uuid>,
    /// Only messages at least this urgent.
    pub min_priority: Priority,
    /// If nothing matches, wait up to this long for something that does.
    pub wait: Option<Duration>,
    /// Mark the listed messages read (take them).
    pub mark_read: bool,
    /// List in arrival order (oldest first) instead of most urgent first, so that `limit`
    /// cuts off only the newest: what a cursor moved to the newest listed needs.
    pub arrival_order: bool,
    /// List what the agent's `since: "last"` reading has not given yet (`since` and
    /// `arrival_order` are then not used), oldest first: messages newer than the last it gave, and those that
    /// arrived after it had gone past their id. The reading moves only when the caller says
    /// what it showed ([`Agent::shown`](super::Agent::shown)).
    pub since_last: bool,
}

impl Default for InboxQuery {
    fn default() -> Self {
        Self {
            unread_only: true,
            limit: 20,
            since: None,
            thread: None,
            min_priority: Priority::Low,
            wait: None,
            mark_read: false,
            arrival_order: false,
            since_last: false,
        }
    }
}

impl InboxQuery {
    /// Whether `message` passes the filters (not `limit`).
    pub(crate) fn matches(&self, message: &Message) -> bool {
        (!self.unread_only || message.state == DeliveryState::Delivered)
            && message.priority >= self.min_priority
            && self.since.is_none_or(|since| message.id > since)
            && self.thread.is_none_or(|thread| message.thread == thread)
    }
}

/// An inbox listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Inbox {
    /// The messages, highest priority first, then oldest first.
    pub messages: Vec<Arc<Message>>,
    /// Unread messages in the mailbox after this listing.
    pub unread: usize,
}

impl Inbox {
    /// The newest id listed: pass it as `since` to see only what arrives later.
    pub fn cursor(&self) -> Option<Uuid> {
        self.messages.iter().map(|m| m.id).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Table, codec};

    #[test]
    fn a_message_stored_before_read_times_were_kept_still_decodes() {
        // The fields a message had before `read_ms` and `acked_ms`, in their order.
        #[derive(Serialize)]
        struct Before {
            id: Uuid,
            from: AgentId,
            to: Arc<str>,
            subject: Box<str>,
            body: Box<str>,
            payload: Option<Arc<Value>>,
            thread: Uuid,
            reply_to: Option<Uuid>,
            priority: Priority,
            created_ms: u64,
            expires_ms: Option<u64>,
            state: DeliveryState,
        }
        let id = Uuid::now_v7();
        let before = Before {
            id,
            from: AgentId::parse("pm").unwrap(),
            to: "dev".into(),
            subject: "s".into(),
            body: "b".into(),
            payload: None,
            thread: id,
            reply_to: None,
            priority: Priority::High,
            created_ms: 7,
            expires_ms: None,
            state: DeliveryState::Read,
        };
        let message: Message = codec::decode(Table::Archive, &codec::encode(&before)).unwrap();
        assert_eq!(
            (message.id, message.state, message.read_ms, message.acked_ms),
            (id, DeliveryState::Read, None, None)
        );
    }
}

/// Output of `message_status`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StatusView {
    /// The message id.
    pub id: String,
    /// The address it was sent to.
    pub to: String,
    /// Its subject.
    pub subject: String,
    /// When it was sent (RFC 3339).
    pub sent: String,
    /// Recipients that have it, unread.
    pub delivered: usize,
    /// Recipients that read it (acknowledged or not).
    pub read: usize,
    /// Recipients that acknowledged it: said they are done with it.
    pub acknowledged: usize,
    /// Each recipient that still has it, by id.
    pub recipients: Vec<RecipientView>,
}

/// One recipient's copy.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RecipientView {
    /// The recipient.
    pub agent: String,
    /// `delivered` (unread), `read` or `acknowledged`.
    pub state: DeliveryState,
    /// When it read it (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_at: Option<String>,
    /// When it acknowledged it (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acknowledged_at: Option<String>,
}
