//! The engine behind [`Cache`]: tiers, policies, partitions, single-flight and counters.
//!
//! Writes go through: an insert lands in the memory tier and is appended to its disk
//! directory's active segment at once (written in batches, see `disk`). Write-through over
//! spill-on-eviction because the agent's blocks cost a remote fetch to get back: a block is
//! on its way to NVMe as soon as it arrives, survives a restart, and a memory eviction is
//! a free drop instead of a write on the read path's critical moment. The price, a write
//! per insert even for blocks read only from memory, is sequential and batched.
//!
//! Policies. General: the memory tier runs CLOCK (see `memory`); disk directories reclaim
//! their oldest segment first (FIFO at segment granularity, which is what makes whole-
//! segment eviction and a simple recovery order possible); hot blocks stay served by the
//! memory tier, where disk hits are promoted. Epoch: admission stops at the partition's
//! quota (`QuotaReached`), and disk hits are promoted only into free memory, since in a
//! random-order epoch no block is hotter than another and evicting for them only churns.
//!
//! With disk tiers the index is authoritative for what a partition holds; without them
//! the memory tier is.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use tokio::sync::watch;

use crate::api::*;
use crate::disk::{Appended, Disk, ReadOutcome};
use crate::index::{Index, Loc};
use crate::io::{self, EngineParams};
use crate::memory::MemoryTier;
use crate::segment::{FLAG_TOMBSTONE, entry_crc};

struct PartState {
    name: String,
    config: Mutex<PartitionConfig>,
    bytes: AtomicU64,
    entries: AtomicU64,
    hits_memory: AtomicU64,
    hits_disk: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
    /// Insertion order of a general partition with a quota: its oldest blocks go first
    /// when it is over quota (16 bytes per block, only for such partitions).
    fifo: Mutex<VecDeque<Key>>,
}

impl PartState {
    fn new(name: &str, config: PartitionConfig) -> Arc<Self> {
        Arc::new(PartState {
            name: name.to_string(),
            config: Mutex::new(config),
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            hits_memory: AtomicU64::new(0),
            hits_disk: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            fifo: Mutex::new(VecDeque::new()),
        })
    }
}

type Flights = Mutex<HashMap<(u16, Key), Box<dyn Any + Send + Sync>>>;

/// Everything a [`Cache`] handle shares.
pub(crate) struct Inner {
    config: CacheConfig,
    choice: EngineChoice,
    memory: MemoryTier,
    disks: Vec<Disk>,
    index: Index,
    parts: RwLock<Vec<Arc<PartState>>>,
    flights: Flights,
    checksum_failures: AtomicU64,
    io_errors: AtomicU64,
    insert_failures: AtomicU64,
}

