//! Segments: where committed files go when the sink compacts its output
//! (see the `compaction` module), and where a replayed commit finds them.
//!
//! With compaction on, the committers do not rename a pending part into its
//! bucket directory but into the bucket's directory of the current
//! *epoch*, a segment:
//!
//! ```text
//!  <bucket>/.part-…inprogress.<lineage>  ──commit──▶  <bucket>/seg-<lineage>-<generation>-<epoch>/part-…
//! ```
//!
//! The epoch is shared by every committer of the sink. The compactor (the
//! sink's global committer) *seals* it when it is old or large enough: new
//! commits then go to the next epoch's segments, and the sealed ones receive
//! nothing more, so they can be merged. Sealing waits for the commits under
//! way (they hold the epoch's read lock), so no file lands in a segment
//! after it was sealed.
//!
//! A segment's name holds the job's lineage and the start's generation, so
//! names never repeat: not across restarts (a new generation), not across
//! runs on fresh checkpoint storage (a new lineage), and two jobs sharing an
//! output directory never share a segment.
//!
//! A committable records its file's bucket and name, not its segment: a
//! replayed commit whose pending file is gone looks for the name
//! ([`find_committed`]) in the bucket itself (committed without compaction),
//! then in every segment of the bucket (its own lineage's first, newest
//! first): as a file, or in the manifest a merged segment keeps of what it
//! merged.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use serde::{Deserialize, Serialize};
use sink_api::{Generation, Lineage};

use tracing::warn;

use crate::blocking::assert_blocking;

/// The start of every segment directory's name.
pub(crate) const SEGMENT_PREFIX: &str = "seg-";

/// The manifest a merged segment keeps: a hidden file in the segment.
pub(crate) const MANIFEST: &str = ".compacted";

/// What a merged segment's manifest says: the merged file, and every file
/// it holds, in order. Written by the compactor; read by a replayed commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// Format version of the manifest: 1.
    pub format: u32,
    /// The merged file's name, in the segment.
    pub merged: String,
    /// The files merged, in the order of their bytes in it.
    pub sources: Vec<Source>,
}

/// One merged file, in a [`Manifest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Source {
    /// Its name, as committed.
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The manifest format written and read.
pub(crate) const MANIFEST_FORMAT: u32 = 1;

/// Reads the manifest of the segment `segment`, if it has one. Blocking.
pub(crate) fn read_manifest(segment: &Path) -> io::Result<Option<Manifest>> {
    let path = segment.join(MANIFEST);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a compaction manifest: {e}", path.display()),
        )
    })?;
    if manifest.format != MANIFEST_FORMAT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} has format {}; this version of the sink reads format {MANIFEST_FORMAT}",
                path.display(),
                manifest.format
            ),
        ));
    }
    Ok(Some(manifest))
}

/// The name of the segment of epoch `epoch` of start `generation` of
/// lineage `lineage`. Numbers are zero-padded, so that within a lineage
/// names sort by age.
pub(crate) fn segment_name(lineage: &Lineage, generation: Generation, epoch: u64) -> String {
    format!("{SEGMENT_PREFIX}{lineage}-{:010}-{epoch:010}", generation.0)
}

/// The generation and epoch of a segment of `lineage` named `name`; `None`
/// for a name that is not one.
pub(crate) fn parse_segment(name: &str, lineage: &Lineage) -> Option<(u64, u64)> {
    let rest = name
        .strip_prefix(SEGMENT_PREFIX)?
        .strip_prefix(lineage.as_str())?
        .strip_prefix('-')?;
    let (generation, epoch) = rest.split_once('-')?;
    let number = |text: &str| {
        (text.len() == 10 && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse::<u64>().ok())
            .flatten()
    };
    Some((number(generation)?, number(epoch)?))
}

/// Where a committed file was found by [`find_committed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// As a file of this size, at this path.
    File(PathBuf, u64),
    /// Merged into this segment's merged file; its size as committed.
    Merged(PathBuf, u64),
    /// Nowhere in the bucket.
    Nowhere,
}

