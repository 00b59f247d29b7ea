//! How a [`DeadLettered`](super::DeadLettered) sink's committables and
//! writer states are stored: each [`Routed`] value as a tag and its own
//! sink's versioned blob.
//!
//! ```text
//! version 1: | tag: 0 = main, 1 = dead letter | blob of that sink's serializer (its own version header) |
//! ```

use std::sync::Arc;

use sink_api::{deserialize_versioned, serialize_versioned, SerializerError, VersionedSerializer};

use super::Routed;

const MAIN: u8 = 0;
const DEAD_LETTER: u8 = 1;

/// Encodes [`Routed`] values with the main sink's and the dead-letter
/// sink's serializers. Made by the sink for the runtime.
pub(super) struct RoutedSerializer<M, D> {
    main: Arc<dyn VersionedSerializer<M>>,
    dead: Arc<dyn VersionedSerializer<D>>,
}

impl<M, D> RoutedSerializer<M, D> {
    pub(super) fn new(
        main: Arc<dyn VersionedSerializer<M>>,
        dead: Arc<dyn VersionedSerializer<D>>,
    ) -> RoutedSerializer<M, D> {
        RoutedSerializer { main, dead }
    }
}

impl<M, D> VersionedSerializer<Routed<M, D>> for RoutedSerializer<M, D> {
    fn version(&self) -> u32 {
        1
    }

    fn serialize(&self, value: &Routed<M, D>) -> Result<Vec<u8>, SerializerError> {
        let (tag, blob) = match value {
            Routed::Main(value) => (MAIN, serialize_versioned(self.main.as_ref(), value)?),
            Routed::DeadLetter(value) => {
                (DEAD_LETTER, serialize_versioned(self.dead.as_ref(), value)?)
            }
        };
        let mut bytes = Vec::with_capacity(1 + blob.len());
        bytes.push(tag);
        bytes.extend_from_slice(&blob);
        Ok(bytes)
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<Routed<M, D>, SerializerError> {
        let decode_error = |message: String| SerializerError::Decode {
            what: std::any::type_name::<Routed<M, D>>(),
            version,
            message,
        };
        if version != 1 {
            return Err(SerializerError::UnsupportedVersion {
                what: std::any::type_name::<Routed<M, D>>(),
                found: version,
                supported: 1,
            });
        }
        match bytes.split_first() {
            Some((&MAIN, blob)) => {
                deserialize_versioned(self.main.as_ref(), blob).map(Routed::Main)
            }
            Some((&DEAD_LETTER, blob)) => {
                deserialize_versioned(self.dead.as_ref(), blob).map(Routed::DeadLetter)
            }
            Some((tag, _)) => Err(decode_error(format!(
                "the tag {tag} names neither the main sink (0) nor the dead-letter sink (1)"
            ))),
            None => Err(decode_error("it is empty".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sink_api::BincodeSerializer;

    #[test]
    fn each_value_is_read_back_by_its_own_sinks_serializer() {
        let codec = RoutedSerializer::<u64, String>::new(
            Arc::new(BincodeSerializer::<u64>::default()),
            Arc::new(BincodeSerializer::<String>::default()),
        );
        for value in [Routed::Main(7), Routed::DeadLetter("bad".to_string())] {
            let blob = serialize_versioned(&codec, &value).unwrap();
            assert_eq!(deserialize_versioned(&codec, &blob).unwrap(), value);
        }
        let error = codec.deserialize(1, &[9, 1, 2]).unwrap_err().to_string();
        assert!(error.contains("the tag 9"), "{error}");
        assert!(codec.deserialize(2, &[0]).is_err());
    }
}
