//! What each task starts with: fresh splits, or the state of the newest
//! completed checkpoint.
//!
//! On a fresh start the source cuts its input into splits and split `k` goes
//! to subtask `k % parallelism`. On a restore, every part of the checkpoint is
//! decoded and handed back: source splits, writer states and pending
//! committables (to the subtask that stored them, or spread over the new
//! subtasks when the parallelism changed), and the global committer's
//! received committables.

use sink_api::{deserialize_versioned, CheckpointId, Generation, Lineage, Sink};
use sink_api::{CommittableOf, InputOf, WriterStateOf};

use tracing::info;

use crate::core::ledger::SubtaskPart;
use crate::core::placement::{fresh_home, pending_home, Dealer};
use crate::error::JobError;
use crate::source::Source;
use crate::storage::{decode_pending, CompletedCheckpoint};
use crate::task::subtask::Serializers;

/// What one subtask starts with.
pub(crate) struct SubtaskStart<Src: Source, S: Sink> {
    pub splits: Vec<Src::Split>,
    pub writer_states: Vec<WriterStateOf<S>>,
    pub pending: Vec<SubtaskPart<CommittableOf<S>>>,
}

/// What the whole job starts with.
pub(crate) struct StartPlan<Src: Source, S: Sink> {
    pub restored: Option<CheckpointId>,
    /// The parallelism of the restored checkpoint (the job's own on a fresh
    /// start): the subtasks the global committer expects for checkpoints up to
    /// the restored one.
    pub restored_parallelism: usize,
    pub generation: Generation,
    /// The restored checkpoint's lineage; on a fresh start a new one, which
    /// the coordinator replaces by the one the checkpoint storage keeps
    /// (`CheckpointStorage::lineage`); on a restore from a checkpoint of
    /// format 1, which has none, a new one.
    pub lineage: Lineage,
    pub subtasks: Vec<SubtaskStart<Src, S>>,
    pub global_pending: Vec<SubtaskPart<CommittableOf<S>>>,
}

/// A lineage never drawn before: 128 random bits, as 32 hex digits.
pub(crate) fn new_lineage() -> Lineage {
    Lineage::new(uuid::Uuid::new_v4().simple().to_string())
}

