//! Public types of the cache: keys, configuration, the cache handle and its statistics.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

/// A fixed-size cache key: a 128-bit hash that the caller derives from whatever identifies
/// the bytes (for the agent: source, object, version or etag, block index).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub [u8; 16]);

impl Key {
    /// Hashes arbitrary identifying bytes into a key (xxh3-128).
    pub fn hash(parts: &[&[u8]]) -> Key {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for p in parts {
            // Length-prefix each part so ("ab","c") and ("a","bc") differ.
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        Key(h.digest128().to_le_bytes())
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Which tier answered a lookup, or that the value had to be fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The memory tier.
    Memory,
    /// A disk tier (checksum verified).
    Disk,
    /// Not cached: the caller's fetch produced it (possibly another caller's, single-flight).
    Fetch,
}

/// A value and where it came from.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// The cached bytes.
    pub value: Bytes,
    /// Where they came from.
    pub origin: Origin,
}

/// What happens to a partition once it holds its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Evict cold entries to make room (the general policy).
    #[default]
    General,
    /// Stop admitting new entries at the quota instead of evicting: in a random-order epoch
    /// the hit ratio then equals the cached fraction, where LRU-like policies thrash.
    Epoch,
}

/// A partition's settings (the agent makes one partition per dataset).
#[derive(Debug, Clone, Default)]
pub struct PartitionConfig {
    /// Evict (general) or stop admitting (epoch) at the quota.
    pub policy: Policy,
    /// Bytes this partition may hold across all tiers; `None` = bounded by the tiers only.
    pub quota: Option<u64>,
}

/// Which I/O engine the disk tiers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// io_uring where the kernel allows it, else psync (the reason is in [`Cache::engine`]).
    #[default]
    Auto,
    /// io_uring only; opening fails where the kernel refuses it.
    IoUring,
    /// pread/pwrite on a thread pool.
    Psync,
}

/// One disk tier directory (or block device) and its budget.
#[derive(Debug, Clone)]
pub struct DiskConfig {
    /// Directory holding the segment files (created if missing).
    pub path: PathBuf,
    /// Bytes of segments this directory may hold.
    pub capacity: u64,
    /// Eviction starts above this fraction of `capacity`...
    pub high_watermark: f64,
    /// ...and reclaims segments until usage is below this fraction.
    pub low_watermark: f64,
}

impl DiskConfig {
    /// A directory with `capacity` bytes and the default watermarks (0.95 / 0.85).
    pub fn new(path: impl Into<PathBuf>, capacity: u64) -> Self {
        DiskConfig {
            path: path.into(),
            capacity,
            high_watermark: 0.95,
            low_watermark: 0.85,
        }
    }
}

/// Every knob of the cache, with defaults that suit a training node.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Bytes of values held in memory.
    pub memory_capacity: u64,
    /// Disk tier directories (none: a memory-only cache).
    pub disks: Vec<DiskConfig>,
    /// I/O engine of the disk tiers.
    pub engine: EngineKind,
    /// Size of one append-only segment on disk.
    pub segment_size: u64,
    /// io_uring submission queue depth per ring.
    pub queue_depth: u32,
    /// Largest value accepted (the agent's block size).
    pub max_value_size: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            memory_capacity: 1 << 30,
            disks: Vec::new(),
            engine: EngineKind::Auto,
            segment_size: 64 << 20,
            queue_depth: 64,
            max_value_size: 4 << 20,
        }
    }
}

/// Builder over [`CacheConfig`].
#[derive(Debug, Clone, Default)]
pub struct CacheBuilder {
    config: CacheConfig,
}

