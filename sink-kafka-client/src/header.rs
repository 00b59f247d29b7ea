//! A record's header: a key and a value (or none), as Kafka has them.

use bytes::Bytes;

/// One header of a Kafka record.
///
/// Read by the Kafka source (each message's headers, in their order) and
/// written by the Kafka sink (each record's). A header's value may be
/// null, which is not the same as empty.
///
/// The `kafka-protocol` crate keeps a record's headers by key: of two
/// headers with one key, the last is read and written. Kafka allows
/// repeated keys; such a record loses the earlier ones here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Header {
    /// Its key.
    pub key: String,
    /// Its value, or `None` (null).
    pub value: Option<Bytes>,
}

impl Header {
    /// A header `key` with `value` (`None`: null).
    pub fn new(key: impl Into<String>, value: Option<impl Into<Bytes>>) -> Header {
        Header {
            key: key.into(),
            value: value.map(Into::into),
        }
    }
}
