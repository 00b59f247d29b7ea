//! The position groups committed to an output, kept small: per writer
//! family (a job's life and subtask, whatever its start), the newest start
//! that committed a group, and the numbers of its committed groups as
//! ranges.
//!
//! A writer is named `<job>-<lineage>-g<generation>-s<subtask>`
//! ([`PositionGroupId::writer`]); its *family* is the same name without
//! the generation, `<job>-<lineage>-s<subtask>`. A writer numbers its
//! groups 0, 1, 2, … and commits them in order, so the committed ones of a
//! writer are one range, with a hole only where a group was superseded (or
//! failed) while a later one committed: a superseded group stays outside
//! the set, and asked again it is superseded again, never taken for a
//! replay.
//!
//! Per family, only the newest generation that committed a group is kept:
//! the groups of older starts are forgotten once a newer start of the same
//! life and subtask committed one of its own. So the set grows with the
//! job's lives (lineages) and subtasks, not with its starts or checkpoints,
//! and a job restarting in a loop for months keeps one entry per subtask.
//!
//! Why forgetting them keeps the replay check right: a start commits a
//! group of its own only once a checkpoint of its own completed, and that
//! checkpoint was taken after the start re-committed what it restored (the
//! runtime's re-commit gate: no source reads a record before). From then
//! on every start restores that checkpoint or a newer one (the runtime
//! restores the newest, never falls back), whose committables are groups
//! of that start or of later ones: no replay asks for a group of an older
//! start again. Only an old process of the same life still running next
//! to the new one (two jobs on one checkpoint storage, which the runtime
//! does not support) could; its forgotten groups are then answered by the
//! position check, superseded, and nothing is applied twice either way.
//!
//! Kept in the position log's snapshots (the `position_log` module),
//! answered by the replay check. Writers named otherwise (not made by this
//! sink's writer) are their own family, never forgotten.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::position_group::PositionGroupId;

/// The family of a writer and its generation: `<job>-<lineage>-s<subtask>`
/// and the generation for a name made by [`PositionGroupId::writer_of`];
/// the whole name and `None` for any other (a generation with a leading
/// zero included: never made by the writer, it would alias another).
fn family_of(writer: &str) -> (String, Option<u64>) {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parsed = writer.rsplit_once("-s").and_then(|(rest, subtask)| {
        let (prefix, generation) = rest.rsplit_once("-g")?;
        if !digits(subtask) || !digits(generation) {
            return None;
        }
        let number: u64 = generation.parse().ok()?;
        if number.to_string() != generation {
            return None;
        }
        Some((format!("{prefix}-s{subtask}"), number))
    });
    match parsed {
        Some((family, generation)) => (family, Some(generation)),
        None => (writer.to_string(), None),
    }
}

/// The committed groups of one family: those of its newest generation
/// that committed any, as inclusive ranges `[first, last]` of group
/// numbers, in order, neither overlapping nor touching.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Family {
    /// `None` for a writer not named by this sink's writer.
    generation: Option<u64>,
    ranges: Vec<[u64; 2]>,
}

impl Family {
    fn contains(&self, number: u64) -> bool {
        let after = self.ranges.partition_point(|[first, _]| *first <= number);
        after > 0 && self.ranges[after - 1][1] >= number
    }

    /// Adds the numbers `first..=last`, merging the ranges they overlap or
    /// touch.
    fn insert(&mut self, first: u64, last: u64) {
        let (mut low, mut high) = (first, last);
        // In order: a range merged can only widen the span towards the
        // ranges not looked at yet.
        self.ranges.retain(|&[a, b]| {
            let merged = a <= high.saturating_add(1) && low <= b.saturating_add(1);
            if merged {
                low = low.min(a);
                high = high.max(b);
            }
            !merged
        });
        let at = self.ranges.partition_point(|[a, _]| *a < low);
        self.ranges.insert(at, [low, high]);
    }

    /// Checks what was read: ranges in order, neither overlapping nor
    /// touching, each of at least one number.
    fn check(ranges: &[[u64; 2]], key: &str) -> Result<(), String> {
        let mut previous: Option<u64> = None;
        for [first, last] in ranges {
            if first > last {
                return Err(format!(
                    "the committed groups of {key} hold the range [{first}, {last}], which ends \
                     before it starts"
                ));
            }
            if previous.is_some_and(|previous| previous.saturating_add(1) >= *first) {
                return Err(format!(
                    "the committed groups of {key} hold ranges out of order or touching (at \
                     [{first}, {last}])"
                ));
            }
            previous = Some(*last);
        }
        Ok(())
    }
}

/// How a [`GroupSet`] is stored, per key: a family, its generation and
/// ranges; or, as the first snapshots of the log were written, a writer
/// and its ranges (read and folded into families, never written).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stored {
    Family(Family),
    Writer(Vec<[u64; 2]>),
}

/// The committed position groups of an output. Made by folding the
/// position log; asked by the committer's replay check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<String, Stored>")]
pub(crate) struct GroupSet {
    /// Per family (see the module's docs).
    #[serde(flatten)]
    families: BTreeMap<String, Family>,
}

impl GroupSet {
    /// Whether `id` is in the set: committed, and of the newest generation
    /// of its family that committed a group.
    pub(crate) fn contains(&self, id: &PositionGroupId) -> bool {
        let (family, generation) = family_of(&id.writer);
        self.families
            .get(&family)
            .is_some_and(|kept| kept.generation == generation && kept.contains(id.number))
    }

    /// Adds `id`. The first group of a newer generation of its family
    /// replaces the groups of the older one; a group of an older
    /// generation than the family's is not kept.
    pub(crate) fn insert(&mut self, id: &PositionGroupId) {
        let (family, generation) = family_of(&id.writer);
        self.insert_numbers(family, generation, id.number, id.number);
    }

