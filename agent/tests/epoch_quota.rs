//! An epoch-mode dataset at its quota, read the way the FUSE front end reads: each file in
//! 128 KiB requests. Blocks that are not admitted must still be fetched from the source
//! once per read of the file, not once per request (the benchmark's "half-cache" case
//! fetched 1.35× the dataset in its first epoch and hit 0.15 instead of 0.5 afterwards).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};
use sluice::config::{ByteSize, DatasetSpec, MountSpec};
use sluice::dataset::Dataset;
use sluice_cache_engine::{CacheBuilder, DiskConfig, EngineKind};

const BLOCK: u64 = 4 << 20;
const CHUNK: u64 = 128 << 10;
const FILES: u64 = 200;

fn size(i: u64) -> usize {
    // 40 KiB .. ~520 KiB, most files above one 128 KiB request.
    40_000 + ((i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % 480_000) as usize
}

fn content(i: u64) -> Vec<u8> {
    (0..size(i))
        .map(|j| (j as u64 * 31 + i * 7) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_quota_fetches_each_uncached_file_once_per_pass() {
    let data = tempfile::tempdir().unwrap();
    for i in 0..FILES {
        std::fs::write(data.path().join(format!("f{i:04}.bin")), content(i)).unwrap();
    }
    let total: u64 = (0..FILES).map(|i| size(i) as u64).sum();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = CacheBuilder::new()
        .engine(EngineKind::Psync)
        .memory_capacity(4 << 20)
        .max_value_size(BLOCK)
        .segment_size(32 << 20)
        .disk(DiskConfig::new(cache_dir.path(), 256 << 20))
        .open()
        .unwrap();
    let yaml = "apiVersion: sluice.io/v1alpha1\nkind: Dataset\nmetadata: { name: half }\nspec:\n  mounts: []\n";
    let mut spec: DatasetSpec = serde_yaml::from_str(yaml).unwrap();
    spec.spec.mounts = vec![MountSpec {
        mount_point: format!("file://{}", data.path().display()),
        name: String::new(),
        options: BTreeMap::new(),
        secret_refs: vec![],
    }];
    spec.spec.cache.policy = Some("epoch".into());
    spec.spec.cache.quota = Some(ByteSize(total / 2));
    let dataset = Dataset::open(&spec, &cache, BLOCK).unwrap();
    let objects = dataset.mounts[0].source.list().await.unwrap();
    assert_eq!(objects.len() as u64, FILES);

    let mut order: Vec<usize> = (0..objects.len()).collect();
    let mut rng = StdRng::seed_from_u64(5);
    let mut fetched_before = 0;
    for pass in 0..3 {
        order.shuffle(&mut rng);
        for &o in &order {
            let object = &objects[o];
            let i: u64 = object.key[1..5].parse().unwrap();
            let mut offset = 0;
            while offset < object.size {
                let got = dataset.read(0, object, offset, CHUNK).await.unwrap();
                let want = &content(i)[offset as usize..(offset + CHUNK).min(object.size) as usize];
                assert!(
                    got[..] == want[..],
                    "pass {pass}: wrong bytes in {} at {offset}",
                    object.key
                );
                offset += CHUNK;
            }
        }
        let fetched = dataset.served.fetched.load(Ordering::Relaxed) - fetched_before;
        fetched_before += fetched;
        let cached = dataset.cache.stats().bytes;
        assert!(
            cached <= total / 2,
            "pass {pass}: {cached} bytes cached over a {} quota",
            total / 2
        );
        assert!(
            cached as f64 >= 0.45 * total as f64,
            "pass {pass}: only {cached} of {total} bytes cached"
        );
        let ratio = fetched as f64 / total as f64;
        if pass == 0 {
            assert!(
                ratio <= 1.02,
                "pass 1 fetched {ratio:.2}× the dataset from the source (want ≈1.0)"
            );
        } else {
            let want = 1.0 - cached as f64 / total as f64;
            assert!(
                (ratio - want).abs() <= 0.05,
                "pass {}: fetched {ratio:.2}× the dataset, want {want:.2}× (the uncached fraction)",
                pass + 1
            );
        }
    }
}