impl Inner {
    fn part(&self, id: u16) -> Arc<PartState> {
        let parts = self.parts.read().unwrap();
        parts
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| parts[0].clone())
    }

    fn add(&self, part: u16, len: u64) {
        let p = self.part(part);
        p.bytes.fetch_add(len, Relaxed);
        p.entries.fetch_add(1, Relaxed);
    }

    fn sub(&self, part: u16, len: u64) {
        let p = self.part(part);
        p.bytes.fetch_sub(len, Relaxed);
        p.entries.fetch_sub(1, Relaxed);
    }

    /// Index bookkeeping for an entry that left the disk tier.
    fn forget(&self, loc: &Loc) {
        self.sub(loc.part, loc.len as u64);
        self.disks[loc.disk as usize].entries.fetch_sub(1, Relaxed);
    }

    /// A general partition with a quota: records `key` as its newest block, then drops its
    /// oldest blocks until it fits its quota again. (No tombstones: a reopen may bring such
    /// blocks back, with their right bytes, until the next insert trims them again; blocks
    /// recovered at open are not in the order list, so only blocks inserted since count.)
    fn trim(&self, id: u16, part: &PartState, config: &PartitionConfig, key: Key) {
        let (Policy::General, Some(quota)) = (config.policy, config.quota) else {
            return;
        };
        let mut fifo = part.fifo.lock().unwrap();
        fifo.push_back(key);
        while part.bytes.load(Relaxed) > quota {
            let Some(old) = fifo.pop_front() else { break };
            if self.disks.is_empty() {
                if let Some((rp, rl)) = self.memory.remove(&old) {
                    self.sub(rp, rl);
                    self.memory.evictions.fetch_add(1, Relaxed);
                }
            } else if let Some(loc) = self.index.get(&old)
                && loc.part == id
                && self.index.remove_exact(&old, &loc)
            {
                self.forget(&loc);
                self.disks[loc.disk as usize]
                    .evictions
                    .fetch_add(1, Relaxed);
                self.memory.remove(&old);
            }
        }
    }

    fn disk_for(&self, key: &Key) -> usize {
        key.0[15] as usize % self.disks.len()
    }

    fn persist_partitions(&self) {
        let names: Vec<(u16, String)> = self
            .parts
            .read()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u16, p.name.clone()))
            .collect();
        for d in &self.disks {
            if let Err(e) = crate::partitions::write(&d.path, &names) {
                tracing::warn!(path = %d.path.display(), "cannot save partition names: {e}");
            }
        }
    }

    /// Drops the index entries of evicted segments, then runs the writes `append` queued.
    async fn finish(&self, disk: &Disk, appended: Appended) -> Result<(), std::io::Error> {
        if !appended.victims.is_empty() {
            let victims = appended.victims;
            let gone = self
                .index
                .remove_where(|l| l.disk == disk.id && victims.contains(&l.seg));
            disk.evictions.fetch_add(gone.len() as u64, Relaxed);
            for l in &gone {
                self.forget(l);
            }
        }
        let mut first_err = None;
        for job in appended.jobs {
            if let Err((e, lost)) = disk.run(job).await {
                self.io_errors.fetch_add(1, Relaxed);
                tracing::warn!(path = %disk.path.display(), "segment write failed: {e}");
                // Entries whose bytes never reached the disk leave the index.
                for r in lost {
                    if let Some(cur) = self.index.get(&r.key)
                        && cur.disk == disk.id
                        && cur.value_off == r.value_off
                        && cur.crc == r.crc
                        && self.index.remove_exact(&r.key, &cur)
                    {
                        self.forget(&cur);
                    }
                }
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn close_disks(&self) {
        for d in &self.disks {
            if let Some(job) = d.take_active()
                && let Err((e, _)) = d.run(job).await
            {
                self.io_errors.fetch_add(1, Relaxed);
                tracing::warn!(path = %d.path.display(), "sealing the active segment failed: {e}");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Best effort: seal active segments so the next open reads footers, not data.
        futures::executor::block_on(self.close_disks());
    }
}

/// Lets this process open as many segment files as its hard limit allows.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    lim.rlim_cur
}

fn validate(config: &CacheConfig) -> Result<(), OpenError> {
    let bad = |m: String| Err(OpenError::Config(m));
    if config.disks.is_empty() {
        return Ok(());
    }
    let min_segment = 4 * (config.max_value_size + 16384).max(1 << 20);
    if config.segment_size < min_segment {
        return bad(format!(
            "segment_size {} is too small for max_value_size {}: use at least {min_segment}",
            config.segment_size, config.max_value_size
        ));
    }
    if config.segment_size > u32::MAX as u64 {
        return bad(format!(
            "segment_size {} exceeds 4 GiB",
            config.segment_size
        ));
    }
    if config.disks.len() > 255 {
        return bad("at most 255 disk directories".into());
    }
    for d in &config.disks {
        if !(0.0 < d.low_watermark
            && d.low_watermark <= d.high_watermark
            && d.high_watermark <= 1.0)
        {
            return bad(format!(
                "{}: watermarks must satisfy 0 < low <= high <= 1",
                d.path.display()
            ));
        }
        if d.capacity < config.segment_size {
            return bad(format!(
                "{}: capacity {} is below one segment ({})",
                d.path.display(),
                d.capacity,
                config.segment_size
            ));
        }
    }
    Ok(())
}

pub(crate) fn open(config: CacheConfig) -> Result<Cache, OpenError> {
    validate(&config)?;
    let (kind, fallback_reason) =
        io::resolve(config.engine).map_err(OpenError::IoUringUnavailable)?;
    if let Some(reason) = &fallback_reason {
        tracing::warn!("io_uring unavailable, using psync: {reason}");
    }
    let nofile = raise_nofile();
    let mut names: Vec<(u16, String)> = vec![(0, "default".into())];
    for d in &config.disks {
        if let Ok(found) = crate::partitions::read(&d.path) {
            for (id, name) in found {
                if !names.iter().any(|(i, _)| *i == id) {
                    names.push((id, name));
                }
            }
        }
    }
    let mut disks = Vec::new();
    let mut recovered = Vec::new();
    for (i, d) in config.disks.iter().enumerate() {
        let segments = d.capacity / config.segment_size + 16;
        let params = EngineParams {
            queue_depth: config.queue_depth,
            // Segments sealed early (at close) are small, so allow many more than capacity
            // / segment_size.
            max_files: (segments * 4).clamp(4096, 1 << 16).min(nofile / 2).max(64) as u32,
        };
        let engine = io::build(kind, params).map_err(|e| match kind {
            EngineKind::IoUring => {
                OpenError::IoUringUnavailable(format!("{}: {e}", d.path.display()))
            }
            _ => OpenError::Directory {
                path: d.path.clone(),
                reason: "cannot start the I/O engine".into(),
                source: Some(e),
            },
        })?;
        let (disk, found) = Disk::open(
            i as u8,
            d,
            config.segment_size,
            config.max_value_size,
            engine,
        )?;
        disks.push(disk);
        recovered.push(found);
    }
    let max_id = names.iter().map(|(i, _)| *i).max().unwrap_or(0);
    let mut parts: Vec<Arc<PartState>> = (0..=max_id)
        .map(|id| {
            let name = names
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, n)| n.clone())
                .unwrap_or_else(|| format!("partition-{id}"));
            PartState::new(&name, PartitionConfig::default())
        })
        .collect();
    // Segment records may name partitions the names file lost: keep them addressable.
    let max_rec = recovered
        .iter()
        .flatten()
        .flat_map(|(_, r)| r.iter().map(|r| r.part))
        .max()
        .unwrap_or(0);
    while parts.len() <= max_rec as usize {
        let id = parts.len();
        parts.push(PartState::new(
            &format!("partition-{id}"),
            PartitionConfig::default(),
        ));
    }
    let inner = Inner {
        memory: MemoryTier::new(config.memory_capacity),
        choice: EngineChoice {
            kind,
            fallback_reason,
        },
        disks,
        index: Index::new(),
        parts: RwLock::new(parts),
        flights: Mutex::new(HashMap::new()),
        checksum_failures: AtomicU64::new(0),
        io_errors: AtomicU64::new(0),
        insert_failures: AtomicU64::new(0),
        config,
    };
    for (disk, segs) in recovered.into_iter().enumerate() {
        for (seg, records) in segs {
            for r in records {
                let old = if r.flags & FLAG_TOMBSTONE != 0 {
                    inner.index.remove(&r.key)
                } else {
                    let loc = Loc {
                        seg,
                        value_off: r.value_off,
                        len: r.len,
                        crc: r.crc,
                        part: r.part,
                        disk: disk as u8,
                    };
                    inner.add(r.part, r.len as u64);
                    inner.disks[disk].entries.fetch_add(1, Relaxed);
                    inner.index.insert(&r.key, loc)
                };
                if let Some(old) = old {
                    inner.forget(&old);
                }
            }
        }
    }
    if !inner.disks.is_empty() {
        inner.persist_partitions();
    }
    Ok(Cache {
        inner: Arc::new(inner),
    })
}

/// Runs `Inner::finish` so that it completes even if the caller's future is dropped: a
/// buffer taken for writing must reach the disk (or be accounted as lost), and evicted
/// segments must leave the index, whoever stops waiting.
async fn finish_detached(
    inner: &Arc<Inner>,
    disk: u8,
    appended: Appended,
) -> Result<(), std::io::Error> {
    if appended.jobs.is_empty() && appended.victims.is_empty() {
        return Ok(());
    }
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            let inner = inner.clone();
            let task =
                rt.spawn(async move { inner.finish(&inner.disks[disk as usize], appended).await });
            task.await.unwrap_or_else(|e| {
                Err(std::io::Error::other(format!(
                    "segment write task failed: {e}"
                )))
            })
        }
        Err(_) => inner.finish(&inner.disks[disk as usize], appended).await,
    }
}

