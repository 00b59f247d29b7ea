//! The codecs of record batches: what the sink writes with (Kafka's
//! `compression.type`), and the name of the codec a fetched batch uses.
//!
//! Every codec Kafka has is read wherever this client reads batches (the
//! Kafka source, the sink's marker and `read_committed` reads): gzip,
//! snappy, lz4 and zstd, through the `kafka-protocol` crate's features.

use std::str::FromStr;

use kafka_protocol::records::Compression;

/// The codec the Kafka sink compresses its batches with: Kafka's
/// `compression.type`, `none` by default.
///
/// Set by `KafkaSinkBuilder::compression` or a client properties file's
/// `compression.type`; read by every producer session of the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompressionType {
    /// Uncompressed (the default).
    #[default]
    None,
    /// gzip.
    Gzip,
    /// Snappy.
    Snappy,
    /// LZ4.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl CompressionType {
    /// The codec of `kafka-protocol`'s batch encoder.
    pub fn codec(self) -> Compression {
        match self {
            CompressionType::None => Compression::None,
            CompressionType::Gzip => Compression::Gzip,
            CompressionType::Snappy => Compression::Snappy,
            CompressionType::Lz4 => Compression::Lz4,
            CompressionType::Zstd => Compression::Zstd,
        }
    }

    /// Its name, as `compression.type` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CompressionType::None => "none",
            CompressionType::Gzip => "gzip",
            CompressionType::Snappy => "snappy",
            CompressionType::Lz4 => "lz4",
            CompressionType::Zstd => "zstd",
        }
    }
}

impl std::fmt::Display for CompressionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CompressionType {
    type Err = String;

    /// `none`, `gzip`, `snappy`, `lz4` or `zstd`, in any case; another
    /// name is refused, naming those.
    fn from_str(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(CompressionType::None),
            "gzip" => Ok(CompressionType::Gzip),
            "snappy" => Ok(CompressionType::Snappy),
            "lz4" => Ok(CompressionType::Lz4),
            "zstd" => Ok(CompressionType::Zstd),
            other => Err(format!(
                "compression.type {other:?} is none of none, gzip, snappy, lz4, zstd"
            )),
        }
    }
}

/// The codec of the first batch in `bytes` (a fetch answer's records of one
/// partition), by name, or `None` when they are too short to say: for
/// errors that name why a batch could not be read.
pub fn codec_of_first_batch(bytes: &[u8]) -> Option<String> {
    // Batch header (format 2): base offset (8), length (4), leader epoch
    // (4), magic (1), crc (4), then the attributes (2), whose lowest three
    // bits are the codec.
    let magic = *bytes.get(16)?;
    if magic != 2 {
        return Some(format!("a batch of message format {magic}"));
    }
    let attributes = i16::from_be_bytes([*bytes.get(21)?, *bytes.get(22)?]);
    Some(match attributes & 0x7 {
        0 => "none".into(),
        1 => "gzip".into(),
        2 => "snappy".into(),
        3 => "lz4".into(),
        4 => "zstd".into(),
        other => format!("the unknown codec {other}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(i: i64) -> Record {
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: i as i32,
            timestamp: 0,
            key: Some(format!("k{i}").into()),
            value: Some(format!("v{i}").repeat(20).into()),
            headers: Default::default(),
        }
    }

    #[test]
    fn every_codec_reads_back_what_it_wrote_and_is_named_in_the_batch() {
        for name in ["none", "gzip", "snappy", "lz4", "zstd"] {
            let codec: CompressionType = name.parse().unwrap();
            assert_eq!(codec.name(), name);
            let records: Vec<Record> = (0..50).map(record).collect();
            let mut bytes = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut bytes,
                records.iter(),
                &RecordEncodeOptions {
                    version: 2,
                    compression: codec.codec(),
                },
            )
            .unwrap();
            assert_eq!(codec_of_first_batch(&bytes).as_deref(), Some(name));
            let mut bytes = bytes.freeze();
            let decoded = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
            let values: Vec<_> = decoded
                .iter()
                .flat_map(|set| set.records.iter().map(|r| r.value.clone()))
                .collect();
            assert_eq!(values.len(), 50, "{name}");
            assert_eq!(values[49], records[49].value, "{name}");
        }
        assert!("brotli"
            .parse::<CompressionType>()
            .unwrap_err()
            .contains("zstd"));
        assert_eq!("ZSTD".parse(), Ok(CompressionType::Zstd));
        assert_eq!(codec_of_first_batch(&[0; 5]), None);
    }
}
