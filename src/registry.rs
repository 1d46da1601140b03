//! The runtime's tools by name: typed handles and a JSON entry point for each.

use std::any::Any;
use std::sync::Arc;

use futures::future::BoxFuture;
use guildhall_actors::{CallContext, CallError, Tool, ToolSpec, WorkerPool, args};
use serde_json::Value;
use tower::ServiceExt;

use crate::governance::{Governed, Request, ToolReply};
use crate::options::CallOptions;
use crate::pipeline::{ToolCall, ToolService};

/// A tool's typed stack: governance around its pipeline.
type TypedStack<T> = Governed<ToolService<T>, <T as Tool>::Input, <T as Tool>::Output>;
/// A tool's JSON stack: the same pipeline, with results encoded for a model.
type JsonStack<T> = Governed<ToolService<T>, <T as Tool>::Input, ToolReply>;

/// A typed handle to one registered tool; calls skip JSON entirely (governance still sees
/// every call). Cheap to clone.
pub struct ToolHandle<T: Tool> {
    service: TypedStack<T>,
    timeout: std::time::Duration,
}

impl<T: Tool> Clone for ToolHandle<T> {
    fn clone(&self) -> Self {
        Self {
            service: self.service.clone(),
            timeout: self.timeout,
        }
    }
}

impl<T: Tool> ToolHandle<T> {
    pub(crate) fn new(service: TypedStack<T>, timeout: std::time::Duration) -> Self {
        Self { service, timeout }
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
        let timeout = options.timeout.unwrap_or(self.timeout);
        let ctx = CallContext::new(options.agent, options.session, timeout, options.observer);
        let call = ToolCall { input, ctx };
        if let Some(pipeline) = self.service.bypass() {
            return pipeline.clone().oneshot(call).await;
        }
        self.service
            .call_ref(Request {
                call,
                asker: options.asker,
            })
            .await
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
}

pub(crate) struct ToolEntry<T: Tool> {
    /// The tool's name, shared with its pipeline.
    pub(crate) name: Arc<str>,
    pub(crate) spec: ToolSpec,
    pub(crate) handle: ToolHandle<T>,
    pub(crate) json: JsonStack<T>,
    pub(crate) pool: WorkerPool<T>,
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
        let timeout = options.timeout.unwrap_or(self.handle.timeout);
        let ctx = CallContext::new(options.agent, options.session, timeout, options.observer);
        let input: T::Input = match args::decode(&self.name, args) {
            Ok(input) => input,
            Err(err) => {
                // Refused before governance could see typed arguments: still audited.
                return Box::pin(self.json.refuse(&ctx, err));
            }
        };
        let call = ToolCall { input, ctx };
        Box::pin(self.json.call_ref(Request {
            call,
            asker: options.asker,
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn close(&self) {
        self.pool.close();
    }
}
