//! Random inserts, gets, removes and reopens checked against a `HashMap`, on both engines.
//! The cache may have evicted an entry; anything it returns must equal the model.

mod common;

use std::collections::HashMap;

use bytes::Bytes;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_cache_engine::{Cache, CacheBuilder, DiskConfig, EngineKind};

fn builder(dir: &std::path::Path, engine: EngineKind) -> CacheBuilder {
    // 16 MiB of 4 MiB segments for ~25 MiB of inserts: segments get evicted.
    CacheBuilder::new()
        .engine(engine)
        .memory_capacity(512 << 10)
        .segment_size(4 << 20)
        .max_value_size(64 << 10)
        .disk(DiskConfig::new(dir, 16 << 20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_match_a_model() {
    for engine in engines() {
        for seed in [1u64, 2] {
            run(engine, seed).await;
        }
    }
}

async fn run(engine: EngineKind, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: HashMap<u64, Bytes> = HashMap::new();
    let mut cache: Cache = builder(dir.path(), engine).open().unwrap();
    let (mut hits, mut gets) = (0, 0);
    for op in 0..3000u64 {
        let k = rng.random_range(0..400u64);
        match rng.random_range(0..100) {
            0..40 => {
                let v = value(k, op, 16 << 10);
                cache.insert(key(k), v.clone()).await.unwrap();
                model.insert(k, v);
            }
            40..85 => {
                gets += 1;
                if let Some(v) = cache.get(&key(k)).await {
                    hits += 1;
                    assert_eq!(
                        Some(&v),
                        model.get(&k),
                        "{engine:?} seed {seed} op {op}: key {k}"
                    );
                }
            }
            85..97 => {
                let removed = cache.remove(&key(k)).await;
                let was = model.remove(&k);
                assert!(
                    !removed || was.is_some(),
                    "{engine:?} seed {seed} op {op}: removed an absent key {k}"
                );
            }
            _ => {
                if rng.random_bool(0.5) {
                    cache.close().await;
                }
                drop(cache);
                cache = builder(dir.path(), engine).open().unwrap();
            }
        }
    }
    for (k, v) in &model {
        if let Some(got) = cache.get(&key(*k)).await {
            assert_eq!(&got, v, "{engine:?} seed {seed}: final check of key {k}");
        }
    }
    let stats = cache.stats();
    assert_eq!(stats.checksum_failures, 0);
    assert!(
        hits * 2 > gets / 2,
        "{engine:?} seed {seed}: only {hits} hits of {gets} gets"
    );
}
