//! Every decoder of stored state against random and mutated bytes.
//!
//! Checkpoint files, and the committables, writer states and source splits
//! they carry, are read back from disk after a crash: whatever bytes are
//! there, decoding must end in a value or a clear error, never in a panic or
//! an allocation the input cannot back. This test takes real stored state
//! (from jobs run here on the file sink, the in-memory sink and a pipeline
//! with idempotency keys, the file sink's committables of a position group,
//! and the PostgreSQL sink's types), mutates it (random
//! bytes, flipped and truncated bytes, and hostile length fields, also under a
//! recomputed checksum), and feeds it to each decoder, measuring what the
//! decode allocated.
//!
//! The bound asserted: decoding `n` bytes allocates at most `64 n` bytes plus
//! 8 MiB. bincode's limit (set from the input's length by
//! `sink_api::BincodeSerializer`) keeps any one reservation under `32 n`;
//! serde keeps each sequence's pre-allocation under 1 MiB whatever its length
//! field says. Before the bound, 20 bytes claiming a string of 2^40 bytes
//! aborted the process.
//!
//! Only one test is in this binary: the allocation counters are process-wide.

use std::alloc::System;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sink_api::{
    deserialize_versioned, serialize_versioned, BincodeSerializer, CheckpointId, Generation,
    InitContext, Lineage, PositionAdvance, Sink, SinkWriter, SplitKey, VersionedSerializer,
};
use sink_runtime::pipeline::{KeyPartition, Pipeline};
use sink_runtime::source::{RangeSplit, SplitCodec};
use sink_runtime::storage::{CompletedCheckpoint, StateBytes};
use sink_runtime::{CheckpointConfig, Job, LocalCheckpointStorage, SequenceSource};
use sinks_file::{FileSink, LineEncoder, RollingPolicy};
use sinks_memory::{MemorySink, MemoryStore};
use sinks_postgres::{PgCommittable, PgWriterState};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Cases per decoder.
const CASES: u32 = 1_500;

/// What decoding `len` bytes may allocate in all.
fn allocation_bound(len: usize) -> usize {
    64 * len + (8 << 20)
}

/// Decodes bytes, saying why not.
type Decode = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One decoder and real blobs it reads.
struct Decoder {
    what: String,
    samples: Vec<Vec<u8>>,
    decode: Decode,
}

fn blob_decoder<T: 'static>(
    what: &str,
    serializer: Arc<dyn VersionedSerializer<T>>,
    samples: Vec<Vec<u8>>,
) -> Decoder {
    assert!(!samples.is_empty(), "no sample of {what}");
    for sample in &samples {
        deserialize_versioned(&*serializer, sample)
            .unwrap_or_else(|e| panic!("a real {what} decodes: {e}"));
    }
    Decoder {
        what: what.to_string(),
        samples,
        decode: Box::new(move |bytes| {
            deserialize_versioned(&*serializer, bytes)
                .map(drop)
                .map_err(|e| e.to_string())
        }),
    }
}

/// A source's split codec and real stored splits it reads (whole, as a
/// storage that keeps no chunks apart hands them back).
fn codec_decoder<S: 'static>(
    what: &str,
    codec: Arc<dyn SplitCodec<S>>,
    samples: Vec<Vec<u8>>,
) -> Decoder {
    assert!(!samples.is_empty(), "no sample of {what}");
    for sample in &samples {
        (codec.decode(&StateBytes::from(sample.clone())))
            .unwrap_or_else(|e| panic!("a real {what} decodes: {e}"));
    }
    Decoder {
        what: what.to_string(),
        samples,
        decode: Box::new(move |bytes| {
            (codec.decode(&StateBytes::from(bytes.to_vec())))
                .map(drop)
                .map_err(|e| e.to_string())
        }),
    }
}

/// The blobs of the newest checkpoint in `dir`.
fn newest(dir: &Path) -> CompletedCheckpoint {
    let state = LocalCheckpointStorage::inspect(dir).expect("a state directory");
    state
        .checkpoints
        .into_iter()
        .last()
        .expect("a checkpoint")
        .content
        .expect("a readable checkpoint")
}

