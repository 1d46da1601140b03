//! Changes someone listens for: an agent's inbox got mail, a context session or one of its
//! entries changed, the agent directory changed, a task changed. Domains report them after the change is
//! committed; listeners (the MCP server's resource subscriptions) hold a [`Watch`] per
//! subject.
//!
//! Only watched subjects cost anything: a report for a subject nobody watches is one atomic
//! load. A watch says *that* something changed since it last looked, not what (the listener
//! reads the subject again), so reports coalesce and a slow listener never holds up the
//! domain or grows a queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use tokio::sync::watch;

/// Something that can change.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Subject {
    /// An agent's inbox: a message arrived.
    Inbox(Arc<str>),
    /// A context session: any of its entries changed.
    Session(Arc<str>),
    /// One entry of a context session.
    Entry(Arc<str>, Arc<str>),
    /// The agent directory: an agent registered, changed or left.
    Agents,
    /// The task board: any task was created or changed.
    Tasks,
    /// One task of the board.
    Task(u64),
    /// The runtime's events: more were kept for `guildhall://events` readers.
    Events,
    /// A proxied server's resource, by the URI guildhall serves it under: the server said
    /// it was updated.
    Resource(Arc<str>),
}

/// The watched subjects of a runtime.
#[derive(Default)]
pub struct Changes {
    watched: DashMap<Subject, watch::Sender<u64>>,
    /// How many subjects are watched: zero makes every report free.
    count: AtomicUsize,
}

impl Changes {
    /// Whether anything is watched (reports are free when not).
    pub fn is_watched(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// Reports that `subject` changed (after the change is committed).
    pub fn changed(&self, subject: &Subject) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(tx) = self.watched.get(subject) {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// Reports new mail for `agent`; builds the subject only when something is watched, so
    /// a delivery nobody listens for allocates nothing.
    pub fn inbox_changed(&self, agent: &str) {
        if self.is_watched() {
            self.changed(&Subject::Inbox(Arc::from(agent)));
        }
    }

    /// Reports changes of `session`'s entries `keys`: the session and each entry.
    pub fn session_changed<'a>(&self, session: &str, keys: impl IntoIterator<Item = &'a str>) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let session: Arc<str> = Arc::from(session);
        for key in keys {
            self.changed(&Subject::Entry(Arc::clone(&session), Arc::from(key)));
        }
        self.changed(&Subject::Session(session));
    }

    /// Reports changes of the task board's tasks `ids`: the board and each task.
    pub fn tasks_changed(&self, ids: &[u64]) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        for id in ids {
            self.changed(&Subject::Task(*id));
        }
        self.changed(&Subject::Tasks);
    }

    /// Watches `subject` until the returned [`Watch`] is dropped.
    pub fn watch(self: &Arc<Self>, subject: Subject) -> Watch {
        let rx = self
            .watched
            .entry(subject.clone())
            .or_insert_with(|| {
                self.count.fetch_add(1, Ordering::AcqRel);
                watch::Sender::new(0)
            })
            .subscribe();
        Watch {
            changes: Arc::clone(self),
            subject,
            rx: Some(rx),
        }
    }
}

/// A listener's hold on one subject.
pub struct Watch {
    changes: Arc<Changes>,
    subject: Subject,
    rx: Option<watch::Receiver<u64>>,
}

impl Watch {
    /// The subject watched.
    pub fn subject(&self) -> &Subject {
        &self.subject
    }

    /// Waits for the next change since the last one seen (or since the watch began).
    ///
    /// # Cancel safety
    /// Cancel safe: a change reported meanwhile is seen by the next call.
    pub async fn changed(&mut self) {
        if let Some(rx) = self.rx.as_mut()
            && rx.changed().await.is_err()
        {
            // The sender lives as long as any watch of the subject: never reached.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.rx.take());
        // Under the map's lock, so a watch taken meanwhile keeps the subject.
        if self
            .changes
            .watched
            .remove_if(&self.subject, |_, tx| tx.receiver_count() == 0)
            .is_some()
        {
            self.changes.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_sees_its_subjects_changes_and_only_those() {
        let changes = Arc::new(Changes::default());
        let mut inbox = changes.watch(Subject::Inbox(Arc::from("bob")));
        let mut entry = changes.watch(Subject::Entry(Arc::from("s"), Arc::from("plan")));
        changes.changed(&Subject::Inbox(Arc::from("alice")));
        changes.session_changed("s", ["plan"]);
        tokio::time::timeout(std::time::Duration::from_secs(5), entry.changed())
            .await
            .expect("the entry's change is seen");
        let seen = |w: &Watch| w.rx.as_ref().is_some_and(|rx| rx.has_changed().unwrap());
        assert!(!seen(&inbox), "alice's mail woke bob's watch");
        changes.changed(&Subject::Inbox(Arc::from("bob")));
        inbox.changed().await;
        drop((inbox, entry));
        assert_eq!(changes.count.load(Ordering::Acquire), 0);
        assert!(changes.watched.is_empty());
    }

    #[test]
    fn a_subject_stays_watched_while_any_watch_holds_it() {
        let changes = Arc::new(Changes::default());
        let first = changes.watch(Subject::Agents);
        let second = changes.watch(Subject::Agents);
        drop(first);
        assert_eq!(changes.count.load(Ordering::Acquire), 1);
        drop(second);
        assert_eq!(changes.count.load(Ordering::Acquire), 0);
    }
}
