//! Versioned serialization of committables and writer states.
//!
//! Committables and writer states outlive the process that made them: they sit
//! in checkpoints and are read back after a crash, possibly by a newer build of
//! the sink. So every blob the runtime stores carries the format version it was
//! written with, and a serializer is asked to read a given version, not just
//! "the" format. [`BincodeSerializer`] is the default; a sink that changes its
//! committable type bumps the version and keeps reading the old one.
//!
//! The envelope written by [`serialize_versioned`] is:
//!
//! ```text
//! +---------+----------------+-----------------------+
//! | "EO"    | version: u32le | payload (serializer's) |
//! +---------+----------------+-----------------------+
//! ```

use std::marker::PhantomData;

use serde::{de::DeserializeOwned, Serialize};

/// Magic bytes at the start of every versioned blob.
const BLOB_MAGIC: [u8; 2] = *b"EO";
/// Length of the envelope header: magic plus the version.
const BLOB_HEADER_LEN: usize = BLOB_MAGIC.len() + 4;

/// A failure to encode or decode a committable or a writer state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SerializerError {
    /// The value could not be encoded.
    #[error("cannot encode {what}: {message}")]
    Encode {
        /// The type being encoded.
        what: &'static str,
        /// The codec's explanation.
        message: String,
    },
    /// The bytes could not be decoded: they are corrupt or of another type.
    #[error("cannot decode {what} (format version {version}): {message}; the stored state is corrupt or was written by an incompatible sink")]
    Decode {
        /// The type being decoded.
        what: &'static str,
        /// The format version the blob claims.
        version: u32,
        /// The codec's explanation.
        message: String,
    },
    /// The blob was written with a format version this serializer cannot read.
    #[error("cannot decode {what}: format version {found} is not supported (this build reads version {supported}); run a build of the sink that knows version {found}")]
    UnsupportedVersion {
        /// The type being decoded.
        what: &'static str,
        /// The version found in the blob.
        found: u32,
        /// The version this serializer reads.
        supported: u32,
    },
    /// The blob is too short or lacks the envelope's magic bytes.
    #[error("cannot decode {what}: the blob of {len} bytes has no valid version header; the stored state is truncated or corrupt")]
    BadEnvelope {
        /// The type being decoded.
        what: &'static str,
        /// The blob's length in bytes.
        len: usize,
    },
}

/// Turns values of `T` into bytes and back, under an explicit format version.
///
/// Called by the runtime: [`serialize`](Self::serialize) when it snapshots
/// committables and writer states into a checkpoint,
/// [`deserialize`](Self::deserialize) when it restores them, possibly in a later
/// build of the program.
///
/// # Guarantees
///
/// - `deserialize(self.version(), serialize(v))` returns a value equal to `v`.
/// - `deserialize` accepts every version this sink ever wrote that it still
///   supports, and returns [`SerializerError::UnsupportedVersion`] for others.
pub trait VersionedSerializer<T>: Send + Sync {
    /// The format version [`serialize`](Self::serialize) writes.
    fn version(&self) -> u32;

    /// Encodes `value` in the format of [`version`](Self::version).
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerializerError>;

    /// Appends the encoding [`serialize`](Self::serialize) returns to `out`.
    /// Called by [`serialize_versioned`], so that a stored blob is made
    /// in one buffer. The default copies what `serialize` returns; a
    /// serializer of large values (a writer state holding megabytes)
    /// encodes straight into `out`, as [`BincodeSerializer`] does, and
    /// saves that copy.
    fn serialize_into(&self, value: &T, out: &mut Vec<u8>) -> Result<(), SerializerError> {
        out.extend_from_slice(&self.serialize(value)?);
        Ok(())
    }

    /// Decodes bytes written in format `version`.
    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<T, SerializerError>;
}

/// Encodes `value` into a self-describing blob: the envelope header with the
/// serializer's version, then the payload.
pub fn serialize_versioned<T>(
    serializer: &dyn VersionedSerializer<T>,
    value: &T,
) -> Result<Vec<u8>, SerializerError> {
    let mut blob = Vec::with_capacity(BLOB_HEADER_LEN);
    blob.extend_from_slice(&BLOB_MAGIC);
    blob.extend_from_slice(&serializer.version().to_le_bytes());
    serializer.serialize_into(value, &mut blob)?;
    Ok(blob)
}

/// Decodes a blob written by [`serialize_versioned`], whatever version it
/// carries, as long as `serializer` supports that version.
pub fn deserialize_versioned<T>(
    serializer: &dyn VersionedSerializer<T>,
    blob: &[u8],
) -> Result<T, SerializerError> {
    let (version, payload) = split_versioned::<T>(blob)?;
    serializer.deserialize(version, payload)
}

