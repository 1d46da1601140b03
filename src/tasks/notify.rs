//! Notices become mail: sent after the change that made them is committed, from the agent
//! whose change it was. Best effort: the board is the record, and a notice that cannot be
//! delivered (the sender deregistered, the recipient's mailbox full) is logged, not retried.

use std::sync::Arc;

use serde_json::json;

use super::model::Notice;
use crate::agents::{Outgoing, PostOffice};

pub(crate) async fn deliver(office: Arc<PostOffice>, notices: Vec<Notice>) {
    for notice in notices {
        let Some(sender) = office.directory.get(notice.from.as_str()) else {
            continue;
        };
        let subject = format!("task {} {}: {}", notice.task, notice.event, notice.title);
        let body = format!(
            "Task {} ({:?}) is {} (by {}). Read it with `task_get` {{\"id\": {}}}.",
            notice.task, notice.title, notice.event, notice.from, notice.task
        );
        let out = Outgoing::to(notice.to.clone())
            .subject(subject)
            .body(body)
            .payload(json!({"task": notice.task, "event": notice.event}));
        if let Err(err) = office.send(&sender, out).await {
            tracing::warn!(task = notice.task, to = %notice.to, error = %guildhall_actors::ErrorChain(&err), "task notice not delivered");
        }
    }
}
