//! A file system that remembers what is durable, and the states a power
//! cut can leave of it.
//!
//! It is fed the operations of a run in order ([`Model::apply`]) and knows,
//! at every point, two things about each file and directory: what the
//! program sees (the page cache, which a killed process leaves whole) and
//! what is on stable storage. The rules are the conservative ones the
//! project's durability rule is written against (`docs/semantics.md`):
//!
//! - a file's bytes are durable as of its latest `fsync`/`fdatasync`;
//! - a directory's entries (creations, renames, removals in it) are durable
//!   as of its latest fsync: syncing a file does not make its name durable,
//!   nor does syncing a directory make its own name in its parent durable;
//! - entries not yet durable reach the disk in the order they were made, a
//!   prefix of them per directory, independently of other directories (a
//!   rename within one directory is one entry change, so it is atomic);
//! - a rename (or an exchange) across two directories is one change too, as
//!   every journaling file system commits it: done in both directories or
//!   in neither, and durable once either directory is synced after it;
//! - a file's bytes not yet durable may be lost, kept, or torn at a page:
//!   the pages before the tear new, those after it old, or zeros where
//!   there were none.
//!
//! [`Model::crash_tree`] builds one such state: the minimal one (nothing
//! that was not synced survives) or one chosen at random within the rules.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use super::trace::{At, Base, Op};
use super::tree::{Entry, Tree, Unknowns};

/// A page: the unit a write is torn at.
const PAGE: usize = 4096;

type Ino = usize;

/// One change of one directory's entries: names added (to the inode) or
/// removed (`None`).
type Change = Vec<(OsString, Option<Ino>)>;

/// A rename (or an exchange) across two directories: an index into
/// [`Model::links`], which says whether it is durable.
type Link = usize;

#[derive(Debug, Clone)]
enum Node {
    File {
        data: Vec<u8>,
        synced: Vec<u8>,
    },
    Dir {
        entries: BTreeMap<OsString, Ino>,
        synced: BTreeMap<OsString, Ino>,
        /// The changes since the latest sync, in order, each with the
        /// rename across directories it is half of, if it is.
        pending: Vec<(Change, Option<Link>)>,
    },
}

/// What an open file descriptor refers to.
#[derive(Debug, Clone)]
enum Target {
    /// A file or directory under the root, and its path when opened.
    Inside(Ino, PathBuf),
    /// Anything else (a file outside the root, a pipe, a socket).
    Outside(PathBuf),
}

#[derive(Debug, Clone)]
struct Description {
    target: Target,
    pos: u64,
    append: bool,
}

/// How a crash state is chosen.
pub(crate) enum Choice<'a> {
    /// Nothing that was not synced survives.
    Minimal,
    /// Each directory keeps a random prefix of its unsynced changes, each
    /// file a random one of its possible contents.
    Random(&'a mut fastrand::Rng),
}

/// The file system under one root, as a run changes it.
#[derive(Debug, Clone)]
pub(crate) struct Model {
    root: PathBuf,
    cwd: PathBuf,
    nodes: Vec<Node>,
    /// Descriptor numbers to open file descriptions (shared by `dup`).
    fds: HashMap<i32, usize>,
    descriptions: Vec<Description>,
    /// Per rename across directories, whether it is durable (either of its
    /// directories was synced after it).
    links: Vec<bool>,
    /// Files mapped shared and writable: their content holds what the
    /// program wrote with calls, not what it wrote through the mapping.
    mapped: HashSet<Ino>,
    /// Files an [`Op::Uncertain`] wrote to: their content is not known.
    unsure_content: HashSet<Ino>,
    /// Paths (relative to the root) an [`Op::Uncertain`] named: whether
    /// they, and anything under them, exist is not known.
    unsure_entries: BTreeSet<PathBuf>,
}

