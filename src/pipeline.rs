//! The call pipeline: a tower stack around the call to a tool's actor.
//!
//! Every call, typed or JSON, passes through the same stack, outermost first:
//!
//! | layer | why it sits here |
//! |---|---|
//! | [`BreakerLayer`] | outermost, so an open circuit rejects a call before it costs anything, and it sees the final outcome of the call (after retries and the deadline), counting crashes and timeouts |
//! | [`DeadlineLayer`] | the deadline bounds everything below it: retries, the wait for a concurrency permit, the wait for a restart, the tool itself; it also cancels the call if its caller goes away |
//! | [`RetryLayer`] | only for idempotent tools (absent otherwise, so it costs nothing); inside the deadline so retries never outlive it, outside the limit so each attempt takes its own permit |
//! | [`LimitLayer`] | innermost, bounding attempts in flight per tool so a flood of calls queues here instead of in the actor's mailbox; calls that wait by design (`Tool::polls`) take no permit, so waiting callers never lock others out |
//! | [`Dispatch`] | the service itself: sends the call to the least busy actor of the tool and awaits its one reply |
//!
//! Governance (the layer above: audit, rate limits, hooks, permission, the loop guard,
//! caching, truncation) wraps this stack from outside the breaker, so a denied call never
//! touches a tool's health and the audit sees every outcome. This module never names it:
//! dependencies point down.

mod breaker;
mod deadline;
mod dispatch;
mod limit;
mod retry;
mod tool_options;

use std::sync::Arc;

use guildhall_actors::{CallContext, Tool, WorkerPool};
use guildhall_supervision::SharedBreaker;
use tower::ServiceBuilder;
use tower::retry::Retry;
use tower::util::Either;

pub use tool_options::ToolOptions;

pub use breaker::{Breaker, BreakerFuture, BreakerLayer};
pub use deadline::{Deadline, DeadlineFuture, DeadlineLayer};
pub use dispatch::Dispatch;
pub use guildhall_actors::deadline::Sweeper;
pub use limit::{Limit, LimitFuture, LimitLayer};
pub use retry::{RetryLayer, RetryPolicy};

use crate::events::Events;

/// One call travelling through the pipeline.
#[derive(Debug, Clone)]
pub struct ToolCall<I> {
    /// The decoded arguments.
    pub input: I,
    /// The call's context.
    pub ctx: CallContext,
}

/// A tool's assembled pipeline. A concrete type rather than a boxed service, so that cloning
/// it for a call allocates nothing.
pub type ToolService<T> = Breaker<Deadline<MaybeRetry<T>>>;

/// The retry layer where the tool is idempotent, nothing otherwise.
type MaybeRetry<T> = Either<Retry<RetryPolicy, Limited<T>>, Limited<T>>;

/// A tool's dispatch behind its limit of calls in flight.
type Limited<T> = Limit<Dispatch<T>, <T as Tool>::Input>;

/// Builds the stack for one tool.
pub fn build<T: Tool>(
    name: Arc<str>,
    pool: WorkerPool<T>,
    options: &ToolOptions,
    breaker: Arc<SharedBreaker>,
    sweeper: Arc<Sweeper>,
    idempotent: bool,
    events: Events,
) -> ToolService<T> {
    let retry = (idempotent && options.max_retries > 0)
        .then(|| RetryLayer::new(RetryPolicy::new(options.max_retries)));
    ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker, Arc::clone(&name)).events(events))
        .layer(DeadlineLayer::new(name, sweeper))
        .option_layer(retry)
        .layer(LimitLayer::new(options.max_in_flight, T::polls))
        .service(Dispatch::new(pool))
}
