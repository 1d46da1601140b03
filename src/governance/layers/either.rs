//! [`Either`] of two futures, polled in place: [`futures::future::Either`]'s `poll` stayed out
//! of line under the governance stack's nesting (`perf`: about 60 ns of a governed call in
//! it), and each nested level then moved the call's answer up once more. See "Built in
//! place" in `layers.rs`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// One future or the other, as a layer's branch chose.
    #[project = Proj]
    #[derive(Debug)]
    // pin-project-lite takes no doc on a variant's field: `inner` is the future.
    #[allow(missing_docs)]
    pub enum Either<A, B> {
        /// The first.
        Left { #[pin] inner: A },
        /// The second.
        Right { #[pin] inner: B },
    }
}

impl<A, B> Either<A, B> {
    /// The first future.
    #[inline(always)]
    pub fn left(inner: A) -> Self {
        Self::Left { inner }
    }

    /// The second future.
    #[inline(always)]
    pub fn right(inner: B) -> Self {
        Self::Right { inner }
    }
}

impl<A, B> Future for Either<A, B>
where
    A: Future,
    B: Future<Output = A::Output>,
{
    type Output = A::Output;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<A::Output> {
        match self.project() {
            Proj::Left { inner } => inner.poll(cx),
            Proj::Right { inner } => inner.poll(cx),
        }
    }
}
