//! A block read in several requests costs the cache one lookup, not one per request: the
//! kernel reads a file in 128 KiB requests, and a block (up to 4 MiB) served from NVMe
//! must not be read from the disk again for each of them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use sluice::config::{DatasetSpec, MountSpec};
use sluice::dataset::Dataset;
use sluice_cache_engine::{CacheBuilder, DiskConfig, EngineKind};

const BLOCK: u64 = 4 << 20;
const CHUNK: u64 = 128 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nvme_block_is_read_once_per_read_of_its_file() {
    let data = tempfile::tempdir().unwrap();
    let files: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1 << 20]).collect();
    for (i, f) in files.iter().enumerate() {
        std::fs::write(data.path().join(format!("f{i:02}")), f).unwrap();
    }
    let cache_dir = tempfile::tempdir().unwrap();
    // A memory tier smaller than one file: warm reads come from NVMe.
    let cache = CacheBuilder::new()
        .engine(EngineKind::Psync)
        .memory_capacity(256 << 10)
        .max_value_size(BLOCK)
        .segment_size(32 << 20)
        .disk(DiskConfig::new(cache_dir.path(), 256 << 20))
        .open()
        .unwrap();
    let yaml = "apiVersion: sluice.io/v1alpha1\nkind: Dataset\nmetadata: { name: nvme }\nspec:\n  mounts: []\n";
    let mut spec: DatasetSpec = serde_yaml::from_str(yaml).unwrap();
    spec.spec.mounts = vec![MountSpec {
        mount_point: format!("file://{}", data.path().display()),
        name: String::new(),
        options: BTreeMap::new(),
        secret_refs: vec![],
    }];
    let dataset = Dataset::open(&spec, &cache, BLOCK).unwrap();
    let mut objects = dataset.mounts[0].source.list().await.unwrap();
    objects.sort_by(|a, b| a.key.cmp(&b.key));

    let read_all = async || {
        for (i, object) in objects.iter().enumerate() {
            let mut offset = 0;
            while offset < object.size {
                let got = dataset.read(0, object, offset, CHUNK).await.unwrap();
                assert!(got[..] == files[i][offset as usize..(offset + CHUNK) as usize]);
                offset += CHUNK;
            }
        }
    };
    read_all().await; // cold: fetched once per file
    assert_eq!(dataset.served.fetched.load(Ordering::Relaxed), 20 << 20);
    let before = dataset.cache.stats();
    read_all().await; // warm: from NVMe
    let after = dataset.cache.stats();
    assert_eq!(
        dataset.served.fetched.load(Ordering::Relaxed),
        20 << 20,
        "warm reads went to the source"
    );
    let disk_reads = after.hits_disk - before.hits_disk;
    let lookups =
        disk_reads + (after.hits_memory - before.hits_memory) + (after.misses - before.misses);
    assert_eq!(
        lookups, 20,
        "{lookups} cache lookups for 20 files of 8 requests each ({disk_reads} from NVMe)"
    );
    let total = dataset.served.memory.load(Ordering::Relaxed)
        + dataset.served.disk.load(Ordering::Relaxed)
        + dataset.served.source.load(Ordering::Relaxed);
    assert_eq!(total, 40 << 20, "served bytes add up to what was read");
}
