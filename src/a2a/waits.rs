//! The bound on what waits: streams (`SendStreamingMessage`, `SubscribeToTask`) and blocking
//! sends, over all callers (`[a2a] max_streams`) and per caller
//! (`[a2a] max_streams_per_caller`), so that one caller holding many cannot take them
//! from the others.

use std::sync::Arc;

use a2a::A2AError;
use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What waits, counted.
pub(super) struct Waits {
    all: Arc<Semaphore>,
    per_caller: usize,
    by_caller: Arc<DashMap<String, usize>>,
}

/// One wait's place, given back when dropped.
pub(super) struct Place {
    _all: OwnedSemaphorePermit,
    caller: String,
    by_caller: Arc<DashMap<String, usize>>,
}

impl Waits {
    pub(super) fn new(all: usize, per_caller: usize) -> Self {
        Self {
            all: Arc::new(Semaphore::new(all)),
            per_caller: per_caller.max(1),
            by_caller: Arc::new(DashMap::new()),
        }
    }

    /// A place for `caller`'s wait, or why there is none.
    pub(super) fn take(&self, caller: &str) -> Result<Place, A2AError> {
        let mut mine = self.by_caller.entry(caller.to_owned()).or_insert(0);
        if *mine >= self.per_caller {
            return Err(A2AError::new(
                -32603,
                format!(
                    "`{caller}` has {} A2A streams or waits open, as many as one caller may \
                     ([a2a] max_streams_per_caller): close one, or poll with GetTask",
                    *mine
                ),
            ));
        }
        let all = Arc::clone(&self.all).try_acquire_owned().map_err(|_| {
            A2AError::new(
                -32603,
                "the server has as many A2A streams and waits open as it allows \
                 ([a2a] max_streams): poll with GetTask, or retry later",
            )
        })?;
        *mine += 1;
        Ok(Place {
            _all: all,
            caller: caller.to_owned(),
            by_caller: Arc::clone(&self.by_caller),
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // The entry goes with its last place, so the map holds only callers waiting now.
        self.by_caller.remove_if_mut(&self.caller, |_, count| {
            *count = count.saturating_sub(1);
            *count == 0
        });
    }
}
