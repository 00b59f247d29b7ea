//! Encoders: how records become the bytes of a part file.
//!
//! A row encoder appends one record to a buffer the writer reuses for every
//! record, so encoding allocates nothing per record once the buffer has grown
//! to the size of the largest one. A bulk format (Parquet, the `parquet`
//! module) is an encoder too: its [`Encoder::bulk`] hands the writer a
//! [`BulkFormat`], which writes each part as a whole (the `bulk` module).

use std::fmt::Display;
use std::io::Write;
use std::marker::PhantomData;

use serde::Serialize;
use sink_api::SinkError;

use crate::bulk::BulkFormat;

/// Turns a record into the bytes of one row.
///
/// Called by the file writer for every record, in order, from one task.
///
/// # Guarantees
///
/// - Appends exactly one complete row to `out` (with its terminator, if the
///   format has one) and leaves what was in `out` before untouched.
/// - On error, the writer drops what the call appended; the record is not
///   written and the job fails with the error.
/// - A bulk format returns itself from [`bulk`](Self::bulk), and the writer
///   then never calls [`encode`](Self::encode).
pub trait Encoder<T>: Send + Sync + 'static {
    /// Appends `record` to `out`.
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), SinkError>;

    /// For a bulk format, such as `ParquetEncoder` (feature `parquet`):
    /// the format, which writes each part as a whole (the `bulk` module).
    /// `None`, the default, for a row format. Asked once by the sink's
    /// builder, then by the writer for each part it opens.
    fn bulk(&self) -> Option<&dyn BulkFormat<T>> {
        None
    }
}

/// An encoder chosen at run time, such as from a `--format` flag.
impl<T: 'static> Encoder<T> for Box<dyn Encoder<T>> {
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), SinkError> {
        (**self).encode(record, out)
    }

    fn bulk(&self) -> Option<&dyn BulkFormat<T>> {
        (**self).bulk()
    }
}

/// One line per record: its `Display` form and a newline.
#[derive(Debug, Clone, Copy, Default)]
pub struct LineEncoder;

impl<T: Display> Encoder<T> for LineEncoder {
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), SinkError> {
        writeln!(out, "{record}").map_err(|e| SinkError::io("encoding a line", e))
    }
}

/// JSON lines: one JSON document per record, then a newline.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLinesEncoder;

impl<T: Serialize> Encoder<T> for JsonLinesEncoder {
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), SinkError> {
        serde_json::to_writer(&mut *out, record)
            .map_err(|e| SinkError::other("encoding a record as JSON", e))?;
        out.push(b'\n');
        Ok(())
    }
}

/// CSV: one row per record (a struct or a tuple of fields), no header, `\n`
/// terminated, quoted where the field needs it.
#[derive(Debug, Clone, Copy)]
pub struct CsvEncoder<T> {
    _record: PhantomData<fn(&T)>,
}

impl<T> Default for CsvEncoder<T> {
    fn default() -> CsvEncoder<T> {
        CsvEncoder {
            _record: PhantomData,
        }
    }
}

impl<T: Serialize + 'static> Encoder<T> for CsvEncoder<T> {
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), SinkError> {
        let mut writer = csv::WriterBuilder::new()
            .has_headers(false)
            .terminator(csv::Terminator::Any(b'\n'))
            .from_writer(&mut *out);
        writer
            .serialize(record)
            .and_then(|()| writer.flush().map_err(csv::Error::from))
            .map_err(|e| SinkError::other("encoding a record as CSV", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Order {
        id: u64,
        note: String,
    }

    #[test]
    fn lines_append_one_line_per_record() {
        let mut out = b"kept:".to_vec();
        LineEncoder.encode(&42, &mut out).unwrap();
        LineEncoder.encode(&"x", &mut out).unwrap();
        assert_eq!(out, b"kept:42\nx\n");
    }

    #[test]
    fn json_lines_are_one_document_per_line() {
        let mut out = Vec::new();
        let order = Order {
            id: 7,
            note: "a\nb".into(),
        };
        JsonLinesEncoder.encode(&order, &mut out).unwrap();
        assert_eq!(out, b"{\"id\":7,\"note\":\"a\\nb\"}\n");
    }

    #[test]
    fn csv_rows_are_quoted_where_needed() {
        let mut out = Vec::new();
        let encoder = CsvEncoder::default();
        encoder
            .encode(
                &Order {
                    id: 1,
                    note: "plain".into(),
                },
                &mut out,
            )
            .unwrap();
        encoder
            .encode(
                &Order {
                    id: 2,
                    note: "with, comma".into(),
                },
                &mut out,
            )
            .unwrap();
        assert_eq!(out, b"1,plain\n2,\"with, comma\"\n");
    }
}
