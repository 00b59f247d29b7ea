//! A source's failure: a transient one is restarted by the job's restart
//! strategy; a permanent one (`SourceError::permanent`) fails the job at
//! once, whatever the strategy.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sink_api::{CheckpointId, PositionAdvance, SubtaskIndex};
use sink_runtime::source::{
    Boundedness, CommitOutcome, ReadStatus, Source, SourceError, SourceStart, SplitReader,
};
use sink_runtime::{Job, JobError, RestartStrategy};
use sinks_memory::{MemorySink, MemoryStore};

/// A source whose every reader fails at its first read; counts the
/// readers made (one per start).
#[derive(Clone)]
struct Failing {
    permanent: bool,
    starts: Arc<AtomicU32>,
}

struct FailingReader {
    permanent: bool,
}

#[sink_api::async_trait]
impl SplitReader for FailingReader {
    type Record = u64;
    type Split = ();

    async fn read_batch(&mut self, _: usize, _: &mut Vec<u64>) -> Result<ReadStatus, SourceError> {
        let error = SourceError::new("the input cannot be read");
        Err(match self.permanent {
            true => error.permanent(),
            false => error,
        })
    }

    fn snapshot_splits(&self) -> Vec<()> {
        vec![()]
    }

    fn on_checkpoint(&mut self, _: CheckpointId) {}

    fn on_commit(&mut self, _: CheckpointId, _: CommitOutcome) {}

    async fn seek_committed(&mut self, _: SourceStart) -> Result<(), SourceError> {
        Ok(())
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        Vec::new()
    }

    async fn close(&mut self) {}
}

impl Source for Failing {
    type Record = u64;
    type Split = ();
    type Reader = FailingReader;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn position_scope(&self) -> Option<String> {
        None
    }

    fn create_splits(&self, parallelism: usize) -> Vec<()> {
        vec![(); parallelism]
    }

    fn create_reader(&self, _: SubtaskIndex, _: Vec<()>) -> Result<FailingReader, SourceError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        Ok(FailingReader {
            permanent: self.permanent,
        })
    }
}

async fn run(permanent: bool) -> (JobError, u32) {
    let source = Failing {
        permanent,
        starts: Arc::default(),
    };
    let starts = Arc::clone(&source.starts);
    let error = Job::builder(
        "source-errors",
        source,
        MemorySink::new(MemoryStore::<u64>::new()),
    )
    .restart_strategy(RestartStrategy::FixedDelay {
        attempts: 3,
        delay: Duration::from_millis(1),
    })
    .build()
    .unwrap()
    .run()
    .await
    .expect_err("the source fails");
    (error, starts.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_permanent_source_error_fails_the_job_at_once_and_a_transient_one_is_restarted() {
    let (error, starts) = run(true).await;
    assert_eq!(starts, 1, "a permanent error was restarted: {error}");
    assert!(!error.is_restartable(), "{error:?}");
    assert!(
        error.to_string().contains("the input cannot be read"),
        "{error}"
    );
    let (error, starts) = run(false).await;
    assert_eq!(starts, 4, "three restarts of a transient error: {error}");
    assert!(error.is_restartable(), "{error:?}");
}
