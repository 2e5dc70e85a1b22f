//! A Dataset: several mounts (sources) forming one tree, read in blocks through the cache.
//!
//! This is the seam between the serving side (FUSE, `sluice load`) and the sources: the
//! front end asks for `(mount, object, offset, len)` and gets bytes; block keys, single-flight
//! fetches and the per-dataset counters live here.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use sluice_cache_engine::{Cache, Key, Origin, Partition};

use crate::config::DatasetSpec;
use crate::source::{ObjectInfo, Source, SourceError};

/// One mount of a dataset: a source shown as subdirectory `name`.
#[derive(Debug, Clone)]
pub struct DatasetMount {
    pub name: String,
    pub source: Arc<dyn Source>,
}

/// Bytes handed to readers per origin, and bytes fetched from the sources, for
/// `sluice status` and metrics. `source` counts what readers got that was not cached;
/// `fetched` what the sources sent (more than `source` when readers skip parts of blocks).
#[derive(Debug, Default)]
pub struct ServedBytes {
    pub memory: AtomicU64,
    pub disk: AtomicU64,
    pub source: AtomicU64,
    pub fetched: AtomicU64,
}

/// Blocks read lately that are not in the memory tier: NVMe hits, and fetched blocks the
/// cache did not admit (an epoch partition at its quota). The kernel reads a file in
/// requests of 128 KiB to `max_read`, several per block: without this, each request would
/// read the whole block from NVMe again, or fetch it from the source again. FIFO, bounded
/// in entries (one or two per reader in flight) and bytes.
#[derive(Debug)]
struct RecentBlocks {
    entries: usize,
    budget: u64,
    state: Mutex<RecentState>,
}

#[derive(Debug, Default)]
struct RecentState {
    blocks: HashMap<Key, (Bytes, Origin)>,
    order: VecDeque<Key>,
    bytes: u64,
}

impl RecentBlocks {
    fn new(entries: usize, budget: u64) -> RecentBlocks {
        RecentBlocks {
            entries,
            budget,
            state: Mutex::default(),
        }
    }

    fn get(&self, key: &Key) -> Option<(Bytes, Origin)> {
        self.state.lock().unwrap().blocks.get(key).cloned()
    }

    fn put(&self, key: Key, value: Bytes, origin: Origin) {
        let mut st = self.state.lock().unwrap();
        if value.len() as u64 > self.budget || st.blocks.contains_key(&key) {
            return;
        }
        while st.bytes + value.len() as u64 > self.budget || st.order.len() >= self.entries {
            let Some(old) = st.order.pop_front() else {
                break;
            };
            st.bytes -= st.blocks.remove(&old).map_or(0, |v| v.0.len() as u64);
        }
        st.bytes += value.len() as u64;
        st.blocks.insert(key, (value, origin));
        st.order.push_back(key);
    }
}

/// How many recent blocks (NVMe hits, fetched but not admitted) a dataset keeps for the
/// rest of their reads.
const RECENT_BLOCKS: usize = 16;

/// A dataset ready to serve.
#[derive(Debug)]
pub struct Dataset {
    pub name: String,
    pub mounts: Vec<DatasetMount>,
    pub block_size: u64,
    pub cache: Partition,
    pub served: ServedBytes,
    recent: RecentBlocks,
}

/// Why a dataset read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("dataset {dataset}: {source}")]
    Source {
        dataset: String,
        #[source]
        source: Arc<SourceError>,
    },
    #[error(
        "dataset {dataset}: source returned {got} bytes for block {block} of {key}, expected {want}"
    )]
    ShortBlock {
        dataset: String,
        key: String,
        block: u64,
        got: usize,
        want: u64,
    },
}

/// Why a dataset could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("dataset {dataset}, mount {mount:?}: {source}")]
    Mount {
        dataset: String,
        mount: String,
        #[source]
        source: Box<SourceError>,
    },
    #[error("dataset {dataset}: {message}")]
    Invalid { dataset: String, message: String },
}

impl Dataset {
    /// Builds every mount's source and the dataset's cache partition (named after the
    /// dataset, with the spec's policy and quota). Makes no request to the sources.
    pub fn open(spec: &DatasetSpec, cache: &Cache, block_size: u64) -> Result<Dataset, OpenError> {
        let name = spec.metadata.name.clone();
        let mut mounts = Vec::with_capacity(spec.spec.mounts.len());
        for m in &spec.spec.mounts {
            let source = crate::source::open(m).map_err(|source| OpenError::Mount {
                dataset: name.clone(),
                mount: m.name.clone(),
                source: Box::new(source),
            })?;
            mounts.push(DatasetMount {
                name: m.name.clone(),
                source,
            });
        }
        let partition =
            spec.spec
                .cache
                .partition_config()
                .map_err(|message| OpenError::Invalid {
                    dataset: name.clone(),
                    message,
                })?;
        Dataset::from_mounts(name, mounts, partition, cache, block_size)
    }

    /// A dataset over already built sources (tests, benchmarks, throttled sources).
    pub fn from_mounts(
        name: String,
        mounts: Vec<DatasetMount>,
        partition: sluice_cache_engine::PartitionConfig,
        cache: &Cache,
        block_size: u64,
    ) -> Result<Dataset, OpenError> {
        if block_size == 0 {
            return Err(OpenError::Invalid {
                dataset: name,
                message: "block size must be more than 0".into(),
            });
        }
        let cache = cache.partition(&name, partition);
        // Enough for each of a DataLoader's readers to finish the block it is in.
        let recent = RecentBlocks::new(RECENT_BLOCKS, RECENT_BLOCKS as u64 * block_size);
        Ok(Dataset {
            name,
            mounts,
            block_size,
            cache,
            served: ServedBytes::default(),
            recent,
        })
    }

