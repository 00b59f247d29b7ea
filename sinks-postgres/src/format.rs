//! The format of the sink's committables in checkpoints, and the older
//! formats still read.
//!
//! | version | what changed |
//! |---|---|
//! | 1 | the transaction's id and its row count |
//! | 2 | the source positions it advances, and whether it was superseded when it was prepared |
//!
//! Committables are written in version 2. A version 1 blob reads as a
//! committable without positions, so that checkpoints taken before an
//! upgrade resume after it. Writer states did not change (version 1).

use serde::{Deserialize, Serialize};
use sink_api::{BincodeSerializer, SerializerError, VersionedSerializer};

use crate::writer::PgCommittable;

/// The committables' serializer: writes version 2, reads 1 and 2. Given to
/// the runtime by `Sink::committable_serializer`.
#[derive(Debug, Default)]
pub(crate) struct CommittableFormat;

/// The version written.
const VERSION: u32 = 2;

/// A committable of version 1.
#[derive(Serialize, Deserialize)]
struct CommittableV1 {
    gid: String,
    rows: u64,
}

impl From<CommittableV1> for PgCommittable {
    fn from(old: CommittableV1) -> PgCommittable {
        PgCommittable {
            gid: old.gid,
            rows: old.rows,
            advances: Vec::new(),
            superseded: None,
            chained_on: Vec::new(),
        }
    }
}

impl VersionedSerializer<PgCommittable> for CommittableFormat {
    fn version(&self) -> u32 {
        VERSION
    }

    fn serialize(&self, value: &PgCommittable) -> Result<Vec<u8>, SerializerError> {
        BincodeSerializer::<PgCommittable>::new(VERSION).serialize(value)
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<PgCommittable, SerializerError> {
        match version {
            1 => BincodeSerializer::<CommittableV1>::new(1)
                .deserialize(1, bytes)
                .map(Into::into),
            // Refuses any other version, naming it.
            _ => BincodeSerializer::<PgCommittable>::new(VERSION).deserialize(version, bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use sink_api::{deserialize_versioned, serialize_versioned, PositionAdvance, SplitKey};

    use super::*;

    /// A version 1 committable as the sink wrote it before positions
    /// (`BincodeSerializer` version 1 of `{ gid, rows }`): must read for
    /// good.
    const GOLDEN_V1: &[u8] = &[
        // blob header: magic and version 1
        b'E', b'O', 1, 0, 0, 0, //
        // gid: length 13, "eo1/j/L/1/0/3"
        13, b'e', b'o', b'1', b'/', b'j', b'/', b'L', b'/', b'1', b'/', b'0', b'/', b'3', //
        // rows: 7
        7,
    ];

    #[test]
    fn a_version_1_committable_reads_as_one_without_positions() {
        let read = deserialize_versioned(&CommittableFormat, GOLDEN_V1).expect("version 1 reads");
        assert_eq!(
            read,
            PgCommittable {
                gid: "eo1/j/L/1/0/3".into(),
                rows: 7,
                advances: Vec::new(),
                superseded: None,
                chained_on: Vec::new(),
            }
        );
        // The golden bytes are what version 1 wrote.
        let old = CommittableV1 {
            gid: "eo1/j/L/1/0/3".into(),
            rows: 7,
        };
        assert_eq!(
            serialize_versioned(&BincodeSerializer::<CommittableV1>::new(1), &old).unwrap(),
            GOLDEN_V1
        );
    }

    #[test]
    fn version_2_round_trips_with_positions_and_other_versions_are_refused() {
        let committable = PgCommittable {
            gid: "eo1/j/L/1/0/3".into(),
            rows: 2,
            advances: vec![PositionAdvance {
                key: SplitKey::new("group/topic", "3"),
                from: Some(10),
                to: 12,
            }],
            superseded: Some("moved".into()),
            chained_on: vec!["eo1/j/L/1/0/2".into()],
        };
        let blob = serialize_versioned(&CommittableFormat, &committable).unwrap();
        assert_eq!(
            deserialize_versioned(&CommittableFormat, &blob).unwrap(),
            committable
        );
        let error = CommittableFormat.deserialize(3, &[]).unwrap_err();
        assert!(
            matches!(error, SerializerError::UnsupportedVersion { found: 3, .. }),
            "{error}"
        );
    }
}
