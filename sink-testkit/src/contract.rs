//! The sink's side of the contract, checked by driving its writer and
//! committer by hand, as the runtime would.

use sink_api::{
    deserialize_versioned, serialize_versioned, CheckpointId, CommitOutcome, CommitRequest,
    Committer, Generation, InitContext, Sink, SinkWriter,
};
use sink_api::{CommittableOf, InputOf};

use crate::runner::exactly_once;
use crate::Destination;
use crate::RecordMaker;

type Committable<D> = CommittableOf<<D as Destination>::Sink>;

fn context(generation: u64) -> InitContext {
    InitContext::new(
        "sink-testkit",
        sink_api::Lineage::new("test-lineage"),
        Generation(generation),
        0,
        1,
    )
}

fn err(what: &str) -> impl Fn(sink_api::SinkError) -> String + '_ {
    move |e| format!("{what} failed: {e}")
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
    sink: &D::Sink,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<<D::Sink as Sink>::Writer, String> {
    let mut writer = sink
        .create_writer(&context(1), Vec::new())
        .await
        .map_err(err("create_writer"))?;
    writer
        .write_batch((0..records).map(|id| record(id)).collect())
        .await
        .map_err(err("write_batch"))?;
    Ok(writer)
}

/// End of input on `writer`: `flush(true)`, then the last `prepare_commit`.
async fn end_of_input<D: Destination>(
    writer: &mut <D::Sink as Sink>::Writer,
) -> Result<Vec<Committable<D>>, String> {
    writer.flush(true).await.map_err(err("flush(true)"))?;
    writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .map_err(err("prepare_commit"))
}

async fn commit<D: Destination>(
    sink: &D::Sink,
    committables: Vec<Committable<D>>,
) -> Result<Vec<CommitOutcome>, String> {
    let mut committer = sink
        .create_committer(&context(1))
        .await
        .map_err(err("create_committer"))?;
    let mut requests: Vec<_> = committables
        .into_iter()
        .map(|c| CommitRequest::new(c, CheckpointId(1), 0))
        .collect();
    committer
        .commit(&mut requests)
        .await
        .map_err(err("commit"))?;
    committer
        .close()
        .await
        .map_err(err("closing the committer"))?;
    let outcomes: Vec<CommitOutcome> = requests.into_iter().map(|r| r.into_parts().1).collect();
    if outcomes.contains(&CommitOutcome::Unsettled) {
        return Err(format!(
            "the committer returned from commit without settling every request (outcomes \
             {outcomes:?}); call request.signal_committed() once a committable is visible, or \
             another outcome: the runtime fails the job on an unsettled request"
        ));
    }
    Ok(outcomes)
}

/// Nothing is visible before its commit; after it, everything once; a
/// replayed commit is recognised and changes nothing.
pub(crate) async fn visibility_and_idempotence<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<Result<(), String>, String> {
    let sink = destination.sink();
    let mut writer = fresh_writer_with::<D>(&sink, record, records).await?;
    // At end of input everything written becomes committable.
    let committables = end_of_input::<D>(&mut writer).await?;
    writer
        .snapshot_state(CheckpointId(1))
        .await
        .map_err(err("snapshot_state"))?;
    let visible = destination.committed_ids().len();
    if visible > 0 {
        return Err(format!(
            "{visible} records were visible after prepare_commit, before any commit: the writer or \
             prepare_commit makes data visible (commits) before the checkpoint completes"
        ));
    }
    let replay = through_checkpoint::<D>(&sink, &committables)?;
    commit::<D>(&sink, through_checkpoint::<D>(&sink, &committables)?).await?;
    exactly_once(destination.committed_ids(), records)
        .map_err(|e| format!("after the commit: {e}"))?;
    writer.close().await.map_err(err("close"))?;

    // The same committables again, as after a crash between the commit and
    // the checkpoint that would have recorded it.
    let outcomes = commit::<D>(&sink, replay).await?;
    let idempotent = match exactly_once(destination.committed_ids(), records) {
        Err(problem) => Err(format!(
            "committing the same committables a second time changed the output ({problem}): commit is not idempotent"
        )),
        Ok(()) if outcomes.iter().any(|o| *o != CommitOutcome::AlreadyCommitted) => Err(format!(
            "a replayed commit was not recognised (outcomes {outcomes:?}); the committer must call \
             signal_already_committed when a committable was committed before"
        )),
        Ok(()) => Ok(()),
    };
    Ok(idempotent)
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
    let sink = destination.sink();
    let mut writer = fresh_writer_with::<D>(&sink, record, records).await?;
    writer.flush(false).await.map_err(err("flush"))?;
    let mut committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .map_err(err("prepare_commit"))?;
    let states = writer
        .snapshot_state(CheckpointId(1))
        .await
        .map_err(err("snapshot_state"))?;
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
    let mut context = context(2);
    context.restored_checkpoint_id = Some(CheckpointId(1));
    let mut writer = sink
        .create_writer(&context, restored)
        .await
        .map_err(err("create_writer (restored)"))?;
    committables.extend(end_of_input::<D>(&mut writer).await?);
    writer.close().await.map_err(err("close"))?;
    let committables = through_checkpoint::<D>(&sink, &committables)?;
    commit::<D>(&sink, committables).await?;
    exactly_once(destination.committed_ids(), records).map_err(|e| {
        format!(
            "a writer restored from the state it took at a checkpoint lost records written before it ({e}): \
             records kept by the writer past prepare_commit must be in snapshot_state"
        )
    })
}

/// After end of input the writer opens nothing that would need a commit.
pub(crate) async fn no_transaction_after_end_of_input<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
) -> Result<Option<()>, String> {
    if destination.open_transactions().is_none() {
        return Ok(None);
    }
    let sink = destination.sink();
    let mut writer = fresh_writer_with::<D>(&sink, record, records).await?;
    let committables = end_of_input::<D>(&mut writer).await?;
    // Checkpoints after end of input only snapshot the writer.
    writer
        .snapshot_state(CheckpointId(2))
        .await
        .map_err(err("snapshot_state"))?;
    writer
        .snapshot_state(CheckpointId(3))
        .await
        .map_err(err("snapshot_state"))?;
    commit::<D>(&sink, through_checkpoint::<D>(&sink, &committables)?).await?;
    let open = destination.open_transactions().unwrap_or(0);
    writer.close().await.map_err(err("close"))?;
    if open > 0 {
        return Err(format!(
            "{open} transaction(s) open after end of input and the final commit: the writer opened a new \
             transaction after flush(end_of_input = true) (FLINK-23473); it must not"
        ));
    }
    Ok(Some(()))
}
