//! The items of a vector, split over subtasks.

use std::sync::Arc;

use sink_api::SubtaskIndex;

use super::range::{RangeReader, RangeRecords, RangeSplit};
use super::{Boundedness, Source, SourceError};

/// A bounded source over the items of a vector (or anything collected into
/// one), cut into one contiguous range per subtask. Items are cloned as they
/// are read, so a restore can read them again.
#[derive(Debug)]
pub struct VecSource<T> {
    items: Arc<Vec<T>>,
}

impl<T> VecSource<T> {
    /// A source over `items`.
    pub fn new(items: Vec<T>) -> VecSource<T> {
        VecSource {
            items: Arc::new(items),
        }
    }
}

impl<T> FromIterator<T> for VecSource<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> VecSource<T> {
        VecSource::new(iter.into_iter().collect())
    }
}

/// The records of [`VecSource`]: the items at the indices read.
#[derive(Debug)]
pub struct Items<T>(Arc<Vec<T>>);

impl<T: Clone + Send + Sync + 'static> RangeRecords for Items<T> {
    type Record = T;
    fn extend(&self, range: std::ops::Range<u64>, out: &mut Vec<T>) {
        // Splits come from `create_splits` over this vector, or from a
        // checkpoint of the same job; clamp anyway rather than panic on a
        // restored split that does not fit.
        let len = self.0.len();
        let start = (range.start as usize).min(len);
        let end = (range.end as usize).min(len);
        out.extend_from_slice(&self.0[start..end]);
    }
}

impl<T: Clone + Send + Sync + 'static> Source for VecSource<T> {
    type Record = T;
    type Split = RangeSplit;
    type Reader = RangeReader<Items<T>>;

    /// Its positions are kept in the job's checkpoints only.
    fn position_scope(&self) -> Option<String> {
        None
    }

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_splits(&self, parallelism: usize) -> Vec<RangeSplit> {
        RangeSplit::cut(self.items.len() as u64, parallelism)
    }

    fn create_reader(
        &self,
        _subtask: SubtaskIndex,
        splits: Vec<RangeSplit>,
    ) -> Result<RangeReader<Items<T>>, SourceError> {
        if let Some(bad) = splits.iter().find(|s| s.end > self.items.len() as u64) {
            return Err(SourceError::new(format!(
                "split {}..{} is beyond the {} items of this source; the checkpoint was taken with other input",
                bad.next,
                bad.end,
                self.items.len()
            )));
        }
        Ok(RangeReader::new(
            Items(self.items.clone()),
            splits,
            Boundedness::Bounded,
        ))
    }
}
