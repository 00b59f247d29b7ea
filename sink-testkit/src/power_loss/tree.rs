//! A directory tree held in memory: what a run found, what a crash left,
//! and what a comparison of two trees leaves out ([`Unknowns`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// One entry of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Entry {
    /// A directory.
    Dir,
    /// A regular file and its bytes.
    File(Vec<u8>),
}

/// Directories and files by their path relative to the tree's root (which
/// is not an entry itself).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Tree {
    entries: BTreeMap<PathBuf, Entry>,
}

/// What the final check against the disk does not compare: the content of
/// files written through a shared mapping or by an uncertain call, and the
/// entries at (and under) paths an uncertain call named. Made by the model
/// (`Model::unknowns`), given to [`Tree::difference`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Unknowns {
    pub content: BTreeSet<PathBuf>,
    pub entries: BTreeSet<PathBuf>,
}

impl Tree {
    /// Reads the tree under `root` from disk. Fails on anything but
    /// directories and regular files.
    pub fn read(root: &Path) -> io::Result<Tree> {
        let mut tree = Tree::default();
        let mut stack = vec![PathBuf::new()];
        while let Some(relative) = stack.pop() {
            for entry in fs::read_dir(root.join(&relative))? {
                let entry = entry?;
                let path = relative.join(entry.file_name());
                let kind = entry.file_type()?;
                if kind.is_dir() {
                    tree.insert(path.clone(), Entry::Dir);
                    stack.push(path);
                } else if kind.is_file() {
                    tree.insert(path, Entry::File(fs::read(entry.path())?));
                } else {
                    return Err(io::Error::other(format!(
                        "{} is neither a directory nor a regular file",
                        entry.path().display()
                    )));
                }
            }
        }
        Ok(tree)
    }

    /// Creates the tree under `root` (which must exist and be empty).
    pub fn write_to(&self, root: &Path) -> io::Result<()> {
        // Parents sort before their children.
        for (path, entry) in &self.entries {
            match entry {
                Entry::Dir => fs::create_dir(root.join(path))?,
                Entry::File(data) => fs::write(root.join(path), data)?,
            }
        }
        Ok(())
    }

    /// The entries, parents before their children.
    pub fn entries(&self) -> impl Iterator<Item = (&PathBuf, &Entry)> {
        self.entries.iter()
    }

    /// The entry at `path`.
    pub fn get(&self, path: &Path) -> Option<&Entry> {
        self.entries.get(path)
    }

    pub(crate) fn insert(&mut self, path: PathBuf, entry: Entry) {
        self.entries.insert(path, entry);
    }

    /// The first difference from `other`, described, or `None`. At the
    /// paths of `unknown.content`, only that both hold a file is compared;
    /// at and under those of `unknown.entries`, nothing.
    pub(crate) fn difference(&self, other: &Tree, unknown: &Unknowns) -> Option<String> {
        let describe = |entry: Option<&Entry>| match entry {
            None => "nothing".to_string(),
            Some(Entry::Dir) => "a directory".to_string(),
            Some(Entry::File(data)) => format!("a file of {} bytes", data.len()),
        };
        let paths: std::collections::BTreeSet<&PathBuf> =
            self.entries.keys().chain(other.entries.keys()).collect();
        paths.into_iter().find_map(|path| {
            if unknown.entries.iter().any(|entry| path.starts_with(entry)) {
                return None;
            }
            let (mine, theirs) = (self.entries.get(path), other.entries.get(path));
            let same = match (mine, theirs) {
                (Some(Entry::File(_)), Some(Entry::File(_))) => {
                    mine == theirs || unknown.content.contains(path.as_path())
                }
                _ => mine == theirs,
            };
            (!same).then(|| {
                format!(
                    "{}: {} here, {} there",
                    path.display(),
                    describe(mine),
                    describe(theirs)
                )
            })
        })
    }
}