/// The version a blob written by [`serialize_versioned`] carries, and its
/// payload: for a decoder that reads the payload in parts (a stored state
/// whose header is followed by sealed chunks). `T` names the type in the
/// error for a blob without the envelope.
pub fn split_versioned<T>(blob: &[u8]) -> Result<(u32, &[u8]), SerializerError> {
    let header = blob
        .get(..BLOB_HEADER_LEN)
        .filter(|header| header[..BLOB_MAGIC.len()] == BLOB_MAGIC)
        .ok_or(SerializerError::BadEnvelope {
            what: std::any::type_name::<T>(),
            len: blob.len(),
        })?;
    let mut version = [0u8; 4];
    version.copy_from_slice(&header[BLOB_MAGIC.len()..]);
    Ok((u32::from_le_bytes(version), &blob[BLOB_HEADER_LEN..]))
}

/// The default serializer: bincode 2 over serde, at one fixed format version.
///
/// Reads only the version it writes. A sink that changes its committable type
/// implements [`VersionedSerializer`] itself and keeps decoding old versions.
pub struct BincodeSerializer<T> {
    version: u32,
    _type: PhantomData<fn() -> T>,
}

impl<T> BincodeSerializer<T> {
    /// A serializer that writes and reads format `version`.
    pub fn new(version: u32) -> BincodeSerializer<T> {
        BincodeSerializer {
            version,
            _type: PhantomData,
        }
    }
}

impl<T> Default for BincodeSerializer<T> {
    /// Format version 1.
    fn default() -> BincodeSerializer<T> {
        BincodeSerializer::new(1)
    }
}

impl<T> std::fmt::Debug for BincodeSerializer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BincodeSerializer")
            .field("type", &std::any::type_name::<T>())
            .field("version", &self.version)
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned> VersionedSerializer<T> for BincodeSerializer<T> {
    fn version(&self) -> u32 {
        self.version
    }

    /// Refuses a payload over [`MAX_DECODED_PAYLOAD`]: what could not be
    /// read back must not be stored (a checkpoint holding it would fail,
    /// rather than one that no restore can read).
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerializerError> {
        let mut payload = Vec::new();
        encode_bincode_into(value, &mut payload)?;
        Ok(payload)
    }

    fn serialize_into(&self, value: &T, out: &mut Vec<u8>) -> Result<(), SerializerError> {
        encode_bincode_into(value, out).map(|_| ())
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<T, SerializerError> {
        let what = std::any::type_name::<T>();
        if version != self.version {
            return Err(SerializerError::UnsupportedVersion {
                what,
                found: version,
                supported: self.version,
            });
        }
        let decode_error = |message: String| SerializerError::Decode {
            what,
            version,
            message,
        };
        let (value, read) = decode_bincode_bounded(bytes).map_err(decode_error)?;
        if read != bytes.len() {
            return Err(decode_error(format!(
                "{} trailing bytes after the value",
                bytes.len() - read
            )));
        }
        Ok(value)
    }
}

/// How many bytes bincode may count as decoded per byte of input.
///
/// bincode's limit counts the decoded size of what it reads (8 bytes for a
/// `u64` whatever its varint encoding took, 16 for a `u128`, a string's
/// length), never more than 16 times the bytes that encoded it.
const DECODED_PER_INPUT_BYTE: usize = 16;

/// The smallest limit tried, so that tiny blobs do not need their own step.
const MIN_LIMIT_EXPONENT: u32 = 12;

// Decoding limits reach 2^34 bytes: a `usize` must hold them.
const _: () = assert!(
    usize::BITS >= 64,
    "sink-api needs a 64-bit target: its decoding limits do not fit a smaller usize"
);

/// The largest payload decoded: 1 GiB. A committable or writer state beyond
/// it is refused with a clear error rather than decoded.
pub const MAX_DECODED_PAYLOAD: usize = 1 << 30;

/// Appends the bincode 2 encoding of `value` (the standard configuration,
/// as [`BincodeSerializer`] writes it) to `out` and returns its length.
///
/// Called by serializers and by the runtime's checkpoint storage when they
/// encode state. The encoding's size is counted first and reserved exactly,
/// so a value of many megabytes costs one buffer of its size: not a buffer
/// grown by doubling, nor a copy into the blob around it. Refuses a value
/// whose encoding is over [`MAX_DECODED_PAYLOAD`]: what a restore would not
/// read back must not be stored. On an error `out` is as it was.
pub fn encode_bincode_into<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
) -> Result<usize, SerializerError> {
    let what = std::any::type_name::<T>();
    let encode_error = |err: bincode::error::EncodeError| SerializerError::Encode {
        what,
        message: err.to_string(),
    };
    let config = bincode::config::standard();
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, config).map_err(encode_error)?;
    check_encoded_len(what, size.bytes_written)?;
    let start = out.len();
    out.reserve_exact(size.bytes_written);
    let encoded = bincode::serde::encode_into_writer(value, Append(out), config)
        .map_err(encode_error)
        .and_then(|()| check_encoded_len(what, out.len() - start));
    match encoded {
        Ok(()) => Ok(out.len() - start),
        Err(error) => {
            // Nothing half-written is left behind.
            out.truncate(start);
            Err(error)
        }
    }
}

