//! Source positions in the table: each split's next offset to read is a
//! `txn` action of its own, moved only by the transaction that adds the
//! split's records.
//!
//! ```text
//!  txn(appId = eo-position/["<scope>","<split>"], version = next offset)   in the log, with the files
//!  _eo_positions/<hex scope>/<hex split>                                    beside it: the splits of a scope
//! ```
//!
//! **Compare and set.** Before each transaction the global committer reads
//! every split's `txn` from the log and keeps a subtask's files and
//! advances only if each split is where its advance starts
//! ([`sort_groups`]); the transaction then writes the splits' new `txn`s.
//! A transaction of another owner that lands after the read and moves one
//! of those splits writes the same `txn` id, and delta-rs refuses ours as a
//! concurrent transaction (the check the owner's fence rests on too); the
//! next attempt reads the log again and finds the split moved.
//!
//! **Listing.** delta-rs reads a `txn` by its id and lists none, while a
//! source asks for every split of its scope. So before the first
//! transaction that moves a split, its name is registered by the
//! conditional create of an empty object under `_eo_positions/` (durable
//! on local tables before the transaction); [`committed_positions`] lists
//! them and reads each one's `txn`. A registered split the log has no `txn`
//! for (a transaction that never landed) has no position. Delta's `VACUUM`
//! leaves directories starting with `_` alone.

use std::collections::{BTreeMap, HashMap, HashSet};

use deltalake_core::DeltaTable;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{PutMode, PutOptions, PutPayload};
use sink_api::{CommittedPositions, PositionAdvance, PositionConflict, SinkError, SplitKey};

use crate::committable::CarriedPositions;
use crate::errors::{delta_error, store_error};
use crate::location::TableLocation;

/// The directory of the split registry, under the table's root.
const REGISTRY: &str = "_eo_positions";

/// The `txn` application id holding `key`'s position.
pub(crate) fn split_app_id(key: &SplitKey) -> String {
    let names = serde_json::to_string(&(&key.scope, &key.split))
        .unwrap_or_else(|_| format!("{:?}/{:?}", key.scope, key.split));
    format!("eo-position/{names}")
}

/// A position as a `txn` version.
pub(crate) fn to_version(key: &SplitKey, position: u64) -> Result<i64, SinkError> {
    i64::try_from(position).map_err(|_| {
        SinkError::msg(format!(
            "the position {position} of {key} exceeds what a Delta txn version holds"
        ))
        .permanent()
    })
}

/// A `txn` version as a position.
pub(crate) fn from_version(key: &SplitKey, version: i64) -> Result<u64, SinkError> {
    u64::try_from(version).map_err(|_| {
        SinkError::msg(format!(
            "the table holds the position {version} for {key}: not an offset (another program \
             wrote its txn)"
        ))
        .permanent()
    })
}

/// What a transaction of a checkpoint keeps of its subtasks' positions.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Sorted {
    /// Each split moved, and where to.
    pub moved: BTreeMap<SplitKey, u64>,
    /// The files of the groups dropped.
    pub dropped_files: HashSet<String>,
    /// Why each dropped group was dropped.
    pub conflicts: Vec<String>,
}

/// Sorts a checkpoint's position groups by whether the table (`found`:
/// each split's position, `None` for none) is where they expect, in order,
/// each kept group moving its splits for the next: a group whose split is
/// elsewhere is dropped with its files, whole (its files hold records of
/// every split it read). So is a group naming a file not in `files` (the
/// checkpoint's files that reached the global committer; one its committer
/// reported lost does not): its positions stay, and its records are read
/// again.
pub(crate) fn sort_groups(
    groups: &[CarriedPositions],
    found: &HashMap<SplitKey, Option<u64>>,
    files: &HashSet<&str>,
) -> Sorted {
    let mut at = found.clone();
    let mut sorted = Sorted::default();
    for group in groups {
        let conflict = group.advances.iter().find_map(|advance| {
            let now = at.get(&advance.key).copied().flatten();
            (now != advance.from).then(|| {
                PositionConflict {
                    key: advance.key.clone(),
                    expected: advance.from,
                    found: now,
                }
                .to_string()
            })
        });
        let missing = || {
            (group.files.iter())
                .find(|file| !files.contains(file.as_str()))
                .map(|file| {
                    format!(
                        "the data file {file} did not reach the global committer (its \
                         committer reported it lost): the positions of its records do not move, \
                         and they are read again"
                    )
                })
        };
        match conflict.or_else(missing) {
            Some(conflict) => {
                sorted.dropped_files.extend(group.files.iter().cloned());
                sorted.conflicts.push(conflict);
            }
            None => {
                for advance in &group.advances {
                    at.insert(advance.key.clone(), Some(advance.to));
                    sorted.moved.insert(advance.key.clone(), advance.to);
                }
            }
        }
    }
    sorted
}

/// The splits every group advances.
pub(crate) fn keys(groups: &[CarriedPositions]) -> HashSet<SplitKey> {
    groups
        .iter()
        .flat_map(|group| {
            group
                .advances
                .iter()
                .map(|a: &PositionAdvance| a.key.clone())
        })
        .collect()
}

/// The registry entry of `key`.
fn entry(key: &SplitKey) -> Path {
    Path::from(format!(
        "{REGISTRY}/{}/{}",
        hex(&key.scope),
        hex(&key.split)
    ))
}

/// The registry directory of `scope`.
fn scope_dir(scope: &str) -> Path {
    Path::from(format!("{REGISTRY}/{}", hex(scope)))
}

