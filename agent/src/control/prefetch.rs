//! The prefetcher: fed by the FUSE access stream of one dataset (opens and reads), it
//! fetches ahead of readers into the cache. It recognises three patterns:
//!
//! - **Sequential reads within a file** ([`Readahead`], per open file): a window of blocks
//!   ahead of the reader that doubles on each sequential read (up to `maxWindow`), halves
//!   on a seek (the blocks fetched ahead of a seeking reader were wasted), and stays put
//!   when the kernel's parallel requests arrive slightly out of order.
//! - **Directory scans** ([`DirScan`], per directory): a reader opening files of one
//!   directory in listing order (each file after the previous one, a stride of a few
//!   allowed, as DataLoader workers splitting a listing do) gets the next files of that
//!   directory fetched ahead, small files whole, large ones their first blocks; the depth
//!   doubles with the run, up to `dirFiles`.
//! - **Repeated epochs** ([`EpochTracker`], per dataset): once the readers opened (nearly,
//!   90%) every file of the dataset, that pass's order of first opens is remembered. When
//!   the next pass starts, if it follows the remembered order, the next `epochFiles` files
//!   in that order are fetched ahead of the reader; if the order is shuffled, the files
//!   the pass has not opened yet are fetched in the remembered order in the background,
//!   as far as the prefetch budget allows, skipping what is cached.
//!
//! Every fetch takes a slot of the node's [`Limiter`] (never waits: a full budget skips the
//! prefetch), runs on the read pool, never blocks a read and joins a reader's fetch of the
//! same block (single-flight). Speculative prefetch (directory and epoch) only runs while
//! the dataset's cache has room for it, so it never evicts what a job is about to read; no
//! prefetch at all goes to an epoch partition at its quota, which would not admit it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::config::PrefetchConfig;
use sluice::dataset::Dataset;
use sluice_cache_engine::{Cache, Key, Policy};

use super::{ControlMetrics, Limiter};
use crate::fuse::pool::ReadPool;
use crate::meta::{Entry, EntryKind, Tree};

/// Reads within this distance of the expected offset are the same sequential stream (the
/// kernel sends a reader's requests in parallel; they can arrive out of order).
const SLACK: u64 = 2 << 20;
/// Prefetched blocks tracked for hits and waste.
const TRACKED: usize = 8192;
/// A tracked block not read within this long was wasted.
const TRACK_TTL: Duration = Duration::from_secs(120);
/// Open files of one directory at most this far apart in the listing are a scan.
const DIR_STRIDE: usize = 4;
/// Directories whose scan state is kept.
const DIRS: usize = 4096;
/// Blocks of a large file fetched by a directory scan.
const DIR_FILE_BLOCKS: u64 = 2;
/// Files of the known set the background walk looks at per open.
const BACKGROUND_SCAN: usize = 512;
/// Share of a dataset's files opened for a pass to count as complete.
const EPOCH_COMPLETE: f64 = 0.9;

/// Readahead of one open file.
#[derive(Debug, Clone, Copy)]
pub struct Readahead {
    next: u64,
    window: u64,
    ahead_until: u64,
    max: u64,
    /// Every read so far was sequential from offset 0.
    whole: bool,
    /// The next file was hinted to the directory scan already.
    hinted: bool,
}

impl Readahead {
    pub fn new(max_window: u64) -> Readahead {
        Readahead {
            next: 0,
            window: 0,
            ahead_until: 0,
            max: max_window.max(1),
            whole: true,
            hinted: false,
        }
    }

    /// True once, when a reader that has read a file of several blocks sequentially from
    /// its start has its window reach the end of the file: it may go on with the next file
    /// of the directory (a shard reader), see [`DirScan::hint`].
    pub fn reaches_end(&mut self, file_size: u64, block: u64) -> bool {
        let blocks = file_size.div_ceil(block);
        let reached = self.whole && !self.hinted && blocks >= 2 && self.ahead_until >= blocks;
        self.hinted |= reached;
        reached
    }

    /// The window now, in blocks.
    #[cfg(test)]
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Updates the state for a read of `size` at `offset` and returns the blocks to fetch.
    pub fn on_read(
        &mut self,
        offset: u64,
        size: u64,
        file_size: u64,
        block: u64,
    ) -> Option<Range<u64>> {
        let end = offset + size;
        if offset == self.next {
            self.window = (self.window * 2).clamp(1, self.max);
        } else if offset.abs_diff(self.next) > SLACK {
            // A seek: what was fetched ahead of the old position is likely wasted.
            self.window /= 2;
            self.whole = false;
            self.ahead_until = 0;
            self.next = end;
            return None;
        }
        self.next = self.next.max(end);
        if self.window == 0 || file_size <= block {
            return None;
        }
        let blocks = file_size.div_ceil(block);
        let current = (end.saturating_sub(1) / block).min(blocks - 1);
        let from = (current + 1).max(self.ahead_until);
        let to = (current + 1 + self.window).min(blocks);
        (from < to).then(|| {
            self.ahead_until = to;
            from..to
        })
    }
}

