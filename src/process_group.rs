//! A process group killed whole: what the shell tools start a command in, and what a proxied
//! MCP server runs in, so that nothing a command or a server started outlives it.

use std::time::Duration;

/// How long a group has between SIGTERM and SIGKILL.
pub(crate) const TERM_GRACE: Duration = Duration::from_millis(500);

/// A process group, killed (SIGKILL) when dropped.
#[derive(Debug)]
pub(crate) struct ProcessGroup(Option<i32>);

impl ProcessGroup {
    /// The group `pgid`, which a child leading its own group (or session) has as its pid.
    pub(crate) fn new(pgid: i32) -> Self {
        Self(Some(pgid))
    }

    /// The group's id, while it has one.
    pub(crate) fn id(&self) -> Option<i32> {
        self.0
    }

    /// SIGTERM to the group, then SIGKILL to what is left after `grace`. Once the group is
    /// seen empty its id is forgotten: the kernel may give it to a new group, which must
    /// never get this one's signals (the drop's kill included).
    pub(crate) async fn terminate_within(&mut self, grace: Duration) {
        let Some(pgid) = self.0 else { return };
        if signal_group(pgid, libc::SIGTERM) {
            let deadline = tokio::time::Instant::now() + grace;
            // Signal 0 only asks whether the group still has members.
            while signal_group(pgid, 0) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.kill();
        }
        if !signal_group(pgid, 0) {
            self.0 = None;
        }
    }

    /// [`terminate_within`](Self::terminate_within) the usual [`TERM_GRACE`].
    pub(crate) async fn terminate(&mut self) {
        self.terminate_within(TERM_GRACE).await;
    }

    /// SIGKILL to every process of the group.
    pub(crate) fn kill(&self) {
        if let Some(pgid) = self.0 {
            signal_group(pgid, libc::SIGKILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // Whoever held the group went away midway (a call cancelled by the pipeline, an
        // actor stopped, the runtime stopping): no grace, nothing survives.
        self.kill();
    }
}

/// Sends `signal` to every process of group `pgid`; `false` when the group has none left.
#[allow(unsafe_code)]
fn signal_group(pgid: i32, signal: i32) -> bool {
    // SAFETY: kill with a negative pid signals a process group; no memory is involved.
    unsafe { libc::kill(-pgid, signal) == 0 }
}
