//! Reading a `POST /events` request: the `Idempotency-Key` header and the
//! body (a JSON array of objects, or JSON lines), with errors precise enough
//! for a client to fix its request, and the body's fingerprint that is kept
//! with the key. Nothing here writes anything: a request is refused whole
//! before any of it reaches the pipeline.

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::value::RawValue;
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
    /// A number the service cannot store as it was sent: an integer beyond
    /// 64 bits, or a decimal that double precision would round.
    #[error(
        "event {event}: the number {text} at {path} cannot be stored as sent (integers are kept \
         to 64 bits, decimals to double precision); send it as a string"
    )]
    InexactNumber {
        /// Which event.
        event: usize,
        /// Where in it, as a JSON pointer (`/a/0/b`).
        path: String,
        /// The number as sent (its first 40 characters).
        text: String,
    },
    /// A key twice in one object: which one to keep would be a guess.
    #[error(
        "event {event}: the key {key:?} appears twice in the object at {path}; send each key once"
    )]
    DuplicateKey {
        /// Which event.
        event: usize,
        /// The object, as a JSON pointer, or `the top level`.
        path: String,
        /// The key.
        key: String,
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
///
/// Every event is then checked to be stored as the same JSON value it was
/// sent as: a number that would change (an integer beyond
/// 64 bits, a decimal beyond double precision) or a key twice in one object
/// is refused, naming where.
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
    let raw = match first {
        Some(b'[') => {
            serde_json::from_str::<Vec<Box<RawValue>>>(text).map_err(|error| syntax(&error, 0))?
        }
        _ => text
            .split('\n')
            .enumerate()
            .filter(|(_, line)| !line.trim_matches([' ', '\t', '\r']).is_empty())
            .map(|(at, line)| serde_json::from_str(line).map_err(|error| syntax(&error, at)))
            .collect::<Result<_, _>>()?,
    };
    for (at, event) in raw.iter().enumerate() {
        check_exact(event, &mut String::new()).map_err(|problem| problem.in_event(at + 1))?;
    }
    Ok(events)
}

/// Where a value cannot be kept as sent, found by [`check_exact`].
enum Inexact {
    Number {
        path: String,
        text: String,
    },
    DuplicateKey {
        path: String,
        key: String,
    },
    /// A part of the event did not parse again (it parsed whole before).
    Reread(serde_json::Error),
}

impl Inexact {
    fn in_event(self, event: usize) -> BodyError {
        match self {
            Inexact::Number { path, text } => BodyError::InexactNumber {
                event,
                path,
                text: text.chars().take(40).collect(),
            },
            Inexact::DuplicateKey { path, key } => BodyError::DuplicateKey {
                event,
                path: if path.is_empty() {
                    "the top level".into()
                } else {
                    path
                },
                key,
            },
            Inexact::Reread(error) => BodyError::Syntax {
                line: error.line(),
                column: error.column(),
                reason: format!("event {event}: {error}"),
            },
        }
    }
}

