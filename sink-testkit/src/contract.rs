//! The sink's side of the contract, checked by driving its writer and
//! committer by hand, as the runtime would: in a job of its own (a job name
//! and a lineage per check), with the start hook called before any writer,
//! committers made with the context of the start they belong to (a replay
//! after a restore is committed by a committer of the restored start), and
//! every commit outcome honoured, retries included.

use std::time::Duration;

use sink_api::{
    deserialize_versioned, serialize_versioned, CheckpointId, CommitOutcome, CommitRequest,
    Committer, Generation, InitContext, JobStart, Lineage, Sink, SinkWriter,
};
use sink_api::{CommittableOf, InputOf, WriterStateOf};

use crate::runner::{exactly_once, new_job_name};
use crate::Destination;
use crate::RecordMaker;

type Committable<D> = CommittableOf<<D as Destination>::Sink>;

/// How often a hand-run commit retries a request that asked for it.
const MAX_RETRIES: u32 = 10;

/// One check's job: its name and lineage, as a fresh start of the runtime
/// would make them.
struct Job {
    name: String,
    lineage: Lineage,
}

impl Job {
    fn new() -> Job {
        let name = new_job_name();
        // Unique per job name, as the runtime's random lineage is per job
        // run: FNV-1a of the name, as 32 hexadecimal digits.
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let lineage = Lineage::new(format!("{hash:032x}"));
        Job { name, lineage }
    }

    /// The context of subtask 0 of 1 in start `generation`, restored from
    /// `restored`.
    fn context(&self, generation: u64, restored: Option<CheckpointId>) -> InitContext {
        InitContext::new(
            self.name.clone(),
            self.lineage.clone(),
            Generation(generation),
            0,
            1,
        )
        .restored_from(restored)
    }

    /// The start hook of a fresh start (generation 1).
    async fn start_fresh<S: Sink>(&self, sink: &S) -> Result<(), String> {
        let start = JobStart::fresh(&self.name, &self.lineage, Generation(1), 1);
        sink.on_start(&start).await.map_err(err("on_start"))
    }

    /// The start hook of start `generation`, restoring checkpoint 1 with
    /// `committables` and `states`.
    async fn start_restored<S: Sink>(
        &self,
        sink: &S,
        generation: u64,
        committables: &[CommittableOf<S>],
        states: &[sink_api::WriterStateOf<S>],
    ) -> Result<(), String> {
        let start = JobStart::fresh(&self.name, &self.lineage, Generation(generation), 1).restored(
            CheckpointId(1),
            1,
            committables.iter().collect(),
            states.iter().collect(),
        );
        sink.on_start(&start)
            .await
            .map_err(err("on_start (restored)"))
    }
}

fn err(what: &str) -> impl Fn(sink_api::SinkError) -> String + '_ {
    move |e| format!("{what} failed: {e}")
}

/// The writer's snapshot at checkpoint `checkpoint`, as the runtime takes
/// it: `snapshot_state`, then the durability work it returns, awaited (the
/// runtime acknowledges a checkpoint only after it).
async fn snapshot<D: Destination>(
    writer: &mut <D::Sink as Sink>::Writer,
    checkpoint: CheckpointId,
) -> Result<Vec<WriterStateOf<D::Sink>>, String> {
    let states = writer
        .snapshot_state(checkpoint)
        .await
        .map_err(err("snapshot_state"))?;
    if let Some(durability) = writer.durability(checkpoint) {
        durability.await.map_err(err("durability"))?;
    }
    Ok(states)
}

/// Copies committables the way a checkpoint does: through the sink's
/// serializer.
fn through_checkpoint<D: Destination>(
    sink: &D::Sink,
    committables: &[Committable<D>],
) -> Result<Vec<Committable<D>>, String> {
    let serializer = sink.committable_serializer();
    committables
        .iter()
        .map(|c| {
            let blob = serialize_versioned(serializer.as_ref(), c)
                .map_err(|e| format!("encoding a committable: {e}"))?;
            deserialize_versioned(serializer.as_ref(), &blob)
                .map_err(|e| format!("decoding a committable: {e}"))
        })
        .collect()
}

