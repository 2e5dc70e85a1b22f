//! The metadata cache: every mount of a dataset listed once into one compact inode tree.
//!
//! `lookup`, `getattr` and `readdir` are answered from a [`Tree`] and never touch the remote
//! store. A refresh lists again, builds a new tree (reusing the inode number of every path
//! that still exists, so the kernel's cached entries stay valid) and swaps it in atomically.
//! Trees are persisted under `stateDir`, so a restarted agent serves the same inode numbers
//! without listing again (which is what lets a resumed FUSE connection keep working).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use sluice::source::ObjectInfo;

/// The root directory's inode number (FUSE's convention).
pub const ROOT_INO: u64 = 1;

const KIND_GONE: u8 = 0;
const KIND_DIR: u8 = 1;
const KIND_FILE: u8 = 2;

/// One inode: 32 bytes plus its name in the shared arena.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Node {
    parent: u32,
    name_off: u32,
    name_len: u32,
    kind: u8,
    size: u64,
    mtime: i64,
    /// Directories: first child in `children`; files: mount index.
    a: u32,
    /// Directories: number of children; files: index into that mount's objects.
    b: u32,
}

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File { mount: usize, object: usize },
}

/// A resolved inode, copied out of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub ino: u64,
    pub kind: EntryKind,
    pub size: u64,
    pub mtime: i64,
}

/// The listing of one mount, as returned by `Source::list`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MountListing {
    /// Subdirectory of the dataset ("" = the dataset root).
    pub name: String,
    pub objects: Vec<ObjectInfo>,
}

/// A dataset's whole namespace; immutable once built.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Tree {
    /// `nodes[ino - 1]`; removed paths leave `KIND_GONE` holes so numbers stay stable.
    nodes: Vec<Node>,
    names: String,
    /// Child inode numbers, one sorted-by-name run per directory.
    children: Vec<u32>,
    /// The listings the files point into.
    pub mounts: Vec<MountListing>,
}

