//! Values come back byte-exact from memory and disk, across a reopen, on both engines.

mod common;

use common::*;
use sluice_cache_engine::{Origin, PartitionConfig, Policy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_survive_memory_eviction_and_reopen() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open(small(dir.path(), engine, 256 << 10));
        assert_eq!(cache.engine().kind, engine);
        let part = cache.partition(
            "imagenet",
            PartitionConfig {
                policy: Policy::General,
                quota: None,
            },
        );
        for i in 0..400 {
            part.insert(key(i), value(i, 0, 64 << 10)).await.unwrap();
        }
        let mut from_disk = 0;
        for i in 0..400 {
            let got = part
                .get(&key(i))
                .await
                .unwrap_or_else(|| panic!("{engine:?}: block {i} missing"));
            assert_eq!(got.value, value(i, 0, 64 << 10), "{engine:?}: block {i}");
            from_disk += (got.origin == Origin::Disk) as u32;
        }
        assert!(from_disk > 0, "{engine:?}: the memory tier held everything");
        let bytes = part.stats().bytes;
        cache.close().await;
        drop((cache, part));

        let cache = open(small(dir.path(), engine, 0));
        let part = cache.partition("imagenet", PartitionConfig::default());
        assert_eq!(
            part.stats().entries,
            400,
            "{engine:?}: the partition kept its blocks"
        );
        assert_eq!(part.stats().bytes, bytes);
        for i in 0..400 {
            let got = part
                .get(&key(i))
                .await
                .unwrap_or_else(|| panic!("{engine:?}: block {i} lost on reopen"));
            assert_eq!(got.value, value(i, 0, 64 << 10));
            assert_eq!(got.origin, Origin::Disk);
        }
        assert!(cache.stats().index_bytes > 0);
        assert_eq!(cache.stats().checksum_failures, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_blocks_and_removals_persist() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open(
            small(dir.path(), engine, 0)
                .max_value_size(4 << 20)
                .segment_size(32 << 20),
        );
        for i in 0..12 {
            cache.insert(key(i), value(i, 1, 4 << 20)).await.unwrap();
        }
        for i in 0..6 {
            assert!(cache.remove(&key(i)).await);
        }
        drop(cache); // no close: drop seals on a best-effort basis
        let cache = open(
            small(dir.path(), engine, 0)
                .max_value_size(4 << 20)
                .segment_size(32 << 20),
        );
        for i in 0..12 {
            let got = cache.get(&key(i)).await;
            if i < 6 {
                assert!(got.is_none(), "{engine:?}: removed block {i} came back");
            } else {
                assert_eq!(
                    got.as_deref(),
                    Some(&value(i, 1, 4 << 20)[..]),
                    "{engine:?}: block {i}"
                );
            }
        }
    }
}

#[test]
fn auto_engine_says_why_it_fell_back() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(small(dir.path(), sluice_cache_engine::EngineKind::Auto, 0));
    let choice = cache.engine();
    match choice.kind {
        sluice_cache_engine::EngineKind::IoUring => assert!(choice.fallback_reason.is_none()),
        sluice_cache_engine::EngineKind::Psync => {
            let why = choice
                .fallback_reason
                .expect("a psync fallback carries its reason");
            eprintln!("Auto fell back to psync: {why}");
        }
        other => panic!("Auto resolved to {other:?}"),
    }
}
