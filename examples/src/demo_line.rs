//! The demo's record format: one line per record, its id as 20 zero-padded
//! digits, a comma, filler up to the record size, a newline.

use std::io::Write;

use sink_api::SinkError;
use sinks_file::Encoder;

/// Encodes record ids as the demo's lines, into the writer's reusable
/// buffer: `<id, 20 digits>,<filler>\n`, `record_size + 1` bytes in all.
#[derive(Debug, Clone, Copy)]
pub struct DemoLine {
    /// Bytes before the newline (at least 21).
    pub record_size: usize,
}

impl DemoLine {
    /// Appends the line of `id` to `out`; the plain-writer baseline of the
    /// benchmark uses it too, so both write the same bytes.
    pub fn append(&self, id: u64, out: &mut Vec<u8>) {
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{id:020},");
        out.resize(out.len() + self.record_size.saturating_sub(21), b'x');
        out.push(b'\n');
    }
}

impl Encoder<u64> for DemoLine {
    fn encode(&self, id: &u64, out: &mut Vec<u8>) -> Result<(), SinkError> {
        self.append(*id, out);
        Ok(())
    }
}