fn writer_states(checkpoint: &CompletedCheckpoint) -> Vec<Vec<u8>> {
    checkpoint
        .subtasks
        .iter()
        .flat_map(|s| s.writer_states.clone())
        .collect()
}

fn committables(checkpoint: &CompletedCheckpoint) -> Vec<Vec<u8>> {
    checkpoint
        .subtasks
        .iter()
        .flat_map(|s| s.pending.iter().flat_map(|p| p.committables.clone()))
        .collect()
}

fn splits(checkpoint: &CompletedCheckpoint) -> Vec<Vec<u8>> {
    checkpoint
        .subtasks
        .iter()
        .map(|s| s.source_splits.to_vec())
        .collect()
}

/// The version a blob's envelope carries, to decode it with the runtime's
/// own serializer for that format.
fn version_of(blob: &[u8]) -> u32 {
    u32::from_le_bytes(blob[2..6].try_into().expect("an envelope"))
}

/// Runs an unbounded job until it stored a few checkpoints, then cancels it.
async fn run_until_checkpointed<S: Sink<Writer: SinkWriter<Input = u64>>>(dir: &Path, sink: S) {
    let handle = Job::builder(
        "hostile",
        SequenceSource::unbounded(1_000_000).paced(20_000),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
    .checkpoint_storage(LocalCheckpointStorage::open(dir).expect("a state directory"))
    .build()
    .expect("a valid job")
    .start();
    while handle.metrics().checkpoints_completed < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.cancel();
    handle.join().await.expect("the job ends");
}

/// Real stored state of every kind this project writes, with its decoders.
async fn decoders(root: &Path) -> (Vec<Decoder>, Vec<std::path::PathBuf>) {
    let mut decoders = Vec::new();
    let mut state_dirs = Vec::new();

    // The file sink.
    let out = root.join("file");
    let state = root.join("file-state");
    let file_sink = FileSink::builder(&out, LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .build()
        .unwrap();
    let (committable_serializer, state_serializer) = (
        file_sink.committable_serializer(),
        file_sink.writer_state_serializer(),
    );
    run_until_checkpointed(&state, file_sink).await;
    let checkpoint = newest(&state);
    decoders.push(blob_decoder(
        "file committable",
        committable_serializer,
        committables(&checkpoint),
    ));
    decoders.push(blob_decoder(
        "file writer state",
        state_serializer,
        writer_states(&checkpoint),
    ));
    decoders.push(blob_decoder(
        "sequence source splits",
        Arc::new(BincodeSerializer::<Vec<RangeSplit>>::new(version_of(
            &checkpoint.subtasks[0].source_splits.to_vec(),
        ))),
        splits(&checkpoint),
    ));
    state_dirs.push(state);

    // The file sink's committables of a position group (a source whose
    // positions are committed with the data), prepared by a writer.
    let positions_sink = FileSink::builder(root.join("file-positions"), LineEncoder)
        .build()
        .unwrap();
    let context = InitContext::new("hostile", Lineage::new("0f3a9c"), Generation(1), 0, 1);
    let mut writer = positions_sink
        .create_writer(&context, Vec::new())
        .await
        .unwrap();
    let serializer = positions_sink.committable_serializer();
    let mut samples = Vec::new();
    for checkpoint in 1..=3u64 {
        writer
            .write_batch((0..20 * checkpoint).collect())
            .await
            .unwrap();
        let advances = (0..checkpoint)
            .map(|split| PositionAdvance {
                key: SplitKey::new("hostile/input", format!("partition-{split}")),
                from: (checkpoint > 1).then_some(10 * checkpoint),
                to: 10 * checkpoint + split,
            })
            .collect();
        writer.carry_positions(advances).unwrap();
        for committable in writer
            .prepare_commit(CheckpointId(checkpoint))
            .await
            .unwrap()
        {
            assert!(committable.positions.is_some());
            samples.push(serialize_versioned(&*serializer, &committable).unwrap());
        }
    }
    decoders.push(blob_decoder(
        "file committable of a position group",
        serializer,
        samples,
    ));

    // The in-memory sink.
    let state = root.join("memory-state");
    let memory_sink = MemorySink::new(MemoryStore::<u64>::new());
    let (committable_serializer, state_serializer) = (
        memory_sink.committable_serializer(),
        memory_sink.writer_state_serializer(),
    );
    run_until_checkpointed(&state, memory_sink).await;
    let checkpoint = newest(&state);
    decoders.push(blob_decoder(
        "memory committable",
        committable_serializer,
        committables(&checkpoint),
    ));
    decoders.push(blob_decoder(
        "memory writer state",
        state_serializer,
        writer_states(&checkpoint),
    ));
    state_dirs.push(state);

    // A pipeline's idempotency keys, kept as its source's splits.
    let state = root.join("pipeline-state");
    let pipeline = Pipeline::builder("hostile", MemorySink::new(MemoryStore::<String>::new()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .checkpoint_storage(LocalCheckpointStorage::open(&state).unwrap())
        .start()
        .await
        .expect("the pipeline starts");
    for i in 0..50 {
        let ticket = pipeline
            .try_send(vec![format!("event {i}")], Some(format!("key-{i}")))
            .expect("the pipeline takes it");
        ticket.await.expect("committed");
    }
    pipeline.shutdown().await.expect("a clean shutdown");
    let checkpoint = newest(&state);
    decoders.push(codec_decoder(
        "pipeline key partitions",
        KeyPartition::codec(),
        splits(&checkpoint),
    ));
    state_dirs.push(state);

    // The PostgreSQL sink's types (its default serializer; no server needed
    // to decode).
    let serializer = Arc::new(BincodeSerializer::<PgCommittable>::default());
    let samples = (0..4)
        .map(|i| {
            let committable = PgCommittable {
                gid: format!("eo:hostile:lineage:{i}:7"),
                rows: 1_000 * i,
                advances: Vec::new(),
                superseded: None,
                chained_on: Vec::new(),
            };
            serialize_versioned(&*serializer, &committable).unwrap()
        })
        .collect();
    decoders.push(blob_decoder("postgres committable", serializer, samples));
    let serializer = Arc::new(BincodeSerializer::<PgWriterState>::default());
    let sample = PgWriterState {
        lineage: "0f3a9c".into(),
    };
    let samples = vec![serialize_versioned(&*serializer, &sample).unwrap()];
    decoders.push(blob_decoder("postgres writer state", serializer, samples));

    (decoders, state_dirs)
}

/// A change to stored bytes.
#[derive(Debug, Clone)]
enum Mutation {
    /// Bytes from nowhere.
    Random(Vec<u8>),
    /// One byte changed.
    Flip { at: usize, xor: u8 },
    /// Cut short.
    Truncate { at: usize },
    /// A varint length field claiming `claimed`, written over the bytes at
    /// `at` (bincode's marker 253 and a u64).
    HostileLength { at: usize, claimed: u64 },
    /// Bytes inserted.
    Splice { at: usize, bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let claimed = prop_oneof![
        Just(u64::MAX),
        Just(1u64 << 40),
        Just(1u64 << 31),
        Just(1u64 << 20),
        any::<u64>(),
        0u64..4096,
    ];
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(Mutation::Random),
        3 => (any::<usize>(), 1u8..=255).prop_map(|(at, xor)| Mutation::Flip { at, xor }),
        2 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        4 => (any::<usize>(), claimed).prop_map(|(at, claimed)| Mutation::HostileLength { at, claimed }),
        2 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Splice { at, bytes }),
    ]
}

/// Applies `mutation` to `bytes`, leaving the first `keep` bytes (a header)
/// alone except for random input.
fn mutate(bytes: &[u8], keep: usize, mutation: &Mutation) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let span = out.len().saturating_sub(keep).max(1);
    let position = |at: usize| (keep + at % span).min(out.len());
    match mutation {
        Mutation::Random(random) => return random.clone(),
        Mutation::Flip { at, xor } => {
            let at = position(*at);
            if let Some(byte) = out.get_mut(at) {
                *byte ^= xor;
            }
        }
        Mutation::Truncate { at } => out.truncate(position(*at)),
        Mutation::HostileLength { at, claimed } => {
            let at = position(*at);
            let mut field = vec![253];
            field.extend_from_slice(&claimed.to_le_bytes());
            let end = (at + field.len()).min(out.len());
            out.splice(at..end, field);
        }
        Mutation::Splice { at, bytes } => {
            let at = position(*at);
            out.splice(at..at, bytes.iter().copied());
        }
    }
    out
}

/// Decodes `input`, failing the case on a panic, an empty error, or an
/// allocation beyond the bound.
fn check(
    what: &str,
    decode: &dyn Fn(&[u8]) -> Result<(), String>,
    input: &[u8],
    measured_len: usize,
) -> Result<(), TestCaseError> {
    let region = Region::new(GLOBAL);
    let outcome = catch_unwind(AssertUnwindSafe(|| decode(input)));
    let allocated = region.change().bytes_allocated;
    let Ok(result) = outcome else {
        return Err(TestCaseError::fail(format!(
            "{what}: decoding {} bytes panicked",
            input.len()
        )));
    };
    if let Err(message) = result {
        prop_assert!(!message.trim().is_empty(), "{what}: an empty error");
    }
    prop_assert!(
        allocated <= allocation_bound(measured_len),
        "{what}: decoding {measured_len} bytes allocated {allocated} bytes"
    );
    Ok(())
}

const FRAME_HEADER_LEN: usize = 24;

/// Rewrites a frame's length and checksum to match its (mutated) payload:
/// hostile content under a correct checksum.
fn reframe(frame: &mut [u8]) {
    if frame.len() < FRAME_HEADER_LEN {
        return;
    }
    let payload_len = (frame.len() - FRAME_HEADER_LEN) as u64;
    let crc = crc32c::crc32c(&frame[FRAME_HEADER_LEN..]);
    frame[12..20].copy_from_slice(&payload_len.to_le_bytes());
    frame[20..24].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn every_decoder_of_stored_state_survives_hostile_bytes() {
    // Quiet the panic hook: a caught panic is reported as a failed case.
    let root = tempfile::tempdir().unwrap();
    let (decoders, state_dirs) = {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(decoders(root.path()))
    };
    std::panic::set_hook(Box::new(|_| {}));

    let config = Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    };
    for decoder in &decoders {
        let mut runner = TestRunner::new(config.clone());
        let samples = decoder.samples.len();
        let result = runner.run(&(0..samples, mutation()), |(sample, mutation)| {
            // Past the envelope's 6 bytes, so most cases reach the
            // payload's decoder.
            let input = mutate(&decoder.samples[sample], 6, &mutation);
            check(&decoder.what, &*decoder.decode, &input, input.len())
        });
        if let Err(error) = result {
            let _ = std::panic::take_hook();
            panic!("{}: {error}", decoder.what);
        }
    }

    // The framed files of a state directory (checkpoints, GENERATION,
    // FINISHED), read as the runtime and `sink-inspect` read them.
    let mut frames = Vec::new();
    for dir in &state_dirs {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name != "LOCK" && !name.starts_with('.') {
                frames.push((name, std::fs::read(&path).unwrap()));
            }
        }
    }
    assert!(frames.iter().any(|(n, _)| n.ends_with(".ckpt")));
    assert!(frames.iter().any(|(n, _)| n == "GENERATION"));
    let scratch = root.path().join("scratch");
    let mut runner = TestRunner::new(config);
    let result = runner.run(
        &(0..frames.len(), mutation(), any::<bool>()),
        |(frame, mutation, reframed)| {
            let (name, bytes) = &frames[frame];
            let _ = std::fs::remove_dir_all(&scratch);
            std::fs::create_dir_all(&scratch).unwrap();
            let mut input = mutate(bytes, FRAME_HEADER_LEN, &mutation);
            if reframed {
                reframe(&mut input);
            }
            std::fs::write(scratch.join(name), &input).unwrap();
            let inspect = |_: &[u8]| {
                let state = LocalCheckpointStorage::inspect(&scratch).map_err(|e| e.to_string())?;
                for file in state.checkpoints {
                    file.content.map_err(|e| e.to_string())?;
                }
                Ok(())
            };
            check(name, &inspect, &input, input.len())
        },
    );
    let _ = std::panic::take_hook();
    if let Err(error) = result {
        panic!("state files: {error}");
    }
}