/// Checks that the JSON value `raw` (at `path`, a JSON pointer) is stored
/// as the same value it was sent as: `serde_json` keeps a number as a
/// 64-bit integer or a double, and keeps one of two equal keys. Walks the
/// value's text, which `serde_json` has already checked for syntax (and for
/// depth: 128 levels at most).
fn check_exact(raw: &RawValue, path: &mut String) -> Result<(), Inexact> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'{') => {
            let Entries(entries) = serde_json::from_str(text).map_err(Inexact::Reread)?;
            let mut seen = std::collections::HashSet::new();
            for (key, value) in &entries {
                if !seen.insert(key.as_str()) {
                    return Err(Inexact::DuplicateKey {
                        path: path.clone(),
                        key: key.clone(),
                    });
                }
                let depth = path.len();
                path.push('/');
                path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                check_exact(value, path)?;
                path.truncate(depth);
            }
            Ok(())
        }
        Some(b'[') => {
            let items: Vec<Box<RawValue>> = serde_json::from_str(text).map_err(Inexact::Reread)?;
            for (at, item) in items.iter().enumerate() {
                let depth = path.len();
                path.push_str(&format!("/{at}"));
                check_exact(item, path)?;
                path.truncate(depth);
            }
            Ok(())
        }
        Some(b'-' | b'0'..=b'9') if !exact_number(text) => Err(Inexact::Number {
            path: path.clone(),
            text: text.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Whether `serde_json` keeps the number `text` as the same value: an
/// integer within 64 bits, or a number whose double, written back (the
/// shortest text that reads as the same double), is the same decimal.
fn exact_number(text: &str) -> bool {
    let Ok(number) = serde_json::from_str::<serde_json::Number>(text) else {
        return false;
    };
    // A double: a decimal, or an integer literal beyond 64 bits (or `-0`).
    !number.is_f64() || decimal(text) == decimal(&number.to_string())
}

/// A JSON number's exact value as (negative, significant digits without
/// leading or trailing zeros, power of ten); every zero is the same zero.
/// `None` for a non-zero number whose exponent is beyond 64 bits.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, "0"),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    let exponent = exponent.parse::<i64>().ok()?;
    let trimmed = significant.trim_end_matches('0');
    let power = exponent
        .checked_sub(i64::try_from(fraction.len()).ok()?)?
        .checked_add(i64::try_from(significant.len() - trimmed.len()).ok()?)?;
    Some((negative, trimmed.to_string(), power))
}

/// An object's entries in the order sent, equal keys included (a map type
/// would keep one of them).
struct Entries(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Visit)
    }
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

    /// Numbers are stored as the value sent or refused, naming where;
    /// never stored as another value (1.2345678901234568e29 for a 30-digit
    /// integer, 0.1 for a 34-digit decimal).
    #[test]
    fn numbers_that_would_change_are_refused_naming_where() {
        for exact in [
            "0",
            "-0",
            "1",
            "-1",
            "18446744073709551615",
            "-9223372036854775808",
            "0.1",
            "1.5e3",
            "1E2",
            "2.50",
            "1e-7",
            "-0.0",
            "9007199254740993",
            "1.7976931348623157e308",
            "0e99999999999999999999999",
        ] {
            let body = format!(r#"{{"id": "x", "n": {exact}}}"#);
            assert!(
                parse_events(body.as_bytes()).is_ok(),
                "{exact}: {:?}",
                parse_events(body.as_bytes())
            );
        }
        for (inexact, path) in [
            ("123456789012345678901234567890", "/n"),
            ("18446744073709551616", "/n"),
            ("-9223372036854775809", "/n"),
            ("0.1000000000000000055511151231257827", "/n"),
            ("9007199254740993.0", "/n"),
            ("1e-400", "/n"),
            (r#"[1, {"a/b": 0.30000000000000000001}]"#, "/n/1/a~1b"),
        ] {
            let body = format!("{{\"id\": \"x\"}}\n{{\"id\": \"y\", \"n\": {inexact}}}\n");
            let message = error(&body);
            assert!(
                message.starts_with("event 2: the number "),
                "{inexact}: {message}"
            );
            assert!(
                message.contains(&format!(" at {path} cannot be stored as sent")),
                "{message}"
            );
        }
    }

    /// A key twice in one object is refused: serde_json would keep one.
    #[test]
    fn a_key_twice_in_one_object_is_refused() {
        assert_eq!(
            error(r#"[{"id": 1, "id": 2}]"#),
            "event 1: the key \"id\" appears twice in the object at the top level; send each \
             key once"
        );
        assert_eq!(
            error(r#"[{"id": 1}, {"id": 2, "a": [{"x": 1, "x": 1}]}]"#),
            "event 2: the key \"x\" appears twice in the object at /a/0; send each key once"
        );
        assert!(parse_events(br#"[{"id": 1, "a": {"id": 2}}]"#).is_ok());
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
