//! The file sink and its builder.

use std::collections::HashSet;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sink_api::{
    CommittedPositions, GlobalCommitterFactory, InitContext, JobStart, Sink, SinkError,
    SystemClock, VersionedSerializer,
};

use crate::blocking::blocking;
use crate::bucket::{BasePathBucketAssigner, BucketAssigner};
use crate::clock::Clock;
use crate::committer::FileCommitter;
use crate::compaction::{probe, Compaction, CompactionPolicy, Compactor, Round};
use crate::config::{FileSinkConfig, Output};
use crate::encoder::Encoder;
use crate::format::FileFormat;
use crate::identity;
use crate::io_error::io_error;
#[cfg(feature = "object-store")]
use crate::multipart_limits::MAX_PARTS;
use crate::multipart_limits::S3_MINIMUM_PART_SIZE;
#[cfg(feature = "object-store")]
use crate::object_output::ObjectOutput;
use crate::placement::Placement;
use crate::position_commit::LogWork;
use crate::rolling::RollingPolicy;
use crate::state::FileCommittable;
use crate::stats::FileSinkStats;
#[cfg(feature = "object-store")]
use crate::upload_orphans::abort_orphaned_uploads;
#[cfg(feature = "object-store")]
use crate::upload_positions::UploadLog;
use crate::writer::{FileWriter, FileWriterState, WriterStart};

/// Writes records into part files under a base directory, committed exactly
/// once: hidden while in progress or pending, made visible by an atomic
/// rename when their checkpoint completes. See the crate docs for the
/// lifecycle and `docs/file-sink.md` for what readers must skip.
///
/// Made with [`FileSink::builder`]; given to the job builder.
pub struct FileSink<T, E, B = BasePathBucketAssigner> {
    config: Arc<FileSinkConfig<E, B>>,
    stats: Arc<FileSinkStats>,
    _record: PhantomData<fn(T)>,
}

impl<T, E, B> FileSink<T, E, B> {
    /// Where this sink's commits put files, on `runtime`'s clock unless
    /// the builder set one.
    fn placement(&self, runtime: &Arc<dyn sink_api::Clock>) -> Placement {
        Placement {
            syncs: self.config.syncs.clone(),
            compaction: self.config.compaction.clone(),
            clock: self.config.clock.clone().unwrap_or_else(|| runtime.clone()),
        }
    }

    /// The builder's clock, or the system's.
    fn clock(&self) -> Arc<dyn sink_api::Clock> {
        self.config
            .clock
            .clone()
            .unwrap_or_else(|| Arc::new(SystemClock))
    }

    /// What the committers did so far.
    pub fn stats(&self) -> Arc<FileSinkStats> {
        self.stats.clone()
    }

    /// The local base directory; `None` for an object store output.
    pub fn base_path(&self) -> Option<&Path> {
        self.config.output.local().map(PathBuf::as_path)
    }

    /// The output, as named in messages: a directory, or a URL such as
    /// `s3://bucket/out`.
    pub fn location(&self) -> String {
        self.config.output.describe()
    }
}

impl<T, E: Encoder<T>> FileSink<T, E, BasePathBucketAssigner> {
    /// Starts a file sink writing under `base_path` with `encoder`. Defaults:
    /// one bucket (the base path), [`RollingPolicy::default`], part names
    /// `part-<writer id>-<n>` without suffix, the runtime's clock.
    pub fn builder(
        base_path: impl Into<PathBuf>,
        encoder: E,
    ) -> FileSinkBuilder<T, E, BasePathBucketAssigner> {
        FileSink::builder_for(Output::Local(base_path.into()), encoder)
    }

