//! The numbers `0..n` in a fixed number of partitions whose positions are
//! committed with the data: the in-process stand-in for a partitioned log
//! (a Kafka topic), for tests and for the kit's hand-over scenarios.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, PositionAdvance, SubtaskIndex};

use super::sequence::Pace;
use super::{
    Boundedness, CommitOutcome, PositionTracker, ReadStatus, Source, SourceError, SourceStart,
    SplitReader,
};

/// The numbers `0..count` in `partitions` partitions: partition `p` holds
/// `p, p + partitions, p + 2 × partitions, …`, and its offset `k` is the
/// number `k × partitions + p`. The partitions do not depend on the job's
/// parallelism, so two instances of a job, at any parallelism, read the
/// same partitions, and positions are committed under the source's scope
/// (`p<partition>` within it).
///
/// Bounded, it ends once every number was read; unbounded, a subtask that
/// read its partitions to the end waits forever.
#[derive(Debug, Clone)]
pub struct PartitionedSequence {
    count: u64,
    partitions: u32,
    scope: String,
    split_prefix: String,
    boundedness: Boundedness,
    records_per_second: Option<u64>,
}

impl PartitionedSequence {
    /// The numbers `0..count` in `partitions` partitions (at least one),
    /// positions committed under `scope`; the job ends after the last.
    pub fn bounded(count: u64, partitions: u32, scope: impl Into<String>) -> PartitionedSequence {
        PartitionedSequence {
            count,
            partitions: partitions.max(1),
            scope: scope.into(),
            split_prefix: "p".to_string(),
            boundedness: Boundedness::Bounded,
            records_per_second: None,
        }
    }

    /// Reads at most `records_per_second` records per second in each
    /// subtask, as a live stream would deliver them (0 means no limit).
    pub fn paced(mut self, records_per_second: u64) -> PartitionedSequence {
        self.records_per_second = (records_per_second > 0).then_some(records_per_second);
        self
    }

    /// Names partition `p`'s split `<prefix><p>` instead of `p<p>`: as a
    /// source of another kind would (a Kafka source's are `-/<p>`, with its
    /// scope `kafka/<topic>/<group>`), for a sink that keeps only such
    /// positions.
    pub fn split_prefix(mut self, prefix: impl Into<String>) -> PartitionedSequence {
        self.split_prefix = prefix.into();
        self
    }

    /// As [`bounded`](Self::bounded), but the job does not end after the
    /// last number.
    pub fn unbounded(count: u64, partitions: u32, scope: impl Into<String>) -> PartitionedSequence {
        PartitionedSequence {
            boundedness: Boundedness::Unbounded,
            ..PartitionedSequence::bounded(count, partitions, scope)
        }
    }

    /// How many numbers partition `partition` holds.
    fn end_of(&self, partition: u32) -> u64 {
        let partition = u64::from(partition);
        let partitions = u64::from(self.partitions);
        self.count.saturating_sub(partition).div_ceil(partitions)
    }
}

/// One partition and the offset of its next number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionedSplit {
    /// The partition.
    pub partition: u32,
    /// The offset of the next number to read.
    pub next: u64,
}

/// Reads the partitions of one subtask, a batch from each in turn.
#[derive(Debug)]
pub struct PartitionedReader {
    /// Each split with its end offset.
    splits: Vec<(PartitionedSplit, u64)>,
    partitions: u32,
    split_prefix: String,
    tracker: PositionTracker,
    turn: usize,
    boundedness: Boundedness,
    pace: Option<Pace>,
}

fn split_name(prefix: &str, partition: u32) -> String {
    format!("{prefix}{partition}")
}

impl Source for PartitionedSequence {
    type Record = u64;
    type Split = PartitionedSplit;
    type Reader = PartitionedReader;

    fn boundedness(&self) -> Boundedness {
        self.boundedness
    }

    fn position_scope(&self) -> Option<String> {
        Some(self.scope.clone())
    }

    fn create_splits(&self, _parallelism: usize) -> Vec<PartitionedSplit> {
        (0..self.partitions)
            .map(|partition| PartitionedSplit { partition, next: 0 })
            .collect()
    }

