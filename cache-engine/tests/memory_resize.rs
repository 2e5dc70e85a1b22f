//! The memory tier resized at runtime (the autoscaler's knob): shrinking evicts down to the
//! new budget at once; with a disk tier nothing is lost (write-through), every value still
//! reads back from disk; without one the partition's accounting follows the evictions.

mod common;

use common::*;
use sluice_cache_engine::{CacheBuilder, DiskConfig, Origin};

const SIZE: usize = 64 << 10;
const N: u64 = 32;

fn val(i: u64) -> bytes::Bytes {
    bytes::Bytes::from(vec![i as u8; SIZE])
}

#[tokio::test]
async fn shrinking_the_memory_tier_loses_nothing_with_a_disk_tier() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheBuilder::new()
            .engine(engine)
            .memory_capacity(N * SIZE as u64)
            .segment_size(4 << 20)
            .max_value_size(SIZE as u64)
            .disk(DiskConfig::new(dir.path(), 16 << 20))
            .open()
            .unwrap();
        for i in 0..N {
            cache.insert(key(i), val(i)).await.unwrap();
        }
        assert_eq!(cache.stats().memory.bytes, N * SIZE as u64);

        cache.set_memory_capacity(4 * SIZE as u64);
        let stats = cache.stats();
        assert_eq!(stats.memory.capacity, 4 * SIZE as u64);
        assert!(stats.memory.bytes <= 4 * SIZE as u64, "{:?}", stats.memory);
        assert_eq!(stats.memory.evictions, N - 4);
        // The partition still holds every entry: they live on disk.
        assert_eq!(stats.partitions[0].entries, N);
        let part = cache.default_partition();
        let mut from_disk = 0;
        for i in 0..N {
            let l = part
                .get(&key(i))
                .await
                .expect("still cached after the shrink");
            assert_eq!(l.value, val(i));
            from_disk += (l.origin == Origin::Disk) as u64;
        }
        assert!(from_disk >= N - 4, "{engine:?}: {from_disk} disk hits");

        // Growing admits more again.
        cache.set_memory_capacity(N * SIZE as u64);
        for i in 0..N {
            part.get(&key(i)).await.unwrap();
        }
        let stats = cache.stats();
        assert_eq!(stats.memory.capacity, N * SIZE as u64);
        assert_eq!(stats.memory.bytes, N * SIZE as u64);
    }
}

#[tokio::test]
async fn shrinking_a_memory_only_cache_keeps_the_accounting_right() {
    let cache = CacheBuilder::new()
        .memory_capacity(N * SIZE as u64)
        .max_value_size(SIZE as u64)
        .open()
        .unwrap();
    for i in 0..N {
        cache.insert(key(i), val(i)).await.unwrap();
    }
    cache.set_memory_capacity(8 * SIZE as u64);
    let stats = cache.stats();
    assert_eq!(stats.memory.entries, 8);
    assert_eq!(stats.partitions[0].entries, 8);
    assert_eq!(stats.partitions[0].bytes, 8 * SIZE as u64);
    let held = (0..N).filter(|&i| cache.contains(&key(i))).count();
    assert_eq!(held, 8);
}