    /// Starts a file sink writing objects under the prefix of `output` (an
    /// object store) with `encoder`: parts are multipart uploads, made
    /// visible by completing them (see `docs/file-sink.md`). Defaults as for
    /// [`builder`](Self::builder), with parts of
    /// [`S3_MINIMUM_PART_SIZE`](crate::S3_MINIMUM_PART_SIZE) and 2 of them
    /// in flight per object.
    #[cfg(feature = "object-store")]
    pub fn object_store_builder(
        output: ObjectOutput,
        encoder: E,
    ) -> FileSinkBuilder<T, E, BasePathBucketAssigner> {
        FileSink::builder_for(Output::Object(output), encoder)
    }

    fn builder_for(output: Output, encoder: E) -> FileSinkBuilder<T, E, BasePathBucketAssigner> {
        FileSinkBuilder {
            config: FileSinkConfig {
                output,
                encoder,
                bucket_assigner: BasePathBucketAssigner,
                rolling: RollingPolicy::default(),
                rolling_chosen: false,
                part_prefix: "part".into(),
                part_suffix: String::new(),
                clock: None,
                syncs: Arc::default(),
                turn: Arc::default(),
                part_size: S3_MINIMUM_PART_SIZE,
                parts_in_flight: 2,
                compaction: None,
                merger: None,
            },
            _record: PhantomData,
        }
    }
}

/// Configures a [`FileSink`]. Made by [`FileSink::builder`].
pub struct FileSinkBuilder<T, E, B> {
    config: FileSinkConfig<E, B>,
    _record: PhantomData<fn(T)>,
}

