//! Reading a `POST /events` request: the `Idempotency-Key` header and the
//! body (a JSON array of objects, or JSON lines), with errors precise enough
//! for a client to fix its request, and the body's fingerprint that is kept
//! with the key. Nothing here writes anything: a request is refused whole
//! before any of it reaches the pipeline.

use axum::http::HeaderMap;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sink_runtime::pipeline::Fingerprint;

/// Longest `Idempotency-Key`, in characters (bytes: they are ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The header was sent more than once.
    #[error("send one Idempotency-Key header, not {0}")]
    Repeated(usize),
    /// Empty, or longer than [`MAX_KEY_LEN`].
    #[error(
        "the Idempotency-Key header must be 1 to {MAX_KEY_LEN} visible ASCII characters; \
         this one is {0} bytes long"
    )]
    Length(usize),
    /// A byte outside `!` (0x21) to `~` (0x7E).
    #[error(
        "the Idempotency-Key header must be 1 to {MAX_KEY_LEN} visible ASCII characters \
         ('!' to '~'); character {position} is byte 0x{byte:02X}"
    )]
    Character {
        /// Where, from 1.
        position: usize,
        /// The byte.
        byte: u8,
    },
}

/// The request's idempotency key, if it sent one, checked: 1 to
/// [`MAX_KEY_LEN`] visible ASCII characters, one header at most.
///
/// Called by `POST /events` before anything else; a refusal is a 400.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, KeyError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let extra = values.count();
    if extra > 0 {
        return Err(KeyError::Repeated(extra + 1));
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
        return Err(KeyError::Length(bytes.len()));
    }
    if let Some((at, &byte)) = bytes
        .iter()
        .enumerate()
        .find(|(_, byte)| !(0x21..=0x7E).contains(*byte))
    {
        return Err(KeyError::Character {
            position: at + 1,
            byte,
        });
    }
    // Every byte is ASCII, so this cannot lose anything.
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// The fingerprint of a `POST /events` body: the first 16 bytes of its
/// SHA-256, over the bytes as received.
///
/// Called by `POST /events` for a request with an `Idempotency-Key`; the
/// pipeline keeps it with the key (also in its checkpoints) and refuses the
/// key with another body (422). SHA-256 is fixed by its standard, so the
/// fingerprint is the same in every process and build that shares the
/// checkpoints; 128 bits leave no accidental collision. The same events
/// encoded differently (other whitespace, JSON lines instead of an array)
/// are another body: a retry must send the same bytes.
pub fn body_fingerprint(body: &[u8]) -> Fingerprint {
    let digest = Sha256::digest(body);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Fingerprint::new(bytes)
}

/// Why a body of `POST /events` was refused. Lines, columns and events
/// count from 1; columns count bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Not UTF-8.
    #[error("the body is not valid UTF-8: line {line}, column {column} (byte {offset}) starts an invalid sequence")]
    NotUtf8 {
        /// The line of the first bad byte.
        line: usize,
        /// Its column.
        column: usize,
        /// Its offset in the body, from 0.
        offset: usize,
    },
    /// Empty, blank, or an empty array.
    #[error("the body holds no events: send a JSON array of objects, or one JSON object per line")]
    NoEvents,
    /// Not JSON where JSON was expected.
    #[error("line {line}, column {column}: {reason}")]
    Syntax {
        /// The line, in the body.
        line: usize,
        /// The column, in that line.
        column: usize,
        /// What the JSON parser says.
        reason: String,
    },
    /// An event that is JSON but not an object.
    #[error("event {event}{} is {kind}; every event must be a JSON object", .line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    NotAnObject {
        /// Which event.
        event: usize,
        /// Its line, for JSON lines.
        line: Option<usize>,
        /// What it is instead, with its article: `a string`.
        kind: &'static str,
    },
}

/// The events of a `POST /events` body, every one a JSON object.
///
/// Called by `POST /events` on the whole body before anything is sent, so a
/// refused body writes nothing. A body whose first non-whitespace byte is
/// `[` is one JSON array; any other body is JSON lines, one event per
/// non-blank line (a trailing `\r` is allowed). Refusals name the place:
/// `line 3, column 7: expected value`, `event 2 is a string; every event
/// must be a JSON object`, `the body holds no events: ...`, or the first
/// byte that is not UTF-8.
pub fn parse_events(body: &[u8]) -> Result<Vec<Value>, BodyError> {
    let text = std::str::from_utf8(body).map_err(|error| {
        let offset = error.valid_up_to();
        let (line, column) = position(&body[..offset]);
        BodyError::NotUtf8 {
            line,
            column,
            offset,
        }
    })?;
    let first = text
        .trim_start_matches([' ', '\t', '\r', '\n'])
        .as_bytes()
        .first();
    let events = match first {
        None => return Err(BodyError::NoEvents),
        Some(b'[') => {
            let events: Vec<Value> =
                serde_json::from_str(text).map_err(|error| syntax(&error, 0))?;
            if let Some((at, event)) = events.iter().enumerate().find(|(_, e)| !e.is_object()) {
                return Err(BodyError::NotAnObject {
                    event: at + 1,
                    line: None,
                    kind: kind(event),
                });
            }
            events
        }
        Some(_) => {
            let mut events = Vec::new();
            for (at, line) in text.split('\n').enumerate() {
                if line.trim_matches([' ', '\t', '\r']).is_empty() {
                    continue;
                }
                let event: Value =
                    serde_json::from_str(line).map_err(|error| syntax(&error, at))?;
                if !event.is_object() {
                    return Err(BodyError::NotAnObject {
                        event: events.len() + 1,
                        line: Some(at + 1),
                        kind: kind(&event),
                    });
                }
                events.push(event);
            }
            events
        }
    };
    if events.is_empty() {
        return Err(BodyError::NoEvents);
    }
    Ok(events)
}

