//! Agents and their durable mailboxes.
//!
//! Agents register in a [`directory`](AgentRecord) with an id, a role and an optional
//! parent (subagent → PM → TL). Each has a mailbox: a supervised actor started on first use
//! and passivated when idle, whose unread messages are in memory and whose every change is
//! committed to the [`Store`](crate::store::Store) first. Agents talk through an [`Agent`]
//! handle, or through the mailbox tools (`send_message`, `check_inbox`, `read_message`,
//! `mark_read`) and the directory tools (`whoami`, `list_agents`) that every runtime
//! registers.
//!
//! Addresses: an agent id, `role:<name>` (every agent in the role but the sender),
//! `parent`, `children` and `*` (everyone else). Inbox listings order by priority, then age;
//! ids are UUID v7 made in order, so one sender's messages to one receiver list in the order
//! they were sent. Messages carry information only; they never grant permissions.

mod agent;
mod credentials;
pub mod cursors;
mod directory;
mod error;
mod held;
mod history;
mod ids;
mod mailbox;
mod message;
mod office;
pub mod once;
mod protocol;
pub mod roster;
mod shared;
pub mod tools;

use std::time::Duration;

pub use agent::Agent;
pub use credentials::{
    Credentials, IdentityError, SOCKET_ENV, TOKEN_ENV, TOKEN_HEADER, checked_role, constant_time_eq,
};
pub(crate) use directory::Connection;
pub use directory::{AgentRecord, AgentSpec, ProcessReport, ProcessView};
pub use error::MailError;
pub(crate) use history::Visible;
pub use history::{MailFound, MailIndexSize, MailSearch};
pub use ids::{AgentId, MAX_NAME_LEN, parse_message_id};
pub(crate) use ids::{check_name, first_id_at, now_ms};
pub use message::{
    Address, DeliveryState, Inbox, InboxQuery, Message, Outgoing, Priority, Receipt, RecipientView,
    Rejected, StatusView,
};
pub use office::AgentDirectory;
pub(crate) use office::PostOffice;

/// Limits and timings of mailboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailboxConfig {
    /// Unread messages a mailbox holds before senders get [`MailError::MailboxFull`].
    pub capacity: usize,
    /// Largest body (and largest JSON payload), in bytes.
    pub max_body_bytes: usize,
    /// Largest subject, in bytes.
    pub max_subject_bytes: usize,
    /// A mailbox idle this long is stopped; its state stays in the store.
    pub idle: Duration,
    /// The longest `check_inbox` wait a tool call may ask for.
    pub max_wait: Duration,
    /// Waiting inbox checks one mailbox admits at once; one more is refused
    /// ([`MailError::TooManyWaits`]). Waits take no slot of the tool, so this is what bounds
    /// them.
    pub max_waiters: usize,
    /// Recipients one message may reach through a fan-out address (`*`, `role:…`,
    /// `children`); more is refused ([`MailError::FanOutTooLarge`]).
    pub max_fan_out: usize,
    /// Read messages older than this are deleted when their mailbox next starts.
    pub retention: Duration,
    /// Agents expected to register (guildhall.toml's `[agents.X]`): mail to one that has not
    /// registered yet is held for it instead of refused.
    pub expected: std::collections::BTreeSet<String>,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        Self {
            capacity: 1_000,
            max_body_bytes: 64 * 1024,
            max_subject_bytes: 1024,
            idle: Duration::from_secs(60),
            max_wait: Duration::from_secs(120),
            max_waiters: 64,
            max_fan_out: 1_000,
            retention: Duration::from_secs(30 * 24 * 3600),
            expected: std::collections::BTreeSet::new(),
        }
    }
}
