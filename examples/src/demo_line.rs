//! The demo's record format: one line per record, its id as 20 zero-padded
//! digits, a comma, filler up to the record size, a newline.

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
        // The id's digits (itoa, not the fmt machinery), zero-padded to 20:
        // a u64 has at most 20 digits.
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(id).as_bytes();
        out.resize(out.len() + (20 - digits.len()), b'0');
        out.extend_from_slice(digits);
        out.push(b',');
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_the_id_in_20_digits_a_comma_and_filler() {
        let line = DemoLine { record_size: 24 };
        let mut out = b"x".to_vec();
        line.append(42, &mut out);
        line.append(u64::MAX, &mut out);
        assert_eq!(
            out,
            b"x00000000000000000042,xxx\n18446744073709551615,xxx\n".to_vec()
        );
        let mut short = Vec::new();
        DemoLine { record_size: 10 }.append(7, &mut short);
        assert_eq!(short, b"00000000000000000007,\n".to_vec());
    }
}
