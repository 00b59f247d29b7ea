//! The end-of-input remainder, always exercised: each reader emits the
//! first half of its ids, waits until a checkpoint's barrier passed, then
//! hands over the rest together with its end of input, in one read, so no
//! barrier can fall between them. Every subtask then holds records that only
//! the end-of-input `prepare_commit` covers: a sink that drops its remainder
//! loses them in every run.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, InputOf, PositionAdvance};
use sink_runtime::source::{
    Boundedness, CommitOutcome, ReadStatus, Source, SourceError, SourceStart, SplitReader,
};
use sink_runtime::{CheckpointConfig, Job, MemoryCheckpointStorage};

use crate::modes::describe;
use crate::runner::{exactly_once, join, new_job_name};
use crate::Destination;
use crate::RecordMaker;

/// One subtask's ids: `next..end`, the barrier awaited from `half` on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Range {
    next: u64,
    half: u64,
    end: u64,
}

/// The ids `0..count`, cut in one range per subtask.
#[derive(Debug, Clone)]
pub(crate) struct RemainderSource {
    count: u64,
}

pub(crate) struct RemainderReader {
    ranges: Vec<Range>,
    /// A barrier passed once every range reached its half.
    barrier_seen: bool,
}

#[async_trait]
impl SplitReader for RemainderReader {
    type Record = u64;
    type Split = Range;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Result<ReadStatus, SourceError> {
        let first_halves = self.ranges.iter_mut().filter(|r| r.next < r.half);
        let mut room = max.max(1) as u64;
        let mut more = false;
        for range in first_halves {
            let take = room.min(range.half - range.next);
            out.extend(range.next..range.next + take);
            range.next += take;
            room -= take;
            more = true;
        }
        if more {
            return Ok(ReadStatus::More);
        }
        if !self.barrier_seen {
            return Ok(ReadStatus::Idle);
        }
        for range in &mut self.ranges {
            out.extend(range.next..range.end);
            range.next = range.end;
        }
        Ok(ReadStatus::Finished)
    }

    fn snapshot_splits(&self) -> Vec<Range> {
        self.ranges.clone()
    }

    fn on_checkpoint(&mut self, _checkpoint_id: CheckpointId) {
        if self.ranges.iter().all(|r| r.next >= r.half) {
            self.barrier_seen = true;
        }
    }

    // Its positions are kept in the job's checkpoints only; nothing is held
    // outside the process.
    fn on_commit(&mut self, _: CheckpointId, _: CommitOutcome) {}

    async fn seek_committed(&mut self, _: SourceStart) -> Result<(), SourceError> {
        Ok(())
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        Vec::new()
    }

    async fn close(&mut self) {}
}

impl Source for RemainderSource {
    type Record = u64;
    type Split = Range;
    type Reader = RemainderReader;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn position_scope(&self) -> Option<String> {
        None
    }

    fn create_splits(&self, parallelism: usize) -> Vec<Range> {
        let parallelism = parallelism.max(1) as u64;
        (0..parallelism)
            .map(|i| {
                let start = self.count * i / parallelism;
                let end = self.count * (i + 1) / parallelism;
                Range {
                    next: start,
                    half: end - remainder_of(end - start),
                    end,
                }
            })
            .collect()
    }

    fn create_reader(
        &self,
        _subtask: usize,
        splits: Vec<Range>,
    ) -> Result<RemainderReader, SourceError> {
        Ok(RemainderReader {
            ranges: splits,
            barrier_seen: false,
        })
    }
}

/// How many of `len` ids come after the barrier: about half, odd and not
/// a multiple of five, so that a writer handing out fixed-size chunks
/// keeps some back whatever its chunk size.
fn remainder_of(len: u64) -> u64 {
    let mut rest = len / 2;
    if rest.is_multiple_of(2) {
        rest = rest.saturating_sub(1);
    }
    if rest.is_multiple_of(5) {
        rest = rest.saturating_sub(2);
    }
    rest.max(1).min(len)
}

/// Bounded input with checkpoints whose last barrier comes before the
/// second half of every subtask's records: every record committed once.
pub(crate) async fn end_of_input_remainder<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    parallelism: usize,
) -> Result<(), String> {
    // An odd count, so that chunking writers keep records back.
    let records = records + 7;
    let record = std::sync::Arc::clone(record);
    let source = RemainderSource { count: records }.map(move |id| record(id));
    let job = Job::builder(new_job_name(), source, destination.sink().await)
        .parallelism(parallelism)
        .batch_size(16)
        .checkpointing(CheckpointConfig::every(std::time::Duration::from_millis(
            10,
        )))
        .checkpoint_storage(MemoryCheckpointStorage::default())
        .build()
        .map_err(|e| format!("the job could not be built: {e}"))?;
    join(job.start()).await.map_err(describe)?;
    exactly_once(destination.committed_ids().await, records).map_err(|e| {
        format!(
            "{e}: the records after the last checkpoint (half of each subtask's) are committed only \
             through the end-of-input prepare_commit, after flush(true); the writer must hand them out \
             there"
        )
    })
}