/// Scan state of one directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirScan {
    last: usize,
    run: u32,
    ahead_until: usize,
    /// The file fetched on a reader's hint, until the next open tells whether it was right.
    hinted: Option<usize>,
    /// A hint was wrong (the next open was another file): no more until a scan is seen.
    hints_off: bool,
}

impl DirScan {
    /// The child at position `pos` of a directory of `len` children was opened: the
    /// positions to fetch ahead, up to `max` files.
    pub fn on_open(&mut self, pos: usize, len: usize, max: usize) -> Range<usize> {
        if let Some(h) = self.hinted.take()
            && h != pos
        {
            self.hints_off = true;
        }
        if pos > self.last && pos - self.last <= DIR_STRIDE {
            self.run += 1;
        } else if pos != self.last || self.run == 0 {
            self.run = 0;
            self.ahead_until = 0;
        }
        self.last = pos;
        if self.run == 0 || max == 0 {
            return 0..0;
        }
        self.hints_off = false;
        let depth = (1usize << self.run.min(16)).min(max);
        let from = (pos + 1).max(self.ahead_until);
        let to = (pos + 1 + depth).min(len);
        if from >= to {
            return 0..0;
        }
        self.ahead_until = to;
        from..to
    }
}

impl DirScan {
    /// A reader reached the end of the file at `pos` ([`Readahead::reaches_end`]): the
    /// next file's position to fetch (its first block), unless a scan already fetched it,
    /// the directory ends, or the last hint here was wrong.
    pub fn hint(&mut self, pos: usize, len: usize) -> Option<usize> {
        let next = pos + 1;
        if self.hints_off || next >= len || (self.run > 0 && self.ahead_until > next) {
            return None;
        }
        self.hinted = Some(next);
        Some(next)
    }
}

/// What the epoch tracker wants fetched after an open.
#[derive(Debug, PartialEq, Eq)]
pub enum EpochAction {
    Nothing,
    /// The pass follows the remembered order: these files (inodes) come next.
    Ahead(Vec<u64>),
    /// A shuffled pass: fetch files not opened yet in the background.
    Background,
}

/// Recognises passes over a dataset's file set.
#[derive(Debug, Default)]
pub struct EpochTracker {
    /// Files opened in the current pass, and their order of first opens.
    seen: HashSet<u64>,
    order: Vec<u64>,
    /// The last complete pass: its order and each file's place in it.
    known: Vec<u64>,
    place: HashMap<u64, usize>,
    /// Completed passes.
    pub passes: u32,
    /// Opens of the current pass that followed the remembered order.
    in_order: usize,
    /// Where the background walk of a shuffled pass is in `known`.
    cursor: usize,
}

impl EpochTracker {
    /// A file was opened; `files` is the dataset's file count. `ahead` files at most.
    pub fn on_open(&mut self, ino: u64, files: usize, ahead: usize) -> EpochAction {
        let complete = self.seen.len() >= files
            || (self.seen.contains(&ino)
                && self.seen.len() as f64 >= EPOCH_COMPLETE * files as f64);
        if complete && !self.seen.is_empty() {
            self.known = std::mem::take(&mut self.order);
            self.place = self
                .known
                .iter()
                .enumerate()
                .map(|(i, &f)| (f, i))
                .collect();
            self.seen.clear();
            self.passes += 1;
            self.in_order = 0;
            self.cursor = 0;
            tracing::info!(
                files = self.known.len(),
                passes = self.passes,
                "prefetch: a pass over the dataset's files is complete; the next one is prefetched"
            );
        }
        if !self.seen.insert(ino) {
            return EpochAction::Nothing;
        }
        self.order.push(ino);
        if self.known.is_empty() {
            return EpochAction::Nothing;
        }
        // Following the remembered order: this file comes right after the previous one.
        let i = self.order.len() - 1;
        let follows = match (self.place.get(&ino), i.checked_sub(1)) {
            (Some(&p), None) => p < 4,
            (Some(&p), Some(prev)) => self
                .place
                .get(&self.order[prev])
                .is_some_and(|&q| p > q && p - q <= DIR_STRIDE),
            (None, _) => false,
        };
        if follows {
            self.in_order += 1;
        }
        // A file the last pass did not open (it counted as complete at 90%) has no place.
        let place = self.place.get(&ino).copied();
        if let Some(p) = place
            && self.in_order * 2 >= self.order.len()
            && self.in_order >= 2
        {
            let next = self.known[p + 1..].iter().take(ahead).copied().collect();
            EpochAction::Ahead(next)
        } else if self.order.len() >= 4 {
            EpochAction::Background
        } else {
            EpochAction::Nothing
        }
    }