impl<T: 'static, E: Encoder<T>, B: BucketAssigner<T>> FileSinkBuilder<T, E, B> {
    /// Which directory under the base path each record goes to.
    pub fn bucket_assigner<B2: BucketAssigner<T>>(
        self,
        bucket_assigner: B2,
    ) -> FileSinkBuilder<T, E, B2> {
        let c = self.config;
        FileSinkBuilder {
            config: FileSinkConfig {
                output: c.output,
                encoder: c.encoder,
                bucket_assigner,
                rolling: c.rolling,
                rolling_chosen: c.rolling_chosen,
                part_prefix: c.part_prefix,
                part_suffix: c.part_suffix,
                clock: c.clock,
                syncs: c.syncs,
                turn: c.turn,
                part_size: c.part_size,
                parts_in_flight: c.parts_in_flight,
                compaction: c.compaction,
                merger: c.merger,
            },
            _record: PhantomData,
        }
    }

    /// When part files roll. Default: [`RollingPolicy::default`] (128 MiB,
    /// 60 s), which also rolls at every checkpoint in a job that promises
    /// visible commits ([`InitContext::visible_commits`]: a `Pipeline`'s
    /// tickets do). There, a chosen policy that does not roll at
    /// checkpoints is refused ([`Sink::deferred_visibility`]), unless the
    /// pipeline acknowledges before visible
    /// (`PipelineBuilder::acknowledge_before_visible`).
    pub fn rolling_policy(mut self, rolling: RollingPolicy) -> Self {
        self.config.rolling = rolling;
        self.config.rolling_chosen = true;
        self
    }

    /// The start of finished part names (default `part`).
    pub fn part_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.part_prefix = prefix.into();
        self
    }

    /// The end of finished part names, such as `.csv` (default none).
    pub fn part_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.config.part_suffix = suffix.into();
        self
    }

    /// Where the time for rolling and date-time buckets comes from, instead
    /// of the runtime's clock ([`sink_api::InitContext::clock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Some(Arc::new(clock));
        self
    }

    /// On an object store output: the size of each uploaded part but an
    /// object's last (default 5 MiB). At least the store's minimum (checked
    /// by [`build`](Self::build)); each object in progress holds up to
    /// `(parts_in_flight + 1) × part_size` bytes in memory.
    pub fn part_size(mut self, bytes: usize) -> Self {
        self.config.part_size = bytes;
        self
    }

    /// On an object store output: how many parts of one object may be on
    /// their way to the store at once (default 2, at least 1); the writer
    /// waits when that many are.
    pub fn parts_in_flight(mut self, parts: usize) -> Self {
        self.config.parts_in_flight = parts.max(1);
        self
    }

    /// Merges committed files, a segment of the output at a time, so that
    /// checkpoints many times a second do not leave many tiny files for
    /// readers (see [`CompactionPolicy`] and `docs/file-sink.md`). Every
    /// commit still makes its file visible at once, in a segment directory
    /// of its bucket; the sink then brings its own global committer (the
    /// compactor), so the job builder takes no other. Local outputs only:
    /// [`build`](Self::build) refuses it on an object store, and the sink's
    /// start refuses a filesystem that cannot exchange two directories
    /// atomically.
    pub fn compaction(mut self, policy: CompactionPolicy) -> Self {
        self.config.compaction = Some(Arc::new(Compaction::new(policy)));
        self
    }

    /// Checks the names (and, on an object store, the part size) and
    /// returns the sink. On an object store, parts roll at the latest when
    /// they reach 10 000 uploaded parts (S3's limit), whatever the rolling
    /// policy says. With a bulk format ([`Encoder::bulk`], such as
    /// Parquet), parts also roll at every checkpoint, whatever the policy
    /// says (a bulk part cannot be resumed), and compaction is refused for
    /// a format that cannot merge its parts.
    pub fn build(mut self) -> Result<FileSink<T, E, B>, SinkError> {
        if let Some(bulk) = self.config.encoder.bulk() {
            self.config.rolling.roll_on_checkpoint = true;
            if self.config.compaction.is_some() {
                self.config.merger = Some(bulk.merger().ok_or_else(|| {
                    SinkError::msg(
                        "compaction cannot merge the parts of this bulk format (its \
                         BulkFormat::merger is None): leave FileSinkBuilder::compaction out, or \
                         roll larger parts",
                    )
                    .permanent()
                })?);
            }
        }
        #[cfg(feature = "object-store")]
        if let (Output::Object(object), Some(_)) = (&self.config.output, &self.config.compaction) {
            return Err(SinkError::msg(format!(
                "compaction works on local outputs only, and {} is an object store, where a set of \
                 objects cannot be replaced by another atomically: leave FileSinkBuilder::compaction \
                 out (roll larger parts instead), or write a table with the Delta sink, which compacts",
                object.location
            ))
            .permanent());
        }
        #[cfg(feature = "object-store")]
        if let Output::Object(object) = &self.config.output {
            // S3 and its peers take at most 10 000 parts an upload: parts
            // roll before they would need more.
            let largest = self.config.part_size as u64 * MAX_PARTS;
            let rolling = &mut self.config.rolling;
            rolling.max_part_size_bytes = Some(
                rolling
                    .max_part_size_bytes
                    .map_or(largest, |size| size.min(largest)),
            );
            if self.config.part_size < object.minimum_part_size {
                return Err(SinkError::msg(format!(
                    "the part size {} is below the smallest part {} accepts ({} bytes): raise it with \
                     FileSinkBuilder::part_size",
                    self.config.part_size, object.location, object.minimum_part_size
                ))
                .permanent());
            }
        }
        let prefix = &self.config.part_prefix;
        if prefix.is_empty() || prefix.starts_with('.') || prefix.contains('/') {
            return Err(SinkError::msg(format!(
                "the part prefix '{prefix}' must be a non-empty file name not starting with '.' \
                 (finished files must be visible)"
            )));
        }
        if self.config.part_suffix.contains('/') {
            return Err(SinkError::msg(format!(
                "the part suffix '{}' must not contain '/'",
                self.config.part_suffix
            )));
        }
        Ok(FileSink {
            config: Arc::new(self.config),
            stats: Arc::default(),
            _record: PhantomData,
        })
    }
}

