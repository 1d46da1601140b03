//! guildhall's tool contract and the actors that run tools.
//!
//! - [`tool`]: the [`Tool`] trait users implement, with [`Annotations`] and [`Concurrency`].
//! - [`context`]: the [`CallContext`] handed to every call (ids, deadline, cancellation,
//!   progress and events).
//! - [`deadline`]: the [`Sweeper`](deadline::Sweeper) that watches calls' deadlines and
//!   fires them; only it may move or fire a call's deadline state.
//! - [`spec`]: [`ToolSpec`], a tool's public description with its JSON Schemas, and name
//!   validation.
//! - [`args`]: decoding JSON arguments into a tool's typed input, naming the bad field.
//! - [`worker`]: [`ToolActor`], the generic actor that runs a tool, and [`WorkerPool`], which
//!   dispatches calls to a tool's actors and turns every outcome into exactly one reply.
//! - [`error`]: [`CallError`], what a caller gets when a call does not succeed.
//!
//! Users never implement `ractor::Actor`: the runtime wraps every [`Tool`] in [`ToolActor`].

pub mod args;
pub mod context;
pub mod deadline;
mod error;
pub mod spec;
pub mod tool;
mod trace;
pub mod worker;

pub use context::{CallContext, CallEvent, CallObserver, Elicitation, Progress};
pub use error::{CallError, ErrorKind, RegistrationError};
pub use guildhall_supervision::ErrorChain;
pub use spec::{ToolSpec, validate_name};
pub use tool::{Annotations, Concurrency, InitState, Tool};
pub use trace::TraceParent;
pub use worker::{Dispatched, ToolActor, ToolMsg, WorkerPool, panic_message};
