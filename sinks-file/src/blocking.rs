//! Where the file sink's blocking file work runs: fsyncs, renames,
//! creations and truncations go to tokio's blocking threads through
//! [`blocking`], never on the async workers, where they would stall every
//! task sharing the thread (a slow disk's fsync takes tens of
//! milliseconds). Buffered appends stay on the writer's task: they reach the
//! page cache, one `write` per megabyte.
//!
//! Debug builds check the rule: the functions that fsync or rename call
//! [`assert_blocking`], which fails when they run outside [`blocking`]. The
//! marker is per thread and set only for the duration of one piece of work.

use std::cell::Cell;

use sink_api::SinkError;

thread_local! {
    /// True while this thread runs work handed to [`blocking`]. Read only by
    /// the debug assertion.
    static IN_BLOCKING_WORK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` on tokio's blocking threads and waits for it. Called by the
/// file sink's async methods around every fsync, rename and creation.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SinkError> + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(move || {
        IN_BLOCKING_WORK.with(|flag| flag.set(true));
        let result = work();
        IN_BLOCKING_WORK.with(|flag| flag.set(false));
        result
    })
    .await
    .map_err(|e| SinkError::msg(format!("a blocking file task ended abnormally: {e}")))?
}

/// Starts `work` on tokio's blocking threads without waiting for it, marked
/// as [`blocking`] marks its work: for background work whose caller goes
/// on (the compactor's merge rounds) and awaits the handle later.
pub(crate) fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(move || {
        IN_BLOCKING_WORK.with(|flag| flag.set(true));
        let result = work();
        IN_BLOCKING_WORK.with(|flag| flag.set(false));
        result
    })
}

/// Runs `work` on this thread as if handed to [`blocking`]: for unit tests
/// that call blocking functions directly, on a thread of their own.
#[cfg(test)]
pub(crate) fn on_this_thread<T>(work: impl FnOnce() -> T) -> T {
    IN_BLOCKING_WORK.with(|flag| flag.set(true));
    let result = work();
    IN_BLOCKING_WORK.with(|flag| flag.set(false));
    result
}

/// Fails (in debug builds) when `what`, a blocking file operation, runs
/// outside [`blocking`].
pub(crate) fn assert_blocking(what: &str) {
    debug_assert!(
        IN_BLOCKING_WORK.with(Cell::get),
        "{what} must run through blocking(), off the async workers"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_handed_over_runs_marked_and_the_caller_is_not() {
        assert!(!IN_BLOCKING_WORK.with(Cell::get));
        let marked = blocking(|| Ok(IN_BLOCKING_WORK.with(Cell::get)))
            .await
            .unwrap();
        assert!(marked);
        assert!(!IN_BLOCKING_WORK.with(Cell::get));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "must run through blocking()")]
    fn an_fsync_outside_is_caught() {
        assert_blocking("an fsync");
    }
}
