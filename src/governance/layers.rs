//! The governance stages as tower layers, one concern per module, and the two stacks they
//! make: [`TypedStack`] for calls from Rust, [`JsonStack`] for calls a model makes, which
//! adds the two stages that only mean something for a model (the result cache and
//! truncation). Outermost first:
//!
//! | layer | stacks | why it sits here |
//! |---|---|---|
//! | [`AuditLayer`] | both | outermost: times the call and records exactly one outcome for it, whatever decided it below (a dropped call is recorded `cancelled`) |
//! | [`TruncateLayer`] | JSON | cuts every result the model gets, fresh or cached, after the after-hooks saw it whole |
//! | [`RateLimitLayer`] | both | cheapest refusal first: a flood is turned away before any hook runs or anyone is asked |
//! | [`HooksLayer`] | both | before-hooks may rewrite the arguments the rules then judge, and allow, ask or deny; after-hooks see every outcome below; below it the arguments no longer change, so it fixes their digest |
//! | [`PermissionLayer`] | both | the rules by scope, combined with the hooks' word (deny wins; a hook's allow skips a rule's ask); `ask` goes to the caller's asker |
//! | [`LoopGuardLayer`] | both | after permission, so a denied call never counts toward a streak |
//! | [`CacheLayer`] | JSON | after permission and the loop guard, so a cached result is never served to a caller who may not call the tool |
//! | [`Pipeline`] | both | the tool's own stack: breaker, deadline, retries, concurrency limit, dispatch |
//!
//! Every layer answers with a [`Decided`](super::call::Decided) and never fails as a
//! service; a layer holds nothing but the layer below (a call brings its governance and
//! tool), so cloning a stack per call costs what cloning its pipeline costs. The fast path
//! of every layer allocates nothing: only hooks, asking and spilling a long result box
//! their futures.
//!
//! **Built in place.** The `call` of every layer both stacks share, and its future's
//! `poll`, are `#[inline(always)]`, and their rare branches (asking, refusing, a repeated
//! call) are out-of-line functions. Left to itself the compiler kept the larger `call`s out of line,
//! and each then built its future on its own stack and copied it into the layer above's:
//! one to two copies of the growing future per layer, about 490 instructions of `memcpy`
//! a call, gone once inlined (see `docs/benchmarks.md`, "Governance built in place").

/// Declares a layer that holds nothing, and its service, which holds only the layer below:
/// every governance layer is one (a call brings what it is judged by).
macro_rules! thin_layer {
    ($(#[$layer_doc:meta])* $layer:ident, $(#[$service_doc:meta])* $service:ident) => {
        $(#[$layer_doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $layer;

        impl<S> tower::Layer<S> for $layer {
            type Service = $service<S>;

            fn layer(&self, inner: S) -> $service<S> {
                $service { inner }
            }
        }

        $(#[$service_doc])*
        #[derive(Debug, Clone)]
        pub struct $service<S> {
            inner: S,
        }
    };
}

mod either;

pub use either::Either;

mod audit;
mod cache;
mod hooks;
mod loop_guard;
mod permission;
mod pipeline;
mod question;
mod rate_limit;
mod truncate;

pub use audit::{Audit, AuditFuture, AuditLayer};
pub(crate) use audit::{Trail, announce};
pub use cache::{CacheFuture, CacheLayer, Cached};
pub use hooks::{HooksLayer, WithHooks};
pub use loop_guard::{JudgedFuture, LoopGuardLayer, LoopGuarded};
pub use permission::{Permission, PermissionLayer};
pub use pipeline::{Convert, Pipeline, PipelineFuture};
pub use rate_limit::{RateLimit, RateLimitLayer};
pub use truncate::{Truncate, TruncateFuture, TruncateLayer};

use tower::ServiceBuilder;

use super::ToolReply;

/// A typed call's stack over the pipeline `S` (whose response is the output `O`).
pub type TypedStack<S, O> = Audit<RateLimit<WithHooks<Permission<LoopGuarded<Pipeline<S, O, O>>>>>>;

/// A JSON call's stack over the pipeline `S` (whose response `R` is encoded for a model).
pub type JsonStack<S, R> = Audit<
    Truncate<RateLimit<WithHooks<Permission<LoopGuarded<Cached<Pipeline<S, R, ToolReply>>>>>>>,
>;

/// Governs typed calls to `pipeline`.
pub fn typed<S, O>(pipeline: S) -> TypedStack<S, O> {
    ServiceBuilder::new()
        .layer(AuditLayer)
        .layer(RateLimitLayer)
        .layer(HooksLayer)
        .layer(PermissionLayer)
        .layer(LoopGuardLayer)
        .service(Pipeline::new(pipeline, |output, _| Ok(output)))
}

/// Governs JSON calls to `pipeline`, its responses encoded with `encode`.
pub fn json<S, R>(pipeline: S, encode: Convert<R, ToolReply>) -> JsonStack<S, R> {
    ServiceBuilder::new()
        .layer(AuditLayer)
        .layer(TruncateLayer)
        .layer(RateLimitLayer)
        .layer(HooksLayer)
        .layer(PermissionLayer)
        .layer(LoopGuardLayer)
        .layer(CacheLayer)
        .service(Pipeline::new(pipeline, encode))
}
