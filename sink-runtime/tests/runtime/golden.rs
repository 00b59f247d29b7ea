//! The checkpoint format is pinned: files written by earlier builds, kept
//! under `tests/data/checkpoints/`, are read back by this one.
//!
//! Each folder `vN` is a state directory written in format version `N`,
//! holding one checkpoint whose content is [`expected`] (the payloads of its
//! blobs decode with the serializers this build uses), a `GENERATION` and a
//! `FINISHED` marker. A change of the format adds a folder and keeps reading
//! the older ones, or refuses them with an error naming both versions; it
//! never misreads them.
//!
//! `GOLDEN_WRITE=1 cargo test -p sink-runtime --test golden` writes the
//! folder of the current format (once, when the format changes).
//!
//! | folder | format | what changed |
//! |---|---|---|
//! | `v1` | 1 | the first format |
//! | `v2` | 2 | checkpoints carry the job's lineage (read from `v1` as none) |
//! | `v3` | 3 | the finished marker keeps what the job lost (read from `v1` and `v2` as nothing) |
//! | `v4` | 4 | checkpoints store sealed chunks once and name them later: subtask 0's splits end in a chunk that checkpoint 6, kept for it, holds (read from `v1` to `v3` as inline bytes) |
//! | `v5` | 5 | checkpoints keep the job counters' totals (read from `v1` to `v4` as none) |
//! | `keys-v4` | 4 | a pipeline's state directory, its idempotency keys in format 4 of the keys (sealed segments): see [`a_pipeline_restored_from_golden_format_4_keys_knows_every_key`] |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sink_api::{
    deserialize_versioned, serialize_versioned, BincodeSerializer, CheckpointId, Generation,
    Lineage, VersionedSerializer,
};
use sink_runtime::source::{BincodeSplits, RangeSplit, SplitCodec};
use sink_runtime::storage::{
    CheckpointStorage, Chunk, CommittableSummary, CompletedCheckpoint, FinishedMarker,
    GlobalCommitterSnapshot, LostOutput, PendingCommittables, StateBytes, SubtaskSnapshot,
};
use sink_runtime::{KnownCommitFailure, LocalCheckpointStorage};
use sinks_memory::{MemoryCommittable, MemoryWriterState};

fn data(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/checkpoints")
        .join(version)
}

fn splits(ranges: &[(u64, u64)]) -> StateBytes {
    let splits: Vec<RangeSplit> = ranges
        .iter()
        .map(|&(next, end)| RangeSplit { next, end })
        .collect();
    BincodeSplits::default().encode(&splits).unwrap()
}

/// `state` with its bytes from `at` on in a sealed chunk.
fn sealed_from(state: StateBytes, at: usize) -> StateBytes {
    let bytes = state.to_vec();
    let mut cut = StateBytes::new();
    cut.push_inline(&bytes[..at]);
    cut.push_chunk(Chunk::seal(bytes[at..].to_vec()));
    cut
}

fn committable(transaction_id: &str, record_count: u64) -> Vec<u8> {
    let committable = MemoryCommittable {
        transaction_id: transaction_id.into(),
        record_count,
    };
    serialize_versioned(&BincodeSerializer::default(), &committable).unwrap()
}

fn writer_state(next_transaction_seq: u64) -> Vec<u8> {
    let state = MemoryWriterState::<u64> {
        next_transaction_seq,
        buffered: Vec::new(),
    };
    serialize_versioned(&BincodeSerializer::default(), &state).unwrap()
}

fn pending(checkpoint: u64, subtask: usize, committables: Vec<Vec<u8>>) -> PendingCommittables {
    PendingCommittables {
        summary: CommittableSummary {
            checkpoint_id: CheckpointId(checkpoint),
            subtask,
            committable_count: committables.len() as u64,
            record_count: 10 * committables.len() as u64,
        },
        committables,
    }
}

/// The folders of every format, oldest first, with the lineage their
/// checkpoint is read with and their finished marker.
fn formats() -> Vec<(&'static str, Option<Lineage>, FinishedMarker)> {
    let lineage = Lineage::new("5f0c2d3a9b8e4f1a8c7d6e5f4a3b2c1d");
    vec![
        ("v1", None, finished(LostOutput::default())),
        ("v2", Some(lineage.clone()), finished(LostOutput::default())),
        ("v3", Some(lineage.clone()), finished(lost())),
        ("v4", Some(lineage.clone()), finished(lost())),
        ("v5", Some(lineage), finished(lost())),
    ]
}