impl CacheBuilder {
    /// A builder with the defaults of [`CacheConfig`].
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets [`CacheConfig::memory_capacity`].
    pub fn memory_capacity(mut self, bytes: u64) -> Self {
        self.config.memory_capacity = bytes;
        self
    }
    /// Adds a disk tier directory.
    pub fn disk(mut self, disk: DiskConfig) -> Self {
        self.config.disks.push(disk);
        self
    }
    /// Sets [`CacheConfig::engine`].
    pub fn engine(mut self, engine: EngineKind) -> Self {
        self.config.engine = engine;
        self
    }
    /// Sets [`CacheConfig::segment_size`].
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.config.segment_size = bytes;
        self
    }
    /// Sets [`CacheConfig::queue_depth`].
    pub fn queue_depth(mut self, depth: u32) -> Self {
        self.config.queue_depth = depth;
        self
    }
    /// Sets [`CacheConfig::max_value_size`].
    pub fn max_value_size(mut self, bytes: u64) -> Self {
        self.config.max_value_size = bytes;
        self
    }
    /// The configuration built so far.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }
    /// Opens the cache: creates or recovers the disk tiers. Blocking; call from
    /// `spawn_blocking` in async code if the tiers are large.
    pub fn open(self) -> Result<Cache, OpenError> {
        crate::open(self.config)
    }
}

/// The engine actually chosen at open, and why if it is not the one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineChoice {
    /// `IoUring` or `Psync` (never `Auto`).
    pub kind: EngineKind,
    /// Why `Auto` fell back to psync.
    pub fallback_reason: Option<String>,
}

/// Why the cache could not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cache directory {path}: {reason}")]
    /// A disk tier directory is missing, unwritable, full or lacks O_DIRECT.
    Directory {
        path: PathBuf,
        reason: String,
        #[source]
        source: Option<std::io::Error>,
    },
    #[error("invalid cache configuration: {0}")]
    /// A setting is out of range; the message says which.
    Config(String),
    #[error("io_uring engine requested but unavailable: {0}")]
    /// `EngineKind::IoUring` was asked for and the kernel refused it.
    IoUringUnavailable(String),
}

/// Why an insert did not store the value. The cache is still usable after any of these.
#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    #[error("value of {size} bytes exceeds the maximum of {max}")]
    /// The value exceeds `max_value_size`.
    TooLarge { size: u64, max: u64 },
    /// Epoch mode: the partition holds its quota and admits nothing more.
    #[error("partition {partition} is at its quota (epoch mode)")]
    QuotaReached { partition: String },
    #[error("disk tier {path}: {source}")]
    /// Writing to the disk tier failed (e.g. ENOSPC); the entry is not stored.
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Counters of one tier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierStats {
    pub bytes: u64,
    pub entries: u64,
    pub capacity: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// Counters of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionStats {
    pub name: String,
    pub bytes: u64,
    pub entries: u64,
    pub quota: Option<u64>,
    pub hits_memory: u64,
    pub hits_disk: u64,
    pub misses: u64,
    /// Inserts refused (epoch quota reached).
    pub rejected: u64,
}

/// A snapshot of the cache's counters.
#[derive(Debug, Clone, Default)]
pub struct CacheStats {
    pub memory: TierStats,
    /// One per disk directory, in configuration order.
    pub disks: Vec<(PathBuf, TierStats)>,
    pub partitions: Vec<PartitionStats>,
    pub checksum_failures: u64,
    pub io_errors: u64,
    pub insert_failures: u64,
    /// DRAM held by the disk tiers' index (hash table buckets at their current size).
    pub index_bytes: u64,
    /// Entries in the disk tiers' index.
    pub index_entries: u64,
}

/// A handle on one partition of the cache; cheap to clone.
#[derive(Clone)]
pub struct Partition {
    pub(crate) cache: Cache,
    pub(crate) id: u16,
}

/// The cache: `Send + Sync`, cheap to clone. Operations on `Cache` itself use the default
/// partition (general policy, no quota).
#[derive(Clone)]
pub struct Cache {
    pub(crate) inner: Arc<crate::Inner>,
}

