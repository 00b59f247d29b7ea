//! Source positions committed with the data read before them.
//!
//! A job is exactly-once end to end only when the position its source has
//! read to becomes durable in the same commit as the records read before
//! it: committed apart, a crash between the two reads records again or
//! skips them. And when a split of the input moves to another owner (a
//! consumer group's rebalance, another instance started on fresh state),
//! the new owner may start only where the destination says the data ends,
//! never where a checkpoint of the old owner says.
//!
//! A sink that commits positions ([`Sink::commits_positions`](crate::Sink::commits_positions))
//! keeps, in its destination, the next offset to read of every split it
//! wrote records of, and changes it only in the commit of those records:
//!
//! ```text
//!  source reader ── at barrier n: advances [from, to) of each split read ─▶ SinkWriter::carry_positions
//!                                                                           │ prepare_commit(n): in the committable
//!                                                                           ▼
//!  Committer::commit: replay? ─▶ already committed
//!                     every split's position still `from`? ─▶ data and positions `to`, in one atomic step
//!                     otherwise ─▶ superseded: nothing of it applied (another owner committed the split)
//! ```
//!
//! Why no interleaving of two owners of a split duplicates or loses a
//! record: a split's position only ever moves by a commit that adds exactly
//! the records `[from, to)` of that split and finds the position at `from`.
//! So the destination holds the split's records from its start up to its
//! position, each once, and nothing beyond; an owner whose commit finds the
//! position moved applies nothing, and the records it had read belong to
//! the owner that moved it. Every owner starts reading where the
//! destination's position is, so nothing before it is read again and
//! nothing after it is skipped. `docs/semantics.md` has the rule and its
//! tests.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One split of one source's input, as positions are kept under: the
/// source's `scope` (a consumer group and topic; the same for every split
/// of the source, and for every instance of the job that shares the
/// input) and the split's name within it (a partition).
///
/// Made by source readers; stored by sinks next to the position.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SplitKey {
    /// What the positions are of: every split of one source shares it,
    /// and [`Sink::committed_positions`](crate::Sink::committed_positions)
    /// lists a scope's splits.
    pub scope: String,
    /// The split within the scope.
    pub split: String,
}

impl SplitKey {
    /// The key of `split` in `scope`.
    pub fn new(scope: impl Into<String>, split: impl Into<String>) -> SplitKey {
        SplitKey {
            scope: scope.into(),
            split: split.into(),
        }
    }
}

impl fmt::Display for SplitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "split {:?} of {:?}", self.split, self.scope)
    }
}

/// The records of one split that one committable carries: offsets
/// `from..to`, where `from` is what the destination held for the split when
/// its owner started reading it (`None`: nothing, the split is read from
/// its start) or what the owner's previous committable moved it to.
///
/// Made by the runtime from the source reader's positions at every barrier,
/// handed to [`SinkWriter::carry_positions`](crate::SinkWriter::carry_positions)
/// before `prepare_commit`; committed by the sink's committer only if the
/// destination's position of the split is still `from`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PositionAdvance {
    /// The split.
    pub key: SplitKey,
    /// The position the commit expects to find; `None`: none yet.
    pub from: Option<u64>,
    /// The position the commit sets: the offset of the next record to read.
    pub to: u64,
}

/// A destination's positions of one scope: each split's next offset to
/// read. Returned by [`Sink::committed_positions`](crate::Sink::committed_positions).
pub type CommittedPositions = BTreeMap<String, u64>;

/// Why a committable's positions cannot be committed: a split is not where
/// the committable expects it. Its records were committed by another owner
/// (or are to be read again from where the destination says): the
/// committer signals [`superseded`](crate::CommitRequest::signal_superseded)
/// with it and applies nothing of the committable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{key} is at {} in the destination, not at {} as this committable expects: another owner of \
     the split committed its records",
    show(*found),
    show(*expected)
)]
pub struct PositionConflict {
    /// The split.
    pub key: SplitKey,
    /// Where the committable expected it.
    pub expected: Option<u64>,
    /// Where the destination has it.
    pub found: Option<u64>,
}

fn show(position: Option<u64>) -> String {
    position.map_or_else(|| "its start (no position)".to_string(), |p| p.to_string())
}

/// Positions as a destination keeps them, with the one check every sink
/// needs: a committable's advances apply only if each split is at the
/// advance's `from`.
///
/// A helper for sinks that keep positions in a structure of their own (the
/// memory sink, a log folded into a map); a database keeps them in a table
/// and checks in SQL. Not a place to keep positions durably by itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionTable {
    positions: BTreeMap<SplitKey, u64>,
}

impl PositionTable {
    /// An empty table.
    pub fn new() -> PositionTable {
        PositionTable::default()
    }

    /// The position of `key`, if any.
    pub fn get(&self, key: &SplitKey) -> Option<u64> {
        self.positions.get(key).copied()
    }

    /// The positions of `scope`'s splits.
    pub fn scope(&self, scope: &str) -> CommittedPositions {
        self.positions
            .iter()
            .filter(|(key, _)| key.scope == scope)
            .map(|(key, position)| (key.split.clone(), *position))
            .collect()
    }

    /// Whether every advance finds its split at its `from`; the first that
    /// does not, otherwise. Changes nothing.
    pub fn check(&self, advances: &[PositionAdvance]) -> Result<(), PositionConflict> {
        for advance in advances {
            let found = self.get(&advance.key);
            if found != advance.from {
                return Err(PositionConflict {
                    key: advance.key.clone(),
                    expected: advance.from,
                    found,
                });
            }
        }
        Ok(())
    }

    /// Applies every advance if [`check`](Self::check) passes, none
    /// otherwise.
    pub fn apply(&mut self, advances: &[PositionAdvance]) -> Result<(), PositionConflict> {
        self.check(advances)?;
        for advance in advances {
            self.positions.insert(advance.key.clone(), advance.to);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advance(split: &str, from: Option<u64>, to: u64) -> PositionAdvance {
        PositionAdvance {
            key: SplitKey::new("s", split),
            from,
            to,
        }
    }

    #[test]
    fn advances_apply_all_or_nothing_and_only_from_where_the_split_is() {
        let mut table = PositionTable::new();
        table.apply(&[advance("a", None, 5)]).unwrap();
        // b is new, but a is not at None any more: nothing is applied.
        let conflict = table
            .apply(&[advance("b", None, 3), advance("a", None, 9)])
            .unwrap_err();
        assert_eq!(conflict.found, Some(5));
        assert_eq!(table.get(&SplitKey::new("s", "b")), None, "all or nothing");
        table
            .apply(&[advance("a", Some(5), 9), advance("b", None, 3)])
            .unwrap();
        assert_eq!(
            table.scope("s"),
            CommittedPositions::from([("a".to_string(), 9), ("b".to_string(), 3)])
        );
        assert!(table.scope("other").is_empty());
        assert!(conflict.to_string().contains("another owner"));
    }
}
