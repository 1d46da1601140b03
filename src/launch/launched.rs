//! One launched agent: what its actor keeps across restarts, and how listings show it.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use guildhall_supervision::RestartWindow;
use serde::Serialize;

use super::config::Profile;
use crate::agents::{ProcessReport, ProcessView};
use crate::output_log::OutputLog;
use crate::runtime::WeakRuntime;

/// Where a launched agent is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchState {
    /// Its process runs.
    Running,
    /// Its process ended and it is being started again.
    Restarting,
    /// It ended and is started again when mail reaches it (`wake_on_mail`).
    Idle,
    /// It ended and will not be started again (done, temporary, or stopped).
    Ended,
    /// It was restarted too often and given up.
    GaveUp,
}

impl LaunchState {
    /// The state as listings spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Restarting => "restarting",
            Self::Idle => "idle",
            Self::Ended => "ended",
            Self::GaveUp => "gave_up",
        }
    }

    /// Whether it is alive (counts against the limits).
    pub fn is_alive(self) -> bool {
        matches!(self, Self::Running | Self::Restarting)
    }
}

/// A launched agent as `status` and `list_agents` show it.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchInfo {
    /// The agent.
    pub agent: String,
    /// Its role.
    pub role: String,
    /// Who started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Its profile.
    pub profile: String,
    /// Where it is in its life.
    pub state: LaunchState,
    /// Its process, while one runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When its current process started (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// Times its process was started again after ending.
    pub restarts: u64,
    /// How its last process ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
    /// Its log file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    /// The last lines it wrote.
    pub tail: Vec<String>,
}

/// How one launched agent is confined: the sandbox, what it reaches besides its roots, and
/// the socket it reaches guildhall through (closed with the launch).
pub(crate) struct Confined {
    pub(crate) confiner: crate::sandbox::Confiner,
    pub(crate) extra: crate::sandbox::Extra,
    pub(crate) _socket: Box<dyn Send + Sync>,
}

/// One launched agent: what its actor needs across restarts.
pub(crate) struct Launch {
    pub(crate) agent: String,
    pub(crate) role: String,
    pub(crate) parent: Option<String>,
    pub(crate) profile_name: String,
    pub(crate) profile: Profile,
    /// Its command line: the profile's `command`, or after a wake its `resume`.
    pub(crate) argv: Mutex<Vec<String>>,
    /// The placeholders' values but `{prompt}`, for the command line of a wake.
    pub(crate) fields: serde_json::Map<String, serde_json::Value>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: PathBuf,
    pub(crate) log: std::sync::Arc<OutputLog>,
    pub(crate) runtime: WeakRuntime,
    /// Told when the agent ends for good (the launcher, which ends its family).
    pub(crate) family: std::sync::Weak<dyn Family>,
    pub(crate) status: Mutex<Status>,
    /// Its sandbox; `None` runs it with the server's rights.
    pub(crate) confined: Option<Confined>,
}

/// What changes over a launched agent's life.
#[derive(Debug)]
pub(crate) struct Status {
    pub(crate) state: LaunchState,
    pub(crate) pid: Option<u32>,
    pub(crate) started_ms: Option<u64>,
    pub(crate) starts: u64,
    pub(crate) last_exit: Option<String>,
    /// When each restart happened (monotonic), for the intensity.
    pub(crate) restarts: RestartWindow,
    /// While idle: ends the wait for mail (a stop, a new launch under its id).
    pub(crate) waiting: Option<tokio_util::sync::CancellationToken>,
    /// It was woken by mail: its going idle again after exit 0 is not news to its parent.
    pub(crate) woken: bool,
}

impl Status {
    /// Ends the wait for mail, if there is one.
    pub(crate) fn stop_waiting(&mut self) {
        if let Some(waiting) = self.waiting.take() {
            waiting.cancel();
        }
    }
}

impl Launch {
    pub(crate) fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends its wait for mail, if it is idle.
    pub(crate) fn stop_waiting(&self) {
        self.status().stop_waiting();
    }

    pub(crate) fn argv(&self) -> Vec<String> {
        self.argv
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn info(&self) -> LaunchInfo {
        let status = self.status();
        LaunchInfo {
            agent: self.agent.clone(),
            role: self.role.clone(),
            parent: self.parent.clone(),
            profile: self.profile_name.clone(),
            state: status.state,
            pid: status.pid,
            started_ms: status.started_ms,
            restarts: status.starts.saturating_sub(1),
            last_exit: status.last_exit.clone(),
            log: self.log.path().cloned(),
            tail: self.log.tail(5),
        }
    }
}

impl ProcessReport for Launch {
    fn report(&self) -> ProcessView {
        let info = self.info();
        let running = info.pid.is_some();
        ProcessView {
            profile: info.profile,
            state: info.state.as_str().to_owned(),
            pid: info.pid,
            uptime_secs: info
                .started_ms
                .filter(|_| running)
                .map(|at| crate::time::now_ms().saturating_sub(at) / 1000),
            restarts: info.restarts,
            last_exit: info.last_exit,
        }
    }
}

/// What a launched agent's actor tells of its agent's end: the launcher ends the agents it
/// started that stop with it (the actor cannot: it runs inside the supervisor's restart or
/// stop, which the launcher's calls wait on).
pub(crate) trait Family: Send + Sync {
    /// `agent` ended for good.
    fn ended(&self, agent: &str);

    /// `launch`'s process ended and it waits for mail to wake it.
    fn idle(&self, launch: std::sync::Arc<Launch>);
}
