//! The format of the Kafka sink's committables in checkpoints, and the
//! older one still read.
//!
//! | version | what changed |
//! |---|---|
//! | 1 | the transaction's identity, checkpoint, subtask, slot and record count |
//! | 2 | the source positions the transaction commits (`positions`) |
//!
//! Committables are written in version 2; version 1 is read as version 2
//! without positions, so that checkpoints taken before an upgrade resume
//! after it.

use serde::{Deserialize, Serialize};
use sink_api::{BincodeSerializer, SerializerError, VersionedSerializer};

use crate::transaction::TransactionIdentity;
use crate::writer::KafkaCommittable;

/// The version written.
const VERSION: u32 = 2;

/// Writes version 2 of [`KafkaCommittable`], reads 1 and 2.
pub(crate) struct CommittableFormat;

/// Version 1, as it was.
#[derive(Serialize, Deserialize)]
struct CommittableV1 {
    transaction: TransactionIdentity,
    checkpoint: u64,
    subtask: usize,
    slot: u32,
    records: u64,
}

impl From<CommittableV1> for KafkaCommittable {
    fn from(v1: CommittableV1) -> KafkaCommittable {
        KafkaCommittable {
            transaction: v1.transaction,
            checkpoint: v1.checkpoint,
            subtask: v1.subtask,
            slot: v1.slot,
            records: v1.records,
            positions: Vec::new(),
        }
    }
}

impl VersionedSerializer<KafkaCommittable> for CommittableFormat {
    fn version(&self) -> u32 {
        VERSION
    }

    fn serialize(&self, value: &KafkaCommittable) -> Result<Vec<u8>, SerializerError> {
        BincodeSerializer::<KafkaCommittable>::new(VERSION).serialize(value)
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<KafkaCommittable, SerializerError> {
        match version {
            1 => BincodeSerializer::<CommittableV1>::new(1)
                .deserialize(1, bytes)
                .map(Into::into),
            // Refuses any other with `UnsupportedVersion`, naming it.
            _ => BincodeSerializer::<KafkaCommittable>::new(VERSION).deserialize(version, bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sink_api::{PositionAdvance, SplitKey};

    fn committable(positions: Vec<PositionAdvance>) -> KafkaCommittable {
        KafkaCommittable {
            transaction: TransactionIdentity {
                transactional_id: "job.l.s0.t0".into(),
                producer_id: 7,
                epoch: 3,
            },
            checkpoint: 12,
            subtask: 0,
            slot: 0,
            records: 5,
            positions,
        }
    }

    #[test]
    fn version_1_reads_as_a_committable_without_positions_and_2_round_trips() {
        let v1 = CommittableV1 {
            transaction: committable(Vec::new()).transaction,
            checkpoint: 12,
            subtask: 0,
            slot: 0,
            records: 5,
        };
        let bytes = BincodeSerializer::<CommittableV1>::new(1)
            .serialize(&v1)
            .unwrap();
        let format = CommittableFormat;
        assert_eq!(
            format.deserialize(1, &bytes).unwrap(),
            committable(Vec::new())
        );
        let with = committable(vec![PositionAdvance {
            key: SplitKey::new("kafka/t/g", "-/0"),
            from: Some(4),
            to: 9,
        }]);
        let bytes = format.serialize(&with).unwrap();
        assert_eq!(format.deserialize(2, &bytes).unwrap(), with);
        assert!(format.deserialize(3, &bytes).is_err());
    }
}
