//! A record refused on its way to the sink: [`BadRecord`].
//!
//! A record can be well delivered and still be unusable: JSON that does
//! not parse, a timestamp the table cannot hold. Whoever refuses it (a
//! source's parse step, through `sink_runtime::source::Transform`) says
//! why in a [`BadRecord`], with the record as it came and where it came
//! from, so that the refusal can be reported, counted or kept aside
//! without a second look at the input.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

/// One refused record: why, what it was, and where it was read.
///
/// Made by the code that refuses it (a transform of a source's records);
/// read by the runtime, which fails the job with it (its message names the
/// position and the reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    error: String,
    payload: Vec<u8>,
    position: String,
}

impl BadRecord {
    /// A record refused for `error` (what was wrong, in words a user can
    /// act on). Without [`payload`](Self::payload) and
    /// [`at`](Self::at), it carries no bytes and no position.
    pub fn new(error: impl fmt::Display) -> BadRecord {
        BadRecord {
            error: error.to_string(),
            payload: Vec::new(),
            position: String::new(),
        }
    }

    /// The same refusal, carrying the record as it was read (a Kafka
    /// message's value, a line of a file).
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> BadRecord {
        self.payload = payload.into();
        self
    }

    /// The same refusal, saying where the record was read (for example
    /// `orders/3@1042`: topic, partition and offset).
    pub fn at(mut self, position: impl Into<String>) -> BadRecord {
        self.position = position.into();
        self
    }

    /// Why the record was refused.
    pub fn error(&self) -> &str {
        &self.error
    }

    /// The record as it was read; empty when none was given.
    pub fn payload_bytes(&self) -> &[u8] {
        &self.payload
    }

    /// Where it was read; empty when none was given.
    pub fn position(&self) -> &str {
        &self.position
    }
}

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position.is_empty() {
            true => write!(f, "a record was refused: {}", self.error),
            false => write!(
                f,
                "the record at {} was refused: {}",
                self.position, self.error
            ),
        }
    }
}

impl std::error::Error for BadRecord {}

/// As a JSON object (a dead letter in a file of JSON lines): `error`,
/// `position`, and the bytes as `payload` when they are UTF-8, as
/// `payload_base64` otherwise.
impl Serialize for BadRecord {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("error", &self.error)?;
        map.serialize_entry("position", &self.position)?;
        match std::str::from_utf8(&self.payload) {
            Ok(text) => map.serialize_entry("payload", text)?,
            Err(_) => map.serialize_entry("payload_base64", &BASE64.encode(&self.payload))?,
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_position_when_there_is_one() {
        let bad = BadRecord::new("expected a number")
            .payload(&b"x"[..])
            .at("t/0@7");
        assert_eq!(
            bad.to_string(),
            "the record at t/0@7 was refused: expected a number"
        );
        assert_eq!(bad.payload_bytes(), b"x");
        assert_eq!(BadRecord::new("no").to_string(), "a record was refused: no");
    }

    #[test]
    fn as_json_the_bytes_are_text_when_they_are_utf8_and_base64_otherwise() {
        let text = BadRecord::new("bad json")
            .payload(&b"{oops"[..])
            .at("t/1@2");
        assert_eq!(
            serde_json::to_string(&text).unwrap(),
            r#"{"error":"bad json","position":"t/1@2","payload":"{oops"}"#
        );
        let binary = BadRecord::new("not utf-8").payload(vec![0xff, 0x00]);
        assert_eq!(
            serde_json::to_string(&binary).unwrap(),
            r#"{"error":"not utf-8","position":"","payload_base64":"/wA="}"#
        );
    }
}