impl Model {
    /// The file system under `root` (absolute, without symbolic links) as
    /// `initial` holds it, all of it durable; relative paths of the program
    /// start at `cwd`.
    pub(crate) fn new(root: &Path, cwd: &Path, initial: &Tree) -> Model {
        let mut model = Model {
            root: root.to_path_buf(),
            cwd: cwd.to_path_buf(),
            nodes: vec![Node::Dir {
                entries: BTreeMap::new(),
                synced: BTreeMap::new(),
                pending: Vec::new(),
            }],
            fds: HashMap::new(),
            descriptions: Vec::new(),
            links: Vec::new(),
            mapped: HashSet::new(),
            unsure_content: HashSet::new(),
            unsure_entries: BTreeSet::new(),
        };
        let mut inos: HashMap<PathBuf, Ino> = HashMap::from([(PathBuf::new(), 0)]);
        for (path, entry) in initial.entries() {
            let node = match entry {
                Entry::Dir => Node::Dir {
                    entries: BTreeMap::new(),
                    synced: BTreeMap::new(),
                    pending: Vec::new(),
                },
                Entry::File(data) => Node::File {
                    data: data.clone(),
                    synced: data.clone(),
                },
            };
            model.nodes.push(node);
            let ino = model.nodes.len() - 1;
            inos.insert(path.clone(), ino);
            let parent = inos[path.parent().unwrap_or(Path::new(""))];
            let name = path.file_name().unwrap_or_default().to_os_string();
            if let Node::Dir {
                entries, synced, ..
            } = &mut model.nodes[parent]
            {
                entries.insert(name.clone(), ino);
                synced.insert(name, ino);
            }
        }
        model
    }

