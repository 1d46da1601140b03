//! guildhall: an actor-based runtime for swarms of AI agents.
//!
//! Every tool is a supervised actor with a typed contract. This crate is the facade; its
//! public modules, from the bottom up:
//!
//! - Leaves: [`time`] (Unix milliseconds and RFC 3339), [`paged`] (answers that fit under
//!   governance's truncation), [`private_fs`] (files and directories only their owner
//!   reaches), [`events`] (tool lifecycle events, a leaf every layer may emit into),
//!   [`changes`] (what domains report after a commit, for watchers).
//! - [`store`]: the store behind every durable domain (redb embedded, in memory, or
//!   PostgreSQL shared by several servers).
//! - The built-in domains: [`files`] (the file tools, confined to each agent's roots),
//!   `sandbox` (Linux: the kernel's confinement of every process started for an agent),
//!   `shell` (Linux: `bash` and background shells), `fetch` (feature `fetch`:
//!   `web_fetch`), [`agents`] (agents, their directory and durable mailboxes), [`context`]
//!   (sessions and their shared context), [`tasks`] (the task board), [`humans`]
//!   (`ask_human`, `confirm`).
//! - A call's way through a tool: [`pipeline`] (breaker, deadline, retry, concurrency
//!   limit), [`governance`] (permissions, hooks, modes, rate limits, the loop guard,
//!   caching, truncation, audit), [`options`] ([`ToolOptions`], [`CallOptions`]),
//!   [`registry`] ([`ToolHandle`], a typed handle to one tool).
//! - [`runtime`]: [`Runtime`] and its builder: the supervision tree, the tool registry,
//!   typed and JSON calls, tree snapshots and graceful shutdown, and the
//!   [`Subsystem`](runtime::Subsystem) contract every domain plugs in through.
//! - [`builtin`]: the built-in domains as subsystems (the task board, the file tools, the
//!   shell, the sandbox, `web_fetch`, the humans), with the builder methods that add them.
//! - Above the runtime: `servers` (Linux: other MCP servers proxied as supervised,
//!   governed tools), `commands` (Linux: programs described in a manifest, served as
//!   tools), `launch` (Linux: agents the runtime starts and supervises), [`tool_search`]
//!   (`find_tools`, a search over the tools a caller may use), [`observe`]
//!   (metrics and traces from the runtime's events), [`mcp`] (the MCP server: stdio,
//!   Streamable HTTP, the local socket), [`config`](mod@config) (the `guildhall.toml`
//!   file), `bench` (feature `bench`: the measurements behind `guildhall bench`).
//!
//! The tool contract lives in [`guildhall_actors`] (re-exported here), supervision in
//! [`guildhall_supervision`].
//!
//! # Examples
//! ```
//! use guildhall::{CallContext, CallOptions, Runtime, Tool};
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! struct Echo;
//!
//! #[derive(Clone, Serialize, Deserialize, JsonSchema)]
//! struct Say { text: String }
//!
//! #[derive(Serialize, JsonSchema)]
//! struct Said { text: String }
//!
//! impl Tool for Echo {
//!     type Input = Say;
//!     type Output = Said;
//!     type Error = std::convert::Infallible;
//!     type State = ();
//!     fn name(&self) -> &str { "echo" }
//!     fn description(&self) -> &str { "Echoes its input." }
//!     async fn call(&self, _: &mut (), input: Say, _: CallContext) -> Result<Said, Self::Error> {
//!         Ok(Said { text: input.text })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = Runtime::builder().tool(Echo).build().await?;
//! let out = runtime
//!     .call_json("echo", serde_json::json!({"text": "hi"}), CallOptions::new())
//!     .await?;
//! assert_eq!(out["text"], "hi");
//! runtime.shutdown().await;
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "a2a")]
pub mod a2a;
mod addresses;
pub mod agents;
#[cfg(feature = "bench")]
pub mod bench;
pub mod builtin;
pub mod changes;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod commands;
pub mod compose;
pub mod config;
pub mod context;
mod detached;
mod durable;
mod error;
pub mod events;
#[cfg(feature = "fetch")]
pub mod fetch;
pub mod files;
pub mod governance;
pub mod humans;
mod json_id;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod launch;
pub mod loop_hooks;
pub mod mcp;
pub mod observe;
pub mod options;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod output_log;
pub mod paged;
pub mod pipeline;
pub mod private_fs;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod process_group;
pub mod registry;
pub mod runtime;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod sandbox;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod servers;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod shell;
pub mod skills;
mod sorted;
pub mod store;
pub mod tasks;
pub mod time;
#[cfg(feature = "tls")]
mod tls;
pub mod tool_search;

pub use agents::{
    Agent, AgentId, AgentSpec, Inbox, InboxQuery, MailError, MailboxConfig, Message, Outgoing,
    Priority, Receipt,
};
pub use context::{Change, Context, ContextConfig, ContextError, SessionId, Sessions, Strategy};
pub use error::BuildError;
pub use events::{EventStream, ToolEvent};
pub use guildhall_actors::{
    self as actors, Annotations, CallContext, CallError, CallEvent, CallObserver, Concurrency,
    Elicitation, ErrorChain, ErrorKind, InitState, Progress, RegistrationError, Tool, ToolSpec,
    TraceParent,
};
pub use guildhall_supervision::{self as supervision, BreakerStatus, ChildSnapshot, ChildStatus};
pub use options::{CallOptions, ToolOptions};
pub use registry::ToolHandle;
pub use runtime::{Runtime, RuntimeBuilder, WeakRuntime};

// The versions of these the runtime's types derive with: a tool's `Input`/`Output` derives
// match them by using these paths (`#[serde(crate = "guildhall::serde")]`,
// `#[schemars(crate = "guildhall::schemars")]`), or the same versions in the embedder's own
// Cargo.toml.
pub use schemars;
pub use serde;
pub use serde_json;