impl Cache {
    /// The partition named `name`, created or reconfigured with `config`. Names persist
    /// across restarts, so a dataset keeps its cached blocks.
    pub fn partition(&self, name: &str, config: PartitionConfig) -> Partition {
        crate::partition(self, name, config)
    }
    /// The partition named "default" (general policy, no quota).
    pub fn default_partition(&self) -> Partition {
        Partition {
            cache: self.clone(),
            id: 0,
        }
    }
    /// The I/O engine chosen at open.
    pub fn engine(&self) -> EngineChoice {
        crate::engine_choice(self)
    }
    /// Resizes the memory tier at runtime (the autoscaler's knob). A smaller budget evicts
    /// down to it at once, in CLOCK order; with disk tiers nothing is lost, since every
    /// memory entry was written through to disk. A larger one admits more from then on.
    pub fn set_memory_capacity(&self, bytes: u64) {
        crate::set_memory_capacity(self, bytes)
    }
    /// A snapshot of every counter.
    pub fn stats(&self) -> CacheStats {
        crate::stats(self)
    }
    /// The value in the default partition, or `None`.
    pub async fn get(&self, key: &Key) -> Option<Bytes> {
        self.default_partition().get(key).await.map(|l| l.value)
    }
    /// Stores the value in the default partition.
    pub async fn insert(&self, key: Key, value: Bytes) -> Result<(), InsertError> {
        self.default_partition().insert(key, value).await
    }
    /// [`Partition::get_or_fetch`] on the default partition.
    pub async fn get_or_fetch<F, Fut, E>(&self, key: Key, fetch: F) -> Result<Lookup, Arc<E>>
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<Bytes, E>> + Send,
        E: Send + Sync + 'static,
    {
        self.default_partition().get_or_fetch(key, fetch).await
    }
    /// Removes the key from every tier (durably); whether it was cached.
    pub async fn remove(&self, key: &Key) -> bool {
        self.default_partition().remove(key).await
    }
    /// Whether the key is cached (no I/O, no checksum check).
    pub fn contains(&self, key: &Key) -> bool {
        self.default_partition().contains(key)
    }
    /// Flushes buffered segment data and writes summaries (also done on drop, best effort).
    pub async fn close(&self) {
        crate::close(self).await
    }
}

impl Partition {
    /// The value, from memory or disk; `None` on a miss (a checksum failure is a miss).
    pub async fn get(&self, key: &Key) -> Option<Lookup> {
        crate::get(self, key).await
    }
    /// Stores the value (memory first; spills to disk as the policy decides).
    pub async fn insert(&self, key: Key, value: Bytes) -> Result<(), InsertError> {
        crate::insert(self, key, value).await
    }
    /// The value if the memory tier holds it, without I/O or awaiting: for callers that can
    /// answer a hit on their own thread and hand only misses to an async reader. A hit is
    /// counted as one; an absent key counts nothing (the caller's `get` will).
    pub fn get_memory(&self, key: &Key) -> Option<Bytes> {
        crate::get_memory(self, key)
    }
    /// The cached value, or runs `fetch` once however many callers miss on `key` at the same
    /// time, admits its result (if the policy allows) and returns it to all of them.
    pub async fn get_or_fetch<F, Fut, E>(&self, key: Key, fetch: F) -> Result<Lookup, Arc<E>>
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<Bytes, E>> + Send,
        E: Send + Sync + 'static,
    {
        crate::get_or_fetch(self, key, fetch).await
    }
    /// Removes the key from every tier (durably); whether it was cached.
    pub async fn remove(&self, key: &Key) -> bool {
        crate::remove(self, key).await
    }
    /// Whether the key is cached (no I/O, no checksum check).
    pub fn contains(&self, key: &Key) -> bool {
        crate::contains(self, key)
    }
    /// This partition's counters.
    pub fn stats(&self) -> PartitionStats {
        crate::partition_stats(self)
    }
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition").field("id", &self.id).finish()
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").finish_non_exhaustive()
    }
}
