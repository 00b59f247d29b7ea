//! Splits that are ranges of indices, and a reader over them: the common
//! ground of the sequence and vector sources.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use sink_api::{CheckpointId, PositionAdvance};

use super::{Boundedness, CommitOutcome, ReadStatus, SourceError, SourceStart, SplitReader};

/// The indices `next..end` still to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSplit {
    /// The next index to read.
    pub next: u64,
    /// One past the last index.
    pub end: u64,
}

impl RangeSplit {
    /// Cuts `0..len` into `parts` contiguous splits of nearly equal size.
    pub fn cut(len: u64, parts: usize) -> Vec<RangeSplit> {
        let parts = parts.max(1) as u64;
        (0..parts)
            .map(|k| RangeSplit {
                next: len * k / parts,
                end: len * (k + 1) / parts,
            })
            .collect()
    }

    fn remaining(&self) -> u64 {
        self.end.saturating_sub(self.next)
    }
}

/// Turns a range of indices into records: implement it to get a replayable
/// source over anything indexable, read through [`RangeReader`].
pub trait RangeRecords: Send + Sync + 'static {
    /// The records produced.
    type Record: Send + 'static;
    /// Appends the records at the indices of `range`, in order, to `out`.
    fn extend(&self, range: std::ops::Range<u64>, out: &mut Vec<Self::Record>);
}

/// Reads a subtask's range splits in order; the reader of the built-in
/// sources.
pub struct RangeReader<R> {
    records: R,
    splits: Vec<RangeSplit>,
    boundedness: Boundedness,
}

impl<R> RangeReader<R> {
    /// A reader of `splits`, producing records through `records`; when they
    /// are read, it finishes (bounded) or idles forever (unbounded).
    pub fn new(records: R, splits: Vec<RangeSplit>, boundedness: Boundedness) -> Self {
        RangeReader {
            records,
            splits: splits.into_iter().filter(|s| s.remaining() > 0).collect(),
            boundedness,
        }
    }
}

#[async_trait]
impl<R: RangeRecords> SplitReader for RangeReader<R> {
    type Record = R::Record;
    type Split = RangeSplit;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<R::Record>,
    ) -> Result<ReadStatus, SourceError> {
        let Some(split) = self.splits.first_mut() else {
            return Ok(match self.boundedness {
                Boundedness::Bounded => ReadStatus::Finished,
                Boundedness::Unbounded => ReadStatus::Idle,
            });
        };
        let take = split.remaining().min(max as u64);
        self.records.extend(split.next..split.next + take, out);
        split.next += take;
        if split.remaining() == 0 {
            self.splits.remove(0);
        }
        Ok(ReadStatus::More)
    }

    fn snapshot_splits(&self) -> Vec<RangeSplit> {
        self.splits.clone()
    }

    // A reader of its own input: nothing is tracked per checkpoint or
    // commit, no position is committed with the data, nothing is held
    // outside the process.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_covers_the_range_without_overlap() {
        for (len, parts) in [(160, 2), (10, 3), (2, 5), (0, 2)] {
            let splits = RangeSplit::cut(len, parts);
            assert_eq!(splits.len(), parts);
            assert_eq!(splits[0].next, 0);
            assert_eq!(splits[parts - 1].end, len);
            for pair in splits.windows(2) {
                assert_eq!(pair[0].end, pair[1].next);
            }
        }
    }
}
