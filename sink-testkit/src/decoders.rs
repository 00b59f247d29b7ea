//! The sink's decoders of stored state, fed damaged bytes.
//!
//! Committables and writer states are read back from checkpoint storage
//! after a crash, whatever bytes are there: a damaged disk, a file edited by
//! hand, a checkpoint written by another build. The sink's serializers must
//! answer each with a value or an error. A panic there fails every restart of
//! the job the same way, and a reservation sized by a corrupt length field
//! aborts the process. This property takes the blobs a real run stored,
//! damages them (flipped, truncated and inserted bytes, length fields
//! claiming up to 2^64) and decodes each with the sink's own serializers.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use sink_api::InputOf;
use sink_api::{deserialize_versioned, Sink, VersionedSerializer};
use sink_runtime::MemoryCheckpointStorage;

use crate::crashes::Rng;
use crate::modes::describe;
use crate::runner::{run, Shape};
use crate::{Destination, RecordMaker};

/// Damaged copies decoded per stored blob.
const DAMAGES_PER_BLOB: u64 = 48;

/// Stored blobs tried at most, of each kind.
const BLOBS_PER_KIND: usize = 24;

/// Runs a job that stores every checkpoint, then decodes damaged copies of
/// its committables and writer states. Returns how many decodes were tried
/// (`None` when no checkpoint held either, so nothing could be tried);
/// fails naming the first panic.
pub(crate) async fn damaged_state<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    parallelism: usize,
) -> Result<Option<u64>, String> {
    let storage = MemoryCheckpointStorage::new(usize::MAX);
    let shape = Shape::streaming(records, parallelism);
    run(destination, record, &shape, &storage)
        .await
        .map_err(describe)?;
    let checkpoints = storage.checkpoints();
    let committables: Vec<Vec<u8>> = checkpoints
        .iter()
        .flat_map(|c| &c.subtasks)
        .flat_map(|s| &s.pending)
        .flat_map(|p| p.committables.iter().cloned())
        .take(BLOBS_PER_KIND)
        .collect();
    let states: Vec<Vec<u8>> = checkpoints
        .iter()
        .flat_map(|c| &c.subtasks)
        .flat_map(|s| s.writer_states.iter().cloned())
        .take(BLOBS_PER_KIND)
        .collect();
    if committables.is_empty() && states.is_empty() {
        return Ok(None);
    }
    let sink = destination.sink().await;
    let mut rng = Rng::new(0x5eed);
    let mut tried = try_damaged(
        "committable",
        &sink.committable_serializer(),
        &committables,
        &mut rng,
    )?;
    tried += try_damaged(
        "writer state",
        &sink.writer_state_serializer(),
        &states,
        &mut rng,
    )?;
    Ok(Some(tried))
}

/// Decodes damaged copies of each blob with `serializer`.
fn try_damaged<T>(
    what: &str,
    serializer: &Arc<dyn VersionedSerializer<T>>,
    blobs: &[Vec<u8>],
    rng: &mut Rng,
) -> Result<u64, String> {
    let mut tried = 0;
    for blob in blobs {
        for _ in 0..DAMAGES_PER_BLOB {
            let (damage, damaged) = damage(blob, rng);
            let decoded = catch_unwind(AssertUnwindSafe(|| {
                deserialize_versioned(&**serializer, &damaged).map(drop)
            }));
            if let Err(panic) = decoded {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                return Err(format!(
                    "decoding a stored {what} with {damage} panicked ({message}); a damaged \
                     checkpoint must give an error, never a panic: check every length and \
                     index your VersionedSerializer reads, or use BincodeSerializer \
                     (damaged blob: {damaged:02x?})"
                ));
            }
            tried += 1;
        }
    }
    Ok(tried)
}

/// One damaged copy of `blob`, and what was done to it. The first 6 bytes
/// (the envelope with the format version) are left alone, except by random
/// bytes, so that most copies reach the sink's own decoder.
fn damage(blob: &[u8], rng: &mut Rng) -> (String, Vec<u8>) {
    const ENVELOPE: usize = 6;
    let mut out = blob.to_vec();
    let span = out.len().saturating_sub(ENVELOPE).max(1) as u64;
    let at = (ENVELOPE + rng.below(span) as usize).min(out.len());
    match rng.below(5) {
        0 => {
            let len = rng.below(64) as usize;
            out = (0..len).map(|_| rng.below(256) as u8).collect();
            (format!("{len} random bytes"), out)
        }
        1 => {
            if let Some(byte) = out.get_mut(at) {
                *byte ^= 1 + rng.below(255) as u8;
            }
            (format!("byte {at} flipped"), out)
        }
        2 => {
            out.truncate(at);
            (format!("the blob cut at byte {at}"), out)
        }
        3 => {
            let claimed = match rng.below(4) {
                0 => u64::MAX,
                1 => 1 << 40,
                2 => 1 << 31,
                _ => rng.below(1 << 20),
            };
            // bincode's varint marker for a u64, then the value.
            let mut field = vec![253];
            field.extend_from_slice(&claimed.to_le_bytes());
            let end = (at + field.len()).min(out.len());
            out.splice(at..end, field);
            (format!("a length field of {claimed} at byte {at}"), out)
        }
        _ => {
            let inserted: Vec<u8> = (0..1 + rng.below(8))
                .map(|_| rng.below(256) as u8)
                .collect();
            let count = inserted.len();
            out.splice(at..at, inserted);
            (format!("{count} bytes inserted at byte {at}"), out)
        }
    }
}
