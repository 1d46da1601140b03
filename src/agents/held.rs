//! Mail held for an agent expected but not registered yet, that expires before it comes.
//!
//! A held message is in its recipient's `Inbox` like any other (the mailbox reads it when
//! the agent registers). One that carries an expiry also has a marker in `Held`, keyed by
//! expiry first, so a sweep finds the expired ones by reading the table's head. For each,
//! if its recipient is still not registered, the message is removed and its sender told
//! (a message in the same thread, from the recipient that never came); otherwise the
//! marker just goes (the mailbox drops expired mail itself).

use std::sync::Arc;

use uuid::Uuid;

use super::ids::{AgentId, new_message_id, now_ms};
use super::message::{DeliveryState, Message, Priority};
use crate::store::{Store, StoreError, Table};

/// The marker of a held message `id` for `agent` that expires at `expires_ms`.
pub(crate) fn marker(expires_ms: u64, agent: &str, id: &Uuid) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + agent.len() + 1 + 16);
    key.extend_from_slice(&expires_ms.to_be_bytes());
    key.extend_from_slice(agent.as_bytes());
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// A marker due: its key, the recipient and the message id.
pub(crate) struct Due {
    pub(crate) marker: Vec<u8>,
    pub(crate) agent: String,
    pub(crate) id: Uuid,
}

/// The markers of held messages expired at `now_ms`, oldest first, at most `limit`.
pub(crate) fn due(store: &dyn Store, now_ms: u64, limit: usize) -> Result<Vec<Due>, StoreError> {
    let mut found = Vec::new();
    store.scan(Table::Held, &[], &mut |key, _| {
        let Some(due) = parse(key) else {
            // Not a marker this version writes: skipped, never a reason to stop.
            return true;
        };
        if due.0 > now_ms {
            return false;
        }
        found.push(Due {
            marker: key.to_vec(),
            agent: due.1,
            id: due.2,
        });
        found.len() < limit
    })?;
    Ok(found)
}

/// A marker's expiry, recipient and message id.
fn parse(key: &[u8]) -> Option<(u64, String, Uuid)> {
    let (expires, rest) = key.split_first_chunk::<8>()?;
    let (agent, id) = rest.split_at_checked(rest.len().checked_sub(17)?)?;
    let (&0, id) = id.split_first()? else {
        return None;
    };
    Some((
        u64::from_be_bytes(*expires),
        String::from_utf8(agent.to_vec()).ok()?,
        Uuid::from_slice(id).ok()?,
    ))
}

/// What `message`'s sender is told when it expired held for `agent`, which never came.
pub(crate) fn notice(message: &Message, agent: &AgentId) -> Message {
    let created_ms = now_ms();
    let expired = message.expires_ms.unwrap_or(created_ms);
    Message {
        id: new_message_id(created_ms),
        from: agent.clone(),
        to: Arc::from(message.from.as_str()),
        subject: format!("undelivered: {}", message.subject).into_boxed_str(),
        body: format!(
            "Your message {} to `{agent}` expired ({}) before `{agent}` registered: it was \
             held for it and never delivered.",
            message.id,
            crate::time::rfc3339(expired)
        )
        .into_boxed_str(),
        payload: Some(Arc::new(serde_json::json!({
            "event": "expired_undelivered",
            "message": message.id,
            "to": agent.as_str(),
            "expired_ms": expired,
        }))),
        thread: message.thread,
        reply_to: Some(message.id),
        priority: Priority::Normal,
        created_ms,
        expires_ms: None,
        state: DeliveryState::Delivered,
        read_ms: None,
        acked_ms: None,
        trace: message.trace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_reads_back_and_sorts_by_expiry() {
        let id = Uuid::now_v7();
        let key = marker(42, "pm-api", &id);
        assert_eq!(parse(&key), Some((42, "pm-api".to_owned(), id)));
        assert!(marker(41, "zz", &id) < key && key < marker(43, "a", &id));
        assert_eq!(parse(&key[..key.len() - 1]), None);
        assert_eq!(parse(b"short"), None);
    }
}
