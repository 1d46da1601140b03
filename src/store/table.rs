//! The tables a store holds.

/// The tables a store holds. Fixed at compile time so a backend can lay them out up front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Table {
    /// Store-wide facts, such as the format version.
    Meta,
    /// The agent directory: agent id → record.
    Agents,
    /// Unread messages: recipient id, 0, message id → message.
    Inbox,
    /// Read and acknowledged messages, same keys as `Inbox`.
    Archive,
    /// Sessions: session id → record.
    Sessions,
    /// Each session's op log: session id, 0, version → the batch that made it.
    ContextLog,
    /// Each session's snapshots, same keys as `ContextLog`.
    ContextSnapshots,
    /// The audit log: the newest call id of a block of records (UUID v7, so in time
    /// order), then `b` → the block, sorted by call id.
    Audit,
    /// Lasting approvals: agent id, 0, rule → the rule.
    Approvals,
    /// The task board: task id (big-endian) → the task.
    Tasks,
    /// Each task's history: task id, version (both big-endian) → the change that made it.
    TaskHistory,
    /// Where an agent's reading has got to: agent id, 0, cursor name → a message id (the
    /// newest its client was told of, for `announced`).
    Cursors,
    /// Sends made with a request id: sender id, 0, request id → the message id and receipt.
    Sends,
    /// Held messages that expire: expiry (ms, big-endian), recipient id, 0, message id →
    /// nothing. The message itself is in `Inbox`; the sweep that tells its sender when it
    /// expires undelivered reads these in expiry order.
    Held,
    /// The mail log: every message once, as sent: the second it was made in (ten hex
    /// digits), 0, its id (UUID v7), so in time order → the message. The history and its
    /// search read it; a recipient's copy lives in `Inbox` or `Archive`.
    Mail,
}

impl Table {
    /// Every table, in a fixed order.
    pub const ALL: [Table; 15] = [
        Table::Meta,
        Table::Agents,
        Table::Inbox,
        Table::Archive,
        Table::Sessions,
        Table::ContextLog,
        Table::ContextSnapshots,
        Table::Audit,
        Table::Approvals,
        Table::Tasks,
        Table::TaskHistory,
        Table::Cursors,
        Table::Sends,
        Table::Held,
        Table::Mail,
    ];

    /// The table's name in the backend.
    pub const fn name(self) -> &'static str {
        match self {
            Table::Meta => "meta",
            Table::Agents => "agents",
            Table::Inbox => "inbox",
            Table::Archive => "archive",
            Table::Sessions => "sessions",
            Table::ContextLog => "context_log",
            Table::ContextSnapshots => "context_snapshots",
            Table::Audit => "audit",
            Table::Approvals => "approvals",
            Table::Tasks => "tasks",
            Table::TaskHistory => "task_history",
            Table::Cursors => "cursors",
            Table::Sends => "sends",
            Table::Held => "held",
            Table::Mail => "mail",
        }
    }

    pub(super) const fn index(self) -> usize {
        self as usize
    }
}