    /// Applies one operation. Returns the bytes written, for a write to
    /// something outside the root (the program's output, a socket);
    /// fails when the operation contradicts the model.
    pub(crate) fn apply(&mut self, op: &Op) -> Result<Option<(i32, Vec<u8>)>, String> {
        match op {
            Op::Open { at, flags, fd } => {
                let path = self.absolute(at)?;
                let target = match self.inside(&path) {
                    None => Target::Outside(path),
                    Some(_) if flags.tmpfile => Target::Inside(self.new_file(), path),
                    Some(names) => match self.lookup(&names) {
                        Some(ino) => {
                            if flags.truncate {
                                if let Node::File { data, .. } = &mut self.nodes[ino] {
                                    data.clear();
                                }
                            }
                            Target::Inside(ino, path)
                        }
                        None if flags.create => {
                            let (parent, name) = self.parent_of(&names, &path)?;
                            let ino = self.new_file();
                            self.change(parent, vec![(name, Some(ino))]);
                            Target::Inside(ino, path)
                        }
                        None => {
                            return Err(format!(
                                "{} was opened but is not in the model",
                                path.display()
                            ))
                        }
                    },
                };
                self.descriptions.push(Description {
                    target,
                    pos: 0,
                    append: flags.append,
                });
                self.fds.insert(*fd, self.descriptions.len() - 1);
            }
            Op::Write { fd, offset, data } => {
                let Some(ino) = self.file_of(*fd)? else {
                    return Ok(Some((*fd, data.clone())));
                };
                let description = &mut self.descriptions[self.fds[fd]];
                let at = match offset {
                    Some(offset) => *offset,
                    None if description.append => self.len(ino),
                    None => description.pos,
                };
                if offset.is_none() {
                    self.descriptions[self.fds[fd]].pos = at + data.len() as u64;
                }
                self.write_at(ino, at, data);
            }
            Op::Truncate { fd, len } => {
                if let Some(ino) = self.file_of(*fd)? {
                    self.resize(ino, *len);
                }
            }
            Op::TruncatePath { at, len } => {
                let path = self.absolute(at)?;
                if let Some(names) = self.inside(&path) {
                    let ino = self.existing(&names, &path)?;
                    self.resize(ino, *len);
                }
            }
            Op::Extend { fd, end } => {
                if let Some(ino) = self.file_of(*fd)? {
                    if self.len(ino) < *end {
                        self.resize(ino, *end);
                    }
                }
            }
            Op::Seek { fd, pos } => {
                if let Some(&d) = self.fds.get(fd) {
                    self.descriptions[d].pos = *pos;
                }
            }
            Op::Sync { fd } => {
                if let Some(ino) = self.inode_of(*fd) {
                    self.sync(ino);
                }
            }
            Op::SyncAll => {
                for ino in 0..self.nodes.len() {
                    self.sync(ino);
                }
            }
            Op::Rename { from, to } => {
                let (from_path, to_path) = (self.absolute(from)?, self.absolute(to)?);
                match (self.inside(&from_path), self.inside(&to_path)) {
                    (Some(from_names), Some(to_names)) => {
                        let ino = self.existing(&from_names, &from_path)?;
                        let (from_dir, from_name) = self.parent_of(&from_names, &from_path)?;
                        let (to_dir, to_name) = self.parent_of(&to_names, &to_path)?;
                        if from_dir == to_dir {
                            if from_name != to_name {
                                self.change(from_dir, vec![(from_name, None), (to_name, Some(ino))]);
                            }
                        } else {
                            let link = self.link();
                            self.linked_change(to_dir, vec![(to_name, Some(ino))], Some(link));
                            self.linked_change(from_dir, vec![(from_name, None)], Some(link));
                        }
                    }
                    (Some(from_names), None) => self.unlink(&from_names, &from_path)?,
                    (None, Some(_)) => {
                        return Err(format!(
                            "{} was moved in from outside the root, with contents the trace does not hold",
                            to_path.display()
                        ))
                    }
                    (None, None) => {}
                }
            }
            Op::Exchange { a, b } => {
                let (a_path, b_path) = (self.absolute(a)?, self.absolute(b)?);
                let (Some(a_names), Some(b_names)) = (self.inside(&a_path), self.inside(&b_path))
                else {
                    return Err(format!(
                        "{} and {} were exchanged across the root's edge",
                        a_path.display(),
                        b_path.display()
                    ));
                };
                let (a_ino, b_ino) = (
                    self.existing(&a_names, &a_path)?,
                    self.existing(&b_names, &b_path)?,
                );
                let (a_dir, a_name) = self.parent_of(&a_names, &a_path)?;
                let (b_dir, b_name) = self.parent_of(&b_names, &b_path)?;
                if a_dir == b_dir {
                    self.change(a_dir, vec![(a_name, Some(b_ino)), (b_name, Some(a_ino))]);
                } else {
                    let link = self.link();
                    self.linked_change(a_dir, vec![(a_name, Some(b_ino))], Some(link));
                    self.linked_change(b_dir, vec![(b_name, Some(a_ino))], Some(link));
                }
            }
            Op::Link { from, to } => {
                let (from_path, to_path) = (self.absolute(from)?, self.absolute(to)?);
                if let Some(to_names) = self.inside(&to_path) {
                    let from_names = self.inside(&from_path).ok_or_else(|| {
                        format!("{} was linked from outside the root", to_path.display())
                    })?;
                    let ino = self.existing(&from_names, &from_path)?;
                    let (dir, name) = self.parent_of(&to_names, &to_path)?;
                    self.change(dir, vec![(name, Some(ino))]);
                }
            }
            Op::LinkFd { fd, to } => {
                let to_path = self.absolute(to)?;
                if let Some(to_names) = self.inside(&to_path) {
                    let ino = self.inode_of(*fd).ok_or_else(|| {
                        format!(
                            "{} was linked from a file outside the root",
                            to_path.display()
                        )
                    })?;
                    let (dir, name) = self.parent_of(&to_names, &to_path)?;
                    self.change(dir, vec![(name, Some(ino))]);
                }
            }
            Op::Unlink { at } => {
                let path = self.absolute(at)?;
                if let Some(names) = self.inside(&path) {
                    self.unlink(&names, &path)?;
                }
            }
            Op::Mkdir { at } => {
                let path = self.absolute(at)?;
                if let Some(names) = self.inside(&path) {
                    let (parent, name) = self.parent_of(&names, &path)?;
                    self.nodes.push(Node::Dir {
                        entries: BTreeMap::new(),
                        synced: BTreeMap::new(),
                        pending: Vec::new(),
                    });
                    let ino = self.nodes.len() - 1;
                    self.change(parent, vec![(name, Some(ino))]);
                }
            }
            Op::Copy { from, to, len } => {
                let source = self.file_of(*from)?;
                let Some(target) = self.file_of(*to)? else {
                    return Ok(None);
                };
                let Some(source) = source else {
                    return Err("a file under the root was copied into from outside it".into());
                };
                let from_d = self.fds[from];
                let start = self.descriptions[from_d].pos as usize;
                let bytes = match &self.nodes[source] {
                    Node::File { data, .. } => data
                        [start.min(data.len())..(start + *len as usize).min(data.len())]
                        .to_vec(),
                    Node::Dir { .. } => Vec::new(),
                };
                self.descriptions[from_d].pos += *len;
                let to_d = self.fds[to];
                let at = self.descriptions[to_d].pos;
                self.descriptions[to_d].pos += bytes.len() as u64;
                self.write_at(target, at, &bytes);
            }
            Op::MapShared { fd } => {
                if let Some(ino) = self.file_of(*fd)? {
                    self.mapped.insert(ino);
                }
            }
            Op::Close { fd } => {
                self.fds.remove(fd);
            }
            Op::Uncertain { op, applied } => {
                self.mark_unsure(op)?;
                if *applied {
                    return self.apply(op);
                }
            }
            Op::Dup { from, to } => match self.fds.get(from).copied() {
                Some(d) => {
                    self.fds.insert(*to, d);
                }
                None => {
                    self.fds.remove(to);
                }
            },
        }
        Ok(None)
    }

