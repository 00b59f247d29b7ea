//! How a source's splits are stored in checkpoints: [`SplitCodec`], and the
//! default, [`BincodeSplits`].

use std::marker::PhantomData;

use serde::{de::DeserializeOwned, Serialize};
use sink_api::{deserialize_versioned, serialize_versioned, BincodeSerializer, SerializerError};

use crate::storage::StateBytes;

/// Encodes a subtask's splits for its checkpoints, and decodes them again.
///
/// Given by [`Source::split_codec`](super::Source::split_codec); called by
/// the subtask at every checkpoint ([`encode`](Self::encode), with what its
/// reader's [`snapshot_splits`](super::SplitReader::snapshot_splits)
/// returned) and by every restore, once per stored subtask
/// ([`decode`](Self::decode)).
///
/// # What an implementation must guarantee
///
/// - `decode` of what `encode` returned gives the same splits, in any later
///   build of the source that may share the checkpoint storage: keep
///   reading older formats.
/// - `decode` refuses damaged bytes with an error; it never panics, and
///   never reserves memory the bytes cannot back
///   ([`sink_api::decode_bincode_bounded`]).
/// - A [`Chunk`](crate::storage::Chunk) in the encoded state holds bytes
///   that never change: storages write it once and name it again in later
///   checkpoints. Sealing what will not change (the keys of a checkpoint
///   that is complete) and returning the same chunks at the next checkpoint
///   makes a checkpoint cost what changed.
pub trait SplitCodec<S>: Send + Sync + 'static {
    /// The splits as stored.
    fn encode(&self, splits: &[S]) -> Result<StateBytes, SerializerError>;

    /// The splits `stored` holds.
    fn decode(&self, stored: &StateBytes) -> Result<Vec<S>, SerializerError>;
}

/// The default [`SplitCodec`]: the splits as one bincode blob in the
/// versioned envelope (format 1), stored inline in every checkpoint.
pub struct BincodeSplits<S> {
    serializer: BincodeSerializer<Vec<S>>,
    _splits: PhantomData<fn() -> S>,
}

impl<S> Default for BincodeSplits<S> {
    fn default() -> BincodeSplits<S> {
        BincodeSplits {
            serializer: BincodeSerializer::new(1),
            _splits: PhantomData,
        }
    }
}

impl<S> std::fmt::Debug for BincodeSplits<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BincodeSplits")
            .field("splits", &std::any::type_name::<S>())
            .finish()
    }
}

impl<S> SplitCodec<S> for BincodeSplits<S>
where
    S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    fn encode(&self, splits: &[S]) -> Result<StateBytes, SerializerError> {
        serialize_versioned(&self.serializer, &splits.to_vec()).map(StateBytes::from)
    }

    fn decode(&self, stored: &StateBytes) -> Result<Vec<S>, SerializerError> {
        deserialize_versioned(&self.serializer, &stored.to_vec())
    }
}
