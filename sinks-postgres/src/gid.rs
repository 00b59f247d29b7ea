//! Global transaction ids: the name a prepared transaction carries between
//! `PREPARE TRANSACTION` and `COMMIT PREPARED`, in the server's
//! `pg_prepared_xacts` and in the commit marker table.
//!
//! `eo1/<job>/<lineage>/<generation>/<subtask>/<checkpoint>`: the job; its
//! lineage, the random id the runtime draws at the first start on a
//! checkpoint storage and keeps in every checkpoint after it
//! (`sink_api::Lineage`; starts before the first checkpoint share it, and
//! differ in generation); the start of the job (generation); the
//! writer subtask; and the checkpoint whose barrier prepared it (or the
//! end-of-input tag). The lineage keeps ids unique for good: a job started
//! again on a new, empty checkpoint storage counts generations and
//! checkpoints from 1 again, and must neither meet the commit markers of its
//! earlier life nor keep that life's prepared transactions. Parsed from the
//! right, so a job name may hold slashes. Less than 200 bytes, the server's
//! limit.

use std::fmt;

/// The prefix of every id this sink writes; the digit is the format version.
const PREFIX: &str = "eo1/";

/// The longest global transaction id the server takes, in bytes.
pub(crate) const MAX_GID_BYTES: usize = 199;

/// Bytes of an id besides the job name, at their widest: the prefix, four
/// slashes, the longest lineage and three 20-digit numbers.
const ID_OVERHEAD: usize = PREFIX.len() + 4 + MAX_LINEAGE_BYTES + 3 * 20;

/// The longest lineage ids carry: the runtime's are 32 hexadecimal digits.
const MAX_LINEAGE_BYTES: usize = 32;

/// The parts of a global transaction id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionId {
    /// The job's name.
    pub job: String,
    /// The lineage of checkpoints it belongs to: random, made at a fresh
    /// start of the job.
    pub lineage: String,
    /// The start of the job that prepared it.
    pub generation: u64,
    /// The writer subtask that prepared it.
    pub subtask: usize,
    /// The checkpoint (or end-of-input tag) it belongs to.
    pub checkpoint: u64,
}

impl TransactionId {
    /// Reads an id written by this sink; `None` for anything else (other
    /// applications' prepared transactions, another format).
    pub fn parse(gid: &str) -> Option<TransactionId> {
        let rest = gid.strip_prefix(PREFIX)?;
        let mut parts = rest.rsplitn(5, '/');
        let checkpoint = parts.next()?.parse().ok()?;
        let subtask = parts.next()?.parse().ok()?;
        let generation = parts.next()?.parse().ok()?;
        let lineage = parts.next()?.to_string();
        let job = parts.next()?.to_string();
        Some(TransactionId {
            job,
            lineage,
            generation,
            subtask,
            checkpoint,
        })
    }
}

impl fmt::Display for TransactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}/{}/{}/{}/{}",
            self.job, self.lineage, self.generation, self.subtask, self.checkpoint
        )
    }
}

/// Checks that ids of job `job` always fit and always read back the same.
/// Called when a writer is created, before anything is written.
pub(crate) fn check_job_name(job: &str) -> Result<(), String> {
    let most = MAX_GID_BYTES - ID_OVERHEAD;
    if job.is_empty() || job.len() > most {
        return Err(format!(
            "the job name must be 1 to {most} bytes for this sink's transaction ids; '{job}' is {} bytes",
            job.len()
        ));
    }
    if let Some(bad) = job.chars().find(|c| c.is_control() || *c == '\\') {
        return Err(format!(
            "the job name '{job}' holds {bad:?}, which this sink's transaction ids cannot carry"
        ));
    }
    Ok(())
}

/// Checks that ids can carry the job's lineage `lineage` (the runtime's,
/// from [`sink_api::InitContext::lineage`]): 1 to 32 ASCII letters, digits
/// or dashes. Called at every start, before anything is written.
pub(crate) fn check_lineage(lineage: &str) -> Result<(), String> {
    let fits = !lineage.is_empty()
        && lineage.len() <= MAX_LINEAGE_BYTES
        && lineage
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-');
    match fits {
        true => Ok(()),
        false => Err(format!(
            "the job's lineage '{lineage}' cannot be carried by this sink's transaction ids: it must be \
             1 to {MAX_LINEAGE_BYTES} ASCII letters, digits or dashes"
        )),
    }
}

/// `text` as an SQL string literal (`PREPARE TRANSACTION` and `COMMIT
/// PREPARED` take a literal, not a parameter). Job names hold no backslash
/// ([`check_job_name`]), so doubling quotes is enough whatever
/// `standard_conforming_strings` says.
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
            lineage: "ab12".into(),
            generation: 3,
            subtask: 1,
            checkpoint: 42,
        };
        let text = id.to_string();
        assert_eq!(text, "eo1/orders/eu 'prod'/ab12/3/1/42");
        assert_eq!(TransactionId::parse(&text), Some(id));
        assert_eq!(literal(&text), "'eo1/orders/eu ''prod''/ab12/3/1/42'");
    }

    #[test]
    fn job_names_that_ids_cannot_carry_are_refused() {
        assert!(check_job_name("orders").is_ok());
        let widest = TransactionId {
            job: "j".repeat(MAX_GID_BYTES - ID_OVERHEAD),
            lineage: "f".repeat(MAX_LINEAGE_BYTES),
            generation: u64::MAX,
            subtask: usize::MAX,
            checkpoint: u64::MAX,
        };
        assert!(check_job_name(&widest.job).is_ok());
        assert_eq!(widest.to_string().len(), MAX_GID_BYTES);
        let longer = format!("{}j", widest.job);
        assert!(check_job_name(&longer).unwrap_err().contains("bytes"));
        assert!(check_job_name("").is_err());
        assert!(check_job_name("a\\b").is_err());
        assert!(check_job_name("a\nb").is_err());
    }

    #[test]
    fn lineages_that_ids_cannot_carry_are_refused() {
        assert!(check_lineage("0123456789abcdef0123456789abcdef").is_ok());
        assert!(check_lineage("L").is_ok());
        for bad in ["", "a/b", "a b", &"f".repeat(MAX_LINEAGE_BYTES + 1)] {
            assert!(check_lineage(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn foreign_ids_are_not_ours() {
        for gid in [
            "",
            "xact-17",
            "eo1/job/w/x/1/2",
            "eo2/job/w/1/1/2",
            "eo1/w/1/2",
        ] {
            assert_eq!(TransactionId::parse(gid), None, "{gid}");
        }
    }
}