    fn create_reader(
        &self,
        _subtask: SubtaskIndex,
        splits: Vec<PartitionedSplit>,
    ) -> Result<PartitionedReader, SourceError> {
        let splits = splits
            .into_iter()
            .map(|split| {
                if split.partition >= self.partitions {
                    return Err(SourceError::new(format!(
                        "the checkpoint holds partition {} but the source has {} partitions: it \
                         was written by a job of another input",
                        split.partition, self.partitions
                    )));
                }
                Ok((split, self.end_of(split.partition)))
            })
            .collect::<Result<_, _>>()?;
        Ok(PartitionedReader {
            splits,
            partitions: self.partitions,
            split_prefix: self.split_prefix.clone(),
            tracker: PositionTracker::new(self.scope.clone()),
            turn: 0,
            boundedness: self.boundedness,
            pace: self.records_per_second.map(Pace::new),
        })
    }
}

#[async_trait]
impl SplitReader for PartitionedReader {
    type Record = u64;
    type Split = PartitionedSplit;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Result<ReadStatus, SourceError> {
        let max = match &mut self.pace {
            Some(pace) => pace.allowance(max).await,
            None => max,
        };
        let mut left = max as u64;
        for _ in 0..self.splits.len() {
            if left == 0 {
                break;
            }
            self.turn = (self.turn + 1) % self.splits.len();
            let (split, end) = &mut self.splits[self.turn];
            let take = end.saturating_sub(split.next).min(left);
            let partitions = u64::from(self.partitions);
            let partition = u64::from(split.partition);
            out.extend((split.next..split.next + take).map(|k| k * partitions + partition));
            split.next += take;
            left -= take;
            self.tracker
                .set_next(&split_name(&self.split_prefix, split.partition), split.next);
        }
        if let Some(pace) = &mut self.pace {
            pace.read(max as u64 - left);
        }
        let done = self.splits.iter().all(|(split, end)| split.next >= *end);
        Ok(match (done, self.boundedness) {
            (false, _) => ReadStatus::More,
            (true, Boundedness::Bounded) => ReadStatus::Finished,
            (true, Boundedness::Unbounded) => ReadStatus::Idle,
        })
    }

    fn snapshot_splits(&self) -> Vec<PartitionedSplit> {
        self.splits.iter().map(|(split, _)| *split).collect()
    }

    // Its positions go with the data (below); nothing else is tracked per
    // checkpoint or commit, nothing is held outside the process.
    fn on_checkpoint(&mut self, _: CheckpointId) {}

    fn on_commit(&mut self, _: CheckpointId, _: CommitOutcome) {}

    async fn close(&mut self) {}

    async fn seek_committed(&mut self, start: SourceStart) -> Result<(), SourceError> {
        let committed = start.committed;
        for (split, end) in &mut self.splits {
            let name = split_name(&self.split_prefix, split.partition);
            let next = self
                .tracker
                .acquire(&name, committed.get(&name).copied(), 0);
            if next > *end {
                return Err(SourceError::new(format!(
                    "the destination's data of partition {} ends at offset {next}, past the \
                     partition's end {end}: it holds data of another input under the same scope",
                    split.partition
                )));
            }
            split.next = next;
        }
        Ok(())
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        self.tracker.take_advances()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sink_api::CommittedPositions;

    #[tokio::test]
    async fn partitions_cover_every_number_once_and_start_where_the_destination_ends() {
        let source = PartitionedSequence::bounded(10, 3, "t");
        let mut reader = source.create_reader(0, source.create_splits(2)).unwrap();
        let committed = CommittedPositions::from([("p1".to_string(), 2)]);
        reader
            .seek_committed(SourceStart::fixed(committed))
            .await
            .unwrap();
        let mut out = Vec::new();
        while reader.read_batch(2, &mut out).await.unwrap() != ReadStatus::Finished {}
        out.sort_unstable();
        // Partition 1 holds 1, 4, 7; offsets 0 and 1 (1 and 4) are committed.
        assert_eq!(out, vec![0, 2, 3, 5, 6, 7, 8, 9]);
        let advances = reader.take_advances();
        let p1 = advances.iter().find(|a| a.key.split == "p1").unwrap();
        assert_eq!((p1.from, p1.to), (Some(2), 3));
        let p0 = advances.iter().find(|a| a.key.split == "p0").unwrap();
        assert_eq!((p0.from, p0.to), (None, 4));
    }

    #[tokio::test]
    async fn a_destination_past_a_partitions_end_is_an_error() {
        let source = PartitionedSequence::bounded(4, 2, "t");
        let mut reader = source.create_reader(0, source.create_splits(1)).unwrap();
        let committed = CommittedPositions::from([("p0".to_string(), 9)]);
        let error = reader
            .seek_committed(SourceStart::fixed(committed))
            .await
            .unwrap_err();
        assert!(error.message().contains("another input"), "{error}");
    }
}