    /// The next files of the remembered set this pass has not opened and `cached` says
    /// are not cached, from the background walk's cursor; advances the cursor past them.
    /// Looks at most at `BACKGROUND_SCAN` files per call. Returns (place, inode) pairs.
    pub fn background(&mut self, n: usize, cached: impl Fn(u64) -> bool) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        let stop = (self.cursor + BACKGROUND_SCAN).min(self.known.len());
        while out.len() < n && self.cursor < stop {
            let f = self.known[self.cursor];
            if !self.seen.contains(&f) && !cached(f) {
                out.push((self.cursor, f));
            }
            self.cursor += 1;
        }
        out
    }

    /// Puts the cursor back to `place` (a file [`background`](Self::background) returned
    /// that was not fetched after all: the budget was spent).
    pub fn rewind_to(&mut self, place: usize) {
        self.cursor = self.cursor.min(place);
    }
}

/// Prefetched blocks not read yet, for the hit and waste counters.
#[derive(Debug, Default)]
struct Tracked {
    at: HashMap<Key, Instant>,
    order: VecDeque<Key>,
}

/// The prefetcher of one dataset.
pub struct Prefetcher {
    dataset: Arc<Dataset>,
    cache: Cache,
    policy: Policy,
    pool: Arc<ReadPool>,
    limiter: Arc<Limiter>,
    metrics: ControlMetrics,
    config: PrefetchConfig,
    handles: Vec<Mutex<HashMap<u64, Readahead>>>,
    dirs: Mutex<HashMap<u64, DirScan>>,
    epoch: Mutex<(usize, usize, EpochTracker)>,
    tracked: Mutex<Tracked>,
}

const SHARDS: usize = 32;

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("dataset", &self.dataset.name)
            .finish_non_exhaustive()
    }
}

impl Prefetcher {
    pub fn new(
        dataset: Arc<Dataset>,
        cache: Cache,
        policy: Policy,
        pool: Arc<ReadPool>,
        limiter: Arc<Limiter>,
        metrics: ControlMetrics,
        config: PrefetchConfig,
    ) -> Prefetcher {
        Prefetcher {
            dataset,
            cache,
            policy,
            pool,
            limiter,
            metrics,
            config,
            handles: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            dirs: Mutex::new(HashMap::new()),
            epoch: Mutex::new((0, 0, EpochTracker::default())),
            tracked: Mutex::new(Tracked::default()),
        }
    }