    fn insert_numbers(&mut self, family: String, generation: Option<u64>, first: u64, last: u64) {
        let kept = self.families.entry(family).or_insert_with(|| Family {
            generation,
            ranges: Vec::new(),
        });
        if generation > kept.generation {
            *kept = Family {
                generation,
                ranges: Vec::new(),
            };
        }
        if generation == kept.generation {
            kept.insert(first, last);
        }
    }

    /// How many ranges the set keeps, over every family.
    #[cfg(test)]
    pub(crate) fn range_count(&self) -> usize {
        self.families.values().map(|f| f.ranges.len()).sum()
    }

    /// How many families the set keeps.
    #[cfg(test)]
    pub(crate) fn family_count(&self) -> usize {
        self.families.len()
    }
}

impl TryFrom<BTreeMap<String, Stored>> for GroupSet {
    type Error = String;

    /// Checks what was read, and folds the per-writer form into families.
    fn try_from(stored: BTreeMap<String, Stored>) -> Result<GroupSet, String> {
        let mut set = GroupSet::default();
        let mut writers = Vec::new();
        for (key, stored) in stored {
            match stored {
                Stored::Family(family) => {
                    Family::check(&family.ranges, &key)?;
                    set.families.insert(key, family);
                }
                Stored::Writer(ranges) => {
                    Family::check(&ranges, &key)?;
                    writers.push((key, ranges));
                }
            }
        }
        for (writer, ranges) in writers {
            let (family, generation) = family_of(&writer);
            for [first, last] in ranges {
                set.insert_numbers(family.clone(), generation, first, last);
            }
        }
        Ok(set)
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
        assert_eq!(json, r#"{"w":{"generation":null,"ranges":[[0,999]]}}"#);
        assert_eq!(serde_json::from_str::<GroupSet>(&json).unwrap(), set);
    }

    #[test]
    fn writers_are_named_by_family_and_generation() {
        assert_eq!(family_of("job-abc-g3-s2"), ("job-abc-s2".into(), Some(3)));
        assert_eq!(
            family_of("my-job-s1-g7-ab12-g40-s0"),
            ("my-job-s1-g7-ab12-s0".into(), Some(40))
        );
        for other in [
            "w",
            "job-abc-g03-s2",
            "job-abc-g-s2",
            "job-abc-gx-s2",
            "job-g1-s",
        ] {
            assert_eq!(family_of(other), (other.to_string(), None), "{other}");
        }
    }

    #[test]
    fn a_thousand_starts_of_a_subtask_keep_one_family_and_answer_the_newest() {
        let mut set = GroupSet::default();
        for generation in 1..=1000u64 {
            // Each start commits a few groups; group 2 of every start is
            // superseded while 3 commits.
            for number in [0, 1, 3] {
                set.insert(&id(&format!("job-l-g{generation}-s0"), number));
            }
            set.insert(&id(&format!("job-l-g{generation}-s1"), 0));
        }
        assert_eq!(set.family_count(), 2, "one per subtask, not per start");
        assert_eq!(set.range_count(), 3);
        let json = serde_json::to_vec(&set).unwrap();
        assert!(json.len() < 200, "{}", String::from_utf8_lossy(&json));
        // The newest start: its replays are recognised, its hole stays one.
        for number in [0, 1, 3] {
            assert!(set.contains(&id("job-l-g1000-s0", number)), "{number}");
        }
        assert!(!set.contains(&id("job-l-g1000-s0", 2)), "superseded");
        assert!(!set.contains(&id("job-l-g1000-s0", 4)), "never committed");
        // Another life of the job, another subtask: not taken for these.
        assert!(!set.contains(&id("job-m-g1000-s0", 0)));
        assert!(!set.contains(&id("job-l-g1000-s2", 0)));
        // An older start's groups are forgotten (no restore asks for them;
        // the position check answers them), and one committed late is not
        // kept.
        assert!(!set.contains(&id("job-l-g999-s0", 0)));
        set.insert(&id("job-l-g5-s0", 9));
        assert!(!set.contains(&id("job-l-g5-s0", 9)));
        assert!(set.contains(&id("job-l-g1000-s0", 0)));
        assert_eq!(
            serde_json::from_slice::<GroupSet>(&serde_json::to_vec(&set).unwrap()).unwrap(),
            set
        );
    }

    #[test]
    fn the_per_writer_form_of_the_first_snapshots_is_read_into_families() {
        let old = r#"{"job-l-g1-s0":[[0,4]],"job-l-g2-s0":[[0,1],[3,3]],"w":[[0,2]]}"#;
        let set = serde_json::from_str::<GroupSet>(old).unwrap();
        assert_eq!(set.family_count(), 2);
        assert!(set.contains(&id("job-l-g2-s0", 3)));
        assert!(!set.contains(&id("job-l-g2-s0", 2)));
        assert!(!set.contains(&id("job-l-g1-s0", 0)), "an older start");
        assert!(set.contains(&id("w", 2)));
    }

    #[test]
    fn ranges_out_of_order_are_refused_when_read() {
        for bad in [
            r#"{"w":[[5,3]]}"#,
            r#"{"w":[[0,4],[5,6]]}"#,
            r#"{"w":[[4,6],[0,2]]}"#,
            r#"{"w":{"generation":3,"ranges":[[0,4],[5,6]]}}"#,
            r#"{"w":{"generation":null,"ranges":[[2,1]]}}"#,
        ] {
            let error = serde_json::from_str::<GroupSet>(bad).unwrap_err();
            assert!(
                error.to_string().contains("committed groups of w"),
                "{bad}: {error}"
            );
        }
    }
}