/// A fresh writer of `sink`, with the records `0..records` written to it.
async fn fresh_writer_with<D: Destination>(
    job: &Job,
    sink: &D::Sink,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<<D::Sink as Sink>::Writer, String> {
    job.start_fresh(sink).await?;
    let mut writer = sink
        .create_writer(&job.context(1, None), Vec::new())
        .await
        .map_err(err("create_writer"))?;
    writer
        .write_batch((0..records).map(|id| record(id)).collect())
        .await
        .map_err(err("write_batch"))?;
    Ok(writer)
}

/// End of input on `writer`: `flush(true)`, then the last `prepare_commit`,
/// tagged `tag` (the runtime's tag: past every checkpoint the writer's job
/// took, the restored one included).
async fn end_of_input<D: Destination>(
    writer: &mut <D::Sink as Sink>::Writer,
    tag: CheckpointId,
) -> Result<Vec<Committable<D>>, String> {
    writer.flush(true).await.map_err(err("flush(true)"))?;
    writer
        .prepare_commit(tag)
        .await
        .map_err(err("prepare_commit"))
}

/// Commits `committables` of checkpoint 1 through a committer made with
/// `context`, as the runtime does: every request settled, retried (with
/// its updated committable) while it asks to be, up to [`MAX_RETRIES`]
/// times; then, for a sink that brings a global committer, hands what the
/// committer committed to a global committer made with `context`. Returns
/// each committable's final outcome at the committer.
async fn commit<D: Destination>(
    sink: &D::Sink,
    context: &InitContext,
    committables: Vec<Committable<D>>,
) -> Result<Vec<CommitOutcome>, String> {
    let (outcomes, committed) =
        commit_at_committer::<D>(sink, context, CheckpointId(1), committables).await?;
    if let Some(factory) = sink.global_committer() {
        factory(context)
            .commit_checkpoint(CheckpointId(1), committed)
            .await
            .map_err(err("the global committer's commit_checkpoint"))?;
    }
    Ok(outcomes)
}

/// The committer's part of [`commit`], for checkpoint `checkpoint`: each
/// committable's final outcome, and the committables committed (to be
/// handed to a global committer).
async fn commit_at_committer<D: Destination>(
    sink: &D::Sink,
    context: &InitContext,
    checkpoint: CheckpointId,
    committables: Vec<Committable<D>>,
) -> Result<(Vec<CommitOutcome>, Vec<Committable<D>>), String> {
    let mut committer = sink
        .create_committer(context)
        .await
        .map_err(err("create_committer"))?;
    let mut outcomes: Vec<Option<CommitOutcome>> = vec![None; committables.len()];
    let mut committed = Vec::new();
    let mut waiting: Vec<(usize, Committable<D>, u32)> = committables
        .into_iter()
        .enumerate()
        .map(|(i, c)| (i, c, 0))
        .collect();
    while !waiting.is_empty() {
        let (positions, mut requests): (Vec<(usize, u32)>, Vec<_>) = waiting
            .drain(..)
            .map(|(i, c, retries)| ((i, retries), CommitRequest::new(c, checkpoint, retries)))
            .unzip();
        committer
            .commit(&mut requests)
            .await
            .map_err(err("commit"))?;
        for ((i, retries), request) in positions.into_iter().zip(requests) {
            let (committable, outcome) = request.into_parts();
            match outcome {
                CommitOutcome::RetryLater | CommitOutcome::UpdatedAndRetryLater
                    if retries < MAX_RETRIES =>
                {
                    waiting.push((i, committable, retries + 1));
                }
                CommitOutcome::RetryLater | CommitOutcome::UpdatedAndRetryLater => {
                    return Err(format!(
                        "a commit still asked to be retried after {MAX_RETRIES} retries"
                    ))
                }
                CommitOutcome::Unsettled => {
                    return Err(
                        "the committer returned from commit without settling every request; call \
                         request.signal_committed() once a committable is visible, or another \
                         outcome: the runtime fails the job on an unsettled request"
                            .into(),
                    )
                }
                settled => {
                    if matches!(
                        settled,
                        CommitOutcome::Committed | CommitOutcome::AlreadyCommitted
                    ) {
                        committed.push(committable);
                    }
                    outcomes[i] = Some(settled)
                }
            }
        }
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    committer
        .close()
        .await
        .map_err(err("closing the committer"))?;
    Ok((outcomes.into_iter().flatten().collect(), committed))
}

/// What the two-phase check saw, one verdict per property: `None` where a
/// step could not be reached because an earlier one failed.
pub(crate) struct TwoPhase {
    /// Nothing was visible after `prepare_commit`, before the commit.
    pub not_visible_early: Result<(), String>,
    /// After the commit, every record once.
    pub commit_makes_visible: Option<Result<(), String>>,
    /// A replay of the same committables by a restored start's committer
    /// was recognised and changed nothing.
    pub replay_recognised: Option<Result<(), String>>,
}

/// Nothing is visible before its commit; after it, everything once; a
/// replayed commit (by the committer of a restored start, as after a crash
/// between the commit and the checkpoint that would have recorded it) is
/// recognised and changes nothing. An error: the check could not run.
pub(crate) async fn two_phase<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<TwoPhase, String> {
    let job = Job::new();
    let sink = destination.sink().await;
    let mut writer = fresh_writer_with::<D>(&job, &sink, record, records).await?;
    // At end of input everything written becomes committable.
    let committables = end_of_input::<D>(&mut writer, CheckpointId(1)).await?;
    let states = snapshot::<D>(&mut writer, CheckpointId(1)).await?;
    let visible = destination.committed_ids().await.len();
    let mut seen = TwoPhase {
        not_visible_early: match visible {
            0 => Ok(()),
            n => Err(format!(
                "{n} records were visible after prepare_commit, before any commit: the writer or \
                 prepare_commit makes data visible before the checkpoint completes"
            )),
        },
        commit_makes_visible: None,
        replay_recognised: None,
    };
    // From here on, a failing step is reported under the property whose
    // step it is.
    // Two copies, as two checkpoints would hold them: one to commit, one
    // to replay.
    let copies = through_checkpoint::<D>(&sink, &committables)
        .and_then(|replay| Ok((replay, through_checkpoint::<D>(&sink, &committables)?)));
    let (replay, first) = match copies {
        Ok(both) => both,
        Err(why) => {
            seen.commit_makes_visible = Some(Err(why));
            return Ok(seen);
        }
    };
    let first = commit::<D>(&sink, &job.context(1, None), first).await;
    let closed = writer.close().await.map_err(err("close"));
    let made_visible = match first.and_then(|outcomes| closed.map(|()| outcomes)) {
        Err(why) => Err(format!("the first commit failed: {why}")),
        Ok(outcomes) => match exactly_once(destination.committed_ids().await, records) {
            Err(problem) if seen.not_visible_early.is_ok() => Err(format!(
                "after the first commit (outcomes {}): {problem}",
                summary(&outcomes)
            )),
            // Records visible too early already explain what is seen.
            Err(_) => Ok(()),
            Ok(()) => Ok(()),
        },
    };
    let first_ok = made_visible.is_ok();
    seen.commit_makes_visible = Some(made_visible);
    if !first_ok {
        return Ok(seen);
    }

    // The same committables again, by the committer of a restored start.
    if let Err(why) = job.start_restored(&sink, 2, &replay, &states).await {
        seen.replay_recognised = Some(Err(why));
        return Ok(seen);
    }
    let outcomes = commit::<D>(&sink, &job.context(2, Some(CheckpointId(1))), replay).await;
    seen.replay_recognised = Some(match outcomes {
        Err(why) => Err(format!("the replayed commit failed: {why}")),
        Ok(outcomes) => match exactly_once(destination.committed_ids().await, records) {
            Err(problem) => Err(format!(
                "committing the same committables a second time changed the output ({problem}): \
                 commit is not idempotent"
            )),
            // With a global committer, the replay may be recognised there
            // (a table's log) rather than by the committers: the output
            // unchanged is what counts.
            Ok(())
                if sink.global_committer().is_none()
                    && outcomes
                        .iter()
                        .any(|o| *o != CommitOutcome::AlreadyCommitted) =>
            {
                Err(format!(
                    "a replayed commit was not recognised (outcomes {}); the committer must call \
                 signal_already_committed when a committable was committed before",
                    summary(&outcomes)
                ))
            }
            Ok(()) => Ok(()),
        },
    });
    Ok(seen)
}

/// Outcomes counted by kind, for messages.
fn summary(outcomes: &[CommitOutcome]) -> String {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for outcome in outcomes {
        let kind = format!("{outcome:?}");
        let kind = kind.split('(').next().unwrap_or_default().to_string();
        *counts.entry(kind).or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    parts.join(", ")
}

/// A writer restored from its state at a checkpoint loses nothing written
/// before that checkpoint.
pub(crate) async fn restore_keeps_written_records<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<(), String> {
    // An odd count, so that a writer sending records out in chunks keeps
    // some of them buffered at the checkpoint.
    let records = records + 7;
    let job = Job::new();
    let sink = destination.sink().await;
    let mut writer = fresh_writer_with::<D>(&job, &sink, record, records).await?;
    writer.flush(false).await.map_err(err("flush"))?;
    let mut committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .map_err(err("prepare_commit"))?;
    let states = snapshot::<D>(&mut writer, CheckpointId(1)).await?;
    // The process dies here: the writer is dropped without close.
    drop(writer);
    let serializer = sink.writer_state_serializer();
    let restored = states
        .iter()
        .map(|s| {
            let blob = serialize_versioned(serializer.as_ref(), s)
                .map_err(|e| format!("encoding a writer state: {e}"))?;
            deserialize_versioned(serializer.as_ref(), &blob)
                .map_err(|e| format!("decoding a writer state: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let pending = through_checkpoint::<D>(&sink, &committables)?;
    job.start_restored(&sink, 2, &pending, &restored).await?;
    let context = job.context(2, Some(CheckpointId(1)));
    let mut writer = sink
        .create_writer(&context, restored)
        .await
        .map_err(err("create_writer (restored)"))?;
    // Restored from checkpoint 1: the runtime tags this writer's end of
    // input 2.
    committables.extend(end_of_input::<D>(&mut writer, CheckpointId(2)).await?);
    writer.close().await.map_err(err("close"))?;
    let committables = through_checkpoint::<D>(&sink, &committables)?;
    let outcomes = commit::<D>(&sink, &context, committables).await?;
    let Err(problem) = exactly_once(destination.committed_ids().await, records) else {
        return Ok(());
    };
    // Blame what was observed: new committables taken for replays are a
    // naming problem, doubled records a committer's, missing ones the
    // writer state's.
    let replays = outcomes
        .iter()
        .filter(|o| **o == CommitOutcome::AlreadyCommitted)
        .count();
    Err(if replays > 0 {
        format!(
            "{problem}: {replays} committable(s) never committed before were signalled already \
             committed; the restored writer named them as the first writer did (names must differ \
             across starts: use the generation, or InitContext::unique_name)"
        )
    } else if problem.contains("twice") {
        format!("{problem}: the commit of the restored writer's committables doubled records")
    } else {
        format!(
            "a writer restored from the state it took at a checkpoint lost records written before it \
             ({problem}): records kept by the writer past prepare_commit must be in snapshot_state"
        )
    })
}

/// After end of input the writer opens nothing that would need a commit.
pub(crate) async fn no_transaction_after_end_of_input<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<Option<()>, String> {
    if destination.open_transactions().await.is_none() {
        return Ok(None);
    }
    let job = Job::new();
    let sink = destination.sink().await;
    let mut writer = fresh_writer_with::<D>(&job, &sink, record, records).await?;
    let committables = end_of_input::<D>(&mut writer, CheckpointId(1)).await?;
    // Checkpoints after end of input only snapshot the writer.
    snapshot::<D>(&mut writer, CheckpointId(2)).await?;
    snapshot::<D>(&mut writer, CheckpointId(3)).await?;
    let context = job.context(1, None);
    commit::<D>(
        &sink,
        &context,
        through_checkpoint::<D>(&sink, &committables)?,
    )
    .await?;
    let open = destination.open_transactions().await.unwrap_or(0);
    writer.close().await.map_err(err("close"))?;
    if open > 0 {
        return Err(format!(
            "{open} transaction(s) open after end of input and the final commit: the writer opened a new \
             transaction after flush(end_of_input = true) (FLINK-23473); it must not"
        ));
    }
    Ok(Some(()))
}

/// For a sink that brings a global committer: checkpoints handed to it
/// several at once (`commit_checkpoints`, as on a commit schedule), then,
/// by later starts, handed again grouped otherwise (a restart delivers
/// what its checkpoint held back, which may overlap what an earlier start
/// committed together): every record once after each.
pub(crate) async fn global_replay_regrouped<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<(), String> {
    let sink = destination.sink().await;
    let Some(factory) = sink.global_committer() else {
        return Err("the sink brings no global committer".into());
    };
    let job = Job::new();
    job.start_fresh(&sink).await?;
    let context = job.context(1, None);
    let mut writer = sink
        .create_writer(&context, Vec::new())
        .await
        .map_err(err("create_writer"))?;
    // Three checkpoints, a third of the records each, each committed by
    // the committer.
    let thirds = [0, records / 3, 2 * records / 3, records];
    let mut checkpoints = Vec::new();
    for (n, ids) in thirds.windows(2).enumerate() {
        let checkpoint = CheckpointId(n as u64 + 1);
        writer
            .write_batch((ids[0]..ids[1]).map(|id| record(id)).collect())
            .await
            .map_err(err("write_batch"))?;
        let prepared = writer
            .prepare_commit(checkpoint)
            .await
            .map_err(err("prepare_commit"))?;
        snapshot::<D>(&mut writer, checkpoint).await?;
        let prepared = through_checkpoint::<D>(&sink, &prepared)?;
        let (_, committed) =
            commit_at_committer::<D>(&sink, &context, checkpoint, prepared).await?;
        checkpoints.push((checkpoint, committed));
    }
    writer.close().await.map_err(err("close"))?;
    // A sink whose committers make its data visible (the file sink, whose
    // global committer compacts) shows every record already.
    let visible_at_committers = exactly_once(destination.committed_ids().await, records).is_ok();
    let copy = |range: std::ops::Range<usize>| -> Result<Vec<_>, String> {
        checkpoints[range]
            .iter()
            .map(|(id, committed)| Ok((*id, through_checkpoint::<D>(&sink, committed)?)))
            .collect()
    };
    // Start 1: checkpoints 1 and 2 together. Start 2, restored from 3: 2
    // and 3 together. Start 3, restored from 3: all three together.
    let deliveries = [(1, None, 0..2), (2, Some(3), 1..3), (3, Some(3), 0..3)];
    for (generation, restored, range) in deliveries {
        let restored = restored.map(CheckpointId);
        if let Some(checkpoint) = restored {
            let start = JobStart::fresh(&job.name, &job.lineage, Generation(generation), 1)
                .restored(checkpoint, 1, Vec::new(), Vec::new());
            sink.on_start(&start)
                .await
                .map_err(err("on_start (restored)"))?;
        }
        let delivered: Vec<CheckpointId> = checkpoints[range.clone()]
            .iter()
            .map(|(id, _)| *id)
            .collect();
        factory(&job.context(generation, restored))
            .commit_checkpoints(copy(range)?)
            .await
            .map_err(err("the global committer's commit_checkpoints"))?;
        let expected = match generation {
            1 if !visible_at_committers => thirds[2],
            _ => records,
        };
        exactly_once(destination.committed_ids().await, expected).map_err(|problem| {
            format!(
                "after start {generation} handed the global committer checkpoints \
                 {delivered:?} at once: {problem}; a global committer must recognise each \
                 checkpoint it committed, however the checkpoints are grouped when they \
                 come again"
            )
        })?;
    }
    Ok(())
}
