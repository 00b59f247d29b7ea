//! Global transaction ids: the name a prepared transaction carries between
//! `PREPARE TRANSACTION` and `COMMIT PREPARED`, in the server's
//! `pg_prepared_xacts` and in the commit marker table.
//!
//! `eo1/<job>/<generation>/<subtask>/<checkpoint>/<writer>`: the job, the
//! start of the job that wrote it, the writer subtask, the checkpoint whose
//! barrier prepared it (or the end-of-input tag), and a random id of the
//! writer. The last makes ids unique for good: a job started again on a new,
//! empty checkpoint storage counts generations and checkpoints from 1 again,
//! and must not meet the commit markers of its earlier life. Parsed from the
//! right, so a job name may hold slashes. At most 200 bytes, the server's
//! limit.

use std::fmt;

/// The prefix of every id this sink writes; the digit is the format version.
const PREFIX: &str = "eo1/";

/// The server's limit on a global transaction id, in bytes.
pub(crate) const MAX_GID_BYTES: usize = 200;

/// The parts of a global transaction id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionId {
    /// The job's name.
    pub job: String,
    /// The start of the job that prepared it.
    pub generation: u64,
    /// The writer subtask that prepared it.
    pub subtask: usize,
    /// The checkpoint (or end-of-input tag) it belongs to.
    pub checkpoint: u64,
    /// The writer that prepared it: random, 32 hexadecimal digits.
    pub writer: String,
}

impl TransactionId {
    /// Reads an id written by this sink; `None` for anything else (other
    /// applications' prepared transactions, another format).
    pub fn parse(gid: &str) -> Option<TransactionId> {
        let rest = gid.strip_prefix(PREFIX)?;
        let mut parts = rest.rsplitn(5, '/');
        let writer = parts.next()?.to_string();
        let checkpoint = parts.next()?.parse().ok()?;
        let subtask = parts.next()?.parse().ok()?;
        let generation = parts.next()?.parse().ok()?;
        let job = parts.next()?.to_string();
        Some(TransactionId {
            job,
            generation,
            subtask,
            checkpoint,
            writer,
        })
    }
}

impl fmt::Display for TransactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}/{}/{}/{}/{}",
            self.job, self.generation, self.subtask, self.checkpoint, self.writer
        )
    }
}

/// `text` as an SQL string literal (`PREPARE TRANSACTION` and `COMMIT
/// PREPARED` take a literal, not a parameter).
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_even_with_slashes_and_quotes_in_the_job_name() {
        let id = TransactionId {
            job: "orders/eu 'prod'".into(),
            generation: 3,
            subtask: 1,
            checkpoint: 42,
            writer: "ab12".into(),
        };
        let text = id.to_string();
        assert_eq!(text, "eo1/orders/eu 'prod'/3/1/42/ab12");
        assert_eq!(TransactionId::parse(&text), Some(id));
        assert_eq!(literal(&text), "'eo1/orders/eu ''prod''/3/1/42/ab12'");
    }

    #[test]
    fn foreign_ids_are_not_ours() {
        for gid in [
            "",
            "xact-17",
            "eo1/job/x/1/2/w",
            "eo2/job/1/1/2/w",
            "eo1/1/2/w",
        ] {
            assert_eq!(TransactionId::parse(gid), None, "{gid}");
        }
    }
}
