//! The innermost service: hands the call to the tool's actors.

use std::task::{Context, Poll};

use guildhall_actors::{CallError, Dispatched, Tool, WorkerPool};
use tower::Service;

use super::ToolCall;

/// Sends each call to the least busy actor of one tool and awaits its single reply.
pub struct Dispatch<T: Tool> {
    pool: WorkerPool<T>,
}

impl<T: Tool> Dispatch<T> {
    /// Dispatches to `pool`.
    pub fn new(pool: WorkerPool<T>) -> Self {
        Self { pool }
    }
}

impl<T: Tool> Clone for Dispatch<T> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
        }
    }
}

impl<T: Tool> Service<ToolCall<T::Input>> for Dispatch<T> {
    type Response = T::Output;
    type Error = CallError;
    type Future = Dispatched<T>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolCall<T::Input>) -> Self::Future {
        self.pool.dispatch(req.input, req.ctx)
    }
}
