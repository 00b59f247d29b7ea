//! The format of the sink's committables in checkpoints, and the older
//! format still read.
//!
//! | version | what changed |
//! |---|---|
//! | 1 | one data file ([`DataFile`]) |
//! | 2 | a data file or the source positions of a subtask's files ([`DeltaCommittable`]) |
//!
//! Committables are written in version 2. A version 1 blob reads as a data
//! file, so that checkpoints taken before an upgrade resume after it.
//! Writer states have no values ([`NoResume`](crate::NoResume)): version 1.

use sink_api::{BincodeSerializer, SerializerError, VersionedSerializer};

use crate::committable::{DataFile, DeltaCommittable};

/// The committables' serializer: writes version 2, reads 1 and 2. Given to
/// the runtime by `Sink::committable_serializer`.
#[derive(Debug, Default)]
pub struct CommittableFormat;

/// The version written.
const VERSION: u32 = 2;

impl VersionedSerializer<DeltaCommittable> for CommittableFormat {
    fn version(&self) -> u32 {
        VERSION
    }

    fn serialize(&self, value: &DeltaCommittable) -> Result<Vec<u8>, SerializerError> {
        BincodeSerializer::<DeltaCommittable>::new(VERSION).serialize(value)
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<DeltaCommittable, SerializerError> {
        match version {
            1 => BincodeSerializer::<DataFile>::new(1)
                .deserialize(1, bytes)
                .map(DeltaCommittable::File),
            // Refuses any other version, naming it.
            _ => BincodeSerializer::<DeltaCommittable>::new(VERSION).deserialize(version, bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use sink_api::{deserialize_versioned, serialize_versioned, PositionAdvance, SplitKey};

    use super::*;
    use crate::committable::CarriedPositions;

    fn file() -> DataFile {
        DataFile {
            app_id: "j/L".into(),
            path: "a.parquet".into(),
            size: 9,
            rows: 2,
            partition_values: vec![("day".into(), Some("1".into()))],
            stats: None,
            modification_time: 5,
        }
    }

    /// A version 1 committable as the sink wrote it before positions
    /// (`BincodeSerializer` version 1 of a `DataFile`): must read for good.
    const GOLDEN_V1: &[u8] = &[
        // blob header: magic and version 1
        b'E', b'O', 1, 0, 0, 0, //
        // app_id "j/L"
        3, b'j', b'/', b'L', //
        // path "a.parquet"
        9, b'a', b'.', b'p', b'a', b'r', b'q', b'u', b'e', b't', //
        // size 9, rows 2
        9, 2, //
        // partition_values: one ("day", Some("1"))
        1, 3, b'd', b'a', b'y', 1, 1, b'1', //
        // stats: None; modification_time 5 (zigzag: 10)
        0, 10,
    ];

    #[test]
    fn a_version_1_committable_reads_as_a_data_file() {
        let read = deserialize_versioned(&CommittableFormat, GOLDEN_V1).expect("version 1 reads");
        assert_eq!(read, DeltaCommittable::File(file()));
        assert_eq!(
            serialize_versioned(&BincodeSerializer::<DataFile>::new(1), &file()).unwrap(),
            GOLDEN_V1,
            "the golden bytes are what version 1 wrote"
        );
    }

    /// A version 2 committable carrying positions: what this version
    /// writes, read for good by later ones.
    const GOLDEN_V2: &[u8] = &[
        // blob header: magic and version 2
        b'E', b'O', 2, 0, 0, 0, //
        // variant 1: Positions; app_id "j/L"
        1, 3, b'j', b'/', b'L', //
        // files: one, "a.parquet"
        1, 9, b'a', b'.', b'p', b'a', b'r', b'q', b'u', b'e', b't', //
        // advances: one; key ("g", "3"); from Some(10); to 12
        1, 1, b'g', 1, b'3', 1, 10, 12,
    ];

    #[test]
    fn a_version_2_committable_with_positions_reads_for_good() {
        let committable = DeltaCommittable::Positions(CarriedPositions {
            app_id: "j/L".into(),
            files: vec!["a.parquet".into()],
            advances: vec![PositionAdvance {
                key: SplitKey::new("g", "3"),
                from: Some(10),
                to: 12,
            }],
        });
        assert_eq!(
            deserialize_versioned(&CommittableFormat, GOLDEN_V2).unwrap(),
            committable
        );
        assert_eq!(
            serialize_versioned(&CommittableFormat, &committable).unwrap(),
            GOLDEN_V2
        );
    }

    #[test]
    fn version_2_round_trips_with_positions_and_other_versions_are_refused() {
        for committable in [
            DeltaCommittable::File(file()),
            DeltaCommittable::Positions(CarriedPositions {
                app_id: "j/L".into(),
                files: vec!["a.parquet".into()],
                advances: vec![PositionAdvance {
                    key: SplitKey::new("group/topic", "3"),
                    from: Some(10),
                    to: 12,
                }],
            }),
        ] {
            let blob = serialize_versioned(&CommittableFormat, &committable).unwrap();
            assert_eq!(blob[2], 2, "written in version 2");
            assert_eq!(
                deserialize_versioned(&CommittableFormat, &blob).unwrap(),
                committable
            );
        }
        let mut blob =
            serialize_versioned(&CommittableFormat, &DeltaCommittable::File(file())).unwrap();
        blob[2] = 3;
        let error = deserialize_versioned(&CommittableFormat, &blob).unwrap_err();
        assert!(
            matches!(error, SerializerError::UnsupportedVersion { found: 3, .. }),
            "{error}"
        );
    }
}
