//! The numbers `0..n`, split over subtasks: the source of the write-up's demo.

use sink_api::SubtaskIndex;

use super::range::{RangeReader, RangeRecords, RangeSplit};
use super::{Boundedness, Source, SourceError};

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
}

impl SequenceSource {
    /// The numbers `0..count`; the job ends after the last.
    pub fn bounded(count: u64) -> SequenceSource {
        SequenceSource {
            count,
            boundedness: Boundedness::Bounded,
        }
    }

    /// The numbers `0..count`; then each subtask waits forever.
    pub fn unbounded(count: u64) -> SequenceSource {
        SequenceSource {
            count,
            boundedness: Boundedness::Unbounded,
        }
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
    type Reader = RangeReader<Numbers>;

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
    ) -> Result<RangeReader<Numbers>, SourceError> {
        Ok(RangeReader::new(Numbers, splits, self.boundedness))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{ReadStatus, SplitReader};

    async fn drain(reader: &mut RangeReader<Numbers>) -> (Vec<u64>, ReadStatus) {
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
}