/// Registers each split of `keys` not in `known`, durably, and adds it
/// there. Called by the global committer before a transaction moves them.
pub(crate) async fn register(
    location: &TableLocation,
    known: &mut HashSet<SplitKey>,
    keys: impl IntoIterator<Item = &SplitKey>,
) -> Result<(), SinkError> {
    let store = location.table_store();
    let mut created = Vec::new();
    let mut new = Vec::new();
    for key in keys {
        if known.contains(key) {
            continue;
        }
        let path = entry(key);
        let put = store
            .put_opts(&path, PutPayload::new(), PutOptions::from(PutMode::Create))
            .await;
        match put {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => {
                return Err(store_error(
                    format!("registering {key} in {}", location.url()),
                    e,
                ))
            }
        }
        // Synced even if it existed: its creator may have died before.
        created.push(path.to_string());
        new.push(key.clone());
    }
    location
        .make_durable(created)
        .await
        .map_err(|e| SinkError::io("making the split registry durable", e))?;
    known.extend(new);
    Ok(())
}

/// The positions the table at its newest version holds for `scope`.
/// `table`, if given, is brought up to date instead of loading the table.
pub(crate) async fn committed_positions(
    location: &TableLocation,
    table: Option<DeltaTable>,
    scope: &str,
) -> Result<CommittedPositions, SinkError> {
    let url = location.url();
    let reading = || format!("reading the Delta table {url}");
    let table = match table {
        Some(mut table) => {
            table
                .update_incremental(None)
                .await
                .map_err(|e| delta_error(reading(), e))?;
            table
        }
        None => location
            .open()
            .await
            .map_err(|e| delta_error(reading(), e))?
            .ok_or_else(|| SinkError::msg(format!("there is no Delta table at {url}")))?,
    };
    // Listed after the table was read: a split is registered, durably,
    // before any transaction moves it, so every split the table read has a
    // position of is listed.
    let entries: Vec<_> = location
        .table_store()
        .list(Some(&scope_dir(scope)))
        .map_ok(|meta| meta.location)
        .try_collect()
        .await
        .map_err(|e| store_error(format!("listing the split registry of {url}"), e))?;
    let mut positions = CommittedPositions::new();
    let snapshot = table.snapshot().map_err(|e| delta_error(reading(), e))?;
    let log_store = table.log_store();
    for path in entries {
        let Some(split) = path.filename().and_then(unhex) else {
            continue;
        };
        let key = SplitKey::new(scope, split);
        let version = snapshot
            .transaction_version(log_store.as_ref(), split_app_id(&key))
            .await
            .map_err(|e| delta_error(reading(), e))?;
        if let Some(version) = version {
            positions.insert(key.split.clone(), from_version(&key, version)?);
        }
    }
    Ok(positions)
}

/// `name` as `x` and lower-case hexadecimal: any name, the empty one
/// too, is one path segment.
fn hex(name: &str) -> String {
    std::iter::once("x".to_string())
        .chain(name.bytes().map(|b| format!("{b:02x}")))
        .collect()
}

/// The name [`hex`] made, if `text` is one.
fn unhex(text: &str) -> Option<String> {
    let text = text.strip_prefix('x')?;
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
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

    fn group(file: &str, advances: Vec<PositionAdvance>) -> CarriedPositions {
        CarriedPositions {
            app_id: "j/L".into(),
            files: vec![file.into()],
            advances,
        }
    }

    #[test]
    fn a_group_is_kept_whole_or_dropped_whole_and_kept_groups_chain() {
        let found = HashMap::from([
            (SplitKey::new("s", "a"), Some(10)),
            (SplitKey::new("s", "b"), None),
            (SplitKey::new("s", "c"), Some(3)),
        ]);
        let groups = [
            group("1", vec![advance("a", Some(10), 12)]),
            // b matches, c does not: nothing of it is kept.
            group("2", vec![advance("b", None, 5), advance("c", Some(2), 4)]),
            // starts where the first group ends.
            group("3", vec![advance("a", Some(12), 15)]),
            // a second owner of a within the checkpoint: behind.
            group("4", vec![advance("a", Some(10), 11)]),
        ];
        let files = HashSet::from(["1", "2", "3", "4"]);
        let sorted = sort_groups(&groups, &found, &files);
        assert_eq!(
            sorted.moved,
            BTreeMap::from([(SplitKey::new("s", "a"), 15)])
        );
        assert_eq!(
            sorted.dropped_files,
            HashSet::from(["2".to_string(), "4".to_string()])
        );
        assert_eq!(sorted.conflicts.len(), 2);
        assert!(
            sorted.conflicts[0].contains("\"c\""),
            "{:?}",
            sorted.conflicts
        );
        assert!(
            sorted.conflicts[1].contains("at 15"),
            "{:?}",
            sorted.conflicts
        );

        // A file its committer reported lost: the group stays where it was.
        let without_3 = HashSet::from(["1", "2", "4"]);
        let sorted = sort_groups(&groups, &found, &without_3);
        assert_eq!(
            sorted.moved,
            BTreeMap::from([(SplitKey::new("s", "a"), 12)])
        );
        assert!(sorted.dropped_files.contains("3"));
        assert!(
            sorted.conflicts.iter().any(|c| c.contains("data file 3")),
            "{:?}",
            sorted.conflicts
        );
    }

    #[test]
    fn names_survive_the_registry_and_ids_do_not_collide() {
        for name in ["", "p0", "group/topic", "ü ✓ %2F"] {
            assert_eq!(unhex(&hex(name)).as_deref(), Some(name));
        }
        assert_eq!(unhex("x0"), None);
        assert_eq!(unhex("xzz"), None);
        assert_eq!(unhex("00"), None, "no prefix");
        assert_ne!(scope_dir(""), scope_dir("a"));
        assert_ne!(entry(&SplitKey::new("s", "")), scope_dir("s"));
        assert_ne!(
            split_app_id(&SplitKey::new("a/b", "c")),
            split_app_id(&SplitKey::new("a", "b/c"))
        );
    }
}
