//! The runtime's tools by name: typed handles and a JSON entry point for each.

use std::any::Any;
use std::sync::Arc;

use futures::future::BoxFuture;
use guildhall_actors::{CallError, Tool, ToolSpec, WorkerPool, args};
use serde_json::Value;
use tower::ServiceExt;

use crate::governance::{Governed, ToolReply, layers};
use crate::options::CallOptions;
use crate::pipeline::{ToolCall, ToolService};

/// A tool's typed stack: governance around its pipeline.
pub(crate) type TypedStack<T> = Governed<
    layers::TypedStack<ToolService<T>, <T as Tool>::Output>,
    <T as Tool>::Input,
    <T as Tool>::Output,
>;
/// A tool's JSON stack: the same pipeline, with results encoded for a model.
pub(crate) type JsonStack<T> =
    Governed<layers::JsonStack<ToolService<T>, <T as Tool>::Output>, <T as Tool>::Input, ToolReply>;

/// A typed handle to one registered tool; calls skip JSON entirely (governance still sees
/// every call). Cheap to clone.
pub struct ToolHandle<T: Tool> {
    service: TypedStack<T>,
    /// The pipeline alone, for calls governance has nothing to do for.
    pipeline: ToolService<T>,
    timeout: std::time::Duration,
}

impl<T: Tool> Clone for ToolHandle<T> {
    fn clone(&self) -> Self {
        Self {
            service: self.service.clone(),
            pipeline: self.pipeline.clone(),
            timeout: self.timeout,
        }
    }
}

impl<T: Tool> ToolHandle<T> {
    pub(crate) fn new(
        service: TypedStack<T>,
        pipeline: ToolService<T>,
        timeout: std::time::Duration,
    ) -> Self {
        Self {
            service,
            pipeline,
            timeout,
        }
    }

    /// Calls the tool with default options.
    ///
    /// # Errors
    /// See [`CallError`]; every call ends in exactly one result.
    ///
    /// # Cancel safety
    /// Dropping the future fires the call's cancellation token; a tool that ignores it is
    /// restarted after its grace period.
    pub async fn call(&self, input: T::Input) -> Result<T::Output, CallError> {
        self.call_with(input, CallOptions::default()).await
    }

    /// Calls the tool as `options` says.
    ///
    /// # Errors
    /// See [`CallError`].
    ///
    /// # Cancel safety
    /// As [`call`](Self::call).
    pub async fn call_with(
        &self,
        input: T::Input,
        options: CallOptions,
    ) -> Result<T::Output, CallError> {
        let (ctx, asker) = options.into_call(self.timeout);
        let call = ToolCall { input, ctx };
        if self.service.governance().lets_typed_calls_pass() {
            // Straight to the pipeline, exactly as without governance.
            return self.pipeline.clone().oneshot(call).await;
        }
        // Boxed: the governed future is large, and kept inline it would make every typed
        // call's future as large, the bypassing ones included.
        Box::pin(self.service.call(call, asker)).await
    }
}

/// A registered tool with its types erased.
pub(crate) trait ErasedTool: Send + Sync + 'static {
    fn spec(&self) -> &ToolSpec;
    fn call_json(
        &self,
        args: Value,
        options: CallOptions,
    ) -> BoxFuture<'static, Result<ToolReply, CallError>>;
    fn as_any(&self) -> &dyn Any;
    fn close(&self);
    /// How long a call may take unless its options say otherwise.
    fn timeout(&self) -> std::time::Duration;
    /// The ids of the tool's actors under the `tools` supervisor.
    fn actor_ids(&self) -> &[Box<str>];
    /// Whether MCP's `tools/list` shows it.
    fn listed(&self) -> bool;
}

pub(crate) struct ToolEntry<T: Tool> {
    /// The tool's name, shared with its pipeline.
    pub(crate) name: Arc<str>,
    pub(crate) spec: ToolSpec,
    pub(crate) handle: ToolHandle<T>,
    pub(crate) json: JsonStack<T>,
    pub(crate) pool: WorkerPool<T>,
    pub(crate) actor_ids: Vec<Box<str>>,
    pub(crate) listed: bool,
}

impl<T: Tool> ErasedTool for ToolEntry<T> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call_json(
        &self,
        args: Value,
        options: CallOptions,
    ) -> BoxFuture<'static, Result<ToolReply, CallError>> {
        let (ctx, asker) = options.into_call(self.handle.timeout);
        let input: T::Input = match args::decode(&self.name, args) {
            Ok(input) => input,
            Err(err) => {
                // Refused before governance could see typed arguments: still audited.
                return Box::pin(std::future::ready(self.json.refuse(&ctx, err)));
            }
        };
        let call = ToolCall { input, ctx };
        Box::pin(self.json.call(call, asker))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn close(&self) {
        self.pool.close();
    }

    fn timeout(&self) -> std::time::Duration {
        self.handle.timeout
    }

    fn actor_ids(&self) -> &[Box<str>] {
        &self.actor_ids
    }

    fn listed(&self) -> bool {
        self.listed
    }
}