pub(crate) fn partition(cache: &Cache, name: &str, config: PartitionConfig) -> Partition {
    let inner = &cache.inner;
    let (id, created) = {
        let mut parts = inner.parts.write().unwrap();
        match parts.iter().position(|p| p.name == name) {
            Some(i) => {
                *parts[i].config.lock().unwrap() = config;
                (i, false)
            }
            None => {
                parts.push(PartState::new(name, config));
                (parts.len() - 1, true)
            }
        }
    };
    if created {
        inner.persist_partitions();
    }
    Partition {
        cache: cache.clone(),
        id: id as u16,
    }
}

pub(crate) fn engine_choice(cache: &Cache) -> EngineChoice {
    cache.inner.choice.clone()
}

pub(crate) fn stats(cache: &Cache) -> CacheStats {
    let inner = &cache.inner;
    let (bytes, entries) = inner.memory.usage();
    CacheStats {
        memory: TierStats {
            bytes,
            entries,
            capacity: inner.memory.capacity(),
            hits: inner.memory.hits.load(Relaxed),
            misses: inner.memory.misses.load(Relaxed),
            evictions: inner.memory.evictions.load(Relaxed),
        },
        disks: inner
            .disks
            .iter()
            .map(|d| {
                (
                    d.path.clone(),
                    TierStats {
                        bytes: d.used(),
                        entries: d.entries.load(Relaxed),
                        capacity: d.capacity,
                        hits: d.hits.load(Relaxed),
                        misses: d.misses.load(Relaxed),
                        evictions: d.evictions.load(Relaxed),
                    },
                )
            })
            .collect(),
        partitions: (0..inner.parts.read().unwrap().len())
            .map(|i| {
                partition_stats(&Partition {
                    cache: cache.clone(),
                    id: i as u16,
                })
            })
            .collect(),
        checksum_failures: inner.checksum_failures.load(Relaxed),
        io_errors: inner.io_errors.load(Relaxed),
        insert_failures: inner.insert_failures.load(Relaxed),
        index_bytes: inner.index.bytes(),
        index_entries: inner.index.len() as u64,
    }
}