    /// The cache key of block `index` of `object` in `mount`: source identity, object key,
    /// version and block index, so changed objects never share keys with old bytes.
    pub fn block_key(&self, mount: usize, object: &ObjectInfo, index: u64) -> Key {
        let version = object.version.as_deref().unwrap_or("");
        Key::hash(&[
            self.mounts[mount].source.id().as_bytes(),
            object.key.as_bytes(),
            version.as_bytes(),
            &object.size.to_le_bytes(),
            &self.block_size.to_le_bytes(),
            &index.to_le_bytes(),
        ])
    }

    /// Range of block `index` within the object.
    fn block_range(&self, object: &ObjectInfo, index: u64) -> std::ops::Range<u64> {
        let start = index * self.block_size;
        start..(start + self.block_size).min(object.size)
    }

    /// Block `index` of `object`, from the cache or fetched once from the source, and where
    /// it came from.
    async fn block(
        &self,
        mount: usize,
        object: &ObjectInfo,
        index: u64,
    ) -> Result<(Bytes, Origin), ReadError> {
        let key = self.block_key(mount, object, index);
        if let Some(hit) = self.recent_block(&key) {
            return Ok(hit);
        }
        let range = self.block_range(object, index);
        let want = range.end - range.start;
        let source = self.mounts[mount].source.clone();
        let fetched = &self.served.fetched;
        let lookup = self
            .cache
            .get_or_fetch(key, || async move {
                let value = source.read(object, range).await?;
                fetched.fetch_add(value.len() as u64, Ordering::Relaxed);
                Ok(value)
            })
            .await
            .map_err(|source| ReadError::Source {
                dataset: self.name.clone(),
                source,
            })?;
        if lookup.value.len() as u64 != want {
            return Err(ReadError::ShortBlock {
                dataset: self.name.clone(),
                key: object.key.clone(),
                block: index,
                got: lookup.value.len(),
                want,
            });
        }
        let keep = match lookup.origin {
            Origin::Memory => false,
            Origin::Disk => true,
            Origin::Fetch => !self.cache.contains(&key),
        };
        if keep {
            self.recent.put(key, lookup.value.clone(), lookup.origin);
        }
        Ok((lookup.value, lookup.origin))
    }

    /// A block kept in the recent blocks, with the origin its bytes count under: the cache's
    /// blocks count as memory hits now; uncached ones stay the source's.
    fn recent_block(&self, key: &Key) -> Option<(Bytes, Origin)> {
        let (value, origin) = self.recent.get(key)?;
        let origin = if origin == Origin::Fetch {
            Origin::Fetch
        } else {
            Origin::Memory
        };
        Some((value, origin))
    }

    /// The bytes of a read if its one block is already in memory (the recent blocks or the
    /// cache's memory tier): no I/O and no await, so the FUSE thread can answer a warm read
    /// itself instead of handing it to a reader thread and back. `None`: use [`Self::read`].
    pub fn read_from_memory(
        &self,
        mount: usize,
        object: &ObjectInfo,
        offset: u64,
        len: u64,
    ) -> Option<Bytes> {
        let end = (offset + len).min(object.size);
        if offset >= end {
            return Some(Bytes::new());
        }
        let index = offset / self.block_size;
        if (end - 1) / self.block_size != index {
            return None;
        }
        let key = self.block_key(mount, object, index);
        let (block, origin) = match self.recent_block(&key) {
            Some(hit) => hit,
            None => (self.cache.get_memory(&key)?, Origin::Memory),
        };
        let range = self.block_range(object, index);
        if block.len() as u64 != range.end - range.start {
            return None; // `read` reports it
        }
        let base = index * self.block_size;
        self.count(origin, (end - offset) as usize);
        Some(block.slice((offset - base) as usize..(end - base) as usize))
    }

    /// Counts `n` bytes handed to a reader from `origin`.
    fn count(&self, origin: Origin, n: usize) {
        let counter = match origin {
            Origin::Memory => &self.served.memory,
            Origin::Disk => &self.served.disk,
            Origin::Fetch => &self.served.source,
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Block `index` of `object` whole, into the cache (preload and prefetch): not counted
    /// as served, since no reader asked for it yet.
    pub async fn read_block(
        &self,
        mount: usize,
        object: &ObjectInfo,
        index: u64,
    ) -> Result<Bytes, ReadError> {
        Ok(self.block(mount, object, index).await?.0)
    }

    /// `len` bytes of `object` from `offset` (fewer at the end of the object).
    pub async fn read(
        &self,
        mount: usize,
        object: &ObjectInfo,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, ReadError> {
        let end = (offset + len).min(object.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let first = offset / self.block_size;
        let last = (end - 1) / self.block_size;
        if first == last {
            let (block, origin) = self.block(mount, object, first).await?;
            let base = first * self.block_size;
            self.count(origin, (end - offset) as usize);
            return Ok(block.slice((offset - base) as usize..(end - base) as usize));
        }
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        for index in first..=last {
            let (block, origin) = self.block(mount, object, index).await?;
            let base = index * self.block_size;
            let from = offset.saturating_sub(base) as usize;
            let to = ((end - base) as usize).min(block.len());
            self.count(origin, to - from);
            out.extend_from_slice(&block[from..to]);
        }
        Ok(out.freeze())
    }
}