/// A bincode writer that appends to a vector.
struct Append<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for Append<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// Refuses to store a payload of `len` bytes that [`decode_bincode_bounded`] would
/// refuse to read.
fn check_encoded_len(what: &'static str, len: usize) -> Result<(), SerializerError> {
    if len > MAX_DECODED_PAYLOAD {
        return Err(SerializerError::Encode {
            what,
            message: format!(
                "its encoding of {len} bytes is larger than the {MAX_DECODED_PAYLOAD} bytes a \
                 restore reads back; keep less in one committable or writer state"
            ),
        });
    }
    Ok(())
}

/// Decodes a bincode 2 payload so that no length or count in it can make
/// the decoder reserve memory the input cannot back.
///
/// bincode reserves a string's or a byte buffer's memory from its length
/// field before reading it, so 20 crafted bytes claiming 2^40 of them would
/// abort the process. Its limit bounds what a decode may claim; it is a
/// constant of the configuration's type, so the smallest power of two
/// admitting every honest payload of this length
/// (16 times it) is picked among fixed steps. A
/// payload of `n` bytes thus never reserves more than `32 n` bytes (4 KiB at
/// least) for one value, and serde caps each sequence's pre-allocation at
/// 1 MiB by itself.
///
/// Returns the value and how many bytes it took; the error says why not, in
/// words. Used by [`BincodeSerializer`], and by formats that keep bincode
/// values inside their own bytes (the pipeline's stored idempotency keys):
/// a value decoded from the front of a longer slice is bounded by that
/// slice's length.
pub fn decode_bincode_bounded<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), String> {
    if bytes.len() > MAX_DECODED_PAYLOAD {
        return Err(format!(
            "its payload of {} bytes is larger than the {} bytes this build decodes",
            bytes.len(),
            MAX_DECODED_PAYLOAD
        ));
    }
    let needed = bytes.len().saturating_mul(DECODED_PER_INPUT_BYTE);
    let exponent = needed
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_LIMIT_EXPONENT);
    macro_rules! with_limit {
        ($($exp:literal)+) => {
            match exponent {
                $($exp => bincode::serde::decode_from_slice(
                    bytes,
                    bincode::config::standard().with_limit::<{ 1usize << $exp }>(),
                ),)+
                // A payload of at most 1 GiB needs a limit of at most 2^34.
                _ => Err(bincode::error::DecodeError::LimitExceeded),
            }
        };
    }
    let decoded = with_limit!(12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34);
    decoded.map_err(|err| match err {
        bincode::error::DecodeError::LimitExceeded => format!(
            "a length or count in it claims more than its {} bytes can hold",
            bytes.len()
        ),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Pending {
        path: String,
        length: u64,
    }

    fn sample() -> Pending {
        Pending {
            path: "/out/.part-0".into(),
            length: 42,
        }
    }

    #[test]
    fn round_trip_carries_the_version() {
        let serializer = BincodeSerializer::<Pending>::new(7);
        let blob = serialize_versioned(&serializer, &sample()).unwrap();
        assert_eq!(&blob[..2], b"EO");
        assert_eq!(u32::from_le_bytes(blob[2..6].try_into().unwrap()), 7);
        assert_eq!(deserialize_versioned(&serializer, &blob).unwrap(), sample());
    }

    /// A state of a megabyte is encoded once, into a blob of exactly its
    /// size: no buffer grown by doubling, no copy into the envelope.
    #[test]
    fn a_large_state_is_encoded_into_one_buffer_of_its_size() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Tail(Vec<u8>);
        let tail = Tail((0..1 << 20).map(|i| i as u8).collect());
        let serializer = BincodeSerializer::<Tail>::new(3);

        let blob = serialize_versioned(&serializer, &tail).unwrap();
        assert_eq!(blob.capacity(), blob.len());
        assert_eq!(deserialize_versioned(&serializer, &blob).unwrap(), tail);

        let mut out = b"before".to_vec();
        serializer.serialize_into(&tail, &mut out).unwrap();
        assert_eq!(&out[..6], b"before");
        assert_eq!(&out[6..], serializer.serialize(&tail).unwrap().as_slice());
        assert_eq!(&out[6..], &blob[BLOB_HEADER_LEN..]);
    }

    #[test]
    fn unknown_version_is_refused_with_both_versions_named() {
        let old = BincodeSerializer::<Pending>::new(1);
        let new = BincodeSerializer::<Pending>::new(2);
        let blob = serialize_versioned(&new, &sample()).unwrap();
        let err = deserialize_versioned(&old, &blob).unwrap_err();
        assert!(matches!(
            err,
            SerializerError::UnsupportedVersion {
                found: 2,
                supported: 1,
                ..
            }
        ));
        assert!(err.to_string().contains("version 2"), "{err}");
    }

    /// A blob whose first length field claims `claimed` elements.
    fn hostile(claimed: u64) -> Vec<u8> {
        let mut payload = Vec::new();
        // bincode's varint: 253 then a u64 little-endian.
        payload.push(253);
        payload.extend_from_slice(&claimed.to_le_bytes());
        payload.extend_from_slice(b"abc");
        payload
    }

    #[test]
    fn hostile_lengths_are_refused_without_reserving_them() {
        // Each of these used to panic ("capacity overflow") or abort on an
        // allocation of a terabyte.
        for claimed in [u64::MAX, 1 << 40, 1 << 31, 4096, 4] {
            let payload = hostile(claimed);
            let err = BincodeSerializer::<Pending>::default()
                .deserialize(1, &payload)
                .unwrap_err();
            assert!(matches!(err, SerializerError::Decode { .. }), "{err}");
            let err = BincodeSerializer::<Vec<Vec<u8>>>::default()
                .deserialize(1, &payload)
                .unwrap_err();
            assert!(matches!(err, SerializerError::Decode { .. }), "{err}");
            let err = BincodeSerializer::<Vec<String>>::default()
                .deserialize(1, &payload)
                .unwrap_err();
            assert!(matches!(err, SerializerError::Decode { .. }), "{err}");
        }
        let err = BincodeSerializer::<String>::default()
            .deserialize(1, &hostile(1 << 40))
            .unwrap_err();
        assert!(
            err.to_string().contains("claims more than its 12 bytes"),
            "{err}"
        );
    }

    #[test]
    fn what_could_not_be_read_back_is_not_stored() {
        assert!(check_encoded_len("x", MAX_DECODED_PAYLOAD).is_ok());
        let err = check_encoded_len("x", MAX_DECODED_PAYLOAD + 1).unwrap_err();
        assert!(matches!(err, SerializerError::Encode { .. }), "{err}");
        assert!(err.to_string().contains("a restore reads back"), "{err}");
    }

    #[test]
    fn honest_payloads_dense_in_wide_integers_still_decode() {
        // bincode counts 16 decoded bytes for each 1-byte u128: the limit
        // must admit them.
        let serializer = BincodeSerializer::<Vec<u128>>::default();
        let value: Vec<u128> = (0..100_000).map(|i| i % 7).collect();
        let blob = serializer.serialize(&value).unwrap();
        assert_eq!(serializer.deserialize(1, &blob).unwrap(), value);
        let serializer = BincodeSerializer::<Vec<(u64, String, Option<u8>)>>::default();
        let value: Vec<_> = (0..10_000).map(|i| (i, String::new(), None)).collect();
        let blob = serializer.serialize(&value).unwrap();
        assert_eq!(serializer.deserialize(1, &blob).unwrap(), value);
    }

    #[test]
    fn truncated_or_foreign_blobs_are_refused() {
        let serializer = BincodeSerializer::<Pending>::default();
        let blob = serialize_versioned(&serializer, &sample()).unwrap();
        assert!(matches!(
            deserialize_versioned(&serializer, &blob[..3]),
            Err(SerializerError::BadEnvelope { len: 3, .. })
        ));
        assert!(matches!(
            deserialize_versioned(&serializer, &blob[..blob.len() - 2]),
            Err(SerializerError::Decode { .. })
        ));
        let mut foreign = blob.clone();
        foreign[0] = b'X';
        assert!(matches!(
            deserialize_versioned(&serializer, &foreign),
            Err(SerializerError::BadEnvelope { .. })
        ));
        let mut trailing = blob;
        trailing.push(0);
        assert!(matches!(
            deserialize_versioned(&serializer, &trailing),
            Err(SerializerError::Decode { .. })
        ));
    }
}
