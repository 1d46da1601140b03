//! Agent ids and message ids.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::MailError;

/// The longest agent id or role name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Names with a meaning of their own in addresses; no agent may take them.
const RESERVED: [&str; 3] = ["parent", "children", "*"];

/// A registered agent's id: 1 to 64 characters from `A-Z a-z 0-9 _ - . @`. Cheap to clone.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct AgentId(Arc<str>);

impl AgentId {
    /// Checks and wraps an id.
    ///
    /// # Errors
    /// [`MailError::InvalidAgentId`] naming what is wrong with it.
    pub fn parse(id: &str) -> Result<Self, MailError> {
        check_name(id).map_err(|reason| MailError::InvalidAgentId {
            id: id.to_owned(),
            reason,
        })?;
        if RESERVED.contains(&id) {
            return Err(MailError::InvalidAgentId {
                id: id.to_owned(),
                reason: "it is reserved for addressing (`parent`, `children`, `*`)".into(),
            });
        }
        Ok(Self(Arc::from(id)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn shared(&self) -> Arc<str> {
        Arc::clone(&self.0)
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl Borrow<str> for AgentId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Checks an agent id or role name; the reason names the first problem.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "it is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@')))
    {
        return Err(format!(
            "it contains {c:?}; use letters, digits, `_`, `-`, `.` and `@`"
        ));
    }
    Ok(())
}

/// Parses a message id (a UUID).
///
/// # Errors
/// [`MailError::InvalidMessageId`].
pub fn parse_message_id(id: &str) -> Result<Uuid, MailError> {
    Uuid::try_parse(id.trim()).map_err(|_| MailError::InvalidMessageId { id: id.to_owned() })
}

pub(crate) use crate::time::now_ms;

/// The last id handed out: milliseconds in the high 48 bits, a counter in the low 16.
static LAST_ID: AtomicU64 = AtomicU64::new(0);

/// A new UUID v7 message id for a message made at `now_ms`, strictly increasing within this
/// process: ids sort in the order
/// they were made, so one sender's messages to one receiver sort in the order sent. Within
/// one millisecond a 16-bit counter orders them (after 65,536 the clock is borrowed from).
pub(crate) fn new_message_id(now_ms: u64) -> Uuid {
    let now = now_ms << 16;
    let mut prev = LAST_ID.load(Ordering::Relaxed);
    let next = loop {
        let next = now.max(prev + 1);
        match LAST_ID.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(actual) => prev = actual,
        }
    };
    let ms = next >> 16;
    let counter = next & 0xFFFF;
    let random = fastrand::u64(..);
    // 48 bits ms | version 7 | 12 high counter bits | variant | 4 low counter bits | random.
    let hi = (ms << 16) | (0x7 << 12) | (counter >> 4);
    let lo = (0b10 << 62) | ((counter & 0xF) << 58) | (random >> 6);
    Uuid::from_u64_pair(hi, lo)
}

/// The smallest v7 id made at `ms`: ids below it are older.
pub(crate) fn first_id_at(ms: u64) -> Uuid {
    Uuid::from_u64_pair((ms << 16) | (0x7 << 12), 0b10 << 62)
}

/// The key of a message in `Inbox` and `Archive`: recipient, a 0 byte, the message id.
pub(crate) fn message_key(recipient: &str, id: &Uuid) -> Vec<u8> {
    let mut key = Vec::with_capacity(recipient.len() + 17);
    key.extend_from_slice(recipient.as_bytes());
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// The key of a message in the mail log (`Table::Mail`): the second it was made in (its
/// id's milliseconds over 1,024, ten hex digits), a 0 byte, its id. Keys sort as ids do,
/// by time; and a store that groups keys by what comes before their first 0 byte (the
/// memory store, as it groups a mailbox's messages by recipient) keeps a second's messages
/// together, rather than one group for each message.
pub(crate) fn log_key(id: &Uuid) -> Vec<u8> {
    use std::io::Write as _;
    let second = (id.as_u128() >> 80) >> 10;
    let mut key = Vec::with_capacity(27);
    // Writing to a Vec cannot fail.
    let _ = write!(key, "{second:010x}");
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// The id a mail log key ends with; `None` for a key that is none.
pub(crate) fn logged_id(key: &[u8]) -> Option<u128> {
    let (_, id) = key.split_last_chunk::<16>()?;
    (key.len() == 27).then(|| u128::from_be_bytes(*id))
}

/// The key prefix of every message of `recipient`.
pub(crate) fn mailbox_prefix(recipient: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(recipient.len() + 1);
    key.extend_from_slice(recipient.as_bytes());
    key.push(0);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_v7_and_strictly_increasing() {
        let ids: Vec<Uuid> = (0..100_000).map(|_| new_message_id(now_ms())).collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1]);
            assert!(pair[0].as_bytes() < pair[1].as_bytes());
        }
        assert_eq!(ids[0].get_version_num(), 7);
        assert_eq!(ids[0].get_variant(), uuid::Variant::RFC4122);
        let ms = ids[0].as_u64_pair().0 >> 16;
        assert!(now_ms().abs_diff(ms) < 60_000);
        assert!(first_id_at(ms) <= ids[0]);
        assert!(first_id_at(ms + 120_000) > ids[ids.len() - 1]);
    }

    #[test]
    fn names_are_checked() {
        assert!(AgentId::parse("pm-1.team@x").is_ok());
        for bad in [
            "",
            "a b",
            "role:pm",
            "*",
            "parent",
            "children",
            &"x".repeat(65),
        ] {
            assert!(AgentId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse_message_id("nope").is_err());
    }
}