/// Looks for the committed file `name` of the bucket directory `bucket`:
/// in the bucket, then in each segment of the bucket, those of `lineage`
/// (the committable's) first, newest name first, as a file or in a merged
/// segment's manifest. A manifest that cannot be read fails the search if
/// it is of `lineage`, and is passed over (with a warning) if it belongs to
/// another job. Blocking.
///
/// A segment being merged at the same time is seen whole either way: its
/// directory is exchanged atomically, and the file is looked for before the
/// manifest (a file gone is a manifest there).
pub(crate) fn find_committed(
    bucket: &Path,
    name: &str,
    lineage: Option<&str>,
) -> io::Result<Found> {
    assert_blocking("looking for a committed file");
    if let Some(size) = size_of(&bucket.join(name))? {
        return Ok(Found::File(bucket.join(name), size));
    }
    let own_prefix = lineage.map(|lineage| format!("{SEGMENT_PREFIX}{lineage}-"));
    let is_own = |segment: &Path| {
        let name = segment
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        own_prefix
            .as_ref()
            .zip(name)
            .is_some_and(|(prefix, name)| name.starts_with(prefix.as_str()))
    };
    let mut segments = Vec::new();
    match std::fs::read_dir(bucket) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                let file_name = entry.file_name();
                if file_name.to_string_lossy().starts_with(SEGMENT_PREFIX)
                    && entry.file_type()?.is_dir()
                {
                    segments.push(entry.path());
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Nowhere),
        Err(e) => return Err(e),
    }
    // Own lineage first, then the rest; newest name first in each.
    segments.sort_unstable_by(|a, b| (is_own(b), b).cmp(&(is_own(a), a)));
    for segment in segments {
        let path = segment.join(name);
        if let Some(size) = size_of(&path)? {
            return Ok(Found::File(path, size));
        }
        let manifest = match read_manifest(&segment) {
            Ok(manifest) => manifest,
            Err(error) if !is_own(&segment) => {
                warn!(segment = %segment.display(), %error, "passing over another job's segment");
                None
            }
            Err(error) => return Err(error),
        };
        let merged = manifest.and_then(|manifest| {
            let source = manifest.sources.iter().find(|source| source.name == name)?;
            Some(source.bytes)
        });
        if let Some(bytes) = merged {
            return Ok(Found::Merged(segment, bytes));
        }
    }
    Ok(Found::Nowhere)
}

/// The size of `path`, or `None` when it does not exist.
pub(crate) fn size_of(path: &Path) -> io::Result<Option<u64>> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A segment sealed for merging: the bucket directory and the segment's
/// name in it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Sealed {
    pub bucket: PathBuf,
    pub name: String,
}

/// The current epoch: what committers place their files in.
#[derive(Debug)]
pub(crate) struct Epoch {
    lineage: Lineage,
    generation: Generation,
    number: u64,
    /// When its first file was committed, on the sink's clock; 0 before.
    first_file_ms: AtomicU64,
    files: AtomicU64,
    bytes: AtomicU64,
    /// The bucket directories that have a segment of this epoch.
    buckets: Mutex<BTreeSet<PathBuf>>,
}

impl Epoch {
    fn new(lineage: Lineage, generation: Generation, number: u64) -> Epoch {
        Epoch {
            lineage,
            generation,
            number,
            first_file_ms: AtomicU64::new(0),
            files: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            buckets: Mutex::new(BTreeSet::new()),
        }
    }

    /// The segment directory of this epoch in the bucket directory
    /// `bucket`, noted as one to merge once the epoch is sealed.
    pub(crate) fn segment_in(&self, bucket: &Path) -> PathBuf {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(bucket.to_path_buf());
        bucket.join(segment_name(&self.lineage, self.generation, self.number))
    }

