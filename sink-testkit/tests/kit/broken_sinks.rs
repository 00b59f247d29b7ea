//! Deliberately broken sinks: the kit must catch each with a property that
//! names the cause, and pass the same sink without its flaw.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use sink_api::{
    async_trait, BincodeSerializer, CheckpointId, CommitRequest, Committer, InitContext,
    SerializerError, Sink, SinkError, SinkWriter, VersionedSerializer,
};
use sink_testkit::{certify_with, Destination, Knobs, Report, Verdict};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    None,
    NonIdempotentCommit,
    LosesBufferAtCheckpoint,
    TransactionAfterEndOfInput,
    CommitsBeforeCompletion,
    /// Decodes its committables with a hand-written reader that trusts the
    /// length it reads.
    TrustingDecoder,
    /// Names batches by subtask and a counter restored from its state: no
    /// generation, no lineage.
    SubtaskCounterIds,
    /// Names batches by generation and subtask, without the lineage: the
    /// names repeat when the job runs again on fresh checkpoint storage.
    NoLineage,
    /// Recognises replays with a set kept in the committer, which a restart
    /// forgets; the destination keeps no trace of what was applied.
    ForgetfulDedup,
    /// Takes a call as one unit: when its first batch was applied, it
    /// signals every batch of the call already committed, so a retry of a
    /// half-applied call skips what was never applied.
    NonAtomicBatch,
    /// At end of input, hands out only full chunks of ten and drops the
    /// remainder.
    DropsRemainder,
    /// Recognises a replay only if this committer applied the batch (as a
    /// sink that looks only where it put files itself); a replay by the
    /// committer of a later start is reported as data lost, although the
    /// data is there: a service would tell its clients to send again.
    ReplayedByAnotherLost,
    /// Recognises replays from what the destination held when the
    /// committer was made (read once, in `create_committer`, as a committer
    /// that loads "what is committed" at start-up), never from the
    /// destination at the call: a replay after a restart is recognised, the
    /// retry of a call whose answer was lost, by the same committer, is
    /// applied again.
    RemembersFromCreation,
    /// Looks a batch up in the destination on its first attempt only: a
    /// request it is asked to retry it takes for one its earlier attempt
    /// did not apply ("it asked for a retry, so it failed"), and applies it
    /// blindly.
    TrustsRetry,
    /// Not a flaw: its destination fails the first request of every
    /// committer half-way, and it asks for a retry, as a correct sink does.
    AsksRetryOnce,
    /// Not a flaw: names batches by lineage, subtask and checkpoint id (no
    /// generation, no counter), unique since a restored writer's ids come
    /// after the restored checkpoint.
    CheckpointNamed,
}

#[derive(Default)]
struct Table {
    committed: Vec<u64>,
    batches: HashSet<String>,
    open: usize,
}

