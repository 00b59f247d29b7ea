//! The kit's source: ids `0..n`, paced, turned into the sink's records.

use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use sink_api::SubtaskIndex;
use sink_runtime::source::{
    Boundedness, RangeSplit, ReadStatus, SequenceReader, SequenceSource, Source, SourceError,
    SplitReader,
};

/// Makes the record with id `id`.
pub(crate) type RecordMaker<I> = Arc<dyn Fn(u64) -> I + Send + Sync>;

/// The numbers `0..n` as records of the sink under test.
pub(crate) struct KitSource<I> {
    pub(crate) ids: SequenceSource,
    pub(crate) record: RecordMaker<I>,
}

/// Reads ids and makes records of them.
pub(crate) struct KitReader<I> {
    ids: SequenceReader,
    record: RecordMaker<I>,
    scratch: Vec<u64>,
    _record: PhantomData<fn() -> I>,
}

#[async_trait]
impl<I: Send + 'static> SplitReader for KitReader<I> {
    type Record = I;
    type Split = RangeSplit;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<I>,
    ) -> Result<ReadStatus, SourceError> {
        self.scratch.clear();
        let status = self.ids.read_batch(max, &mut self.scratch).await?;
        out.extend(self.scratch.iter().map(|&id| (self.record)(id)));
        Ok(status)
    }

    fn snapshot_splits(&self) -> Vec<RangeSplit> {
        self.ids.snapshot_splits()
    }
}

impl<I: Send + 'static> Source for KitSource<I> {
    type Record = I;
    type Split = RangeSplit;
    type Reader = KitReader<I>;

    fn boundedness(&self) -> Boundedness {
        self.ids.boundedness()
    }

    fn create_splits(&self, parallelism: usize) -> Vec<RangeSplit> {
        self.ids.create_splits(parallelism)
    }

    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<RangeSplit>,
    ) -> Result<KitReader<I>, SourceError> {
        Ok(KitReader {
            ids: self.ids.create_reader(subtask, splits)?,
            record: self.record.clone(),
            scratch: Vec::new(),
            _record: PhantomData,
        })
    }
}
