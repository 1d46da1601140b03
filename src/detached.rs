//! Work that runs to its end whether or not its caller keeps waiting: changes made in
//! several steps (a tool deregistered, then the list of what is registered updated) that
//! must never stop halfway because the caller's future was dropped.

use std::future::Future;

/// Runs `work` on a task of its own and waits for it. Dropping the returned future stops
/// the waiting, not the work. `None` when the runtime shut down before the work ended; a
/// panic in the work resumes in the caller.
pub(crate) async fn run_to_end<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    match tokio::spawn(work).await {
        Ok(done) => Some(done),
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(_) => None,
    }
}
