//! Erlang/OTP supervision for [`ractor`] actors, plus per-service circuit breakers.
//!
//! ractor links actors into a tree and reports child failures to the parent, but ships no
//! restart strategies. This crate supplies them with OTP's vocabulary:
//!
//! - [`spec`]: [`ChildSpec`], [`Restart`] (`Permanent` / `Transient` / `Temporary`) and
//!   [`Shutdown`] (`BrutalKill` / `Timeout` / `Infinity`).
//! - [`supervisor`]: [`SupervisorActor`] with [`Strategy`] `OneForOne`, `OneForAll`,
//!   `RestForOne`; escalation when restart intensity is exceeded; ordered shutdown.
//! - [`dynamic`]: a one-for-one supervisor for many children started on demand, kept in
//!   hash maps (OTP's `simple_one_for_one`).
//! - [`intensity`]: the restart-intensity window (max restarts within a period).
//! - [`backoff`]: exponential backoff with jitter between restarts.
//! - [`breaker`]: a circuit breaker with Akka semantics.
//! - [`lazy`]: actors started on first use and stopped when idle, under partitioned
//!   dynamic supervisors, with requests re-sent when their actor dies.
//! - [`snapshot`]: a point-in-time view of a supervision tree.
//!
//! Policy code (`intensity`, `backoff`, `breaker`) takes `now` as an argument and never reads
//! a clock, so it is tested as plain functions. This crate knows nothing about tools.

pub mod backoff;
pub mod breaker;
pub mod dynamic;
mod error;
pub mod intensity;
pub mod lazy;
pub mod snapshot;
pub mod spec;
pub mod supervisor;

pub use backoff::Backoff;
pub use breaker::{BreakerConfig, BreakerStatus, CircuitBreaker, CircuitOpen, SharedBreaker};
pub use dynamic::{DynamicSpec, DynamicSupervisorActor};
pub use error::{ErrorChain, SupervisorError, Unreachable};
pub use intensity::{IntensityExceeded, RestartIntensity, RestartWindow};
pub use snapshot::{ChildSnapshot, ChildStatus};
pub use spec::{ChildKind, ChildSpec, Restart, Shutdown, StartFn};
pub use supervisor::{Strategy, Supervisor, SupervisorActor, SupervisorMsg, SupervisorSpec};