/// The line and column (from 1, in bytes) just after `before`.
fn position(before: &[u8]) -> (usize, usize) {
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    (line, before.len() - line_start + 1)
}

/// A `serde_json` error as a [`BodyError::Syntax`], its line moved down by
/// `lines_before` (JSON lines are parsed one at a time).
fn syntax(error: &serde_json::Error, lines_before: usize) -> BodyError {
    let message = error.to_string();
    // serde_json appends " at line L column C" to the reason; it is said
    // separately, in the body's terms.
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    let reason = message
        .strip_suffix(&suffix)
        .unwrap_or(&message)
        .to_string();
    BodyError::Syntax {
        line: error.line() + lines_before,
        column: error.column(),
        reason,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn error(body: &str) -> String {
        parse_events(body.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn arrays_and_json_lines_give_the_same_events() {
        let array = parse_events(br#" [{"id": 1}, {"id": 2}] "#).unwrap();
        let lines = parse_events(b"{\"id\": 1}\r\n\n  \n{\"id\": 2}\n").unwrap();
        assert_eq!(array, lines);
        assert_eq!(array.len(), 2);
    }

    #[test]
    fn syntax_errors_name_the_line_and_column_of_the_body() {
        assert_eq!(
            error("[{\"id\": 1},\n {\"id\": }]"),
            "line 2, column 9: expected value"
        );
        assert_eq!(
            error("{\"id\": 1}\n\n{\"id\": tru}\n"),
            "line 3, column 11: expected ident"
        );
        assert_eq!(
            error("[{\"id\": 1}] x"),
            "line 1, column 13: trailing characters"
        );
        assert_eq!(
            error("[{\"id\": 1}"),
            "line 1, column 10: EOF while parsing a list"
        );
    }

    #[test]
    fn events_must_be_objects() {
        assert_eq!(
            error(r#"[{"id": 1}, "two"]"#),
            "event 2 is a string; every event must be a JSON object"
        );
        assert_eq!(
            error("{\"id\": 1}\n\n[1]\n"),
            "event 2 (line 3) is an array; every event must be a JSON object"
        );
        assert_eq!(
            error("7"),
            "event 1 (line 1) is a number; every event must be a JSON object"
        );
    }

    #[test]
    fn empty_bodies_hold_no_events() {
        for body in ["", "  \n\t", "[]", " [ ] ", "\n\r\n"] {
            assert_eq!(parse_events(body.as_bytes()), Err(BodyError::NoEvents));
        }
    }

    #[test]
    fn bad_utf8_is_located() {
        let error = parse_events(b"{\"a\": 1}\n{\"a\": \"\xff\"}").unwrap_err();
        assert_eq!(
            error,
            BodyError::NotUtf8 {
                line: 2,
                column: 8,
                offset: 16
            }
        );
        assert!(error.to_string().contains("not valid UTF-8"));
    }

    #[test]
    fn body_fingerprints_are_the_sha256_prefix_and_tell_bodies_apart() {
        // Fixed forever: fingerprints are kept in checkpoints. SHA-256("abc")
        // starts ba7816bf 8f01cfea 414140de 5dae2223.
        assert_eq!(
            body_fingerprint(b"abc").to_string(),
            "ba7816bf8f01cfea414140de5dae2223"
        );
        let array = br#"[{"id": 1}]"#;
        assert_eq!(body_fingerprint(array), body_fingerprint(array));
        assert_ne!(body_fingerprint(array), body_fingerprint(br#"[{"id": 2}]"#));
        assert_ne!(body_fingerprint(array), body_fingerprint(b"{\"id\": 1}\n"));
    }

    #[test]
    fn keys_are_one_header_of_visible_ascii() {
        let with = |values: &[&[u8]]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append("Idempotency-Key", HeaderValue::from_bytes(value).unwrap());
            }
            idempotency_key(&headers)
        };
        assert_eq!(with(&[]), Ok(None));
        assert_eq!(with(&[b"req-1"]), Ok(Some("req-1".into())));
        assert_eq!(with(&[&[b'k'; 255]]), Ok(Some("k".repeat(255))));
        assert_eq!(with(&[&[b'k'; 256]]), Err(KeyError::Length(256)));
        assert_eq!(with(&[b""]), Err(KeyError::Length(0)));
        assert_eq!(
            with(&[b"a b"]),
            Err(KeyError::Character {
                position: 2,
                byte: b' '
            })
        );
        assert_eq!(
            with(&[b"caf\xc3\xa9"]),
            Err(KeyError::Character {
                position: 4,
                byte: 0xC3
            })
        );
        assert_eq!(with(&[b"a", b"b"]), Err(KeyError::Repeated(2)));
        assert!(KeyError::Length(256).to_string().contains("1 to 255"));
    }
}