#[async_trait]
impl<T, E, B> Sink for FileSink<T, E, B>
where
    T: Send + 'static,
    E: Encoder<T>,
    B: BucketAssigner<T>,
{
    type Writer = FileWriter<T, E, B>;
    type Committer = FileCommitter;

    /// Rolls the output's position log forward (the `position_commit`
    /// module), then removes the hidden parts (aborts the uploads) of this
    /// lineage that the restored checkpoint does not refer to (see the
    /// `orphans` and `upload_orphans` modules), all of them at a start that restores
    /// nothing (its lineage is the one the checkpoint storage keeps for
    /// starts before the first checkpoint). Does nothing when the output has
    /// no identity marker (nothing was written there) or the restored
    /// checkpoint was written in another output directory (its writers then
    /// refuse it with both directories named).
    async fn on_start(
        &self,
        start: &JobStart<'_, FileCommittable, FileWriterState>,
    ) -> Result<(), SinkError> {
        self.stats.register(&start.metrics);
        #[cfg(feature = "object-store")]
        if let Output::Object(object) = &self.config.output {
            return self.on_object_store_start(object, start).await;
        }
        if let (Some(compaction), Output::Local(base)) =
            (&self.config.compaction, &self.config.output)
        {
            let (compaction, base) = (compaction.clone(), base.clone());
            let (lineage, generation) = (start.lineage.clone(), start.generation);
            let fresh = start.restored_checkpoint_id.is_none();
            blocking(move || {
                probe(&base, fresh)?;
                compaction.segments.begin(&lineage, generation);
                Ok(())
            })
            .await?;
        }
        // Also at a start that restores nothing: its lineage is the one the
        // checkpoint storage keeps, so hidden parts of earlier starts killed
        // before their first checkpoint are found (no checkpoint names them).
        let Some(base) = self.config.output.local() else {
            return Ok(());
        };
        let base = base.clone();
        let ids = start.restored_committables.iter().map(|c| &c.output_id);
        let ids: HashSet<&String> = ids
            .chain(start.restored_writer_states.iter().map(|s| &s.output_id))
            .collect();
        let committables = start
            .restored_committables
            .iter()
            .map(|c| c.pending.clone());
        let kept: HashSet<PathBuf> = committables
            .chain(
                (start.restored_writer_states.iter())
                    .flat_map(|state| state.in_progress.iter().map(|part| part.path.clone())),
            )
            .collect();
        let lineage = start.lineage.clone();
        let ids: Vec<String> = ids.into_iter().cloned().collect();
        let (placement, turn, stats) = (
            self.placement(&start.clock),
            self.config.turn.clone(),
            self.stats.clone(),
        );
        let removed = blocking(move || {
            // No marker: nothing was ever written here.
            let Some(own) = identity::read(&base)? else {
                return Ok(0);
            };
            // Groups committed with parts still pending (a committer died
            // after the log's entry) are completed first: their parts are
            // no orphans. The sink's turn at the log is held from the
            // roll-forward to the end of the sweep, and no part a log entry
            // names is removed.
            let work = LogWork {
                base: &base,
                placement: &placement,
                turn: &turn,
                tag: lineage.as_str(),
                stats: &stats,
            };
            let sweep = ids.iter().all(|id| &own.id == id);
            work.settle_and_sweep(&lineage, &kept, sweep)
        })
        .await?;
        self.stats.orphans_removed(removed);
        Ok(())
    }

    /// Creates the base directory and its identity marker if needed, and a
    /// writer that first turns the restored in-progress parts into pending
    /// files (all of it off the async workers). Restored states must come from this base directory (the
    /// identity in them is its marker's, wherever the directory was then):
    /// otherwise, or when the directory has no marker, nothing is created or
    /// changed and the error names both directories.
    async fn create_writer(
        &self,
        context: &InitContext,
        restored_states: Vec<FileWriterState>,
    ) -> Result<FileWriter<T, E, B>, SinkError> {
        let start = WriterStart::of(context);
        let clock = match &self.config.clock {
            Some(clock) => clock.clone(),
            None => context.clock.clone(),
        };
        let config = self.config.clone();
        let base = match &config.output {
            Output::Local(base) => base.clone(),
            #[cfg(feature = "object-store")]
            Output::Object(object) => {
                let output = match restored_states.first() {
                    Some(state) => identity::read_object(object).await?.ok_or_else(|| {
                        identity::mismatch(
                            Path::new(&object.location),
                            None,
                            "a writer state",
                            &state.output_id,
                            &state.output_dir,
                        )
                    })?,
                    None => identity::ensure_object(object).await?,
                };
                let object = object.clone();
                return FileWriter::on_object_store(
                    config,
                    &object,
                    output,
                    start,
                    clock,
                    restored_states,
                )
                .await;
            }
        };
        blocking(move || {
            let base = &base;
            if let Some(state) = restored_states.first() {
                // A completed checkpoint refers to it: durable.
                config.syncs.durable_dir(base);
                let output = identity::read(base)?.ok_or_else(|| {
                    identity::mismatch(
                        base,
                        None,
                        "a writer state",
                        &state.output_id,
                        &state.output_dir,
                    )
                })?;
                return FileWriter::new(
                    config.clone(),
                    base,
                    output,
                    start,
                    clock,
                    restored_states,
                );
            }
            // Its name, and every name above it, must survive a power cut:
            // synced whether this start created it or an earlier one, killed
            // before it synced, did.
            sink_local_fs::create_dir_all(base).map_err(|e| {
                io_error(
                    format!("creating the output directory {}", base.display()),
                    e,
                )
            })?;
            config.syncs.durable_dir(base);
            let output = identity::ensure(base)?;
            FileWriter::new(config.clone(), base, output, start, clock, restored_states)
        })
        .await
    }

    /// A committer for this base directory. It reads the directory's
    /// identity at its first commit and refuses committables of another.
    /// With compaction on, it places its files in the segments of this
    /// start's current epoch.
    async fn create_committer(&self, context: &InitContext) -> Result<FileCommitter, SinkError> {
        if let Some(compaction) = self.config.compaction.clone() {
            let (lineage, generation) = (context.lineage.clone(), context.generation);
            blocking(move || {
                compaction.segments.begin(&lineage, generation);
                Ok(())
            })
            .await?;
        }
        Ok(FileCommitter {
            stats: self.stats.clone(),
            placement: self.placement(&context.clock),
            output_location: self.config.output.clone(),
            output: None,
            turn: self.config.turn.clone(),
            lineage: context.lineage.clone(),
        })
    }

    /// True: the committers commit each checkpoint's committables of a
    /// writer as one position group, with the positions, through the
    /// output's position log (the `position_commit` module; on an object
    /// store `upload_positions`, the log's entries created by conditional
    /// puts and the group's uploads completed after its entry). With
    /// compaction on (local outputs), the group's parts go into segments,
    /// which the log places and finds, and the compactor (the global
    /// committer) only merges what the committers committed.
    fn commits_positions(&self) -> bool {
        true
    }

    /// With a rolling policy the user chose that does not roll at
    /// checkpoints, records stay out of sight after their commit, until
    /// their part rolls; with the default policy, writers roll at every
    /// checkpoint when the job promises visible commits, and a bulk format
    /// always does.
    fn deferred_visibility(&self) -> Option<String> {
        self.config.deferred_visibility()
    }

    /// Reads the output's position log and rolls it forward (every
    /// committed group's parts renamed into place, durably; on an object
    /// store, their uploads completed), off the async workers: the
    /// positions of `scope`'s splits as the committed groups left them.
    /// Nothing when nothing was committed with positions.
    async fn committed_positions(&self, scope: &str) -> Result<CommittedPositions, SinkError> {
        #[cfg(feature = "object-store")]
        if let Output::Object(object) = &self.config.output {
            let log = UploadLog {
                output: object,
                stats: &self.stats,
            };
            return Ok(log.settle().await?.positions.scope(scope));
        }
        let Some(base) = self.config.output.local() else {
            return Ok(CommittedPositions::new());
        };
        let (base, placement) = (base.clone(), self.placement(&self.clock()));
        let (turn, stats, scope) = (
            self.config.turn.clone(),
            self.stats.clone(),
            scope.to_string(),
        );
        blocking(move || {
            let work = LogWork {
                base: &base,
                placement: &placement,
                turn: &turn,
                tag: "",
                stats: &stats,
            };
            Ok(work.settle()?.positions.scope(&scope))
        })
        .await
    }

    /// With compaction on, the compactor (see [`CompactionPolicy`]): it
    /// seals epochs after checkpoints and merges their segments in the
    /// background, and all that is left at end of input before the job
    /// ends. Without compaction, none.
    fn global_committer(&self) -> Option<GlobalCommitterFactory<FileCommittable>> {
        let compaction = self.config.compaction.clone()?;
        let base = self.config.output.local()?;
        let base = base.clone();
        let (stats, clock) = (self.stats.clone(), self.config.clock.clone());
        let (prefix, suffix) = (
            self.config.part_prefix.clone(),
            self.config.part_suffix.clone(),
        );
        let merger = self.config.merger.clone();
        Some(Box::new(move |context: &InitContext| {
            let round = Round {
                compaction: compaction.clone(),
                base: base.clone(),
                prefix: prefix.clone(),
                suffix: suffix.clone(),
                merger: merger.clone(),
                lineage: context.lineage.clone(),
                generation: context.generation,
                stats: stats.clone(),
                clock: clock.clone().unwrap_or_else(|| context.clock.clone()),
            };
            Box::new(Compactor::new(round))
        }))
    }

    /// Format version 3 (the `format` module): paths relative to the
    /// output, the output's identity, and on an object store the upload.
    /// Version 2 blobs are read; version 1 (absolute paths) is refused with
    /// [`sink_api::SerializerError::UnsupportedVersion`].
    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<FileCommittable>> {
        Arc::new(FileFormat::<FileCommittable>::new())
    }

    /// Format version 3, as for committables.
    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<FileWriterState>> {
        Arc::new(FileFormat::<FileWriterState>::new())
    }
}

