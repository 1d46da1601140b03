//! A2A (Agent2Agent 1.0) at the edge: agents of any framework reach guildhall's agents, and
//! remote A2A agents become supervised tools. The swarm's own bus stays native mail.
//!
//! ```toml
//! [a2a]
//! expose = ["role:tl", "reviewer"]   # who remote A2A clients may send to
//! wait = "30s"                       # the longest a blocking SendMessage waits
//! max_streams = 256                  # streams open at once (SendStreamingMessage, SubscribeToTask)
//!
//! [a2a.remote.planner]               # a remote A2A agent, as the tool a2a__planner__send
//! url = "http://127.0.0.1:9999"
//! timeout = "60s"
//! ```
//!
//! **Serving** ([`routes`]): each exposed agent or role has an Agent Card and a JSON-RPC
//! endpoint (`/a2a/role/tl`, `/a2a/agent/reviewer`; the first one's card is also at
//! `/.well-known/agent-card.json`), through the official server crate's binding. A remote
//! caller is an agent of this swarm (role `a2a`): named by the `Guildhall-Agent` header and
//! proven by its token when the config gives it one, else `a2a-remote`. Its calls go
//! through the tools (`task_create`, `send_message`, `task_update`) as that agent, so
//! governance's rules, rate limits and audit judge it like any other.
//!
//! - `SendMessage` creates a task on the board, assigned to the target and labelled `a2a`,
//!   and mails the target the message; the A2A task's id is the board's. A message naming
//!   its task continues it: a note on the task, and a reply in its mail thread to whoever
//!   holds it.
//! - The A2A task mirrors the board's ([`mirror`]): `open` → submitted, `in_progress` →
//!   working, `done` → completed, `failed`, `cancelled`; the agent's replies in the thread
//!   are the agent's messages, and one whose payload holds `"input_required": true` puts
//!   the task in `INPUT_REQUIRED` until the caller answers. A completed task's artifact is
//!   the last note someone other than the caller left on it (else the last reply).
//! - `GetTask`, `ListTasks`, `CancelTask` (the creator may cancel a task another holds),
//!   `SubscribeToTask` read the same board; a caller sees only the tasks it created.
//! - Streams wake on the task's and the caller's inbox's changes ([`crate::changes`]), not
//!   on a timer.

mod caller;
mod card;
mod config;
mod edge;
mod follow;
mod mirror;
mod push;
mod questions;
mod remote;
mod waits;

pub use caller::{ANONYMOUS, ROLE};
pub use config::{
    A2aConfig, DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_CALLER, DEFAULT_REMOTE_TIMEOUT,
    DEFAULT_WAIT, RemoteConfig, Target,
};
pub use edge::routes;
pub use remote::{RemoteAgent, RemoteError, RemoteTask, remote_tools};
