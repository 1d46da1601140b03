//! The call pipeline: a tower stack around the call to a tool's actor.
//!
//! Every call, typed or JSON, passes through the same stack, outermost first:
//!
//! | layer | why it sits here |
//! |---|---|
//! | [`BreakerLayer`] | outermost, so an open circuit rejects a call before it costs anything, and it sees the final outcome of the call (after retries and the deadline), counting crashes and timeouts |
//! | [`DeadlineLayer`] | the deadline bounds everything below it: retries, the wait for a concurrency permit, the wait for a restart, the tool itself |
//! | [`RetryLayer`] | only for idempotent tools; inside the deadline so retries never outlive it, outside the limit so each attempt takes its own permit |
//! | `ConcurrencyLimitLayer` (tower) | innermost, bounding attempts in flight per tool so a flood of calls queues here instead of in the actor's mailbox |
//! | [`Dispatch`] | the service itself: sends the call to the least busy actor of the tool and awaits its one reply |
//!
//! Later layers (permission, hooks, output truncation, audit) go outside the breaker, so a
//! denied call never touches a tool's health and audit sees every outcome.

mod breaker;
mod deadline;
mod dispatch;
mod retry;

use std::sync::Arc;

use guildhall_actors::{CallContext, CallError, Tool, WorkerPool};
use guildhall_supervision::SharedBreaker;
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower::util::BoxCloneSyncService;

pub use breaker::{Breaker, BreakerLayer};
pub use deadline::{Deadline, DeadlineLayer};
pub use dispatch::Dispatch;
pub use retry::{RetryLayer, RetryPolicy};

use crate::options::ToolOptions;

/// One call travelling through the pipeline.
#[derive(Debug, Clone)]
pub struct ToolCall<I> {
    /// The decoded arguments.
    pub input: I,
    /// The call's context.
    pub ctx: CallContext,
}

/// A tool's assembled pipeline.
pub type ToolService<T> =
    BoxCloneSyncService<ToolCall<<T as Tool>::Input>, <T as Tool>::Output, CallError>;

/// Builds the stack for one tool.
pub fn build<T: Tool>(
    pool: WorkerPool<T>,
    options: &ToolOptions,
    breaker: Arc<SharedBreaker>,
    idempotent: bool,
) -> ToolService<T> {
    let name: Arc<str> = Arc::from(pool.name());
    // Non-idempotent tools get a policy with no retries, which also skips the request clone.
    let retries = if idempotent { options.max_retries } else { 0 };
    let service = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker, Arc::clone(&name)))
        .layer(DeadlineLayer::new(name))
        .layer(RetryLayer::new(RetryPolicy::new(retries)))
        .layer(ConcurrencyLimitLayer::new(options.max_in_flight))
        .service(Dispatch::new(pool));
    BoxCloneSyncService::new(service)
}
