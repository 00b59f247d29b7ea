//! The position groups committed to an output, kept small: per writer, the
//! numbers of its committed groups as ranges.
//!
//! A writer numbers its groups 0, 1, 2, … and commits them in order, so
//! the committed ones of a writer are one range, with a hole only where a
//! group was superseded (or failed) while a later one committed. So the set
//! grows with the writers (subtasks times starts), not with the
//! checkpoints, and a superseded group stays outside it: asked again, it is
//! superseded again, never taken for a replay. Kept in the position log's
//! snapshots (the `position_log` module), answered by the replay check.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::position_group::PositionGroupId;

/// How a [`GroupSet`] is stored: per writer, inclusive ranges `[first,
/// last]` of group numbers, in order, neither overlapping nor touching.
type StoredGroupSet = BTreeMap<String, Vec<[u64; 2]>>;

/// The committed position groups of an output. Made by folding the
/// position log; asked by the committer's replay check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StoredGroupSet", into = "StoredGroupSet")]
pub(crate) struct GroupSet {
    /// Per writer: inclusive ranges of numbers, in order, neither
    /// overlapping nor touching.
    ranges: BTreeMap<String, Vec<[u64; 2]>>,
}

impl GroupSet {
    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: &PositionGroupId) -> bool {
        let Some(ranges) = self.ranges.get(&id.writer) else {
            return false;
        };
        let after = ranges.partition_point(|[first, _]| *first <= id.number);
        after > 0 && ranges[after - 1][1] >= id.number
    }

    /// Adds `id`, merging it with the ranges it touches.
    pub(crate) fn insert(&mut self, id: &PositionGroupId) {
        let ranges = self.ranges.entry(id.writer.clone()).or_default();
        let number = id.number;
        // The first range starting after `number`.
        let after = ranges.partition_point(|[first, _]| *first <= number);
        if after > 0 && ranges[after - 1][1] >= number {
            return;
        }
        let joins_before = after > 0 && ranges[after - 1][1].checked_add(1) == Some(number);
        let joins_after = ranges
            .get(after)
            .is_some_and(|[first, _]| number.checked_add(1) == Some(*first));
        match (joins_before, joins_after) {
            (true, true) => {
                ranges[after - 1][1] = ranges[after][1];
                ranges.remove(after);
            }
            (true, false) => ranges[after - 1][1] = number,
            (false, true) => ranges[after][0] = number,
            (false, false) => ranges.insert(after, [number, number]),
        }
    }

    /// How many ranges the set keeps, over every writer.
    #[cfg(test)]
    pub(crate) fn range_count(&self) -> usize {
        self.ranges.values().map(Vec::len).sum()
    }
}

impl From<GroupSet> for StoredGroupSet {
    fn from(set: GroupSet) -> StoredGroupSet {
        set.ranges
    }
}

impl TryFrom<StoredGroupSet> for GroupSet {
    type Error = String;

    /// Checks what was read: ranges in order, neither overlapping nor
    /// touching, each of at least one number.
    fn try_from(ranges: StoredGroupSet) -> Result<GroupSet, String> {
        for (writer, of_writer) in &ranges {
            let mut previous: Option<u64> = None;
            for [first, last] in of_writer {
                if first > last {
                    return Err(format!(
                        "the committed groups of {writer} hold the range [{first}, {last}], \
                         which ends before it starts"
                    ));
                }
                if previous.is_some_and(|previous| previous.saturating_add(1) >= *first) {
                    return Err(format!(
                        "the committed groups of {writer} hold ranges out of order or touching \
                         (at [{first}, {last}])"
                    ));
                }
                previous = Some(*last);
            }
        }
        Ok(GroupSet { ranges })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(writer: &str, number: u64) -> PositionGroupId {
        PositionGroupId {
            writer: writer.into(),
            number,
            checkpoint: 1,
        }
    }

    #[test]
    fn numbers_merge_into_ranges_and_a_hole_stays_a_hole() {
        let mut set = GroupSet::default();
        for number in [0, 1, 2, 4, 5, 9, 7, 8] {
            set.insert(&id("w", number));
        }
        // 3 was superseded while 4 committed; 6 as well.
        for number in [0, 1, 2, 4, 5, 7, 8, 9] {
            assert!(set.contains(&id("w", number)), "{number}");
        }
        for number in [3, 6, 10, u64::MAX] {
            assert!(!set.contains(&id("w", number)), "{number}");
        }
        assert!(!set.contains(&id("v", 0)), "another writer");
        assert_eq!(set.range_count(), 3);
        set.insert(&id("w", 3));
        set.insert(&id("w", 6));
        assert_eq!(set.range_count(), 1);
        set.insert(&id("w", 5));
        assert_eq!(set.range_count(), 1, "inserting twice changes nothing");
        set.insert(&id("w", u64::MAX));
        assert!(set.contains(&id("w", u64::MAX)));
    }

    #[test]
    fn a_thousand_groups_in_order_are_one_range() {
        let mut set = GroupSet::default();
        for number in 0..1000 {
            set.insert(&id("w", number));
        }
        assert_eq!(set.range_count(), 1);
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(json, r#"{"w":[[0,999]]}"#);
        assert_eq!(serde_json::from_str::<GroupSet>(&json).unwrap(), set);
    }

    #[test]
    fn ranges_out_of_order_are_refused_when_read() {
        for bad in [
            r#"{"w":[[5,3]]}"#,
            r#"{"w":[[0,4],[5,6]]}"#,
            r#"{"w":[[4,6],[0,2]]}"#,
        ] {
            let error = serde_json::from_str::<GroupSet>(bad).unwrap_err();
            assert!(
                error.to_string().contains("committed groups of w"),
                "{bad}: {error}"
            );
        }
    }
}
