//! The numbers `0..n`, split over subtasks: the source of the write-up's demo.

use std::time::Duration;

use async_trait::async_trait;
use sink_api::{CheckpointId, PositionAdvance, SubtaskIndex};

use super::range::{RangeReader, RangeRecords, RangeSplit};
use super::{
    Boundedness, CommitOutcome, ReadStatus, Source, SourceError, SourceStart, SplitReader,
};

/// Produces the records `0..n` (as `u64`), cut into one contiguous range per
/// subtask.
///
/// Bounded, it ends when every number was read. Unbounded, a subtask that ran
/// out of numbers waits forever (like a streaming source whose split
/// enumerator has nothing left to hand out): the job never reaches end of
/// input, so only checkpoints can commit its output.
#[derive(Debug, Clone, Copy)]
pub struct SequenceSource {
    count: u64,
    boundedness: Boundedness,
    records_per_second: Option<u64>,
}

impl SequenceSource {
    /// The numbers `0..count`; the job ends after the last.
    pub fn bounded(count: u64) -> SequenceSource {
        SequenceSource {
            count,
            boundedness: Boundedness::Bounded,
            records_per_second: None,
        }
    }

    /// The numbers `0..count`; then each subtask waits forever.
    pub fn unbounded(count: u64) -> SequenceSource {
        SequenceSource {
            count,
            boundedness: Boundedness::Unbounded,
            records_per_second: None,
        }
    }

    /// Reads at most `records_per_second` records per second in each
    /// subtask, as a live stream would deliver them (0 means no limit).
    pub fn paced(mut self, records_per_second: u64) -> SequenceSource {
        self.records_per_second = (records_per_second > 0).then_some(records_per_second);
        self
    }
}

/// Reads a subtask's numbers, at a limited rate if the source is paced.
pub struct SequenceReader {
    inner: RangeReader<Numbers>,
    pace: Option<Pace>,
}

/// Keeps a reader at `per_second` records per second since its first read.
#[derive(Debug)]
pub(super) struct Pace {
    per_second: u64,
    started: Option<tokio::time::Instant>,
    read: u64,
}

impl Pace {
    /// A pace of `per_second` records per second from the first read.
    pub(super) fn new(per_second: u64) -> Pace {
        Pace {
            per_second,
            started: None,
            read: 0,
        }
    }

    /// `records` more were read.
    pub(super) fn read(&mut self, records: u64) {
        self.read += records;
    }

    /// How many records may be read now; waits until at least one may.
    /// Record `k` (from 0) is due `k / per_second` seconds after the first
    /// read; integer arithmetic, so a due record is never missed by rounding.
    pub(super) async fn allowance(&mut self, max: usize) -> usize {
        let started = *self.started.get_or_insert_with(tokio::time::Instant::now);
        let per_second = u128::from(self.per_second);
        let due_at = |record: u64| {
            let nanos = (u128::from(record) * 1_000_000_000).div_ceil(per_second);
            started + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        };
        tokio::time::sleep_until(due_at(self.read)).await;
        let elapsed = started.elapsed().as_nanos();
        let due = u64::try_from(elapsed * per_second / 1_000_000_000 + 1).unwrap_or(u64::MAX);
        due.saturating_sub(self.read).clamp(1, max.max(1) as u64) as usize
    }
}

#[async_trait]
impl SplitReader for SequenceReader {
    type Record = u64;
    type Split = RangeSplit;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Result<ReadStatus, SourceError> {
        let max = match &mut self.pace {
            Some(pace) => pace.allowance(max).await,
            None => max,
        };
        let before = out.len();
        let status = self.inner.read_batch(max, out).await?;
        if let Some(pace) = &mut self.pace {
            pace.read((out.len() - before) as u64);
        }
        Ok(status)
    }

    fn snapshot_splits(&self) -> Vec<RangeSplit> {
        self.inner.snapshot_splits()
    }

    // Wraps a range reader: everything but the pace is the inner reader's.
    fn on_checkpoint(&mut self, checkpoint_id: CheckpointId) {
        self.inner.on_checkpoint(checkpoint_id);
    }

    fn on_commit(&mut self, checkpoint_id: CheckpointId, outcome: CommitOutcome) {
        self.inner.on_commit(checkpoint_id, outcome);
    }

    async fn seek_committed(&mut self, start: SourceStart) -> Result<(), SourceError> {
        self.inner.seek_committed(start).await
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        self.inner.take_advances()
    }

    async fn close(&mut self) {
        self.inner.close().await;
    }
}

/// The records of [`SequenceSource`]: each index is its own record.
#[derive(Debug, Clone, Copy)]
pub struct Numbers;

impl RangeRecords for Numbers {
    type Record = u64;
    fn extend(&self, range: std::ops::Range<u64>, out: &mut Vec<u64>) {
        out.extend(range);
    }
}

impl Source for SequenceSource {
    type Record = u64;
    type Split = RangeSplit;
    type Reader = SequenceReader;

    /// Its positions are kept in the job's checkpoints only.
    fn position_scope(&self) -> Option<String> {
        None
    }

    fn boundedness(&self) -> Boundedness {
        self.boundedness
    }

    fn create_splits(&self, parallelism: usize) -> Vec<RangeSplit> {
        RangeSplit::cut(self.count, parallelism)
    }

    fn create_reader(
        &self,
        _subtask: SubtaskIndex,
        splits: Vec<RangeSplit>,
    ) -> Result<SequenceReader, SourceError> {
        Ok(SequenceReader {
            inner: RangeReader::new(Numbers, splits, self.boundedness),
            pace: self.records_per_second.map(Pace::new),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn drain(reader: &mut SequenceReader) -> (Vec<u64>, ReadStatus) {
        let mut out = Vec::new();
        loop {
            let status = reader.read_batch(3, &mut out).await.unwrap();
            if status != ReadStatus::More {
                return (out, status);
            }
        }
    }

    #[tokio::test]
    async fn bounded_reads_its_range_then_finishes() {
        let source = SequenceSource::bounded(10);
        let mut splits = source.create_splits(2);
        let mut reader = source.create_reader(1, vec![splits.remove(1)]).unwrap();
        let (records, status) = drain(&mut reader).await;
        assert_eq!(records, (5..10).collect::<Vec<_>>());
        assert_eq!(status, ReadStatus::Finished);
    }

    #[tokio::test]
    async fn unbounded_goes_idle_and_snapshots_resume_exactly() {
        let source = SequenceSource::unbounded(10);
        let mut reader = source.create_reader(0, source.create_splits(1)).unwrap();
        let mut out = Vec::new();
        reader.read_batch(4, &mut out).await.unwrap();
        let snapshot = reader.snapshot_splits();
        assert_eq!(snapshot, vec![RangeSplit { next: 4, end: 10 }]);
        let mut resumed = source.create_reader(0, snapshot).unwrap();
        let (rest, status) = drain(&mut resumed).await;
        assert_eq!(rest, (4..10).collect::<Vec<_>>());
        assert_eq!(status, ReadStatus::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_source_reads_at_its_rate() {
        let source = SequenceSource::bounded(1_000).paced(100);
        let mut reader = source.create_reader(0, source.create_splits(1)).unwrap();
        let started = tokio::time::Instant::now();
        let (records, status) = drain(&mut reader).await;
        assert_eq!(records, (0..1_000).collect::<Vec<_>>());
        assert_eq!(status, ReadStatus::Finished);
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(9_900) && elapsed <= Duration::from_millis(10_100),
            "1000 records at 100 per second: {elapsed:?}"
        );
    }
}