    /// What the program sees now (and what a killed process leaves).
    pub(crate) fn logical_tree(&self) -> Tree {
        let mut tree = Tree::default();
        self.walk(0, PathBuf::new(), &mut tree, &mut |_, node| match node {
            Node::Dir { entries, .. } => DirOrFile::Dir(entries.clone()),
            Node::File { data, .. } => DirOrFile::File(data.clone()),
        });
        tree
    }

    /// Records what an uncertain `op` names as unknown to the final check.
    fn mark_unsure(&mut self, op: &Op) -> Result<(), String> {
        let (ats, fds): (Vec<&At>, Vec<i32>) = match op {
            Op::Open { at, .. } | Op::TruncatePath { at, .. } | Op::Unlink { at } => {
                (vec![at], vec![])
            }
            Op::Mkdir { at } => (vec![at], vec![]),
            Op::Rename { from, to } | Op::Link { from, to } => (vec![from, to], vec![]),
            Op::Exchange { a, b } => (vec![a, b], vec![]),
            Op::LinkFd { to, .. } => (vec![to], vec![]),
            Op::Write { fd, .. } | Op::Truncate { fd, .. } | Op::Extend { fd, .. } => {
                (vec![], vec![*fd])
            }
            Op::Copy { to, .. } => (vec![], vec![*to]),
            _ => (vec![], vec![]),
        };
        for at in ats {
            let path = self.absolute(at)?;
            if let Some(names) = self.inside(&path) {
                self.unsure_entries.insert(names.iter().collect());
            }
        }
        for fd in fds {
            if let Some(ino) = self.inode_of(fd) {
                self.unsure_content.insert(ino);
            }
        }
        Ok(())
    }

    /// What the final check against the disk must not compare.
    pub(crate) fn unknowns(&self) -> Unknowns {
        let unsure: HashSet<Ino> = self.unsure_content.union(&self.mapped).copied().collect();
        Unknowns {
            content: self.paths_of(&unsure),
            entries: self.unsure_entries.clone(),
        }
    }

    /// The paths (in [`logical_tree`](Self::logical_tree)) of the files
    /// the program mapped shared and writable: their content there is what
    /// its write calls left, which the mapping may have changed since.
    #[cfg(test)]
    pub(crate) fn mapped_paths(&self) -> BTreeSet<PathBuf> {
        self.paths_of(&self.mapped)
    }

    /// The paths (in [`logical_tree`](Self::logical_tree)) of the files
    /// `inos`.
    fn paths_of(&self, inos: &HashSet<Ino>) -> BTreeSet<PathBuf> {
        let mut paths = BTreeSet::new();
        let mut stack = vec![(0, PathBuf::new())];
        while let Some((ino, path)) = stack.pop() {
            match &self.nodes[ino] {
                Node::Dir { entries, .. } if path.components().count() < 64 => {
                    for (name, child) in entries {
                        stack.push((*child, path.join(name)));
                    }
                }
                Node::Dir { .. } => {}
                Node::File { .. } => {
                    if inos.contains(&ino) {
                        paths.insert(path);
                    }
                }
            }
        }
        paths
    }

    /// One state a power cut at this point can leave.
    pub(crate) fn crash_tree(&self, choice: &mut Choice<'_>) -> Tree {
        // Each rename across directories is done in both or in neither.
        let done: Vec<bool> = (self.links.iter())
            .map(|&durable| {
                durable
                    || match choice {
                        Choice::Minimal => false,
                        Choice::Random(rng) => rng.bool(),
                    }
            })
            .collect();
        let mut tree = Tree::default();
        self.walk(0, PathBuf::new(), &mut tree, &mut |ino, node| match node {
            Node::Dir {
                synced, pending, ..
            } => {
                let kept = match choice {
                    Choice::Minimal => 0,
                    Choice::Random(rng) => rng.usize(0..=pending.len()),
                };
                let mut entries = synced.clone();
                for (i, (change, link)) in pending.iter().enumerate() {
                    let persisted = match link {
                        Some(link) => done[*link],
                        None => i < kept,
                    };
                    if persisted {
                        apply_change(&mut entries, change);
                    }
                }
                DirOrFile::Dir(entries)
            }
            Node::File { data, synced } => {
                let written = match choice {
                    _ if data == synced => data.clone(),
                    Choice::Minimal => synced.clone(),
                    Choice::Random(rng) => {
                        let tear = PAGE * rng.usize(0..=data.len().max(synced.len()) / PAGE);
                        match rng.u8(0..4) {
                            0 => synced.clone(),
                            1 => data.clone(),
                            2 => torn(data, synced, tear, false),
                            _ => torn(data, synced, tear, true),
                        }
                    }
                };
                DirOrFile::File(match choice {
                    // Any page written through a mapping may or may not
                    // have reached the disk, so its pages are anything.
                    Choice::Random(rng) if self.mapped.contains(&ino) => scribbled(written, rng),
                    _ => written,
                })
            }
        });
        tree
    }

