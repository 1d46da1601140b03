//! An idle agent's wait for mail (`wake_on_mail`): it watches the agent's inbox, and while
//! it has unread mail sent since its last process started, the launcher starts it again
//! with a prompt naming that mail.
//!
//! "Since its last start", not "since its end": mail its process left unread wakes it (once:
//! the next start is later), and mail delivered between the process's exit and the watch's
//! start is never missed. Mail that woke it, sent before the start, does not wake it
//! again. A wake the launcher has no
//! room for (`max_agents`, `max_per_parent`) is tried again on the next mail or after
//! [`RETRY`]. The wait ends with the wake, with a stop or a new launch under its id, or
//! with the launcher.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::launched::Launch;
use crate::agents::{InboxQuery, Message, first_id_at};
use crate::changes::Subject;

/// How soon a wake that found no room is tried again, if no mail comes first.
const RETRY: Duration = Duration::from_secs(5);
/// How many of the new messages the prompt names.
const NAMED: usize = 5;

/// What a wake came to.
pub(crate) enum Woken {
    /// The agent runs again, or ended trying: the wait is over.
    Done,
    /// No room for it now: wait again.
    NoRoom,
}

/// Waits for mail to `launch`'s agent, and calls `wake` with the prompt naming it, until
/// `wake` is done or `waiting` is cancelled.
pub(crate) async fn wait_for_mail<W, F>(launch: Arc<Launch>, waiting: CancellationToken, wake: W)
where
    W: Fn(Arc<Launch>, String) -> F,
    F: Future<Output = Woken>,
{
    let Some(runtime) = launch.runtime.upgrade() else {
        return;
    };
    let mut watch = runtime
        .changes()
        .watch(Subject::Inbox(Arc::from(launch.agent.as_str())));
    // The agent's runtime is not kept alive by an agent waiting on it.
    drop(runtime);
    let started_ms = launch.status().started_ms.unwrap_or(0);
    let since = first_id_at(started_ms);
    let mut no_room = false;
    loop {
        if let Some(prompt) = new_mail(&launch, since).await {
            match wake(Arc::clone(&launch), prompt).await {
                Woken::Done => return,
                Woken::NoRoom => no_room = true,
            }
        }
        tokio::select! {
            () = waiting.cancelled() => return,
            () = watch.changed() => {}
            () = tokio::time::sleep(RETRY), if no_room => {}
        }
    }
}

/// The prompt a woken agent is started with, when unread mail came since `since`.
async fn new_mail(launch: &Launch, since: Uuid) -> Option<String> {
    let runtime = launch.runtime.upgrade()?;
    let agent = runtime.agent(&launch.agent).ok()?;
    let inbox = agent
        .check_inbox(InboxQuery {
            since: Some(since),
            limit: NAMED,
            ..InboxQuery::default()
        })
        .await
        .map_err(|err| tracing::warn!(agent = %launch.agent, error = %err, "could not read the mail of an idle agent"))
        .ok()?;
    (!inbox.messages.is_empty()).then(|| prompt(&launch.agent, &inbox.messages, inbox.unread))
}

/// Names the new `messages` (most urgent first) of `agent`'s `unread`.
fn prompt(agent: &str, messages: &[Arc<Message>], unread: usize) -> String {
    let mut text = format!("You are agent `{agent}`, woken by new mail in guildhall:");
    for message in messages {
        let urgency = message.priority.tag();
        text.push_str(&format!(
            "\n- {urgency}from `{}`: \"{}\" (id {})",
            message.from.as_str(),
            message.subject,
            message.id
        ));
    }
    if unread > messages.len() {
        text.push_str(&format!("\n{unread} unread in all."));
    }
    text.push_str("\nRead it with check_inbox, answer with send_message.");
    text
}
