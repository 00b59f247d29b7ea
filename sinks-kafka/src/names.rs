//! Transactional ids: `<prefix>.<lineage>.s<subtask>.t<slot>`.
//!
//! - The prefix is the sink's (by default the job's name): what ACLs on
//!   transactional ids and groups match.
//! - The lineage (`sink_api::Lineage`) is drawn at the first start on a
//!   checkpoint storage: a run on fresh storage never meets an id of an
//!   earlier life of the job, so it neither commits nor aborts one of its
//!   transactions.
//! - Each subtask has a pool of slots, `0..pool_size`: a slot holds one
//!   transaction at a time, from its first record until its commit is
//!   settled; the writer takes a free slot for each new transaction (see
//!   `slots`). The ids of a lineage are bounded (`parallelism × pool
//!   size`), and a downscale leaves no id with an open transaction: the
//!   start aborts every open transaction of the lineage that the restored
//!   checkpoint does not hold, whichever subtask wrote it.
//!
//! The id is also the group its commit marker is kept in (see `marker`).
//! Parsed from the right, so a prefix may hold dots.

use std::fmt;

/// The parts of a transactional id this sink writes.
///
/// Made by the sink's writers; parsed back by the start hook from the ids
/// the cluster lists, to find this lineage's open transactions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransactionalIdName {
    /// The sink's prefix.
    pub prefix: String,
    /// The job's lineage.
    pub lineage: String,
    /// The writer subtask.
    pub subtask: usize,
    /// The slot of the subtask's pool.
    pub slot: u32,
}

impl TransactionalIdName {
    /// Reads an id this sink wrote; `None` for anything else.
    pub fn parse(id: &str) -> Option<TransactionalIdName> {
        let mut parts = id.rsplitn(4, '.');
        let slot = parts.next()?.strip_prefix('t')?.parse().ok()?;
        let subtask = parts.next()?.strip_prefix('s')?.parse().ok()?;
        let lineage = parts.next()?;
        let prefix = parts.next()?;
        if lineage.is_empty() || prefix.is_empty() {
            return None;
        }
        Some(TransactionalIdName {
            prefix: prefix.to_string(),
            lineage: lineage.to_string(),
            subtask,
            slot,
        })
    }

    /// The ids of `prefix` and `lineage` start with this.
    pub(crate) fn lineage_prefix(prefix: &str, lineage: &str) -> String {
        format!("{prefix}.{lineage}.")
    }
}

impl fmt::Display for TransactionalIdName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.s{}.t{}",
            self.prefix, self.lineage, self.subtask, self.slot
        )
    }
}

/// Why a prefix cannot be used: empty, or with characters the cluster's
/// ACL patterns and logs handle badly.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err(
            "the transactional id prefix is empty; give the job a name, or set \
                    KafkaSinkBuilder::transactional_id_prefix"
                .to_string(),
        );
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "the transactional id prefix {prefix:?} holds {c:?}; use letters, digits, '.', '_' \
             and '-' (set KafkaSinkBuilder::transactional_id_prefix)"
        ));
    }
    if prefix.len() > 200 {
        return Err(format!(
            "the transactional id prefix is {} bytes long; use at most 200",
            prefix.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_back_from_the_right() {
        let name = TransactionalIdName {
            prefix: "orders.v2-eu".into(),
            lineage: "0123456789abcdef0123456789abcdef".into(),
            subtask: 12,
            slot: 3,
        };
        let id = name.to_string();
        assert_eq!(id, "orders.v2-eu.0123456789abcdef0123456789abcdef.s12.t3");
        assert_eq!(TransactionalIdName::parse(&id), Some(name));
        assert!(id.starts_with(&TransactionalIdName::lineage_prefix(
            "orders.v2-eu",
            "0123456789abcdef0123456789abcdef"
        )));
        for other in [
            "",
            "a.b.s1",
            "a.b.s1.x2",
            "a.b.1.t2",
            ".b.s1.t2",
            "a..s1.t2",
        ] {
            assert_eq!(TransactionalIdName::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn prefixes_with_odd_characters_are_refused_with_the_fix() {
        assert!(check_prefix("job-1.eu_west").is_ok());
        let error = check_prefix("job 1").expect_err("a space");
        assert!(error.contains("transactional_id_prefix"), "{error}");
        assert!(check_prefix("").is_err());
    }
}
