//! Commit calls that run to their end, and that the coordinator waits for.
//!
//! A commit call stopped half-way is the one outcome a runtime must never
//! create: dropping its future at an `await` does not stop what the sink
//! handed to a blocking thread, a server or a transaction, so the call may
//! still take effect after the job moved on, while the next attempt of the
//! job commits the same committable. Each call to `Committer::commit` and
//! to the global committer therefore runs in a task of its own that nothing
//! aborts; the job's teardown stops the tasks that made the calls, not the
//! calls, and [`CommitCalls::settle`] waits for every call before the job
//! restarts in this process or returns. A process that dies instead is
//! safe: nothing of it runs on, and the next start asks the destination.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{warn, Instrument};

use crate::error::JobError;

/// The commit calls running in one job, shared by its committer tasks and
/// its coordinator.
#[derive(Debug, Clone)]
pub(crate) struct CommitCalls {
    running: Arc<watch::Sender<usize>>,
}

/// Counts one call as running until dropped, when the call's task ends.
struct Running(Arc<watch::Sender<usize>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl CommitCalls {
    pub(crate) fn new() -> CommitCalls {
        CommitCalls {
            running: Arc::new(watch::channel(0).0),
        }
    }

    /// Runs `call` (which owns the committer and hands it back with the
    /// result) in a task of its own and waits for it. Should the caller's
    /// task be aborted while it waits, the call goes on to its end. A call
    /// that panics fails the job, naming `task`.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        task: &str,
        call: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, JobError> {
        self.running.send_modify(|n| *n += 1);
        let running = Running(Arc::clone(&self.running));
        let call = async move {
            let _running = running;
            call.await
        };
        tokio::spawn(call.in_current_span())
            .await
            .map_err(|e| JobError::Panicked {
                task: task.into(),
                message: e.to_string(),
            })
    }

    /// Waits until no call runs, saying every `every` how many still do.
    /// Called by the coordinator after an attempt of the job ended, before
    /// it restarts the job or returns.
    pub(crate) async fn settle(&self, every: Duration) {
        let mut running = self.running.subscribe();
        while tokio::time::timeout(every, running.wait_for(|&n| n == 0))
            .await
            .is_err()
        {
            warn!(
                running = *running.borrow(),
                "commit calls still run after the job stopped; waiting for them, whose outcome the \
                 next start must see (a process killed instead is safe: its next start asks the \
                 destination)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_caller_is_aborted_runs_to_its_end_and_is_waited_for() {
        let calls = CommitCalls::new();
        let done = Arc::new(AtomicBool::new(false));
        let caller = tokio::spawn({
            let (calls, done) = (calls.clone(), done.clone());
            async move {
                calls
                    .run("test", async move {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        done.store(true, Ordering::SeqCst);
                    })
                    .await
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        caller.abort();
        assert!(!done.load(Ordering::SeqCst));
        calls.settle(Duration::from_secs(5)).await;
        assert!(
            done.load(Ordering::SeqCst),
            "settled only after the call ended"
        );
    }

    #[tokio::test]
    async fn a_call_that_panics_is_an_error_naming_the_task() {
        let calls = CommitCalls::new();
        let error = calls
            .run("committer 3", async { panic!("boom") })
            .await
            .unwrap_err();
        assert!(error.to_string().contains("committer 3"), "{error}");
        calls.settle(Duration::from_secs(1)).await;
    }
}
