//! Epoch mode: admission stops at the quota, so a random-order pass hits exactly the
//! cached fraction; the general policy keeps changing its cached set instead.

mod common;

use common::*;
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};
use sluice_cache_engine::{
    CacheBuilder, DiskConfig, EngineKind, Partition, PartitionConfig, Policy,
};

const BLOCKS: u64 = 300;
const SIZE: usize = 64 << 10;

fn builder(dir: &std::path::Path, engine: EngineKind) -> CacheBuilder {
    CacheBuilder::new()
        .engine(engine)
        .memory_capacity(1 << 20)
        .segment_size(4 << 20)
        .max_value_size(SIZE as u64)
        .disk(DiskConfig::new(dir, 16 << 20))
}

fn block(i: u64) -> bytes::Bytes {
    bytes::Bytes::from(vec![i as u8; SIZE])
}

/// One pass over every block in `order` through get_or_fetch; returns the hits.
async fn pass(part: &Partition, order: &[u64]) -> u64 {
    let mut hits = 0;
    for &i in order {
        let l = part
            .get_or_fetch(key(i), || async move { Ok::<_, String>(block(i)) })
            .await
            .unwrap();
        assert_eq!(l.value, block(i));
        hits += (l.origin != sluice_cache_engine::Origin::Fetch) as u64;
    }
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_hit_ratio_equals_cached_fraction() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = builder(dir.path(), engine).open().unwrap();
        // The dataset (19 MiB) exceeds the disk tier (16 MiB); the quota is 8 MiB.
        let quota = 8 << 20;
        let part = cache.partition(
            "epoch-ds",
            PartitionConfig {
                policy: Policy::Epoch,
                quota: Some(quota),
            },
        );
        let mut order: Vec<u64> = (0..BLOCKS).collect();
        pass(&part, &order).await;
        let stats = part.stats();
        assert!(
            stats.bytes <= quota,
            "{engine:?}: {} bytes over a {quota} quota",
            stats.bytes
        );
        assert!(stats.rejected > 0, "{engine:?}: nothing rejected");
        let cached: Vec<u64> = (0..BLOCKS).filter(|i| part.contains(&key(*i))).collect();
        let fraction = cached.len() as f64 / BLOCKS as f64;
        let mut rng = StdRng::seed_from_u64(7);
        for epoch in 0..3 {
            order.shuffle(&mut rng);
            let hits = pass(&part, &order).await;
            let ratio = hits as f64 / BLOCKS as f64;
            assert!(
                (ratio - fraction).abs() <= 0.02,
                "{engine:?} epoch {epoch}: hit ratio {ratio} vs cached fraction {fraction}"
            );
            let now: Vec<u64> = (0..BLOCKS).filter(|i| part.contains(&key(*i))).collect();
            assert_eq!(
                now, cached,
                "{engine:?}: the epoch partition's cached set changed"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn general_policy_changes_its_cached_set() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = builder(dir.path(), engine).open().unwrap();
        let part = cache.partition("general-ds", PartitionConfig::default());
        let mut order: Vec<u64> = (0..BLOCKS).collect();
        pass(&part, &order).await;
        let before: Vec<u64> = (0..BLOCKS).filter(|i| part.contains(&key(*i))).collect();
        order.shuffle(&mut StdRng::seed_from_u64(7));
        pass(&part, &order).await;
        let after: Vec<u64> = (0..BLOCKS).filter(|i| part.contains(&key(*i))).collect();
        assert!(before.len() < BLOCKS as usize, "{engine:?}: everything fit");
        assert_ne!(
            before, after,
            "{engine:?}: the general policy's cached set did not change"
        );
        assert!(cache.stats().disks[0].1.evictions > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn general_partition_with_a_quota_evicts_its_oldest_blocks() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = builder(dir.path(), engine).open().unwrap();
        let quota = 2 << 20;
        let part = cache.partition(
            "capped",
            PartitionConfig {
                policy: Policy::General,
                quota: Some(quota),
            },
        );
        for i in 0..100 {
            part.insert(key(i), block(i)).await.unwrap();
            assert!(
                part.stats().bytes <= quota,
                "{engine:?}: over quota after block {i}"
            );
        }
        assert_eq!(part.stats().rejected, 0);
        assert!(
            part.contains(&key(99)),
            "{engine:?}: the newest block was dropped"
        );
        assert!(
            !part.contains(&key(0)),
            "{engine:?}: the oldest block was kept"
        );
        assert_eq!(part.get(&key(99)).await.unwrap().value, block(99));
    }
}

/// The benchmark's shape at the engine level: many small blocks of varied sizes, a memory
/// tier much smaller than the quota, a disk tier that holds the whole dataset, an epoch
/// partition whose quota is half the data. Pass 1 fetches every block exactly once and
/// caches about half; later random-order passes hit exactly the cached fraction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_quota_with_small_memory_tier_keeps_the_cached_fraction() {
    const N: u64 = 1000;
    const MAX: usize = 4 << 20;
    let size = |i: u64| -> usize {
        // Deterministic, skewed sizes around ~60 KiB (8..~250 KiB).
        let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
        let u = (x % 1000) as f64 / 1000.0;
        (8192.0 * (1.0 + 30.0 * u * u * u)) as usize
    };
    let val = |i: u64| bytes::Bytes::from(vec![(i % 251) as u8; size(i)]);
    let total: u64 = (0..N).map(|i| size(i) as u64).sum();
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheBuilder::new()
            .engine(engine)
            .memory_capacity(total / 8)
            .segment_size(32 << 20)
            .max_value_size(MAX as u64)
            .disk(DiskConfig::new(dir.path(), total * 2 + (64 << 20)))
            .open()
            .unwrap();
        let quota = total / 2;
        let part = cache.partition(
            "epoch-small-mem",
            PartitionConfig {
                policy: Policy::Epoch,
                quota: Some(quota),
            },
        );
        let fetches = std::sync::atomic::AtomicU64::new(0);
        let mut order: Vec<u64> = (0..N).collect();
        let mut rng = StdRng::seed_from_u64(11);
        order.shuffle(&mut rng);
        let run = |order: Vec<u64>| {
            let part = part.clone();
            let fetches = &fetches;
            async move {
                let mut hits = 0u64;
                for i in order {
                    let l = part
                        .get_or_fetch(key(i), || async move {
                            fetches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Ok::<_, String>(val(i))
                        })
                        .await
                        .unwrap();
                    assert_eq!(l.value, val(i));
                    hits += (l.origin != sluice_cache_engine::Origin::Fetch) as u64;
                }
                hits
            }
        };
        run(order.clone()).await;
        assert_eq!(
            fetches.load(std::sync::atomic::Ordering::Relaxed),
            N,
            "{engine:?}: pass 1 fetched a block twice"
        );
        let stats = part.stats();
        assert!(
            stats.bytes <= quota,
            "{engine:?}: {} bytes over a {quota} quota",
            stats.bytes
        );
        let cached: Vec<u64> = (0..N).filter(|i| part.contains(&key(*i))).collect();
        let cached_bytes: u64 = cached.iter().map(|&i| size(i) as u64).sum();
        assert!(
            cached_bytes as f64 >= 0.95 * quota as f64,
            "{engine:?}: only {cached_bytes} of a {quota} quota cached ({} blocks; partition says {} bytes)",
            cached.len(),
            stats.bytes
        );
        let fraction = cached.len() as f64 / N as f64;
        for epoch in 0..3 {
            order.shuffle(&mut rng);
            let hits = run(order.clone()).await;
            let ratio = hits as f64 / N as f64;
            assert!(
                (ratio - fraction).abs() <= 0.05,
                "{engine:?} epoch {epoch}: hit ratio {ratio} vs cached fraction {fraction}"
            );
            let now: Vec<u64> = (0..N).filter(|i| part.contains(&key(*i))).collect();
            assert_eq!(
                now.len(),
                cached.len(),
                "{engine:?}: the epoch partition's cached set changed"
            );
        }
        // Fetches after pass 1: exactly the blocks not cached, once per pass.
        assert_eq!(
            fetches.load(std::sync::atomic::Ordering::Relaxed),
            N + 3 * (N - cached.len() as u64)
        );
    }
}