pub(crate) fn set_memory_capacity(cache: &Cache, bytes: u64) {
    let inner = &cache.inner;
    let evicted = inner.memory.set_capacity(bytes);
    // With disk tiers every memory entry was written through to disk and stays indexed
    // there, so dropping the memory copy loses nothing. Without them the memory tier is
    // the partitions' only copy: account for what left.
    if inner.disks.is_empty() {
        for (part, len) in evicted {
            inner.sub(part, len);
        }
    }
}

pub(crate) async fn get(p: &Partition, key: &Key) -> Option<Lookup> {
    lookup(p, key, true).await
}

pub(crate) fn get_memory(p: &Partition, key: &Key) -> Option<Bytes> {
    let inner = &p.cache.inner;
    let value = inner.memory.get(key, false)?;
    inner.part(p.id).hits_memory.fetch_add(1, Relaxed);
    Some(value)
}

/// A lookup; `count_miss` false for a repeated lookup of a key whose miss was already
/// counted (get_or_fetch re-checks after taking the lead), so that one read counts as one
/// miss in the partition's and tiers' counters (the agent's hit ratio is computed from them).
async fn lookup(p: &Partition, key: &Key, count_miss: bool) -> Option<Lookup> {
    let inner = &p.cache.inner;
    let part = inner.part(p.id);
    if let Some(value) = inner.memory.get(key, count_miss) {
        part.hits_memory.fetch_add(1, Relaxed);
        return Some(Lookup {
            value,
            origin: Origin::Memory,
        });
    }
    let found = match inner.index.get(key) {
        Some(loc) if !inner.disks.is_empty() => read_disk(inner, p, key, loc).await,
        _ => None,
    };
    if found.is_none() && count_miss {
        part.misses.fetch_add(1, Relaxed);
        if !inner.disks.is_empty() {
            inner.disks[inner.disk_for(key)]
                .misses
                .fetch_add(1, Relaxed);
        }
    }
    found
}