#[cfg(feature = "object-store")]
impl<T, E, B> FileSink<T, E, B> {
    /// The start hook on an object store output: checks the store is
    /// reachable (a missing bucket or wrong credentials fail the job here,
    /// before any record), then, when a checkpoint is restored into this
    /// output, aborts the uploads of the lineage it does not name.
    async fn on_object_store_start(
        &self,
        object: &ObjectOutput,
        start: &JobStart<'_, FileCommittable, FileWriterState>,
    ) -> Result<(), SinkError> {
        // No marker: nothing was ever written here. A start that restores
        // nothing looks too (see `on_start`).
        let Some(own) = identity::read_object(object).await? else {
            return Ok(());
        };
        let ids = start.restored_committables.iter().map(|c| &c.output_id);
        let mut ids = ids.chain(start.restored_writer_states.iter().map(|s| &s.output_id));
        if !ids.all(|id| &own.id == id) {
            // Refused with both outputs named by the writers.
            return Ok(());
        }
        // Every group the position log holds completed first: an upload a
        // log entry names is committed, never an orphan.
        let logged = UploadLog {
            output: object,
            stats: &self.stats,
        }
        .settle()
        .await?;
        let logged = (logged.entries.iter())
            .flat_map(|(_, entry)| entry.parts.iter().map(|part| &part.upload));
        let committables = start.restored_committables.iter().map(|c| &c.upload);
        let kept: HashSet<String> = committables
            .chain(
                (start.restored_writer_states.iter())
                    .flat_map(|state| state.in_progress.iter().map(|part| &part.upload)),
            )
            .chain(logged)
            .flatten()
            .map(|upload| upload.upload_id.clone())
            .collect();
        let aborted =
            abort_orphaned_uploads(object, start.lineage, start.generation, &kept).await?;
        self.stats.orphans_removed(aborted);
        Ok(())
    }
}
