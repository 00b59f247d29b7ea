//! The sinks this project ships, certified by the kit.

use std::path::PathBuf;
use std::time::Duration;

use sink_api::async_trait;
use sink_testkit::{certify, Destination};
use sinks_file::{CompactionPolicy, FileSink, LineEncoder, RollingPolicy};
use sinks_memory::{MemorySink, MemoryStore, TransactionState};

/// The memory sink's store; with `background`, its transactions become
/// durable through the writers' durability work, and a commit before it is
/// a violation of the store, which fails the read.
struct Memory(MemoryStore<u64>, bool);

#[async_trait]
impl Destination for Memory {
    type Sink = MemorySink<u64>;

    async fn sink(&self) -> MemorySink<u64> {
        let sink = MemorySink::new(self.0.clone()).roll_every(16);
        match self.1 {
            true => sink.durable_in_background(),
            false => sink,
        }
    }

    async fn committed_ids(&self) -> Vec<u64> {
        let violations = self.0.violations();
        assert!(violations.is_empty(), "the store saw: {violations:?}");
        self.0.committed()
    }

    async fn open_transactions(&self) -> Option<usize> {
        Some(
            self.0
                .transactions()
                .iter()
                .filter(|(_, state)| *state == TransactionState::Open)
                .count(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_sink_is_certified() {
    let report = certify(|| async { Memory(MemoryStore::new(), false) }, |id| id).await;
    // A figure, not an assertion: the bound is 10 s on 2 cores.
    println!(
        "memory sink, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
    assert!(report.properties.len() >= 18);
    assert!(
        report
            .properties
            .iter()
            .all(|p| p.verdict == sink_testkit::Verdict::Passed),
        "{report}"
    );
}

/// With its transactions made durable in the background: acknowledgements
/// wait for the writers' durability work, and nothing is committed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_sink_with_background_durability_is_certified() {
    let report = certify(|| async { Memory(MemoryStore::new(), true) }, |id| id).await;
    println!(
        "memory sink with background durability, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}

struct Files {
    _dir: tempfile::TempDir,
    out: PathBuf,
    /// Compaction at every checkpoint (every epoch sealed as soon as it has
    /// a file), or none.
    compaction: bool,
}

impl Files {
    fn new(compaction: bool) -> Files {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("out");
        Files {
            _dir: dir,
            out,
            compaction,
        }
    }
}

#[async_trait]
impl Destination for Files {
    type Sink = FileSink<u64, LineEncoder>;

    async fn sink(&self) -> FileSink<u64, LineEncoder> {
        let builder = FileSink::builder(&self.out, LineEncoder).rolling_policy(RollingPolicy {
            // Small parts, rolled at every checkpoint: several
            // committables per checkpoint, none waiting for a timed roll.
            max_part_size_bytes: Some(64),
            ..RollingPolicy::on_checkpoint()
        });
        let builder = match self.compaction {
            // Replaced files kept a while: a compaction left running by a
            // crashed start may still swap a segment while the kit reads.
            true => builder.compaction(
                CompactionPolicy::every(Duration::ZERO).retention(Duration::from_secs(5)),
            ),
            false => builder,
        };
        builder.build().expect("a valid file sink")
    }

    /// What a reader sees, read as readers of a compacted output must
    /// ([`sinks_file::read_finished`]).
    async fn committed_ids(&self) -> Vec<u64> {
        let out = self.out.clone();
        let contents = tokio::task::spawn_blocking(move || sinks_file::read_finished(&out))
            .await
            .expect("the reading thread ends")
            .expect("the output can be read");
        let mut ids = Vec::new();
        for (_, bytes) in contents {
            let text = String::from_utf8(bytes).expect("lines of digits");
            ids.extend(text.lines().filter_map(|line| line.parse::<u64>().ok()));
        }
        ids
    }

    /// Parts not committed yet: the hidden in-progress and pending files.
    async fn open_transactions(&self) -> Option<usize> {
        fn hidden_parts(dir: &std::path::Path) -> usize {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return 0;
            };
            entries
                .flatten()
                .map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    match entry.file_type().map(|t| t.is_dir()) {
                        Ok(true) if !name.starts_with('.') => hidden_parts(&entry.path()),
                        Ok(false) if name.starts_with('.') && name.contains(".inprogress.") => 1,
                        _ => 0,
                    }
                })
                .sum()
        }
        Some(hidden_parts(&self.out))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_sink_is_certified() {
    let report = certify(|| async { Files::new(false) }, |id| id).await;
    println!(
        "file sink, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}

/// With compaction at every checkpoint: commits into segments, merges and
/// exchanges all the time, replays found in merged segments' manifests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_sink_with_compaction_is_certified() {
    let report = certify(|| async { Files::new(true) }, |id| id).await;
    println!(
        "file sink with compaction, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}

/// A record of the Parquet certification: the kit's id.
#[derive(serde::Serialize)]
struct IdRow {
    id: u64,
}

/// The file sink writing Parquet parts, Hive-style by event hour (16 ids
/// an hour: a checkpoint of a subtask holds several parts).
struct ParquetFiles(Files);

#[async_trait]
impl Destination for ParquetFiles {
    type Sink = FileSink<
        IdRow,
        sinks_file::ParquetEncoder<IdRow>,
        sinks_file::EventTimeBucketAssigner<fn(&IdRow) -> i64>,
    >;

    async fn sink(&self) -> Self::Sink {
        let schema = arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "id",
            arrow_schema::DataType::UInt64,
            false,
        )]);
        let encoder =
            sinks_file::ParquetEncoder::new(std::sync::Arc::new(schema)).expect("a valid schema");
        let hour: fn(&IdRow) -> i64 = |row| row.id as i64 * 225_000;
        FileSink::builder(&self.0.out, encoder)
            .bucket_assigner(sinks_file::EventTimeBucketAssigner::hourly(hour))
            .part_suffix(".parquet")
            .build()
            .expect("a valid file sink")
    }

    async fn committed_ids(&self) -> Vec<u64> {
        use arrow_array::cast::AsArray;
        let out = self.0.out.clone();
        let contents = tokio::task::spawn_blocking(move || sinks_file::read_finished(&out))
            .await
            .expect("the reading thread ends")
            .expect("the output can be read");
        let mut ids = Vec::new();
        for (path, bytes) in contents {
            let batches = sinks_file::read_parquet(bytes)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for batch in batches {
                let column = batch
                    .column(0)
                    .as_primitive::<arrow_array::types::UInt64Type>();
                ids.extend(column.values().iter().copied());
            }
        }
        ids
    }

    async fn open_transactions(&self) -> Option<usize> {
        self.0.open_transactions().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parquet_file_sink_is_certified() {
    let report = certify(
        || async { ParquetFiles(Files::new(false)) },
        |id| IdRow { id },
    )
    .await;
    println!(
        "Parquet file sink, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}

/// The file sink on an object store (in memory, with S3's multipart rules; the
/// same certification against an S3-compatible server is in
/// `sinks-file/tests/file_sink/s3.rs`).
struct Objects {
    store: std::sync::Arc<sinks_file::MemoryObjectStore>,
    output: sinks_file::ObjectOutput,
    /// Parts roll at every checkpoint (else by size only, so that uploads
    /// in progress, with their tails, are in the writers' states).
    roll_on_checkpoint: bool,
}

impl Objects {
    fn new(roll_on_checkpoint: bool) -> Objects {
        let store = std::sync::Arc::new(sinks_file::MemoryObjectStore::new());
        let output = sinks_file::ObjectOutput::new(
            store.clone(),
            object_store::path::Path::from("out"),
            "memory://out",
        );
        Objects {
            store,
            output,
            roll_on_checkpoint,
        }
    }
}

#[async_trait]
impl Destination for Objects {
    type Sink = FileSink<u64, LineEncoder>;

    async fn sink(&self) -> FileSink<u64, LineEncoder> {
        FileSink::object_store_builder(self.output.clone(), LineEncoder)
            .rolling_policy(RollingPolicy {
                max_part_size_bytes: Some(if self.roll_on_checkpoint { 64 } else { 256 }),
                roll_on_checkpoint: self.roll_on_checkpoint,
                // Without rolls at checkpoints, an endless input's parts
                // roll by age.
                rollover_interval: Some(std::time::Duration::from_millis(200)),
                ..RollingPolicy::on_checkpoint()
            })
            // Parts of 16 bytes: objects of several parts and a tail.
            .part_size(16)
            .build()
            .expect("a valid file sink")
    }

    async fn committed_ids(&self) -> Vec<u64> {
        let mut ids = Vec::new();
        let objects = sinks_file::finished_objects(&self.output)
            .await
            .expect("the in-memory store lists");
        for object in objects {
            let bytes = sinks_file::read_object(&self.output, &object)
                .await
                .expect("a listed object reads");
            let text = String::from_utf8_lossy(&bytes);
            ids.extend(text.lines().filter_map(|line| line.parse::<u64>().ok()));
        }
        ids
    }

    /// Multipart uploads neither completed nor aborted.
    async fn open_transactions(&self) -> Option<usize> {
        Some(self.store.uploads_in_progress())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_sink_on_an_object_store_is_certified() {
    for roll_on_checkpoint in [true, false] {
        let report = certify(|| async move { Objects::new(roll_on_checkpoint) }, |id| id).await;
        println!(
            "file sink on an object store (parts rolled at checkpoints: {roll_on_checkpoint}), \
             certified in {:.1} s:\n{report}",
            report.duration().as_secs_f64()
        );
        report.assert_passed();
    }
}
