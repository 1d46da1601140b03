//! What servers sharing a store tell each other (see `cluster`), as plain data: a batch
//! carries the notices it sends, committed with it.

use std::sync::Arc;

/// A notice sent to one server, or to all, committed with a batch (see
/// [`Batch::notify`](super::Batch::notify)): delivered only if the batch commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The server to tell; `None` tells every server but the sender.
    pub to: Option<Arc<str>>,
    /// What to tell it.
    pub notice: Notice,
}

/// What servers tell each other.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// Hand the subject over: stop its actor, so that its lease is released.
    Release(Arc<str>),
    /// A message was stored into an agent's inbox by another server.
    Mail {
        /// The recipient.
        agent: Arc<str>,
        /// The message's id.
        id: uuid::Uuid,
    },
    /// Something every server keeps in memory changed (`agents`, `sessions`): read it again.
    Changed(Arc<str>),
    /// Notices may have been missed (the listening connection broke, or a subscriber fell
    /// behind): whatever a notice would have said, look again.
    Resync,
}

impl Notice {
    /// The notice as sent through the database.
    pub fn encode(&self) -> String {
        match self {
            Notice::Release(subject) => format!("release\n{subject}"),
            Notice::Mail { agent, id } => format!("mail\n{agent}\n{id}"),
            Notice::Changed(what) => format!("changed\n{what}"),
            Notice::Resync => "resync".into(),
        }
    }

    /// A notice as received; `None` for one this build does not know.
    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '\n');
        match (parts.next()?, parts.next(), parts.next()) {
            ("release", Some(subject), None) => Some(Notice::Release(subject.into())),
            ("mail", Some(agent), Some(id)) => Some(Notice::Mail {
                agent: agent.into(),
                id: id.parse().ok()?,
            }),
            ("changed", Some(what), None) => Some(Notice::Changed(what.into())),
            ("resync", None, None) => Some(Notice::Resync),
            _ => None,
        }
    }
}