    /// Visits the tree from `ino`, seeing each node once through `view` (so
    /// that a file with two names, or a choice, is the same under both).
    fn walk(
        &self,
        ino: Ino,
        path: PathBuf,
        tree: &mut Tree,
        view: &mut dyn FnMut(Ino, &Node) -> DirOrFile,
    ) {
        let mut seen: HashMap<Ino, DirOrFile> = HashMap::new();
        let mut stack = vec![(ino, path)];
        while let Some((ino, path)) = stack.pop() {
            let seen_view = seen
                .entry(ino)
                .or_insert_with(|| view(ino, &self.nodes[ino]))
                .clone();
            match seen_view {
                DirOrFile::Dir(entries) => {
                    if !path.as_os_str().is_empty() {
                        tree.insert(path.clone(), Entry::Dir);
                    }
                    // A directory reached twice through unsynced renames of
                    // directories would loop: bounded by the depth.
                    if path.components().count() < 64 {
                        for (name, child) in entries {
                            stack.push((child, path.join(name)));
                        }
                    }
                }
                DirOrFile::File(data) => tree.insert(path, Entry::File(data)),
            }
        }
    }

    fn absolute(&self, at: &At) -> Result<PathBuf, String> {
        let path = Path::new(&at.path);
        if path.is_absolute() {
            return Ok(path.to_path_buf());
        }
        let base = match at.base {
            Base::Cwd => self.cwd.clone(),
            Base::Fd(fd) => match self.fds.get(&fd).map(|&d| &self.descriptions[d].target) {
                Some(Target::Inside(_, path) | Target::Outside(path)) => path.clone(),
                None => {
                    return Err(format!(
                        "a path relative to descriptor {fd}, which the trace never opened"
                    ))
                }
            },
        };
        Ok(base.join(path))
    }

    /// The names from the root down to `path`, if it is under the root.
    fn inside(&self, path: &Path) -> Option<Vec<OsString>> {
        let mut normal = PathBuf::new();
        for component in path.components() {
            match component {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other),
            }
        }
        let relative = normal.strip_prefix(&self.root).ok()?;
        Some(
            relative
                .components()
                .map(|c| c.as_os_str().to_os_string())
                .collect(),
        )
    }

    fn lookup(&self, names: &[OsString]) -> Option<Ino> {
        let mut ino = 0;
        for name in names {
            match &self.nodes[ino] {
                Node::Dir { entries, .. } => ino = *entries.get(name)?,
                Node::File { .. } => return None,
            }
        }
        Some(ino)
    }

    fn existing(&self, names: &[OsString], path: &Path) -> Result<Ino, String> {
        self.lookup(names)
            .ok_or_else(|| format!("{} is not in the model", path.display()))
    }

    fn parent_of(&self, names: &[OsString], path: &Path) -> Result<(Ino, OsString), String> {
        let Some((name, parent)) = names.split_last() else {
            return Err(format!("{} is the root itself", path.display()));
        };
        match self.lookup(parent) {
            Some(ino) if matches!(self.nodes[ino], Node::Dir { .. }) => Ok((ino, name.clone())),
            _ => Err(format!(
                "the directory of {} is not in the model",
                path.display()
            )),
        }
    }

    fn unlink(&mut self, names: &[OsString], path: &Path) -> Result<(), String> {
        self.existing(names, path)?;
        let (dir, name) = self.parent_of(names, path)?;
        self.change(dir, vec![(name, None)]);
        Ok(())
    }

    fn change(&mut self, dir: Ino, change: Change) {
        self.linked_change(dir, change, None);
    }

    /// A change of `dir`'s entries, half of the rename across directories
    /// `link` if it is one.
    fn linked_change(&mut self, dir: Ino, change: Change, link: Option<Link>) {
        if let Node::Dir {
            entries, pending, ..
        } = &mut self.nodes[dir]
        {
            apply_change(entries, &change);
            pending.push((change, link));
        }
    }

    /// A new rename across directories, not durable yet.
    fn link(&mut self) -> Link {
        self.links.push(false);
        self.links.len() - 1
    }

    fn new_file(&mut self) -> Ino {
        self.nodes.push(Node::File {
            data: Vec::new(),
            synced: Vec::new(),
        });
        self.nodes.len() - 1
    }

    /// Whether `fd` is an open directory under the root.
    pub(crate) fn is_directory(&self, fd: i32) -> bool {
        self.inode_of(fd)
            .is_some_and(|ino| matches!(self.nodes[ino], Node::Dir { .. }))
    }

    fn inode_of(&self, fd: i32) -> Option<Ino> {
        match &self.descriptions[*self.fds.get(&fd)?].target {
            Target::Inside(ino, _) => Some(*ino),
            Target::Outside(_) => None,
        }
    }

    /// The regular file under the root `fd` refers to; `None` for anything
    /// outside it; an error for a directory.
    fn file_of(&self, fd: i32) -> Result<Option<Ino>, String> {
        match self.inode_of(fd) {
            Some(ino) if matches!(self.nodes[ino], Node::Dir { .. }) => {
                Err(format!("descriptor {fd} is a directory, written to"))
            }
            other => Ok(other),
        }
    }

    fn len(&self, ino: Ino) -> u64 {
        match &self.nodes[ino] {
            Node::File { data, .. } => data.len() as u64,
            Node::Dir { .. } => 0,
        }
    }

    fn write_at(&mut self, ino: Ino, at: u64, bytes: &[u8]) {
        if let Node::File { data, .. } = &mut self.nodes[ino] {
            let at = at as usize;
            if data.len() < at + bytes.len() {
                data.resize(at + bytes.len(), 0);
            }
            data[at..at + bytes.len()].copy_from_slice(bytes);
        }
    }

    fn resize(&mut self, ino: Ino, len: u64) {
        if let Node::File { data, .. } = &mut self.nodes[ino] {
            data.resize(len as usize, 0);
        }
    }

    fn sync(&mut self, ino: Ino) {
        match &mut self.nodes[ino] {
            Node::File { data, synced } => synced.clone_from(data),
            Node::Dir {
                entries,
                synced,
                pending,
            } => {
                synced.clone_from(entries);
                // A rename across directories is durable with either's sync.
                for (_, link) in pending.drain(..) {
                    if let Some(link) = link {
                        self.links[link] = true;
                    }
                }
            }
        }
    }
}