fn lost() -> LostOutput {
    LostOutput {
        commits_failed: 1,
        records_lost: 10,
        known_failures: vec![KnownCommitFailure::new(
            CheckpointId(6),
            1,
            "the pending file part-3-1.txt is gone",
            Some(10),
        )],
    }
}

/// What the golden checkpoint holds: two subtasks of the in-memory sink over
/// a sequence source, one with a pending committable, and a global
/// committer's pending part; `lineage` as its format reads, and the job
/// counters of `counters` (format 5 keeps them; older formats read none).
fn expected(lineage: Option<Lineage>, counters: bool) -> CompletedCheckpoint {
    CompletedCheckpoint {
        checkpoint_id: CheckpointId(7),
        job_name: "golden".into(),
        generation: Generation(3),
        lineage,
        parallelism: 2,
        subtasks: vec![
            SubtaskSnapshot {
                subtask: 0,
                source_splits: splits(&[(40, 100)]),
                writer_states: vec![writer_state(4)],
                pending: vec![pending(7, 0, vec![committable("g3-s0-t3", 10)])],
                end_of_input: false,
            },
            SubtaskSnapshot {
                subtask: 1,
                source_splits: splits(&[(100, 100)]),
                writer_states: vec![writer_state(2)],
                pending: Vec::new(),
                end_of_input: true,
            },
        ],
        global_committer: Some(GlobalCommitterSnapshot {
            pending: vec![pending(6, 1, vec![committable("g3-s1-t1", 10)])],
        }),
        is_final: false,
        counters: match counters {
            true => BTreeMap::from([("events_skipped".into(), 3), ("odd_ids".into(), 40)]),
            false => BTreeMap::new(),
        },
    }
}

/// The golden finished marker, with what its format keeps of a loss.
fn finished(lost: LostOutput) -> FinishedMarker {
    FinishedMarker {
        generation: Generation(3),
        last_checkpoint: Some(CheckpointId(7)),
        lost,
    }
}

#[tokio::test]
async fn golden_checkpoint_files_of_every_format_are_read_back() {
    let formats = formats();
    if std::env::var_os("GOLDEN_WRITE").is_some() {
        let (current, lineage, marker) = formats.last().cloned().unwrap();
        let dir = data(current);
        let storage = LocalCheckpointStorage::open_retaining(&dir, 1).unwrap();
        for _ in 0..3 {
            storage.begin().await.unwrap();
        }
        // Checkpoint 6 stores the chunk; 7 names it, and 6 is kept for it
        // (retaining 1 checkpoint).
        let mut last = expected(lineage, true);
        let split = sealed_from(last.subtasks[0].source_splits.clone(), 4);
        last.subtasks[0].source_splits = split;
        let mut before = last.clone();
        before.checkpoint_id = CheckpointId(6);
        storage.store(before).await.unwrap();
        storage.store(last).await.unwrap();
        storage.mark_finished(marker).await.unwrap();
        drop(storage);
        std::fs::remove_file(dir.join("LOCK")).unwrap();
    }

    for (version, lineage, marker) in formats {
        let state = LocalCheckpointStorage::inspect(data(version)).expect("the golden directory");
        assert_eq!(state.generation, Some(Generation(3)), "{version}");
        assert_eq!(state.finished, Some(marker), "{version}");
        let checkpoint = state.checkpoints.last().unwrap();
        assert_eq!(checkpoint.checkpoint_id, CheckpointId(7), "{version}");
        let checkpoint = checkpoint
            .content
            .as_ref()
            .unwrap_or_else(|e| panic!("format {version} is read: {e}"));
        if version == "v4" || version == "v5" {
            // The chunk is stored once, in checkpoint 6, kept for it.
            assert_eq!(state.checkpoints.len(), 2);
            let splits = &checkpoint.subtasks[0].source_splits;
            assert_eq!(splits.chunks().count(), 1);
            assert!(state.checkpoints[1].size_bytes < state.checkpoints[0].size_bytes);
        } else {
            assert_eq!(state.checkpoints.len(), 1, "{version}");
        }
        assert_eq!(*checkpoint, expected(lineage, version == "v5"), "{version}");

        // The blobs inside decode with this build's serializers.
        let committables = BincodeSerializer::<MemoryCommittable>::default();
        let pending = &checkpoint.subtasks[0].pending[0].committables[0];
        let decoded = deserialize_versioned(&committables, pending).unwrap();
        assert_eq!(decoded.transaction_id, "g3-s0-t3");
        let states = BincodeSerializer::<MemoryWriterState<u64>>::default();
        let state =
            deserialize_versioned(&states, &checkpoint.subtasks[0].writer_states[0]).unwrap();
        assert_eq!(state.next_transaction_seq, 4);
        let ranges = BincodeSerializer::<Vec<RangeSplit>>::new(1);
        assert_eq!(ranges.version(), 1);
        let stored = checkpoint.subtasks[0].source_splits.to_vec();
        let split = deserialize_versioned(&ranges, &stored).unwrap();
        assert_eq!(split[0].next, 40);
    }
}