#[derive(Clone)]
struct Toy {
    table: Arc<Mutex<Table>>,
    flaw: Flaw,
    /// The committer's own memory of applied batches: new with every
    /// committer, empty (`ForgetfulDedup`) or the destination's batches at
    /// its creation (`RemembersFromCreation`).
    seen: Arc<Mutex<HashSet<String>>>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Batch {
    id: String,
    ids: Vec<u64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ToyState {
    next: u64,
    buffer: Vec<u64>,
}

/// Buffers records and sends them out in chunks of ten, keeping the rest
/// buffered across checkpoints (in its state), as a batching writer would.
struct ToyWriter {
    toy: Toy,
    prefix: String,
    next: u64,
    buffer: Vec<u64>,
    open: bool,
    ended: bool,
}

impl ToyWriter {
    fn open_transaction(&mut self) {
        if !self.open {
            self.open = true;
            self.toy.table.lock().unwrap().open += 1;
        }
    }

    fn close_transaction(&mut self) {
        if self.open {
            self.open = false;
            self.toy.table.lock().unwrap().open -= 1;
        }
    }
}

#[async_trait]
impl Sink for Toy {
    type Writer = ToyWriter;
    type Committer = Toy;

    async fn create_writer(
        &self,
        cx: &InitContext,
        restored: Vec<ToyState>,
    ) -> Result<ToyWriter, SinkError> {
        let mut writer = ToyWriter {
            toy: self.clone(),
            prefix: match self.flaw {
                Flaw::SubtaskCounterIds => format!("s{}", cx.subtask_index),
                Flaw::NoLineage => format!("g{}-s{}", cx.generation, cx.subtask_index),
                Flaw::CheckpointNamed => format!("{}-s{}", cx.lineage, cx.subtask_index),
                _ => format!("{}-g{}-s{}", cx.lineage, cx.generation, cx.subtask_index),
            },
            next: restored.iter().map(|s| s.next).max().unwrap_or(0),
            buffer: restored.into_iter().flat_map(|s| s.buffer).collect(),
            open: false,
            ended: false,
        };
        if !writer.buffer.is_empty() {
            writer.open_transaction();
        }
        Ok(writer)
    }

    async fn create_committer(&self, _: &InitContext) -> Result<Toy, SinkError> {
        let seen = match self.flaw {
            Flaw::RemembersFromCreation => self.table.lock().unwrap().batches.clone(),
            _ => HashSet::new(),
        };
        Ok(Toy {
            seen: Arc::new(Mutex::new(seen)),
            ..self.clone()
        })
    }

    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<Batch>> {
        match self.flaw {
            Flaw::TrustingDecoder => Arc::new(LengthPrefixed),
            _ => Arc::new(BincodeSerializer::<Batch>::default()),
        }
    }
}

/// A hand-written format: a u32 length, then the bincode payload. Its
/// decoder trusts the bytes it is given, as hand-written decoders often do.
struct LengthPrefixed;

impl VersionedSerializer<Batch> for LengthPrefixed {
    fn version(&self) -> u32 {
        1
    }

    fn serialize(&self, value: &Batch) -> Result<Vec<u8>, SerializerError> {
        let payload = BincodeSerializer::<Batch>::default().serialize(value)?;
        let mut out = (payload.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&payload);
        Ok(out)
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<Batch, SerializerError> {
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        BincodeSerializer::<Batch>::default().deserialize(version, &bytes[4..4 + len])
    }
}

#[async_trait]
impl SinkWriter for ToyWriter {
    type Input = u64;
    type Committable = Batch;
    type State = ToyState;

    async fn write(&mut self, id: u64) -> Result<(), SinkError> {
        self.open_transaction();
        self.buffer.push(id);
        Ok(())
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        self.ended |= end_of_input;
        Ok(())
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: sink_api::CheckpointId,
    ) -> Result<Vec<Batch>, SinkError> {
        let cut = if self.ended && self.toy.flaw != Flaw::DropsRemainder {
            self.buffer.len()
        } else {
            self.buffer.len() / 10 * 10
        };
        let ids: Vec<u64> = self.buffer.drain(..cut).collect();
        if self.ended && self.toy.flaw == Flaw::DropsRemainder {
            self.buffer.clear();
        }
        if self.buffer.is_empty() {
            self.close_transaction();
        }
        if self.toy.flaw == Flaw::CommitsBeforeCompletion {
            self.toy.table.lock().unwrap().committed.extend(&ids);
        }
        if self.toy.flaw == Flaw::TransactionAfterEndOfInput && self.ended {
            // Begins the next transaction eagerly, as some producers do.
            self.open_transaction();
        }
        // A batch per chunk of ten: a call commits several.
        let batches = ids
            .chunks(10)
            .enumerate()
            .map(|(k, chunk)| {
                self.next += 1;
                let id = match self.toy.flaw {
                    Flaw::CheckpointNamed => format!("{}-c{checkpoint_id}-{k}", self.prefix),
                    _ => format!("{}-{}", self.prefix, self.next),
                };
                Batch {
                    id,
                    ids: chunk.to_vec(),
                }
            })
            .collect();
        Ok(batches)
    }

    async fn snapshot_state(&mut self, _: CheckpointId) -> Result<Vec<ToyState>, SinkError> {
        let buffer = match self.toy.flaw {
            Flaw::LosesBufferAtCheckpoint => Vec::new(),
            _ => self.buffer.clone(),
        };
        Ok(vec![ToyState {
            next: self.next,
            buffer,
        }])
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        self.close_transaction();
        self.buffer.clear();
        Ok(())
    }
}

#[async_trait]
impl Committer for Toy {
    type Committable = Batch;

    async fn commit(&mut self, requests: &mut [CommitRequest<Batch>]) -> Result<(), SinkError> {
        let mut table = self.table.lock().unwrap();
        if self.flaw == Flaw::NonAtomicBatch {
            let first_applied = requests
                .first()
                .is_some_and(|r| table.batches.contains(&r.committable().id));
            for request in requests.iter_mut() {
                match first_applied {
                    true => request.signal_already_committed(),
                    false => {
                        let batch = request.committable();
                        table.committed.extend(batch.ids.clone());
                        let id = batch.id.clone();
                        table.batches.insert(id);
                        request.signal_committed();
                    }
                }
            }
            return Ok(());
        }
        for request in requests.iter_mut() {
            if self.flaw == Flaw::AsksRetryOnce
                && self.seen.lock().unwrap().insert("retried".into())
            {
                request.retry_later();
                continue;
            }
            let batch = request.committable();
            let replay = match self.flaw {
                Flaw::ForgetfulDedup | Flaw::RemembersFromCreation => {
                    self.seen.lock().unwrap().contains(&batch.id)
                }
                Flaw::TrustsRetry if request.retry_count() > 0 => false,
                _ => table.batches.contains(&batch.id),
            };
            if self.flaw == Flaw::ForgetfulDedup {
                self.seen.lock().unwrap().insert(batch.id.clone());
            }
            if replay
                && self.flaw == Flaw::ReplayedByAnotherLost
                && !self.seen.lock().unwrap().contains(&batch.id)
            {
                let (records, id) = (batch.ids.len() as u64, batch.id.clone());
                request.signal_records_lost(records, format!("batch {id} not found"));
                continue;
            }
            if replay && self.flaw != Flaw::NonIdempotentCommit {
                request.signal_already_committed();
                continue;
            }
            if self.flaw != Flaw::CommitsBeforeCompletion {
                let ids = batch.ids.clone();
                table.committed.extend(ids);
            }
            let id = batch.id.clone();
            if self.flaw == Flaw::ReplayedByAnotherLost {
                self.seen.lock().unwrap().insert(id.clone());
            }
            table.batches.insert(id);
            request.signal_committed();
        }
        Ok(())
    }
}

struct ToyDestination(Toy);

#[async_trait]
impl Destination for ToyDestination {
    type Sink = Toy;

    async fn sink(&self) -> Toy {
        self.0.clone()
    }

    async fn committed_ids(&self) -> Vec<u64> {
        self.0.table.lock().unwrap().committed.clone()
    }

    async fn open_transactions(&self) -> Option<usize> {
        Some(self.0.table.lock().unwrap().open)
    }
}

async fn certify_toy(flaw: Flaw) -> Report {
    let knobs = Knobs {
        records: 200,
        seeds: 4,
        ..Knobs::default()
    };
    certify_with(
        knobs,
        move || async move {
            ToyDestination(Toy {
                table: Arc::default(),
                flaw,
                seen: Arc::default(),
            })
        },
        |id| id,
    )
    .await
}

fn failure(report: &Report, property: &str) -> String {
    match report.verdict(property) {
        Some(Verdict::Failed(why)) => why.clone(),
        other => panic!("{property} should have failed, got {other:?}:\n{report}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_toy_sink_passes() {
    let report = certify_toy(Flaw::None).await;
    report.assert_passed();
    assert!(
        report
            .properties
            .iter()
            .all(|p| p.verdict == Verdict::Passed),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_idempotent_commit_is_caught() {
    let report = certify_toy(Flaw::NonIdempotentCommit).await;
    assert!(
        failure(&report, "contract/commit-is-idempotent").contains("not idempotent"),
        "{report}"
    );
    assert!(!report.passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_losing_its_buffer_at_a_checkpoint_is_caught() {
    let report = certify_toy(Flaw::LosesBufferAtCheckpoint).await;
    let why = failure(&report, "contract/restore-keeps-written-records");
    assert!(why.contains("must be in snapshot_state"), "{why}");
    assert!(
        report
            .failures()
            .iter()
            .any(|p| p.name.starts_with("crash/")),
        "crashes lose records too:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_opened_after_end_of_input_is_caught() {
    let report = certify_toy(Flaw::TransactionAfterEndOfInput).await;
    let why = failure(&report, "contract/no-transaction-after-end-of-input");
    assert!(
        why.contains("opened a new transaction after flush(end_of_input = true)"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_committing_before_completion_is_caught() {
    let report = certify_toy(Flaw::CommitsBeforeCompletion).await;
    let why = failure(&report, "contract/nothing-visible-before-commit");
    assert!(why.contains("before the checkpoint completes"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoder_that_panics_on_damaged_state_is_caught() {
    let report = certify_toy(Flaw::TrustingDecoder).await;
    let why = failure(&report, "contract/damaged-state-is-an-error");
    assert!(
        why.contains("decoding a stored committable") && why.contains("panicked"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_report_reads_well_in_a_test_failure() {
    let report = certify_toy(Flaw::NonIdempotentCommit).await;
    let shown = std::panic::catch_unwind(|| report.assert_passed())
        .expect_err("assert_passed panics on a failed report");
    let message = shown.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("the sink is not exactly-once"),
        "{message}"
    );
    assert!(
        message.contains("FAILED") && message.contains("contract/commit-is-idempotent"),
        "{message}"
    );
    assert!(message.contains("failed"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_of_subtask_and_restored_counter_are_caught_by_a_rescale_chain() {
    let report = certify_toy(Flaw::SubtaskCounterIds).await;
    let why = failure(&report, "rescale/2-to-1-to-2");
    assert!(
        why.contains("through the parallelisms 2 -> 1 -> 2"),
        "{why}"
    );
    assert!(why.contains("never committed"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_without_the_lineage_are_caught_by_a_run_on_fresh_storage() {
    let report = certify_toy(Flaw::NoLineage).await;
    let why = failure(&report, "rerun/fresh-checkpoint-storage");
    assert!(why.contains("fewer than 2 times"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committer_deduplicating_from_memory_is_caught_by_a_lost_outcome() {
    let report = certify_toy(Flaw::ForgetfulDedup).await;
    let why = failure(&report, "unknown-outcome/first-call");
    assert!(why.contains("committed twice"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committer_not_atomic_within_a_batch_is_caught_by_a_half_applied_call() {
    let report = certify_toy(Flaw::NonAtomicBatch).await;
    let why = failure(&report, "unknown-outcome/middle-of-batch");
    assert!(why.contains("never committed"), "{why}");
    assert_eq!(
        report.verdict("unknown-outcome/first-call"),
        Some(&Verdict::Passed)
    );
}

/// Caught in every run, not one in five: 20 runs of the property alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_dropping_its_end_of_input_remainder_is_caught_every_time() {
    for run in 0..20 {
        let knobs = Knobs {
            records: 200,
            only: vec!["modes/end-of-input-remainder".into()],
            ..Knobs::default()
        };
        let report = certify_with(
            knobs,
            || async {
                ToyDestination(Toy {
                    table: Arc::default(),
                    flaw: Flaw::DropsRemainder,
                    seen: Arc::default(),
                })
            },
            |id| id,
        )
        .await;
        assert_eq!(report.properties.len(), 1, "{report}");
        let why = failure(&report, "modes/end-of-input-remainder");
        assert!(why.contains("never committed"), "run {run}: {why}");
    }
}

/// A committer that reports data it committed before as lost (it did not
/// find it where it looked) is caught, although every record is there once:
/// the kit removes nothing, so a reported loss is a false one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committer_reporting_a_replay_as_lost_is_caught() {
    let report = certify_toy(Flaw::ReplayedByAnotherLost).await;
    let why = failure(&report, "contract/commit-is-idempotent");
    assert!(why.contains("FailedWithKnownReason"), "{why}");
    // And in the runs, by the report of the job: a restart's replays.
    let why = failure(&report, "unknown-outcome/first-call");
    assert!(
        why.contains("reported their data lost") && why.contains("not found"),
        "{why}"
    );
}

/// A correct sink that asks for a retry (its destination failed a commit
/// half-way) is not failed: the hand-run commits of the contract checks
/// retry as the runtime does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_asking_to_retry_a_commit_passes() {
    let report = certify_toy(Flaw::AsksRetryOnce).await;
    report.assert_passed();
}

/// A correct sink naming batches by lineage, subtask and checkpoint id
/// passes: the contract checks tag a restored writer's end of input after
/// the restored checkpoint, as the runtime does, and do not blame its names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_naming_batches_by_checkpoint_passes() {
    let report = certify_toy(Flaw::CheckpointNamed).await;
    report.assert_passed();
}

/// The in-place retry class (issue 33): a committer that recognises a
/// replay only after a restore.
const RETRIED_IN_PLACE: &str = "unknown-outcome/retried-in-place";

/// A committer that recognises a replay only after a restore (from what it
/// loaded at its creation, or by trusting that a request it is asked to
/// retry was never applied) is caught by `unknown-outcome/retried-in-place`
/// in every run, 10 runs of the property alone for each: the first commit
/// call of every job loses its answer, and the same committer applies it
/// again, whatever the timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committer_recognising_replays_only_after_a_restore_is_caught_every_time() {
    for flaw in [Flaw::RemembersFromCreation, Flaw::TrustsRetry] {
        for run in 0..10 {
            let knobs = Knobs {
                records: 200,
                only: vec![RETRIED_IN_PLACE.into()],
                ..Knobs::default()
            };
            let report = certify_with(
                knobs,
                move || async move {
                    ToyDestination(Toy {
                        table: Arc::default(),
                        flaw,
                        seen: Arc::default(),
                    })
                },
                |id| id,
            )
            .await;
            assert_eq!(report.properties.len(), 1, "{report}");
            let why = failure(&report, RETRIED_IN_PLACE);
            assert!(
                why.contains("the first commit call of the job")
                    && why.contains("retried it in place")
                    && why.contains("committed twice"),
                "{flaw:?}, run {run}: {why}"
            );
        }
    }
}

/// The same committers pass every other property: only an in-place retry
/// shows their flaw, so this test is what proves the property adds a check
/// (it fails if an older property starts catching them, or if the new one
/// stops). Every scenario with a restart hands the replay to a new
/// committer, which recognises it; the contract checks make a committer per
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committer_recognising_replays_only_after_a_restore_passes_every_other_property() {
    for flaw in [Flaw::RemembersFromCreation, Flaw::TrustsRetry] {
        let report = certify_toy(flaw).await;
        let failed: Vec<&str> = report.failures().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(failed, vec![RETRIED_IN_PLACE], "{flaw:?}:\n{report}");
        assert!(report.unchecked().is_empty(), "{flaw:?}:\n{report}");
    }
}