    /// Counts a file of `bytes` committed into this epoch at `now_ms`.
    pub(crate) fn add(&self, bytes: u64, now_ms: u64) {
        let _ = self.first_file_ms.compare_exchange(
            0,
            now_ms.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The segments of this epoch, to merge.
    fn sealed(&self) -> Vec<Sealed> {
        let name = segment_name(&self.lineage, self.generation, self.number);
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .iter()
            .map(|bucket| Sealed {
                bucket: bucket.clone(),
                name: name.clone(),
            })
            .collect()
    }
}

/// When an epoch is sealed: any limit reached (its age counted from its
/// first file, so that an epoch opened before a quiet spell is not sealed
/// by its first file after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealLimits {
    pub age_ms: u64,
    pub bytes: u64,
    pub files: u64,
}

/// The epochs of one sink: shared by its committers (which place files in
/// the current one, under its read lock) and its compactor (which seals it).
#[derive(Debug, Default)]
pub(crate) struct Segments {
    epoch: RwLock<Option<Epoch>>,
}

/// The current epoch, held open while a batch of commits places files in
/// it: a seal waits until it is dropped.
pub(crate) struct Placing<'a>(RwLockReadGuard<'a, Option<Epoch>>);

impl Placing<'_> {
    /// The epoch, if the sink was started ([`Segments::begin`]).
    pub(crate) fn epoch(&self) -> Option<&Epoch> {
        self.0.as_ref()
    }
}

impl Segments {
    /// Opens epoch 0 of start `generation` of `lineage`, unless an epoch of
    /// that start is open already. Called at every start by the sink's
    /// start hook and its committers: no commit goes into an earlier
    /// start's segments any more (the next start's repair merges them).
    pub(crate) fn begin(&self, lineage: &Lineage, generation: Generation) {
        let mut epoch = self.epoch.write().unwrap_or_else(|e| e.into_inner());
        let current = epoch
            .as_ref()
            .is_some_and(|e| &e.lineage == lineage && e.generation == generation);
        if !current {
            *epoch = Some(Epoch::new(lineage.clone(), generation, 0));
        }
    }