/// Why metadata could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("metadata file {path} is corrupt ({source}); delete it to list again")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl Tree {
    /// Builds the tree of `mounts`, reusing inode numbers from `previous` for paths it has.
    pub fn build(mounts: Vec<MountListing>, previous: Option<&Tree>) -> Tree {
        // Every path (files and the directories they imply) with what it is.
        // path -> (kind, size, mtime, a, b), as in `Node`.
        type Shape = (u8, u64, i64, u32, u32);
        let mut paths: HashMap<String, Shape> = HashMap::new();
        paths.insert(String::new(), (KIND_DIR, 0, 0, 0, 0));
        for (m, mount) in mounts.iter().enumerate() {
            let base = mount.name.trim_matches('/');
            for (i, obj) in mounts[m].objects.iter().enumerate() {
                let key = obj.key.trim_matches('/');
                if key.is_empty()
                    || key
                        .split('/')
                        .any(|c| c.is_empty() || c == "." || c == "..")
                {
                    tracing::warn!(mount = %mount.name, key = %obj.key, "skipping object with an unusable path");
                    continue;
                }
                let full = if base.is_empty() {
                    key.to_string()
                } else {
                    format!("{base}/{key}")
                };
                // Implied parent directories.
                let mut at = 0;
                while let Some(pos) = full[at..].find('/') {
                    let dir = &full[..at + pos];
                    let e = paths
                        .entry(dir.to_string())
                        .or_insert((KIND_DIR, 0, 0, 0, 0));
                    if e.0 != KIND_DIR {
                        tracing::warn!(
                            path = dir,
                            "object shadowed by a directory of the same name"
                        );
                        *e = (KIND_DIR, 0, 0, 0, 0);
                    }
                    at += pos + 1;
                }
                match paths.get(&full) {
                    Some(e) if e.0 == KIND_DIR => {
                        tracing::warn!(path = %full, "object shadowed by a directory of the same name");
                    }
                    _ => {
                        paths.insert(
                            full,
                            (KIND_FILE, obj.size, obj.modified, m as u32, i as u32),
                        );
                    }
                }
            }
            if !base.is_empty() {
                let mut at = 0;
                loop {
                    let end = base[at..].find('/').map(|p| at + p).unwrap_or(base.len());
                    paths
                        .entry(base[..end].to_string())
                        .or_insert((KIND_DIR, 0, 0, 0, 0));
                    if end == base.len() {
                        break;
                    }
                    at = end + 1;
                }
            }
        }

        // Inode numbers: the previous tree's where the path (and kind) survives, new ones after.
        let mut next = previous.map(|p| p.nodes.len() as u64).unwrap_or(1) + 1;
        let mut sorted: Vec<(&String, &Shape)> = paths.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let mut ino_of: HashMap<&str, u64> = HashMap::with_capacity(sorted.len());
        for (path, e) in &sorted {
            let reused = if path.is_empty() {
                Some(ROOT_INO)
            } else {
                previous
                    .and_then(|p| p.resolve(path))
                    .filter(|old| (old.kind == EntryKind::Dir) == (e.0 == KIND_DIR))
                    .map(|old| old.ino)
            };
            let ino = reused.unwrap_or_else(|| {
                next += 1;
                next - 1
            });
            ino_of.insert(path.as_str(), ino);
        }
        let max_ino = ino_of
            .values()
            .copied()
            .max()
            .unwrap_or(1)
            .max(previous.map(|p| p.nodes.len() as u64).unwrap_or(1));
        let mut nodes = vec![Node::default(); max_ino as usize];
        let mut names = String::new();
        let mut by_parent: HashMap<u64, Vec<(&str, u64)>> = HashMap::new();
        for (path, e) in &sorted {
            let ino = ino_of[path.as_str()];
            let (parent_path, name) = match path.rfind('/') {
                Some(p) => (&path[..p], &path[p + 1..]),
                None => ("", path.as_str()),
            };
            let parent = if path.is_empty() {
                ROOT_INO
            } else {
                ino_of[parent_path]
            };
            let node = &mut nodes[ino as usize - 1];
            node.parent = parent as u32;
            node.name_off = names.len() as u32;
            node.name_len = name.len() as u32;
            names.push_str(name);
            node.kind = e.0;
            node.size = e.1;
            node.mtime = e.2;
            node.a = e.3;
            node.b = e.4;
            if !path.is_empty() {
                by_parent.entry(parent).or_default().push((name, ino));
            }
        }
        let mut children = Vec::with_capacity(sorted.len());
        for (parent, mut kids) in by_parent {
            kids.sort_by(|a, b| a.0.cmp(b.0));
            let node = &mut nodes[parent as usize - 1];
            node.a = children.len() as u32;
            node.b = kids.len() as u32;
            children.extend(kids.iter().map(|k| k.1 as u32));
        }
        for node in nodes.iter_mut().filter(|n| n.kind == KIND_DIR) {
            node.size = 4096;
        }
        Tree {
            nodes,
            names,
            children,
            mounts,
        }
    }

    fn node(&self, ino: u64) -> Option<&Node> {
        let n = self.nodes.get((ino as usize).checked_sub(1)?)?;
        (n.kind != KIND_GONE).then_some(n)
    }

    fn name_of(&self, n: &Node) -> &str {
        &self.names[n.name_off as usize..(n.name_off + n.name_len) as usize]
    }

    fn entry(&self, ino: u64, n: &Node) -> Entry {
        let kind = if n.kind == KIND_DIR {
            EntryKind::Dir
        } else {
            EntryKind::File {
                mount: n.a as usize,
                object: n.b as usize,
            }
        };
        Entry {
            ino,
            kind,
            size: n.size,
            mtime: n.mtime,
        }
    }

    /// The inode `ino`, if it exists.
    pub fn get(&self, ino: u64) -> Option<Entry> {
        self.node(ino).map(|n| self.entry(ino, n))
    }

    /// The child `name` of directory `parent` (binary search over its sorted children).
    pub fn lookup(&self, parent: u64, name: &str) -> Option<Entry> {
        let p = self.node(parent).filter(|n| n.kind == KIND_DIR)?;
        let kids = &self.children[p.a as usize..(p.a + p.b) as usize];
        let i = kids
            .binary_search_by(|&k| self.name_of(&self.nodes[k as usize - 1]).cmp(name))
            .ok()?;
        self.get(kids[i] as u64)
    }

    /// The parent of `ino` (the root is its own parent).
    pub fn parent(&self, ino: u64) -> u64 {
        self.node(ino).map(|n| n.parent as u64).unwrap_or(ROOT_INO)
    }

    /// Children of directory `ino` in name order, as (name, entry).
    pub fn children(&self, ino: u64) -> impl Iterator<Item = (&str, Entry)> + '_ {
        self.children_from(ino, 0)
    }

    /// Children of directory `ino` in name order, from the `skip`-th on (readdir offsets).
    pub fn children_from(&self, ino: u64, skip: usize) -> impl Iterator<Item = (&str, Entry)> + '_ {
        let range = match self.node(ino) {
            Some(n) if n.kind == KIND_DIR => {
                (n.a as usize + skip).min((n.a + n.b) as usize)..(n.a + n.b) as usize
            }
            _ => 0..0,
        };
        self.children[range].iter().filter_map(move |&k| {
            let n = self.node(k as u64)?;
            Some((self.name_of(n), self.entry(k as u64, n)))
        })
    }

    /// How many children directory `ino` has (0 for a file).
    pub fn child_count(&self, ino: u64) -> usize {
        self.node(ino)
            .filter(|n| n.kind == KIND_DIR)
            .map_or(0, |n| n.b as usize)
    }

    /// The parent of `ino` and the index of `ino` among its children (name order).
    pub fn position(&self, ino: u64) -> Option<(u64, usize)> {
        let n = self.node(ino)?;
        let parent = n.parent as u64;
        let p = self.node(parent).filter(|p| p.kind == KIND_DIR)?;
        let kids = &self.children[p.a as usize..(p.a + p.b) as usize];
        let name = self.name_of(n);
        let i = kids
            .binary_search_by(|&k| self.name_of(&self.nodes[k as usize - 1]).cmp(name))
            .ok()?;
        (kids[i] as u64 == ino).then_some((parent, i))
    }

    /// The entry at `path` (`/`-separated, relative to the dataset root).
    pub fn resolve(&self, path: &str) -> Option<Entry> {
        let mut cur = self.get(ROOT_INO)?;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            cur = self.lookup(cur.ino, part)?;
        }
        Some(cur)
    }

    /// The path of `ino` relative to the dataset root (for messages).
    pub fn path_of(&self, ino: u64) -> String {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            let Some(n) = self.node(cur) else { break };
            parts.push(self.name_of(n));
            cur = n.parent as u64;
        }
        parts.reverse();
        parts.join("/")
    }

    /// Every file under `ino` (itself if it is a file), depth first.
    pub fn files_under(&self, ino: u64) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut stack = vec![ino];
        while let Some(i) = stack.pop() {
            match self.get(i) {
                Some(
                    e @ Entry {
                        kind: EntryKind::File { .. },
                        ..
                    },
                ) => out.push(e),
                Some(_) => stack.extend(self.children(i).map(|(_, e)| e.ino)),
                None => {}
            }
        }
        out
    }

    /// The object behind a file entry.
    pub fn object(&self, mount: usize, object: usize) -> &ObjectInfo {
        &self.mounts[mount].objects[object]
    }

    /// Number of files and their total size.
    pub fn totals(&self) -> (u64, u64) {
        self.nodes
            .iter()
            .filter(|n| n.kind == KIND_FILE)
            .fold((0, 0), |(f, b), n| (f + 1, b + n.size))
    }

    /// Every live inode.
    pub fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        (1..=self.nodes.len() as u64).filter_map(|ino| self.get(ino))
    }

    /// The last path component of `ino` ("" for the root).
    pub fn name(&self, ino: u64) -> &str {
        self.node(ino).map(|n| self.name_of(n)).unwrap_or("")
    }

    /// Inodes of `old` that the kernel may hold stale: files gone or changed (size, mtime,
    /// version), and every directory (its listing may have changed). Each with its parent
    /// and name in `old`, and whether it is gone.
    pub fn changed_since<'a>(
        &'a self,
        old: &'a Tree,
    ) -> impl Iterator<Item = (u64, u64, &'a str, bool)> + 'a {
        old.entries().filter_map(move |e| {
            let gone = self
                .get(e.ino)
                .is_none_or(|n| (n.kind == EntryKind::Dir) != (e.kind == EntryKind::Dir));
            let changed = gone
                || match (e.kind, self.get(e.ino).map(|n| n.kind)) {
                    (EntryKind::Dir, _) => true,
                    (
                        EntryKind::File {
                            mount: m0,
                            object: o0,
                        },
                        Some(EntryKind::File {
                            mount: m1,
                            object: o1,
                        }),
                    ) => {
                        let (a, b) = (old.object(m0, o0), self.object(m1, o1));
                        a.size != b.size || a.modified != b.modified || a.version != b.version
                    }
                    _ => true,
                };
            changed.then(|| (e.ino, old.parent(e.ino), old.name(e.ino), gone))
        })
    }

    /// Highest inode number in use, for statfs.
    pub fn inode_count(&self) -> u64 {
        self.nodes.len() as u64
    }

    /// Loads a persisted tree; `Ok(None)` if there is none.
    pub fn load(path: &Path) -> Result<Option<Tree>, MetaError> {
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(MetaError::Io {
                    path: path.into(),
                    source,
                });
            }
        };
        serde_json::from_slice(&data)
            .map(Some)
            .map_err(|source| MetaError::Corrupt {
                path: path.into(),
                source,
            })
    }

    /// Persists the tree (write to a temporary file, then rename, so a crash never leaves
    /// half a file).
    pub fn save(&self, path: &Path) -> Result<(), MetaError> {
        let io = |source| MetaError::Io {
            path: path.into(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("tmp");
        let data = serde_json::to_vec(self).expect("tree serializes");
        std::fs::write(&tmp, data).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// The current tree of one dataset; readers take a snapshot, a refresh swaps it.
#[derive(Debug, Default)]
pub struct MetaCache {
    // The lock is held only to clone or replace the Arc, never across a request.
    current: RwLock<Arc<Tree>>,
}

impl MetaCache {
    /// A cache holding `tree`.
    pub fn new(tree: Tree) -> Self {
        MetaCache {
            current: RwLock::new(Arc::new(tree)),
        }
    }
    /// The tree as of now.
    pub fn snapshot(&self) -> Arc<Tree> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    /// Replaces the tree.
    pub fn swap(&self, tree: Tree) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tree);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str, size: u64) -> ObjectInfo {
        ObjectInfo {
            key: key.into(),
            size,
            version: None,
            modified: 0,
        }
    }

    #[test]
    fn lookup_readdir_and_stable_inodes() {
        let m = vec![
            MountListing {
                name: "train".into(),
                objects: vec![obj("a/x.jpg", 3), obj("a/y.jpg", 4), obj("b.bin", 5)],
            },
            MountListing {
                name: "val".into(),
                objects: vec![obj("z", 1)],
            },
        ];
        let t = Tree::build(m, None);
        let train = t.lookup(ROOT_INO, "train").unwrap();
        assert_eq!(train.kind, EntryKind::Dir);
        let names: Vec<_> = t.children(train.ino).map(|(n, _)| n.to_string()).collect();
        assert_eq!(names, ["a", "b.bin"]);
        let y = t.resolve("train/a/y.jpg").unwrap();
        assert_eq!(y.size, 4);
        assert_eq!(t.path_of(y.ino), "train/a/y.jpg");
        assert_eq!(t.totals(), (4, 13));
        assert!(t.lookup(ROOT_INO, "nope").is_none());

        // Refresh: y removed, w added; surviving paths keep their numbers.
        let m2 = vec![
            MountListing {
                name: "train".into(),
                objects: vec![obj("a/x.jpg", 3), obj("a/w.jpg", 9), obj("b.bin", 5)],
            },
            MountListing {
                name: "val".into(),
                objects: vec![obj("z", 1)],
            },
        ];
        let t2 = Tree::build(m2, Some(&t));
        assert_eq!(
            t2.resolve("train/a/x.jpg").unwrap().ino,
            t.resolve("train/a/x.jpg").unwrap().ino
        );
        assert_eq!(
            t2.resolve("val/z").unwrap().ino,
            t.resolve("val/z").unwrap().ino
        );
        assert!(t2.get(y.ino).is_none());
        let w = t2.resolve("train/a/w.jpg").unwrap();
        assert!(w.ino > t.inode_count());

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.json");
        t2.save(&p).unwrap();
        let t3 = Tree::load(&p).unwrap().unwrap();
        assert_eq!(t3.resolve("train/a/w.jpg"), Some(w));
    }
}
