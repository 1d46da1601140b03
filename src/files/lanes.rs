//! [`Lanes`]: how much of tokio's blocking pool the file tools may occupy, in all and per
//! agent, so that one agent's slow or numerous file calls cannot take the threads another
//! agent's calls (or the runtime's own blocking work, such as spilled context answers)
//! need.
//!
//! A call waits for its lane *before* it takes a thread: the waiting is asynchronous, so
//! 600 queued writes of one agent hold 600 small futures, not 600 threads.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// File calls of one agent running on the blocking pool at once.
pub(super) const PER_AGENT: usize = 4;
/// File calls of all agents running on the blocking pool at once: well under tokio's 512
/// blocking threads, so the rest of the runtime always finds one.
pub(super) const IN_ALL: usize = 64;

/// The lanes: one semaphore for all, one per agent with calls in flight.
pub(super) struct Lanes {
    all: Arc<Semaphore>,
    agents: DashMap<Arc<str>, Arc<Semaphore>>,
}

/// Room on the blocking pool for one call, released when dropped.
pub(super) struct Lane {
    _agent: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

impl Lanes {
    pub(super) fn new() -> Self {
        Self {
            all: Arc::new(Semaphore::new(IN_ALL)),
            agents: DashMap::new(),
        }
    }

    /// Waits for room for one call of `agent`: its own lane first, so an agent over its
    /// share waits without holding a place in the shared count.
    ///
    /// # Cancel safety
    /// Dropping the future gives back whatever it held.
    pub(super) async fn enter(&self, agent: &Arc<str>) -> Lane {
        let own = self
            .agents
            .entry(Arc::clone(agent))
            .or_insert_with(|| Arc::new(Semaphore::new(PER_AGENT)))
            .clone();
        // Neither semaphore is ever closed.
        let agent_permit = own
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the lanes' semaphores are never closed"));
        let all = Arc::clone(&self.all)
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the lanes' semaphores are never closed"));
        Lane {
            _agent: agent_permit,
            _all: all,
        }
    }

    /// Forgets the lanes of agents with nothing in flight, so the map holds only agents
    /// with calls running or waiting (called as a call leaves).
    pub(super) fn tidy(&self, agent: &Arc<str>) {
        self.agents.remove_if(agent, |_, own| {
            Arc::strong_count(own) == 1 && own.available_permits() == PER_AGENT
        });
    }

    /// Agents with a lane (tests).
    #[cfg(test)]
    fn agents(&self) -> usize {
        self.agents.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `enter` gives when polled once, outside tokio's cooperative budget (a test that
    /// takes 64 lanes in one poll would otherwise see its budget run out, not a lane).
    fn now(enter: impl std::future::Future<Output = Lane>) -> Option<Lane> {
        futures::FutureExt::now_or_never(tokio::task::unconstrained(enter))
    }

    #[tokio::test]
    async fn an_agent_over_its_share_waits_while_another_enters() {
        let lanes = Lanes::new();
        let (busy, other): (Arc<str>, Arc<str>) = (Arc::from("busy"), Arc::from("other"));
        let mut held = Vec::new();
        for _ in 0..PER_AGENT {
            held.push(now(lanes.enter(&busy)).expect("a free lane"));
        }
        assert!(
            now(lanes.enter(&busy)).is_none(),
            "a fifth call of one agent waits"
        );
        let lane = now(lanes.enter(&other)).expect("another agent enters at once");
        drop(held.pop());
        assert!(
            now(lanes.enter(&busy)).is_some(),
            "a lane given back is taken"
        );
        drop((lane, held));
        lanes.tidy(&busy);
        lanes.tidy(&other);
        assert_eq!(lanes.agents(), 0, "idle agents' lanes are forgotten");
    }

    #[tokio::test]
    async fn all_agents_together_stop_at_the_shared_count() {
        let lanes = Lanes::new();
        let held: Vec<Lane> = (0..IN_ALL)
            .map(|i| {
                let agent: Arc<str> = Arc::from(format!("a{}", i / PER_AGENT));
                now(lanes.enter(&agent)).expect("room in all")
            })
            .collect();
        let newcomer: Arc<str> = Arc::from("newcomer");
        assert!(now(lanes.enter(&newcomer)).is_none());
        drop(held);
        assert!(now(lanes.enter(&newcomer)).is_some());
    }
}