async fn read_disk(inner: &Inner, p: &Partition, key: &Key, loc: Loc) -> Option<Lookup> {
    let disk = &inner.disks[loc.disk as usize];
    let value = match disk
        .read(loc.seg, loc.value_off as u64, loc.len as usize)
        .await
    {
        ReadOutcome::Value(v) if entry_crc(key, &v) == loc.crc => v,
        ReadOutcome::Value(_) | ReadOutcome::Short => {
            inner.checksum_failures.fetch_add(1, Relaxed);
            tracing::warn!(path = %disk.path.display(), segment = loc.seg, "checksum mismatch: dropping the entry");
            if inner.index.remove_exact(key, &loc) {
                inner.forget(&loc);
            }
            return None;
        }
        ReadOutcome::Gone => return None,
        ReadOutcome::Failed(e) => {
            inner.io_errors.fetch_add(1, Relaxed);
            tracing::warn!(path = %disk.path.display(), "read failed: {e}");
            return None;
        }
    };
    disk.hits.fetch_add(1, Relaxed);
    let part = inner.part(p.id);
    part.hits_disk.fetch_add(1, Relaxed);
    let evict = part.config.lock().unwrap().policy == Policy::General;
    inner.memory.insert(*key, loc.part, value.clone(), evict);
    Some(Lookup {
        value,
        origin: Origin::Disk,
    })
}

pub(crate) async fn insert(p: &Partition, key: Key, value: Bytes) -> Result<(), InsertError> {
    let inner = &p.cache.inner;
    let len = value.len() as u64;
    if len > inner.config.max_value_size {
        inner.insert_failures.fetch_add(1, Relaxed);
        return Err(InsertError::TooLarge {
            size: len,
            max: inner.config.max_value_size,
        });
    }
    let part = inner.part(p.id);
    let config = part.config.lock().unwrap().clone();
    if config.policy == Policy::Epoch
        && let Some(quota) = config.quota
        && part.bytes.load(Relaxed) + len > quota
    {
        part.rejected.fetch_add(1, Relaxed);
        return Err(InsertError::QuotaReached {
            partition: part.name.clone(),
        });
    }
    let evict = config.policy == Policy::General;
    if inner.disks.is_empty() {
        let (stored, replaced, evicted) = inner.memory.insert(key, p.id, value, true);
        if let Some((rp, rl)) = replaced {
            inner.sub(rp, rl);
        }
        for (ep, el) in evicted {
            inner.sub(ep, el);
        }
        if stored {
            inner.add(p.id, len);
            inner.trim(p.id, &part, &config, key);
        }
        return Ok(());
    }
    let disk = &inner.disks[inner.disk_for(&key)];
    let crc = entry_crc(&key, &value);
    disk.wait_for_room().await;
    let appended = match disk.append(key, p.id, 0, &value, crc) {
        Ok(a) => a,
        Err(source) => {
            inner.insert_failures.fetch_add(1, Relaxed);
            return Err(InsertError::Io {
                path: disk.path.clone(),
                source,
            });
        }
    };
    let loc = Loc {
        seg: appended.seg,
        value_off: appended.value_off as u32,
        len: len as u32,
        crc,
        part: p.id,
        disk: disk.id,
    };
    inner.add(p.id, len);
    disk.entries.fetch_add(1, Relaxed);
    if let Some(old) = inner.index.insert(&key, loc) {
        inner.forget(&old);
    }
    inner.memory.insert(key, p.id, value, evict);
    inner.trim(p.id, &part, &config, key);
    finish_detached(&p.cache.inner, disk.id, appended)
        .await
        .map_err(|source| {
            inner.insert_failures.fetch_add(1, Relaxed);
            InsertError::Io {
                path: disk.path.clone(),
                source,
            }
        })
}

pub(crate) async fn remove(p: &Partition, key: &Key) -> bool {
    let inner = &p.cache.inner;
    let in_memory = inner.memory.remove(key);
    if inner.disks.is_empty() {
        if let Some((rp, rl)) = in_memory {
            inner.sub(rp, rl);
        }
        return in_memory.is_some();
    }
    let Some(old) = inner.index.remove(key) else {
        return in_memory.is_some();
    };
    inner.forget(&old);
    // A tombstone, so that a reopen does not resurrect the entry from its segment.
    let disk = &inner.disks[inner.disk_for(key)];
    match disk.append(*key, old.part, FLAG_TOMBSTONE, &[], 0) {
        Ok(appended) => {
            let _ = finish_detached(&p.cache.inner, disk.id, appended).await;
        }
        Err(e) => {
            inner.io_errors.fetch_add(1, Relaxed);
            tracing::warn!(path = %disk.path.display(), "cannot record a removal: {e}");
        }
    }
    true
}