/// A node as one walk sees it.
#[derive(Debug, Clone)]
enum DirOrFile {
    Dir(BTreeMap<OsString, Ino>),
    File(Vec<u8>),
}

fn apply_change(entries: &mut BTreeMap<OsString, Ino>, change: &Change) {
    for (name, ino) in change {
        match ino {
            Some(ino) => entries.insert(name.clone(), *ino),
            None => entries.remove(name),
        };
    }
}

/// A write torn at `tear`: the new bytes before it, the durable ones after
/// it, and where the durable file was shorter, nothing (`zeros`: zeros up
/// to the new length, as when the size reached the disk before the data).
/// A file written through a shared mapping as a crash may leave it: its
/// length (which only calls change), each page what the calls wrote, zeros
/// or other bytes, chosen at random.
fn scribbled(mut bytes: Vec<u8>, rng: &mut fastrand::Rng) -> Vec<u8> {
    let mode = rng.u8(0..3);
    for page in bytes.chunks_mut(PAGE) {
        match (mode, rng.u8(0..3)) {
            (0, _) | (2, 0) => {}
            (1, _) | (2, 1) => page.fill(0),
            _ => page.iter_mut().for_each(|byte| *byte = rng.u8(..)),
        }
    }
    bytes
}

fn torn(data: &[u8], synced: &[u8], tear: usize, zeros: bool) -> Vec<u8> {
    let mut bytes = data[..tear.min(data.len())].to_vec();
    if synced.len() > bytes.len() {
        bytes.extend_from_slice(&synced[bytes.len()..]);
    }
    if zeros && data.len() > bytes.len() {
        bytes.resize(data.len(), 0);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::super::trace::OpenFlags;
    use super::*;

    fn at(path: &str) -> At {
        At {
            base: Base::Cwd,
            path: path.into(),
        }
    }

    fn open(path: &str, fd: i32) -> Op {
        Op::Open {
            at: at(path),
            flags: OpenFlags {
                create: true,
                ..OpenFlags::default()
            },
            fd,
        }
    }

    fn write(fd: i32, data: &[u8]) -> Op {
        Op::Write {
            fd,
            offset: None,
            data: data.to_vec(),
        }
    }

    /// Opens `path` as `fd` and fsyncs it.
    fn sync(path: &str, fd: i32) -> [Op; 2] {
        [
            Op::Open {
                at: at(path),
                flags: OpenFlags::default(),
                fd,
            },
            Op::Sync { fd },
        ]
    }

    fn model(ops: &[Op]) -> Model {
        let mut model = Model::new(Path::new("/r"), Path::new("/r"), &Tree::default());
        for op in ops {
            model.apply(op).unwrap();
        }
        model
    }

    fn paths(tree: &Tree) -> Vec<String> {
        tree.entries()
            .map(|(path, entry)| match entry {
                Entry::Dir => format!("{}/", path.display()),
                Entry::File(data) => {
                    format!("{}={}", path.display(), String::from_utf8_lossy(data))
                }
            })
            .collect()
    }

    #[test]
    fn only_what_was_synced_survives_the_minimal_crash() {
        let ops = [
            Op::Mkdir { at: at("d") },
            open("d/f", 3),
            write(3, b"hello"),
            Op::Sync { fd: 3 },
            // d's entry in the root is not durable yet, nor f's in d.
            Op::Open {
                at: at("d"),
                flags: OpenFlags::default(),
                fd: 4,
            },
            Op::Sync { fd: 4 },
        ];
        let m = model(&ops);
        assert_eq!(paths(&m.logical_tree()), ["d/", "d/f=hello"]);
        assert!(paths(&m.crash_tree(&mut Choice::Minimal)).is_empty());
        // Once the root is synced too, the synced file survives whole.
        let mut m = m;
        m.apply(&Op::Open {
            at: at("/r"),
            flags: OpenFlags::default(),
            fd: 5,
        })
        .unwrap();
        m.apply(&Op::Sync { fd: 5 }).unwrap();
        assert_eq!(
            paths(&m.crash_tree(&mut Choice::Minimal)),
            ["d/", "d/f=hello"]
        );
        // Bytes written after the sync may be lost.
        m.apply(&write(3, b" world")).unwrap();
        assert_eq!(
            paths(&m.crash_tree(&mut Choice::Minimal)),
            ["d/", "d/f=hello"]
        );
    }

    #[test]
    fn an_unsynced_rename_leaves_the_old_name_or_the_new_never_both_or_neither() {
        let ops = [
            open("a", 3),
            write(3, b"x"),
            Op::Sync { fd: 3 },
            Op::Open {
                at: at("."),
                flags: OpenFlags::default(),
                fd: 4,
            },
            Op::Sync { fd: 4 },
            Op::Rename {
                from: at("a"),
                to: at("b"),
            },
        ];
        let m = model(&ops);
        assert_eq!(paths(&m.crash_tree(&mut Choice::Minimal)), ["a=x"]);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            seen.insert(paths(&m.crash_tree(&mut Choice::Random(&mut rng))));
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            [vec!["a=x".to_string()], vec!["b=x".to_string()]]
        );
    }

    #[test]
    fn unsynced_bytes_are_lost_kept_or_torn_at_a_page() {
        let old = vec![b'o'; 2 * PAGE];
        let new = vec![b'n'; 3 * PAGE];
        assert_eq!(
            torn(&new, &old, PAGE, false),
            [&new[..PAGE], &old[PAGE..]].concat()
        );
        assert_eq!(torn(&new, &[], PAGE, false), &new[..PAGE]);
        assert_eq!(
            torn(&new, &[], PAGE, true),
            [&new[..PAGE], &vec![0; 2 * PAGE][..]].concat()
        );
    }

    #[test]
    fn an_unsynced_exchange_leaves_both_names_swapped_or_neither() {
        let mut ops = vec![
            Op::Mkdir { at: at("a") },
            Op::Mkdir { at: at("b") },
            open("a/x", 3),
            open("b/y", 4),
        ];
        ops.extend(sync(".", 5));
        ops.extend(sync("a", 6));
        ops.extend(sync("b", 7));
        ops.push(Op::Exchange {
            a: at("a"),
            b: at("b"),
        });
        let m = model(&ops);
        let before = vec!["a/", "a/x=", "b/", "b/y="];
        let after = vec!["a/", "a/y=", "b/", "b/x="];
        assert_eq!(paths(&m.logical_tree()), after);
        assert_eq!(paths(&m.crash_tree(&mut Choice::Minimal)), before);
        let mut rng = fastrand::Rng::with_seed(3);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            seen.insert(paths(&m.crash_tree(&mut Choice::Random(&mut rng))));
        }
        let both: std::collections::BTreeSet<Vec<String>> = [before, after]
            .into_iter()
            .map(|v| v.into_iter().map(String::from).collect())
            .collect();
        assert_eq!(seen, both);
    }

    #[test]
    fn a_rename_across_directories_is_done_in_both_or_neither_and_durable_with_either_sync() {
        let mut ops = vec![
            Op::Mkdir { at: at("a") },
            Op::Mkdir { at: at("b") },
            open("a/x", 3),
        ];
        ops.extend(sync(".", 4));
        ops.extend(sync("a", 5));
        ops.push(Op::Rename {
            from: at("a/x"),
            to: at("b/x"),
        });
        // Another change in `a`, synced by nobody: a prefix may keep it.
        ops.push(open("a/y", 6));
        let m = model(&ops);
        let mut rng = fastrand::Rng::with_seed(11);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let tree = paths(&m.crash_tree(&mut Choice::Random(&mut rng)));
            let x: Vec<&String> = tree.iter().filter(|p| p.ends_with("/x=")).collect();
            assert_eq!(
                x.len(),
                1,
                "the file under one name, never none or both: {tree:?}"
            );
            seen.insert(x[0].clone());
        }
        assert_eq!(seen.len(), 2, "either name: {seen:?}");
        // Synced in its source directory only, it is durable: the new name.
        let mut m = m;
        for op in sync("a", 7) {
            m.apply(&op).unwrap();
        }
        for _ in 0..50 {
            let tree = paths(&m.crash_tree(&mut Choice::Random(&mut rng)));
            assert!(tree.contains(&"b/x=".to_string()), "{tree:?}");
        }
        assert!(paths(&m.crash_tree(&mut Choice::Minimal)).contains(&"b/x=".to_string()));
    }

    #[test]
    fn descriptors_follow_dup_and_seek_and_renames_keep_the_inode() {
        let ops = [
            open("f", 3),
            Op::Dup { from: 3, to: 7 },
            write(7, b"abc"),
            Op::Seek { fd: 3, pos: 1 },
            write(3, b"Z"),
            Op::Rename {
                from: at("f"),
                to: at("g"),
            },
            write(7, b"!"),
            Op::Close { fd: 3 },
        ];
        assert_eq!(paths(&model(&ops).logical_tree()), ["g=aZ!"]);
    }

    /// A file mapped shared and writable is named, so that the check
    /// against the disk compares only that it is there; the minimal crash
    /// state holds what the write calls left, random ones anything of the
    /// same length.
    #[test]
    fn a_shared_writable_mapping_marks_its_file_content_unknown() {
        let mut ops = vec![open("db-shm", 3), write(3, &[0; 5000])];
        ops.push(Op::Sync { fd: 3 });
        ops.extend(sync(".", 4));
        ops.push(Op::MapShared { fd: 3 });
        let model = model(&ops);
        assert_eq!(
            model.mapped_paths().into_iter().collect::<Vec<_>>(),
            vec![PathBuf::from("db-shm")]
        );
        let tree = model.logical_tree();
        let mut disk = Tree::default();
        disk.insert("db-shm".into(), Entry::File(vec![7; 5000]));
        assert_eq!(tree.difference(&disk, &model.unknowns()), None);
        assert!(tree.difference(&disk, &Unknowns::default()).is_some());
        assert!(Tree::default()
            .difference(&disk, &model.unknowns())
            .is_some());
        let path = Path::new("db-shm");
        let minimal = model.crash_tree(&mut Choice::Minimal);
        assert_eq!(minimal.get(path), Some(&Entry::File(vec![0; 5000])));
        let mut rng = fastrand::Rng::with_seed(3);
        let mut contents = BTreeSet::new();
        for _ in 0..30 {
            let state = model.crash_tree(&mut Choice::Random(&mut rng));
            match state.get(path) {
                Some(Entry::File(bytes)) => {
                    assert_eq!(bytes.len(), 5000, "only calls change its length");
                    contents.insert(bytes.clone());
                }
                other => panic!("the synced mapped file is gone: {other:?}"),
            }
        }
        assert!(
            contents.len() > 2,
            "random states vary its pages: {}",
            contents.len()
        );
    }

    #[test]
    fn what_contradicts_the_model_is_an_error() {
        let mut m = model(&[]);
        let error = m
            .apply(&Op::Open {
                at: at("missing"),
                flags: OpenFlags::default(),
                fd: 3,
            })
            .unwrap_err();
        assert!(error.contains("/r/missing"), "{error}");
        assert!(m.apply(&open("no/dir/f", 3)).is_err());
        // Outside the root: not modelled, and the bytes are output.
        assert_eq!(m.apply(&open("/elsewhere/f", 3)).unwrap(), None);
        assert_eq!(
            m.apply(&write(3, b"out")).unwrap(),
            Some((3, b"out".to_vec()))
        );
        assert_eq!(
            m.apply(&write(1, b"said")).unwrap(),
            Some((1, b"said".to_vec()))
        );
    }
}