/// Plans a fresh start, or a restore from `latest`.
pub(crate) fn plan<Src, S>(
    job_name: &str,
    source: &Src,
    parallelism: usize,
    serializers: &Serializers<S, Src>,
    latest: Option<CompletedCheckpoint>,
    generation: Generation,
) -> Result<StartPlan<Src, S>, JobError>
where
    Src: Source<Record = InputOf<S>>,
    S: Sink,
{
    let mut subtasks: Vec<SubtaskStart<Src, S>> = (0..parallelism)
        .map(|_| SubtaskStart {
            splits: Vec::new(),
            writer_states: Vec::new(),
            pending: Vec::new(),
        })
        .collect();
    let Some(checkpoint) = latest else {
        for (k, split) in source.create_splits(parallelism).into_iter().enumerate() {
            subtasks[fresh_home(k, parallelism)].splits.push(split);
        }
        return Ok(StartPlan {
            restored: None,
            restored_parallelism: parallelism,
            generation,
            lineage: new_lineage(),
            subtasks,
            global_pending: Vec::new(),
        });
    };

    let checkpoint_id = checkpoint.checkpoint_id;
    let refuse = |message: String| JobError::Restore {
        checkpoint_id,
        message,
    };
    if checkpoint.job_name != job_name {
        return Err(refuse(format!(
            "it belongs to job '{}', not '{job_name}'; give each job its own checkpoint storage",
            checkpoint.job_name
        )));
    }
    let decode = |what: &str, error: sink_api::SerializerError| {
        refuse(format!("cannot decode {what}: {error}"))
    };
    // Writer states and splits: see `core::placement`.
    let (mut states_dealer, mut splits_dealer) = (
        Dealer::new(checkpoint.parallelism, parallelism),
        Dealer::new(checkpoint.parallelism, parallelism),
    );
    if states_dealer.rescaled() {
        info!(from = checkpoint.parallelism, to = parallelism, checkpoint = %checkpoint_id,
            "restoring with another parallelism: spreading writer states, splits and pending committables");
    }
    // Writer states stay with their subtask when the parallelism is the same,
    // and are dealt round-robin otherwise; so are splits (a source may keep
    // per-split state that its producers route to, such as the pipeline's
    // idempotency keys). Pending committables go to subtask `origin % parallelism`,
    // keeping their origin, so that each is committed exactly once and the
    // global committer still sees every original subtask's part
    // (`core::placement`).
    let indices: Vec<usize> = checkpoint.subtasks.iter().map(|s| s.subtask).collect();
    if indices != (0..checkpoint.parallelism).collect::<Vec<_>>() {
        return Err(refuse(format!(
            "it holds the subtasks {indices:?}, not each of 0..{} once; the checkpoint is inconsistent",
            checkpoint.parallelism
        )));
    }
    for snapshot in checkpoint.subtasks {
        let states: Vec<WriterStateOf<S>> = snapshot
            .writer_states
            .iter()
            .map(|blob| deserialize_versioned(serializers.writer_state.as_ref(), blob))
            .collect::<Result<_, _>>()
            .map_err(|e| decode("a writer state", e))?;
        for state in states {
            subtasks[states_dealer.next(snapshot.subtask)]
                .writer_states
                .push(state);
        }
        for part in decode_pending(&snapshot.pending, serializers.committable.as_ref())
            .map_err(|e| decode("a pending committable", e))?
        {
            let summary = part.summary;
            if summary.committable_count != part.committables.len() as u64
                || summary.subtask >= checkpoint.parallelism
                || summary.checkpoint_id > checkpoint_id
            {
                return Err(refuse(format!(
                    "subtask {} holds a part of checkpoint {} from subtask {} announcing {} committables \
                     with {} present; the checkpoint is inconsistent",
                    snapshot.subtask,
                    summary.checkpoint_id,
                    summary.subtask,
                    summary.committable_count,
                    part.committables.len()
                )));
            }
            subtasks[pending_home(summary.subtask, parallelism)]
                .pending
                .push(part);
        }
        let splits: Vec<Src::Split> = (serializers.splits)
            .decode(&snapshot.source_splits)
            .map_err(|e| decode("the source position", e))?;
        for split in splits {
            subtasks[splits_dealer.next(snapshot.subtask)]
                .splits
                .push(split);
        }
    }
    let global_pending = match &checkpoint.global_committer {
        Some(global) => decode_pending(&global.pending, serializers.committable.as_ref())
            .map_err(|e| decode("a committable of the global committer", e))?,
        None => Vec::new(),
    };
    Ok(StartPlan {
        restored: Some(checkpoint_id),
        restored_parallelism: checkpoint.parallelism,
        generation,
        lineage: checkpoint.lineage.clone().unwrap_or_else(new_lineage),
        subtasks,
        global_pending,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sink_api::{serialize_versioned, Sink};
    use sinks_memory::{MemorySink, MemoryStore, MemoryWriterState};

    use super::*;
    use crate::source::{RangeSplit, SequenceSource};
    use crate::storage::SubtaskSnapshot;

    type TestSink = MemorySink<u64>;

    fn serializers() -> Serializers<TestSink, SequenceSource> {
        let sink = MemorySink::new(MemoryStore::new());
        Serializers {
            committable: sink.committable_serializer(),
            writer_state: sink.writer_state_serializer(),
            splits: Arc::new(crate::source::BincodeSplits::default()),
        }
    }

    /// Two subtasks, each with two splits (`next` = 100·subtask + k) and two
    /// writer states (`next_transaction_seq` = 10·subtask + k).
    fn checkpoint(serializers: &Serializers<TestSink, SequenceSource>) -> CompletedCheckpoint {
        let subtasks = (0..2u64)
            .map(|subtask| {
                let splits: Vec<RangeSplit> = (0..2)
                    .map(|k| RangeSplit {
                        next: 100 * subtask + k,
                        end: 1_000,
                    })
                    .collect();
                let writer_states = (0..2)
                    .map(|k| {
                        let state = MemoryWriterState::<u64> {
                            next_transaction_seq: 10 * subtask + k,
                            buffered: Vec::new(),
                        };
                        serialize_versioned(serializers.writer_state.as_ref(), &state).unwrap()
                    })
                    .collect();
                SubtaskSnapshot {
                    subtask: subtask as usize,
                    source_splits: serializers.splits.encode(&splits).unwrap(),
                    writer_states,
                    pending: Vec::new(),
                    end_of_input: false,
                }
            })
            .collect();
        CompletedCheckpoint {
            checkpoint_id: CheckpointId(4),
            job_name: "plan".into(),
            generation: Generation(1),
            lineage: Some(Lineage::new("plan-lineage")),
            parallelism: 2,
            subtasks,
            global_committer: None,
            is_final: false,
            counters: std::collections::BTreeMap::new(),
        }
    }

    fn planned(parallelism: usize) -> Vec<(Vec<u64>, Vec<u64>)> {
        let serializers = serializers();
        let latest = checkpoint(&serializers);
        let plan = plan::<SequenceSource, TestSink>(
            "plan",
            &SequenceSource::bounded(1_000),
            parallelism,
            &serializers,
            Some(latest),
            Generation(2),
        )
        .unwrap();
        plan.subtasks
            .iter()
            .map(|start| {
                (
                    start.splits.iter().map(|s| s.next).collect(),
                    start
                        .writer_states
                        .iter()
                        .map(|s| s.next_transaction_seq)
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn with_the_same_parallelism_splits_and_states_stay_with_their_subtask() {
        assert_eq!(
            planned(2),
            vec![(vec![0, 1], vec![0, 1]), (vec![100, 101], vec![10, 11])]
        );
    }

    #[test]
    fn with_another_parallelism_splits_and_states_are_dealt_round_robin() {
        assert_eq!(
            planned(3),
            vec![
                (vec![0, 101], vec![0, 11]),
                (vec![1], vec![1]),
                (vec![100], vec![10]),
            ]
        );
    }

    fn lineage_of(latest: Option<CompletedCheckpoint>) -> Lineage {
        plan::<SequenceSource, TestSink>(
            "plan",
            &SequenceSource::bounded(1_000),
            2,
            &serializers(),
            latest,
            Generation(2),
        )
        .unwrap()
        .lineage
    }

    #[test]
    fn a_restore_keeps_the_lineage_and_a_fresh_start_draws_a_new_one() {
        let restored = checkpoint(&serializers());
        assert_eq!(
            lineage_of(Some(restored.clone())),
            Lineage::new("plan-lineage")
        );
        let (first, second) = (lineage_of(None), lineage_of(None));
        assert_ne!(first, second, "two fresh starts, two lineages");
        assert_eq!(first.as_str().len(), 32);
        // A checkpoint of format 1 has none: its restore draws one.
        let old = CompletedCheckpoint {
            lineage: None,
            ..restored
        };
        assert_ne!(lineage_of(Some(old.clone())), lineage_of(Some(old)));
    }
}