    fn shard(&self, fh: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Readahead>> {
        self.handles[fh as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A file was opened as handle `fh`: directory-scan and epoch detection.
    pub fn on_open(&self, tree: &Arc<Tree>, ino: u64, fh: u64) {
        self.shard(fh)
            .insert(fh, Readahead::new(self.config.max_window));
        if let Some((parent, pos)) = tree.position(ino) {
            let len = tree.child_count(parent);
            let ahead = {
                let mut dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
                if dirs.len() >= DIRS && !dirs.contains_key(&parent) {
                    dirs.clear();
                }
                dirs.entry(parent)
                    .or_default()
                    .on_open(pos, len, self.config.dir_files)
            };
            if !ahead.is_empty() {
                let files: Vec<Entry> = tree
                    .children_from(parent, ahead.start)
                    .take(ahead.len())
                    .map(|(_, e)| e)
                    .collect();
                self.fetch_files(tree, &files, "dir", DIR_FILE_BLOCKS);
            }
        }
        if self.config.epoch {
            self.epoch_open(tree, ino);
        }
    }

    fn epoch_open(&self, tree: &Arc<Tree>, ino: u64) {
        let mut guard = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
        let (tree_id, files, tracker) = &mut *guard;
        // A refreshed listing is a new file set: start over.
        let id = Arc::as_ptr(tree) as usize;
        if *tree_id != id {
            *tree_id = id;
            *files = tree.totals().0 as usize;
            *tracker = EpochTracker::default();
        }
        match tracker.on_open(ino, *files, self.config.epoch_files) {
            EpochAction::Nothing => {}
            EpochAction::Ahead(inos) => {
                drop(guard);
                let files: Vec<Entry> = inos.iter().filter_map(|&i| tree.get(i)).collect();
                self.fetch_files(tree, &files, "epoch", u64::MAX);
            }
            EpochAction::Background => {
                // As many files as there are free slots; those that do not get one wait
                // for a later open.
                let free = self
                    .limiter
                    .limit()
                    .saturating_sub(self.limiter.in_flight());
                let batch = tracker.background(free, |f| self.file_cached(tree, f));
                drop(guard);
                let files: Vec<Entry> = batch.iter().filter_map(|&(_, i)| tree.get(i)).collect();
                let done = self.fetch_files(tree, &files, "epoch", u64::MAX);
                if let Some(&(place, _)) = batch.get(done) {
                    let mut guard = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
                    guard.2.rewind_to(place);
                }
            }
        }
    }

    /// A read of `size` at `offset` of `ino` through handle `fh`: counts prefetch hits and
    /// moves the readahead window.
    pub fn on_read(&self, tree: &Arc<Tree>, ino: u64, fh: u64, offset: u64, size: u64) {
        let Some(Entry {
            kind: EntryKind::File { mount, object },
            size: file_size,
            ..
        }) = tree.get(ino)
        else {
            return;
        };
        let block = self.dataset.block_size;
        if offset < file_size {
            let obj = tree.object(mount, object);
            let last = (offset + size).min(file_size).saturating_sub(1) / block;
            let mut t = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
            if !t.at.is_empty() {
                for index in offset / block..=last {
                    if t.at
                        .remove(&self.dataset.block_key(mount, obj, index))
                        .is_some()
                    {
                        self.metrics.prefetch_hits.inc();
                    }
                }
            }
        }
        let (ahead, end) = {
            let mut handles = self.shard(fh);
            let r = handles
                .entry(fh)
                .or_insert_with(|| Readahead::new(self.config.max_window));
            let ahead = r.on_read(offset, size, file_size, block);
            (ahead, r.reaches_end(file_size, block))
        };
        if let Some(blocks) = ahead {
            if self.at_quota(block) {
                self.metrics.skipped("quota");
                return;
            }
            for index in blocks {
                // A sequential reader also waits on NVMe: stage cached blocks ahead too.
                if self.fetch_block(tree, mount, object, index, "readahead", true) == Fetch::Full {
                    break;
                }
            }
        }
        if end && let Some((parent, pos)) = tree.position(ino) {
            let next = {
                let mut dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
                dirs.entry(parent)
                    .or_default()
                    .hint(pos, tree.child_count(parent))
            };
            if let Some(next) = next {
                let files: Vec<Entry> = tree
                    .children_from(parent, next)
                    .take(1)
                    .map(|(_, e)| e)
                    .collect();
                self.fetch_files(tree, &files, "dir", 1);
            }
        }
    }

    /// Handle `fh` was closed.
    pub fn on_release(&self, fh: u64) {
        self.shard(fh).remove(&fh);
    }

    /// Whether file `ino`'s first and last blocks are cached (a cheap "all of it").
    fn file_cached(&self, tree: &Tree, ino: u64) -> bool {
        let Some(Entry {
            kind: EntryKind::File { mount, object },
            size,
            ..
        }) = tree.get(ino)
        else {
            return true;
        };
        let obj = tree.object(mount, object);
        let last = size.div_ceil(self.dataset.block_size).saturating_sub(1);
        [0, last].iter().all(|&i| {
            self.dataset
                .cache
                .contains(&self.dataset.block_key(mount, obj, i))
        })
    }

    /// An epoch partition that cannot admit `bytes` more.
    fn at_quota(&self, bytes: u64) -> bool {
        if self.policy != Policy::Epoch {
            return false;
        }
        let s = self.dataset.cache.stats();
        s.quota.is_some_and(|q| s.bytes + bytes > q)
    }

    /// Bytes that fit without evicting anything of this dataset or the node's (below the
    /// quota if there is one), and whether that bound is an epoch partition's quota.
    fn room(&self) -> (u64, bool) {
        let s = self.dataset.cache.stats();
        if let Some(q) = s.quota {
            return (q.saturating_sub(s.bytes), self.policy == Policy::Epoch);
        }
        let c = self.cache.stats();
        let room = if c.disks.is_empty() {
            c.memory.capacity.saturating_sub(c.memory.bytes)
        } else {
            // Below the disks' eviction watermark (0.85 of capacity by default).
            let (used, cap) = c
                .disks
                .iter()
                .fold((0, 0), |(u, k), (_, t)| (u + t.bytes, k + t.capacity));
            (cap / 100 * 85).saturating_sub(used)
        };
        (room, false)
    }

    /// Fetches the first `max_blocks` blocks of each file; returns how many files got all
    /// their fetches (a full budget or a full cache stops early).
    fn fetch_files(&self, tree: &Arc<Tree>, files: &[Entry], kind: &str, max_blocks: u64) -> usize {
        let block = self.dataset.block_size;
        let (mut room, epoch_quota) = self.room();
        // Bounds one call's work and bytes (an epoch of large files would otherwise queue
        // whole files); what is left over waits for a later open.
        let mut budget = self.config.max_window * 4;
        let mut done = 0;
        for e in files {
            let EntryKind::File { mount, object } = e.kind else {
                done += 1;
                continue;
            };
            let blocks = e.size.div_ceil(block).min(max_blocks);
            let bytes = (blocks * block).min(e.size);
            if bytes > room {
                // An epoch partition at its quota would not admit it; anything else would
                // have to evict.
                self.metrics
                    .skipped(if epoch_quota { "quota" } else { "room" });
                return done;
            }
            room -= bytes;
            for index in 0..blocks {
                if budget == 0 {
                    return done;
                }
                budget -= 1;
                if self.fetch_block(tree, mount, object, index, kind, false) == Fetch::Full {
                    return done;
                }
            }
            done += 1;
        }
        done
    }

    /// Fetches one block into the cache in the background unless it is cached; with
    /// `stage`, a block cached only on NVMe is read too, so that the reader finds it in
    /// memory (the dataset keeps NVMe hits for the rest of their reads).
    fn fetch_block(
        &self,
        tree: &Arc<Tree>,
        mount: usize,
        object: usize,
        index: u64,
        kind: &str,
        stage: bool,
    ) -> Fetch {
        let obj = tree.object(mount, object);
        let key = self.dataset.block_key(mount, obj, index);
        // Cached, or prefetched already and not read yet (in flight or just arrived).
        if (!stage && self.dataset.cache.contains(&key))
            || self
                .tracked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .at
                .contains_key(&key)
        {
            return Fetch::Cached;
        }
        let Some(permit) = self.limiter.try_acquire() else {
            self.metrics.skipped("full");
            return Fetch::Full;
        };
        self.track(key);
        self.metrics.prefetched(kind);
        let ds = self.dataset.clone();
        let tree = tree.clone();
        self.pool.spawn(move || async move {
            let _ = ds
                .read_block(mount, tree.object(mount, object), index)
                .await;
            drop(permit);
        });
        Fetch::Started
    }

    fn track(&self, key: Key) {
        let mut t = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Forget the oldest: read ones are gone from `at` already, the rest were wasted.
        while let Some(old) = t.order.front().copied() {
            let expired = match t.at.get(&old) {
                Some(at) => t.order.len() >= TRACKED || now.duration_since(*at) > TRACK_TTL,
                None => true,
            };
            if !expired {
                break;
            }
            t.order.pop_front();
            if t.at.remove(&old).is_some() {
                self.metrics.prefetch_wasted.inc();
            }
        }
        if t.at.insert(key, now).is_none() {
            t.order.push_back(key);
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Fetch {
    Cached,
    Started,
    Full,
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 4 << 20;

    #[test]
    fn readahead_grows_on_sequential_reads_and_shrinks_on_seeks() {
        let mut r = Readahead::new(8);
        let file = 100 * B;
        let chunk = 1 << 20;
        let mut windows = vec![];
        let mut off = 0;
        for _ in 0..6 {
            r.on_read(off, chunk, file, B);
            windows.push(r.window());
            off += chunk;
        }
        assert_eq!(windows, [1, 2, 4, 8, 8, 8]);
        // A seek halves the window and fetches nothing for that read.
        assert_eq!(r.on_read(50 * B, chunk, file, B), None);
        assert_eq!(r.window(), 4);
        // Sequential again: it grows back, fetching from the new position.
        let got = r.on_read(50 * B + chunk, chunk, file, B).unwrap();
        assert_eq!(r.window(), 8);
        assert_eq!(got, 51..59);
        // Seeks in a row shrink it to nothing.
        for i in 0..5 {
            r.on_read(i * 10 * B, chunk, file, B);
        }
        assert_eq!(r.window(), 0);
    }

    #[test]
    fn readahead_tolerates_requests_out_of_order() {
        let mut r = Readahead::new(8);
        let chunk = 128 << 10;
        r.on_read(0, chunk, 10 * B, B);
        r.on_read(2 * chunk, chunk, 10 * B, B);
        r.on_read(chunk, chunk, 10 * B, B);
        assert_eq!(r.window(), 1, "no seek: the window was kept");
    }

    #[test]
    fn readahead_never_passes_the_end_nor_refetches() {
        let mut r = Readahead::new(8);
        assert_eq!(r.on_read(0, 1 << 20, 3 * B, B), Some(1..2));
        assert_eq!(r.on_read(1 << 20, 1 << 20, 3 * B, B), Some(2..3));
        assert_eq!(r.on_read(2 << 20, 1 << 20, 3 * B, B), None);
        // A one-block file has nothing ahead.
        let mut r = Readahead::new(8);
        assert_eq!(r.on_read(0, 1 << 20, B, B), None);
    }

    #[test]
    fn a_whole_file_read_hints_the_next_file_until_a_hint_is_wrong() {
        let mut r = Readahead::new(8);
        let file = 3 * B;
        let mut ends = vec![];
        for i in 0..12 {
            r.on_read(i << 20, 1 << 20, file, B);
            ends.push(r.reaches_end(file, B));
        }
        assert_eq!(ends.iter().filter(|&&e| e).count(), 1, "once: {ends:?}");
        assert!(ends[1], "the window covers the file after the second read");
        let mut r = Readahead::new(8);
        r.on_read(B, 1 << 20, file, B);
        r.on_read(B + (1 << 20), 1 << 20, file, B);
        assert!(!r.reaches_end(file, B), "a reader that started mid-file");

        let mut d = DirScan::default();
        d.on_open(0, 10, 16);
        assert_eq!(d.hint(0, 10), Some(1));
        d.on_open(1, 10, 16);
        assert_eq!(d.hint(1, 10), None, "the scan fetched ahead already");
        let mut d = DirScan::default();
        d.on_open(5, 10, 16);
        assert_eq!(d.hint(5, 10), Some(6));
        d.on_open(2, 10, 16);
        assert_eq!(d.hint(2, 10), None, "the last hint was wrong");
        d.on_open(3, 10, 16);
        d.on_open(4, 10, 16);
        assert_eq!(d.hint(9, 10), None, "the end of the directory");
    }

    #[test]
    fn dir_scan_detects_listing_order_and_deepens() {
        let mut d = DirScan::default();
        assert_eq!(d.on_open(0, 100, 16), 0..0);
        assert_eq!(d.on_open(1, 100, 16), 2..4);
        assert_eq!(d.on_open(2, 100, 16), 4..7);
        assert_eq!(d.on_open(3, 100, 16), 7..12);
        assert_eq!(d.on_open(4, 100, 16), 12..21);
        assert_eq!(d.on_open(5, 100, 16), 21..22);
        // A stride (workers splitting the listing) still counts.
        assert_eq!(d.on_open(8, 100, 16), 22..25);
        // Random opens stop it.
        assert_eq!(d.on_open(70, 100, 16), 0..0);
        assert_eq!(d.on_open(12, 100, 16), 0..0);
        // The end of the directory bounds it.
        let mut d = DirScan::default();
        d.on_open(97, 100, 16);
        assert_eq!(d.on_open(98, 100, 16), 99..100);
        assert_eq!(d.on_open(99, 100, 16), 0..0);
    }

    #[test]
    fn epoch_in_the_same_order_fetches_ahead() {
        let mut e = EpochTracker::default();
        for f in 1..=10 {
            assert_eq!(e.on_open(f, 10, 3), EpochAction::Nothing);
        }
        assert_eq!(e.passes, 0);
        // The second pass starts: the first pass is now known.
        assert_eq!(e.on_open(1, 10, 3), EpochAction::Nothing);
        assert_eq!(e.passes, 1);
        assert_eq!(e.on_open(2, 10, 3), EpochAction::Ahead(vec![3, 4, 5]));
        assert_eq!(e.on_open(3, 10, 3), EpochAction::Ahead(vec![4, 5, 6]));
        assert_eq!(e.on_open(3, 10, 3), EpochAction::Nothing, "a reopen");
    }

    #[test]
    fn shuffled_epoch_fetches_unopened_files_in_the_background() {
        let mut e = EpochTracker::default();
        for f in 1..=10 {
            e.on_open(f, 10, 3);
        }
        let shuffled = [7, 2, 9, 4, 1];
        let actions: Vec<_> = shuffled.iter().map(|&f| e.on_open(f, 10, 3)).collect();
        assert_eq!(actions[4], EpochAction::Background);
        assert_eq!(e.passes, 1);
        assert_eq!(e.background(3, |_| false), vec![(2, 3), (4, 5), (5, 6)]);
        e.rewind_to(5);
        assert_eq!(e.background(10, |f| f == 8), vec![(5, 6), (9, 10)]);
        assert_eq!(e.background(10, |_| false), vec![]);
    }

    /// A real dataset over a local directory, a real memory cache and read pool.
    mod live {
        use super::super::*;
        use crate::meta::MountListing;
        use sluice::config::MountSpec;
        use sluice_cache_engine::{CacheBuilder, PartitionConfig};

        pub struct Live {
            pub _dir: tempfile::TempDir,
            pub dataset: Arc<Dataset>,
            pub tree: Arc<Tree>,
            pub prefetcher: Prefetcher,
            pub limiter: Arc<Limiter>,
            pub metrics: ControlMetrics,
            /// File inodes in listing order.
            pub files: Vec<u64>,
        }

        pub async fn live(files: usize, size: usize, partition: PartitionConfig) -> Live {
            let dir = tempfile::tempdir().unwrap();
            for i in 0..files {
                std::fs::write(dir.path().join(format!("f{i:03}")), vec![i as u8; size]).unwrap();
            }
            let cache = CacheBuilder::new()
                .memory_capacity(256 << 20)
                .max_value_size(1 << 20)
                .open()
                .unwrap();
            let spec = MountSpec {
                mount_point: format!("file://{}", dir.path().display()),
                name: String::new(),
                options: Default::default(),
                secret_refs: vec![],
            };
            let source = sluice::source::open(&spec).unwrap();
            let objects = source.list().await.unwrap();
            let mounts = vec![sluice::dataset::DatasetMount {
                name: String::new(),
                source,
            }];
            let policy = partition.policy;
            let dataset = Arc::new(
                Dataset::from_mounts("t".into(), mounts, partition, &cache, 1 << 20).unwrap(),
            );
            let tree = Arc::new(Tree::build(
                vec![MountListing {
                    name: String::new(),
                    objects,
                }],
                None,
            ));
            let files = tree.children(1).map(|(_, e)| e.ino).collect();
            let limiter = Limiter::new(8);
            let metrics = ControlMetrics::default();
            let prefetcher = Prefetcher::new(
                dataset.clone(),
                cache,
                policy,
                Arc::new(ReadPool::new(2).unwrap()),
                limiter.clone(),
                metrics.clone(),
                PrefetchConfig::default(),
            );
            Live {
                _dir: dir,
                dataset,
                tree,
                prefetcher,
                limiter,
                metrics,
                files,
            }
        }

        impl Live {
            pub fn cached(&self, ino: u64) -> bool {
                let Some(Entry {
                    kind: EntryKind::File { mount, object },
                    ..
                }) = self.tree.get(ino)
                else {
                    return false;
                };
                let obj = self.tree.object(mount, object);
                self.dataset
                    .cache
                    .contains(&self.dataset.block_key(mount, obj, 0))
            }

            /// Opens and reads `ino` whole, as a reader through FUSE would.
            pub async fn read(&self, ino: u64, fh: u64) {
                self.prefetcher.on_open(&self.tree, ino, fh);
                let e = self.tree.get(ino).unwrap();
                let EntryKind::File { mount, object } = e.kind else {
                    panic!()
                };
                self.prefetcher.on_read(&self.tree, ino, fh, 0, e.size);
                let obj = self.tree.object(mount, object);
                self.dataset.read(mount, obj, 0, e.size).await.unwrap();
                self.prefetcher.on_release(fh);
            }

            pub async fn settle(&self) {
                for _ in 0..500 {
                    if self.limiter.in_flight() == 0 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("prefetches still in flight");
            }

            pub async fn forget(&self, ino: u64) {
                let e = self.tree.get(ino).unwrap();
                let EntryKind::File { mount, object } = e.kind else {
                    panic!()
                };
                let obj = self.tree.object(mount, object);
                self.dataset
                    .cache
                    .remove(&self.dataset.block_key(mount, obj, 0))
                    .await;
            }

            pub fn prefetched(&self, kind: &str) -> u64 {
                self.metrics
                    .prefetched_blocks
                    .get_or_create(&vec![("kind".into(), kind.into())])
                    .get()
            }
        }
    }

    #[tokio::test]
    async fn a_directory_scan_prefetches_the_next_files_and_counts_hits() {
        let l = live::live(20, 64 << 10, Default::default()).await;
        l.read(l.files[0], 1).await;
        l.settle().await;
        assert!(!l.cached(l.files[1]), "one open is not a scan");
        l.read(l.files[1], 2).await;
        l.settle().await;
        assert!(l.cached(l.files[2]) && l.cached(l.files[3]));
        assert!(!l.cached(l.files[4]));
        for (i, &f) in l.files.iter().enumerate().skip(2) {
            l.read(f, 10 + i as u64).await;
            l.settle().await;
        }
        assert_eq!(l.prefetched("dir"), 18);
        assert_eq!(l.metrics.prefetch_hits.get(), 18);
        assert_eq!(l.metrics.prefetch_wasted.get(), 0);
    }

    #[tokio::test]
    async fn a_repeated_epoch_refetches_what_the_cache_lost_ahead_of_the_reader() {
        let l = live::live(30, 64 << 10, Default::default()).await;
        // Pass 1, shuffled (no directory scan), fills the cache.
        let mut order = l.files.clone();
        order.reverse();
        order.swap(3, 17);
        for (i, &f) in order.iter().enumerate() {
            l.read(f, i as u64).await;
        }
        l.settle().await;
        assert_eq!(l.prefetched("epoch"), 0);
        // The cache loses ten files (evicted under another dataset's pressure).
        for &f in &order[10..20] {
            l.forget(f).await;
        }
        // Pass 2 in the same order: the lost files come back ahead of the reader.
        for (i, &f) in order.iter().enumerate().take(5) {
            l.read(f, 100 + i as u64).await;
            l.settle().await;
        }
        assert!(l.prefetched("epoch") >= 10, "{}", l.prefetched("epoch"));
        for &f in &order[10..20] {
            assert!(l.cached(f), "lost file {f} was not prefetched");
        }
    }

    #[tokio::test]
    async fn a_shuffled_epoch_refetches_lost_files_in_the_background() {
        let l = live::live(30, 64 << 10, Default::default()).await;
        for (i, &f) in l.files.iter().rev().enumerate() {
            l.read(f, i as u64).await;
        }
        l.settle().await;
        for &f in &l.files[0..6] {
            l.forget(f).await;
        }
        // Pass 2 in another shuffled order.
        let pass2 = [
            l.files[20],
            l.files[7],
            l.files[25],
            l.files[12],
            l.files[29],
        ];
        for (i, &f) in pass2.iter().enumerate() {
            l.read(f, 100 + i as u64).await;
            l.settle().await;
        }
        for &f in &l.files[0..6] {
            assert!(l.cached(f), "lost file {f} was not prefetched");
        }
        assert_eq!(l.prefetched("epoch"), 6);
    }

    #[tokio::test]
    async fn nothing_is_prefetched_into_an_epoch_partition_at_its_quota() {
        use sluice_cache_engine::PartitionConfig;
        let l = live::live(
            20,
            64 << 10,
            PartitionConfig {
                policy: Policy::Epoch,
                quota: Some(5 * (64 << 10)),
            },
        )
        .await;
        for (i, &f) in l.files.iter().enumerate() {
            l.read(f, i as u64).await;
            l.settle().await;
        }
        // Files 2..4 were prefetched by the scan until the quota was reached.
        let prefetched = l.prefetched("dir");
        assert!(prefetched <= 5, "{prefetched}");
        assert!(
            l.metrics
                .prefetch_skipped
                .get_or_create(&vec![("reason".into(), "quota".into())])
                .get()
                > 0
        );
    }

    #[test]
    fn a_file_the_last_pass_missed_is_no_trouble() {
        let mut e = EpochTracker::default();
        for f in 1..=95 {
            e.on_open(f, 100, 3);
        }
        e.on_open(1, 100, 3);
        e.on_open(2, 100, 3);
        e.on_open(3, 100, 3);
        // 99 was not in the last (95%) pass, and the pass follows the order.
        assert_eq!(e.on_open(99, 100, 3), EpochAction::Background);
        assert_eq!(e.on_open(4, 100, 3), EpochAction::Ahead(vec![5, 6, 7]));
    }

    #[test]
    fn a_mostly_complete_pass_counts() {
        let mut e = EpochTracker::default();
        for f in 1..=95 {
            e.on_open(f, 100, 3);
        }
        e.on_open(1, 100, 3);
        assert_eq!(e.passes, 1, "95% of the files then a reopen: a new pass");
    }
}
