use uuid::Uuid;

use crate::store::StoreError;

/// Why an agent or mailbox operation was refused. Every variant names what to fix; nothing
/// was stored when one is returned (except where a variant says otherwise).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum MailError {
    /// Not a valid agent id.
    #[error("invalid agent id {id:?}: {reason}")]
    InvalidAgentId {
        /// The id given.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Not a valid role name.
    #[error("invalid role {role:?}: {reason}")]
    InvalidRole {
        /// The role given.
        role: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No agent with this id is registered.
    #[error("no agent `{id}` is registered{near}")]
    UnknownAgent {
        /// The id asked for.
        id: String,
        /// The registered ids it may be a slip for, as the message's end (`; did you mean
        /// `pm-api`?`), or empty.
        near: String,
    },
    /// The parent would make the hierarchy a cycle.
    #[error("agent `{agent}` cannot have `{parent}` as its parent: `{parent}` is below it")]
    ParentCycle {
        /// The agent being registered.
        agent: String,
        /// The parent asked for.
        parent: String,
    },
    /// Not a valid address.
    #[error(
        "invalid address {address:?}: {reason} (use an agent id, `role:<name>`, `parent`, \
         `children` or `*`)"
    )]
    InvalidAddress {
        /// The address given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The address names nobody (an empty role, no children, no other agents).
    #[error("no agent matches {address:?}: {reason}")]
    NoRecipients {
        /// The address given.
        address: String,
        /// Why it is empty.
        reason: String,
    },
    /// A fan-out address names more agents than one message may reach.
    #[error(
        "`{address}` names {recipients} agents; one message may reach at most {limit} \
         (`max_fan_out`): address a role or the children instead"
    )]
    FanOutTooLarge {
        /// The address given.
        address: String,
        /// How many agents it names.
        recipients: usize,
        /// The most one message may reach.
        limit: usize,
    },
    /// Message body, subject or payload over the configured limit.
    #[error("the message is too large: {what} is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The recipient's mailbox holds as many unread messages as it may.
    #[error(
        "the mailbox of `{agent}` is full ({capacity} unread messages); try again after it \
         has read some"
    )]
    MailboxFull {
        /// The recipient.
        agent: String,
        /// Its capacity.
        capacity: usize,
    },
    /// Not a valid message id.
    #[error(
        "invalid message id {id:?}: expected a UUID such as 019a4e0c-7f1e-7c3a-9d2b-5b8e2f6a1c44"
    )]
    InvalidMessageId {
        /// The id given.
        id: String,
    },
    /// No mailbox holds a message with this id sent by this agent (it never sent it, or
    /// every copy expired or went with its recipient).
    #[error("no message {id} sent by `{agent}` is in any mailbox")]
    UnknownSent {
        /// The sender who asked.
        agent: String,
        /// The id asked for.
        id: Uuid,
    },
    /// The message is not in this agent's mailbox.
    #[error("message {id} is not in the mailbox of `{agent}`")]
    UnknownMessage {
        /// The agent whose mailbox was searched.
        agent: String,
        /// The id asked for.
        id: Uuid,
    },
    /// A tool argument is out of range.
    #[error("invalid `{name}`: {reason}")]
    InvalidArgument {
        /// The argument.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The agent already has as many waiting `check_inbox` calls as a mailbox admits.
    #[error(
        "`{agent}` already has {limit} inbox checks waiting, the most a mailbox admits; \
         wait for one of them to answer instead of starting another"
    )]
    TooManyWaits {
        /// The agent.
        agent: String,
        /// The most waiting checks a mailbox admits.
        limit: usize,
    },
    /// A reply needs a recipient: `to`, or `reply_to` to answer the original's sender.
    #[error("the message has no recipient: give `to`, or `reply_to` to answer a message")]
    MissingRecipient,
    /// A tool was called without an agent identity.
    #[error(
        "this tool acts for an agent, and the call has none: bind the connection to an agent \
         (`guildhall mcp --agent ID`) or set the call's agent"
    )]
    NoIdentity,
    /// The mailbox could not be reached (it kept failing to start).
    #[error("the mailbox of `{agent}` is unavailable: {reason}")]
    Unavailable {
        /// The agent.
        agent: String,
        /// What went wrong.
        reason: String,
    },
    /// The mail search stopped before it answered (it failed, or the server is stopping).
    #[error("the mail search stopped before answering: {reason}")]
    SearchStopped {
        /// Why.
        reason: String,
    },
    /// The store failed; the operation did not take effect.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl MailError {
    /// Whether the same call may succeed later: the mailbox or the store unavailable for
    /// now (the database restarting, another server handing the mailbox over).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Store(err) => err.is_transient(),
            _ => false,
        }
    }
}