pub(crate) fn contains(p: &Partition, key: &Key) -> bool {
    let inner = &p.cache.inner;
    inner.memory.contains(key) || (!inner.disks.is_empty() && inner.index.get(key).is_some())
}

pub(crate) fn partition_stats(p: &Partition) -> PartitionStats {
    let part = p.cache.inner.part(p.id);
    PartitionStats {
        name: part.name.clone(),
        bytes: part.bytes.load(Relaxed),
        entries: part.entries.load(Relaxed),
        quota: part.config.lock().unwrap().quota,
        hits_memory: part.hits_memory.load(Relaxed),
        hits_disk: part.hits_disk.load(Relaxed),
        misses: part.misses.load(Relaxed),
        rejected: part.rejected.load(Relaxed),
    }
}

pub(crate) async fn close(cache: &Cache) {
    cache.inner.close_disks().await;
}

/// Result shared by the callers of one fetch.
type Shared<E> = Option<Result<Bytes, Arc<E>>>;

/// Removes the in-flight marker when the leading fetch ends or is cancelled.
struct FlightGuard<'a> {
    flights: &'a Flights,
    key: (u16, Key),
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        self.flights.lock().unwrap().remove(&self.key);
    }
}

pub(crate) async fn get_or_fetch<F, Fut, E>(
    p: &Partition,
    key: Key,
    fetch: F,
) -> Result<Lookup, Arc<E>>
where
    F: FnOnce() -> Fut + Send,
    Fut: Future<Output = Result<Bytes, E>> + Send,
    E: Send + Sync + 'static,
{
    let inner = &p.cache.inner;
    let mut fetch = Some(fetch);
    let mut counted = false;
    loop {
        if let Some(l) = lookup(p, &key, !counted).await {
            return Ok(l);
        }
        counted = true;
        // Join a fetch in flight, or lead one.
        enum Role<E> {
            Join(watch::Receiver<Shared<E>>),
            Lead(watch::Sender<Shared<E>>),
            Alone,
        }
        let role: Role<E> = {
            let mut flights = inner.flights.lock().unwrap();
            match flights.get(&(p.id, key)) {
                Some(any) => match any.downcast_ref::<watch::Receiver<Shared<E>>>() {
                    Some(rx) => Role::Join(rx.clone()),
                    None => Role::Alone, // a fetch with another error type: run ours alone
                },
                None => {
                    let (tx, rx) = watch::channel::<Shared<E>>(None);
                    flights.insert((p.id, key), Box::new(rx));
                    Role::Lead(tx)
                }
            }
        };
        let joined = match role {
            Role::Join(rx) => Some(rx),
            Role::Alone => None,
            Role::Lead(tx) => {
                let _guard = FlightGuard {
                    flights: &inner.flights,
                    key: (p.id, key),
                };
                // Another leader may have finished between our miss and now.
                if let Some(l) = lookup(p, &key, false).await {
                    let _ = tx.send(Some(Ok(l.value.clone())));
                    return Ok(l);
                }
                let fetch = fetch.take().expect("fetch runs once");
                let res = fetch().await.map_err(Arc::new);
                if let Ok(value) = &res {
                    let _ = insert(p, key, value.clone()).await;
                }
                let _ = tx.send(Some(res.clone()));
                return res.map(|value| Lookup {
                    value,
                    origin: Origin::Fetch,
                });
            }
        };
        match joined {
            Some(mut rx) => {
                if let Ok(v) = rx.wait_for(|v| v.is_some()).await {
                    let res = v.clone().expect("waited for a result");
                    return res.map(|value| Lookup {
                        value,
                        origin: Origin::Fetch,
                    });
                }
                // The leader was cancelled: try again (we may lead this time).
            }
            None => {
                let fetch = fetch.take().expect("fetch runs once");
                let value = fetch().await.map_err(Arc::new)?;
                let _ = insert(p, key, value.clone()).await;
                return Ok(Lookup {
                    value,
                    origin: Origin::Fetch,
                });
            }
        }
    }
}