/// A file of a format this build does not know is refused naming both
/// versions, never misread.
#[tokio::test]
async fn a_checkpoint_of_an_unknown_format_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let name = "checkpoint-00000000000000000007.ckpt";
    let mut bytes = std::fs::read(data("v2").join(name)).unwrap();
    bytes[8] = 99;
    std::fs::write(dir.path().join(name), bytes).unwrap();
    let state = LocalCheckpointStorage::inspect(dir.path()).unwrap();
    let error = state.checkpoints[0]
        .content
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("format version 99") && error.contains("versions 1 to 5"),
        "{error}"
    );
}

/// The pipeline's idempotency keys are pinned too: `keys-v4` is the state
/// directory of a pipeline (memory sink, parallelism 2) that acknowledged
/// `key-0` to `key-39` and shut down, its keys stored in format 4 (sealed
/// segments shared between checkpoints). A pipeline started on a copy of
/// it, at the same parallelism (which keeps the stored segments) and at
/// another (which seals them again), answers every key as a duplicate,
/// and a new key as new. `GOLDEN_WRITE=1` writes it again.
///
/// The keys were accepted when the files were written: the pipelines here
/// keep keys for a century, or the default hour would have expired them
/// an hour after (a restore that expires old keys is right; that is not
/// what this test pins).
#[tokio::test]
async fn a_pipeline_restored_from_golden_format_4_keys_knows_every_key() {
    use sink_runtime::pipeline::{KeyRetention, Pipeline};
    use sinks_memory::{MemorySink, MemoryStore};
    use std::time::Duration;

    const KEYS: usize = 40;
    let golden = data("keys-v4");
    let start = |dir: PathBuf, parallelism: usize| async move {
        let storage = LocalCheckpointStorage::open(&dir).unwrap();
        let store = MemoryStore::<String>::new();
        Pipeline::builder("golden-keys", MemorySink::new(store))
            .parallelism(parallelism)
            .key_retention(KeyRetention {
                max_age: Duration::from_secs(100 * 365 * 24 * 3600),
                ..KeyRetention::default()
            })
            .checkpointing(sink_runtime::CheckpointConfig::every(
                Duration::from_millis(20),
            ))
            .checkpoint_storage(storage)
            .start()
            .await
            .unwrap()
    };
    if std::env::var_os("GOLDEN_WRITE").is_some() {
        let _ = std::fs::remove_dir_all(&golden);
        let pipeline = start(golden.clone(), 2).await;
        for i in 0..KEYS {
            let ticket = pipeline
                .send(vec![format!("e{i}")], Some(format!("key-{i}")))
                .await
                .unwrap();
            ticket.await.unwrap();
        }
        pipeline.shutdown().await.unwrap();
        drop(pipeline);
        std::fs::remove_file(golden.join("LOCK")).unwrap();
    }
    for parallelism in [2, 3] {
        let copy = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&golden).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
        let pipeline = start(copy.path().to_path_buf(), parallelism).await;
        for i in 0..KEYS {
            let ack = pipeline
                .send(vec![format!("again {i}")], Some(format!("key-{i}")))
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(ack.duplicate, "key-{i} at parallelism {parallelism}");
        }
        let new = pipeline
            .send(vec!["new".into()], Some("key-new".into()))
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(!new.duplicate);
        pipeline.shutdown().await.unwrap();
    }
}