    /// The current epoch, while one commit places its file in it. Blocking:
    /// a seal may be under way.
    pub(crate) fn placing(&self) -> Placing<'_> {
        assert_blocking("placing commits in a segment");
        Placing(self.epoch.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Seals the current epoch, if it is one of start `generation` of
    /// `lineage` (a seal by an earlier start's compactor, still finishing,
    /// does nothing) and it reached a limit of `limits` at `now_ms` (or
    /// `force`); opens the next one and returns the sealed one's segments.
    /// Waits for the commits placing files in it. Blocking.
    pub(crate) fn seal(
        &self,
        lineage: &Lineage,
        generation: Generation,
        limits: SealLimits,
        now_ms: u64,
        force: bool,
    ) -> Vec<Sealed> {
        assert_blocking("sealing an epoch");
        let due = |epoch: &Epoch| {
            let files = epoch.files.load(Ordering::Relaxed);
            let first = epoch.first_file_ms.load(Ordering::Relaxed);
            &epoch.lineage == lineage
                && epoch.generation == generation
                && (force
                    || (files > 0
                        && (now_ms.saturating_sub(first) >= limits.age_ms
                            || epoch.bytes.load(Ordering::Relaxed) >= limits.bytes
                            || files >= limits.files)))
        };
        // Checked under the read lock first: most calls find nothing due.
        if !self
            .epoch
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(due)
        {
            return Vec::new();
        }
        let mut epoch = self.epoch.write().unwrap_or_else(|e| e.into_inner());
        let Some(current) = epoch.as_ref().filter(|e| due(e)) else {
            return Vec::new();
        };
        let sealed = current.sealed();
        let next = Epoch::new(
            current.lineage.clone(),
            current.generation,
            current.number + 1,
        );
        *epoch = Some(next);
        sealed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::on_this_thread;

    fn lineage() -> Lineage {
        Lineage::new("ab12-cd")
    }

    #[test]
    fn segment_names_sort_by_age_and_parse_back_only_for_their_lineage() {
        let older = segment_name(&lineage(), Generation(2), 9);
        let newer = segment_name(&lineage(), Generation(2), 10);
        let next_start = segment_name(&lineage(), Generation(3), 0);
        assert!(older < newer && newer < next_start);
        assert_eq!(parse_segment(&newer, &lineage()), Some((2, 10)));
        assert_eq!(parse_segment(&newer, &Lineage::new("ab12")), None);
        assert_eq!(parse_segment("seg-ab12-cd-12-3", &lineage()), None);
        assert_eq!(parse_segment("part-1", &lineage()), None);
    }

    #[test]
    fn a_committed_file_is_found_in_its_bucket_its_segment_or_a_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = dir.path();
        let plain = bucket.join("part-a");
        std::fs::write(&plain, "12345").unwrap();
        let segment = bucket.join(segment_name(&lineage(), Generation(1), 0));
        std::fs::create_dir(&segment).unwrap();
        std::fs::write(segment.join("part-b"), "123").unwrap();
        let merged = bucket.join(segment_name(&lineage(), Generation(1), 1));
        std::fs::create_dir(&merged).unwrap();
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            merged: "part-merged".into(),
            sources: vec![Source {
                name: "part-c".into(),
                bytes: 7,
            }],
        };
        std::fs::write(
            merged.join(MANIFEST),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        on_this_thread(|| {
            assert_eq!(
                find_committed(bucket, "part-a", None).unwrap(),
                Found::File(plain.clone(), 5)
            );
            assert_eq!(
                find_committed(bucket, "part-b", Some("ab12-cd")).unwrap(),
                Found::File(segment.join("part-b"), 3)
            );
            assert_eq!(
                find_committed(bucket, "part-c", Some("ab12-cd")).unwrap(),
                Found::Merged(merged.clone(), 7)
            );
            assert_eq!(
                find_committed(bucket, "part-d", Some("ab12-cd")).unwrap(),
                Found::Nowhere
            );
            assert_eq!(
                find_committed(&bucket.join("missing"), "part-a", None).unwrap(),
                Found::Nowhere
            );
        });
        std::fs::write(merged.join(MANIFEST), "{\"format\":2}").unwrap();
        let error =
            on_this_thread(|| find_committed(bucket, "part-d", Some("ab12-cd"))).unwrap_err();
        assert!(error.to_string().contains("compaction manifest"), "{error}");
        // Another job's damaged manifest is passed over.
        assert_eq!(
            on_this_thread(|| find_committed(bucket, "part-d", Some("other"))).unwrap(),
            Found::Nowhere
        );
    }

    #[test]
    fn an_epoch_is_sealed_at_a_limit_and_only_with_files_in_it() {
        let segments = Segments::default();
        let limits = SealLimits {
            age_ms: 1_000,
            bytes: 100,
            files: 3,
        };
        let seal = |now_ms| segments.seal(&lineage(), Generation(1), limits, now_ms, false);
        on_this_thread(|| {
            segments.begin(&lineage(), Generation(1));
            assert!(seal(5_000).is_empty(), "empty");
            {
                let placing = segments.placing();
                let epoch = placing.epoch().unwrap();
                assert!(epoch.segment_in(Path::new("/b")).ends_with(segment_name(
                    &lineage(),
                    Generation(1),
                    0
                )));
                epoch.add(10, 100);
            }
            assert!(seal(1_000).is_empty(), "young (from its first file), small");
            let sealed = seal(1_100);
            assert_eq!(
                sealed,
                vec![Sealed {
                    bucket: PathBuf::from("/b"),
                    name: segment_name(&lineage(), Generation(1), 0)
                }]
            );
            let placing = segments.placing();
            let epoch = placing.epoch().unwrap();
            assert!(epoch.segment_in(Path::new("/b")).ends_with(segment_name(
                &lineage(),
                Generation(1),
                1
            )));
            epoch.add(200, 1_101);
            drop(placing);
            assert_eq!(seal(1_102).len(), 1, "by size");
            // Another start: epoch 0 of its generation, which an earlier
            // start's compactor does not seal.
            segments.begin(&lineage(), Generation(2));
            segments.placing().epoch().unwrap().add(200, 2_000);
            assert!(seal(9_000).is_empty(), "not generation 1's epoch");
            segments.begin(&lineage(), Generation(2));
            let placing = segments.placing();
            assert!(placing
                .epoch()
                .unwrap()
                .segment_in(Path::new("/b"))
                .ends_with(segment_name(&lineage(), Generation(2), 0)));
        });
    }
}
