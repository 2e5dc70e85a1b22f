//! `cargo xtask bench engine`: the cache engine against its limits and its peer, in one run.
//!
//! 1. NVMe-tier reads (memory tier off) against `fio --ioengine=io_uring --direct=1` reading
//!    one of the very segment files, at the same block size and queue depth.
//! 2. A read-mostly key/value mix (lognormal sizes around 110 KiB plus some 4 MiB blocks,
//!    working set several times the memory tier) against foyer's hybrid cache with the
//!    same memory and disk budgets.
//! 3. DRAM per cached block in the index, and the time to reopen a cache of 1 M blocks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use rand::{Rng, SeedableRng, rngs::StdRng};
use sluice_cache_engine::{Cache, CacheBuilder, DiskConfig, EngineKind, Key};

use crate::bench::BenchArgs;

/// Counts live heap bytes so the index's DRAM can be measured, not only computed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only adds a counter.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const QD: usize = 16;
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn key(i: u64) -> Key {
    Key::hash(&[b"bench", &i.to_le_bytes()])
}

/// A pool of random bytes that values are sliced from.
fn pool(len: usize) -> Bytes {
    let mut rng = StdRng::seed_from_u64(42);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    Bytes::from(v)
}

fn bench_dir() -> anyhow::Result<tempfile::TempDir> {
    let base = std::env::var_os("SLUICE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    std::fs::create_dir_all(&base)?;
    Ok(tempfile::Builder::new()
        .prefix("sluice-bench-engine-")
        .tempdir_in(base)?)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

struct FioRow {
    name: &'static str,
    ours: f64,
    fio: f64,
}

/// Part 1: our disk-tier reads vs fio on one of our segment files.
fn fio_compare(
    rt: &tokio::runtime::Runtime,
    base: &Path,
    quick: bool,
) -> anyhow::Result<Vec<FioRow>> {
    let data = if quick { 256 * MIB } else { 1024 * MIB };
    let secs = if quick { 3 } else { 10 };
    let values = pool(2 * MIB as usize);
    let mut rows = Vec::new();
    for (name, bs, random) in [
        ("4k", 4 * KIB, true),
        ("128k", 128 * KIB, true),
        ("1m", MIB, false),
    ] {
        let dir = base.join(format!("fio-{name}"));
        let builder = || {
            CacheBuilder::new()
                .engine(EngineKind::IoUring)
                .memory_capacity(0)
                .queue_depth(QD as u32)
                .segment_size(64 * MIB)
                .max_value_size(MIB)
                .disk(DiskConfig::new(&dir, 4 * data))
        };
        let n = data / bs;
        rt.block_on(async {
            let cache = builder().open()?;
            for i in 0..n {
                let at = (i as usize * 4096) % MIB as usize;
                cache
                    .insert(key(i), values.slice(at..at + bs as usize))
                    .await?;
            }
            cache.close().await;
            anyhow::Ok(())
        })?;
        let cache = builder().open()?;
        anyhow::ensure!(
            cache.engine().kind == EngineKind::IoUring,
            "io_uring unavailable: {:?}",
            cache.engine().fallback_reason
        );
        // fio reads the very segment files of this cache (all of them, so both sides
        // cover the same bytes and neither gets an advantage from a smaller hot set).
        let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".dat"))
            .map(|e| e.path())
            .collect();
        segs.sort();
        anyhow::ensure!(!segs.is_empty(), "no segment file");
        // Alternate the two, best of two rounds each: the machine is shared, so noise
        // from other work hits both sides alike.
        let (mut ours, mut fio) = (0f64, 0f64);
        for _ in 0..2 {
            ours = ours.max(rt.block_on(read_loop(
                cache.clone(),
                n,
                bs,
                random,
                Duration::from_secs(secs),
            ))?);
            fio = fio.max(run_fio(&segs, bs, random, secs)?);
        }
        drop(cache);
        println!(
            "  {name:>5}: sluice {:>8.1} MiB/s   fio {:>8.1} MiB/s",
            ours / MIB as f64,
            fio / MIB as f64
        );
        rows.push(FioRow { name, ours, fio });
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(rows)
}

/// `QD` tasks reading blocks for `dur`; returns bytes per second.
async fn read_loop(
    cache: Cache,
    n: u64,
    bs: u64,
    random: bool,
    dur: Duration,
) -> anyhow::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..QD {
        let (cache, stop, next, bytes) = (cache.clone(), stop.clone(), next.clone(), bytes.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(t as u64);
            while !stop.load(Relaxed) {
                let i = if random {
                    rng.random_range(0..n)
                } else {
                    next.fetch_add(1, Relaxed) % n
                };
                match cache.get(&key(i)).await {
                    Some(v) if v.len() as u64 == bs => bytes.fetch_add(bs, Relaxed),
                    other => bail!("block {i}: {:?} bytes", other.map(|v| v.len())),
                };
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(dur).await;
    stop.store(true, Relaxed);
    for t in tasks {
        t.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        cache.stats().checksum_failures == 0,
        "checksum failures during the read loop"
    );
    Ok(bytes.load(Relaxed) as f64 / elapsed)
}

fn run_fio(files: &[PathBuf], bs: u64, random: bool, secs: u64) -> anyhow::Result<f64> {
    let mut size = u64::MAX;
    for f in files {
        size = size.min(std::fs::metadata(f)?.len() / bs * bs);
    }
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let out = Command::new("fio")
        .arg("--name=sluice-peer")
        .arg(format!("--filename={}", names.join(":")))
        .arg(format!(
            "--file_service_type={}",
            if random { "random" } else { "sequential" }
        ))
        .args([
            "--ioengine=io_uring",
            "--direct=1",
            "--readonly",
            "--time_based",
            "--output-format=json",
        ])
        .arg(format!("--iodepth={QD}"))
        .arg(format!("--rw={}", if random { "randread" } else { "read" }))
        .arg(format!("--bs={bs}"))
        .arg(format!("--size={}", size * files.len() as u64))
        .arg(format!("--runtime={secs}"))
        .output()
        .context("running fio")?;
    anyhow::ensure!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).context("fio's JSON")?;
    json["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .context("fio bw_bytes")
}

/// The key/value mix: sizes of each key.
fn mix_sizes(working_set: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(9);
    let mut sizes = Vec::new();
    let mut total = 0;
    while total < working_set {
        let s = if rng.random_bool(0.03) {
            4 * MIB as usize
        } else {
            // Lognormal around 110 KiB (sigma 0.6) from two uniforms (Box-Muller).
            let (u1, u2): (f64, f64) = (rng.random_range(1e-9..1.0), rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            ((110.0 * 1024.0) * (0.6 * z).exp()).clamp(1024.0, 2.0 * MIB as f64) as usize
        };
        total += s as u64;
        sizes.push(s);
    }
    sizes
}

struct MixResult {
    ours: f64,
    foyer: f64,
    ours_hit: f64,
    foyer_hit: f64,
    keys: usize,
}

/// Part 2: ops/s of the same read-mostly mix on Sluice and on foyer.
fn foyer_compare(
    rt: &tokio::runtime::Runtime,
    base: &Path,
    quick: bool,
) -> anyhow::Result<MixResult> {
    let (memory, disk) = if quick {
        (32 * MIB, 512 * MIB)
    } else {
        (128 * MIB, 2048 * MIB)
    };
    let secs = if quick { 8 } else { 30 };
    let sizes = Arc::new(mix_sizes(disk * 6 / 10));
    let values = pool(8 * MIB as usize);
    let n = sizes.len();

    let dir = base.join("mix-sluice");
    let cache = CacheBuilder::new()
        .engine(EngineKind::IoUring)
        .memory_capacity(memory)
        .queue_depth(QD as u32)
        .segment_size(64 * MIB)
        .disk(DiskConfig::new(&dir, disk))
        .open()?;
    let (ours, ours_hit) = rt.block_on(async {
        let ops = Ops::new(sizes.clone(), values.clone());
        for i in 0..n {
            cache.insert(key(i as u64), ops.value(i)).await?;
        }
        let c = cache.clone();
        ops.run(Duration::from_secs(secs), move |i, v| {
            let c = c.clone();
            async move {
                match c.get(&key(i as u64)).await {
                    Some(got) => Ok(Some(got.len())),
                    None => c
                        .insert(key(i as u64), v)
                        .await
                        .map(|()| None)
                        .map_err(anyhow::Error::from),
                }
            }
        })
        .await
    })?;
    drop(cache);

    let dir = base.join("mix-foyer");
    std::fs::create_dir_all(&dir)?;
    let (foyer, foyer_hit) = rt.block_on(async {
        use foyer::{
            BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCacheBuilder,
            HybridCachePolicy, UringIoEngineConfig,
        };
        // O_DIRECT like ours: buffered I/O would serve foyer's disk tier from the page cache.
        let device = FsDeviceBuilder::new(&dir)
            .with_capacity(disk as usize)
            .with_direct(true)
            .build()?;
        let hybrid: foyer::HybridCache<u64, Vec<u8>> = HybridCacheBuilder::new()
            .with_name("bench")
            .with_policy(HybridCachePolicy::WriteOnInsertion)
            .memory(memory as usize)
            .with_weighter(|_k: &u64, v: &Vec<u8>| v.len())
            .storage()
            .with_io_engine_config(Box::new(UringIoEngineConfig::new().with_io_depth(QD))
                as Box<dyn foyer::IoEngineConfig>)
            .with_engine_config(BlockEngineConfig::new(device).with_block_size(16 * MIB as usize))
            .build()
            .await?;
        let ops = Ops::new(sizes.clone(), values.clone());
        for i in 0..n {
            hybrid.insert(i as u64, ops.value(i).to_vec());
        }
        let h = hybrid.clone();
        let res = ops
            .run(Duration::from_secs(secs), move |i, v| {
                let h = h.clone();
                async move {
                    match h.get(&(i as u64)).await? {
                        Some(e) => Ok(Some(e.value().len())),
                        None => {
                            h.insert(i as u64, v.to_vec());
                            Ok(None)
                        }
                    }
                }
            })
            .await;
        hybrid.close().await?;
        res
    })?;
    Ok(MixResult {
        ours,
        foyer,
        ours_hit,
        foyer_hit,
        keys: n,
    })
}

/// The operation stream of the mix: uniform keys, 95 % gets (a miss inserts), 5 % inserts.
struct Ops {
    sizes: Arc<Vec<usize>>,
    values: Bytes,
}

impl Ops {
    fn new(sizes: Arc<Vec<usize>>, values: Bytes) -> Self {
        Ops { sizes, values }
    }
    fn value(&self, i: usize) -> Bytes {
        let at = (i * 4096) % (self.values.len() - self.sizes[i]);
        self.values.slice(at..at + self.sizes[i])
    }
    /// Runs `get` (returns the length found, or None after inserting) from `QD` tasks;
    /// returns (ops/s, hit ratio).
    async fn run<F, Fut>(self, dur: Duration, get: F) -> anyhow::Result<(f64, f64)>
    where
        F: Fn(usize, Bytes) -> Fut + Send + Sync + Clone + 'static,
        Fut: std::future::Future<Output = anyhow::Result<Option<usize>>> + Send,
    {
        let this = Arc::new(self);
        let stop = Arc::new(AtomicBool::new(false));
        let (ops, hits, gets) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let start = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..QD {
            let (this, stop, ops, hits, gets, get) = (
                this.clone(),
                stop.clone(),
                ops.clone(),
                hits.clone(),
                gets.clone(),
                get.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(100 + t as u64);
                while !stop.load(Relaxed) {
                    let i = rng.random_range(0..this.sizes.len());
                    if rng.random_bool(0.05) {
                        // An overwrite: through the same path as a miss.
                        get(usize::MAX - i, this.value(i)).await.ok();
                    } else {
                        gets.fetch_add(1, Relaxed);
                        if let Some(len) = get(i, this.value(i)).await? {
                            anyhow::ensure!(
                                len == this.sizes[i],
                                "key {i}: {len} bytes, expected {}",
                                this.sizes[i]
                            );
                            hits.fetch_add(1, Relaxed);
                        }
                    }
                    ops.fetch_add(1, Relaxed);
                }
                anyhow::Ok(())
            }));
        }
        tokio::time::sleep(dur).await;
        stop.store(true, Relaxed);
        for t in tasks {
            t.await??;
        }
        let secs = start.elapsed().as_secs_f64();
        Ok((
            ops.load(Relaxed) as f64 / secs,
            hits.load(Relaxed) as f64 / gets.load(Relaxed).max(1) as f64,
        ))
    }
}

struct IndexResult {
    blocks: u64,
    computed_bytes_per_block: f64,
    allocated_bytes_per_block: f64,
    reopen_seconds: f64,
}

/// Part 3: DRAM per block and reopen time with many small blocks.
fn index_and_reopen(
    rt: &tokio::runtime::Runtime,
    base: &Path,
    quick: bool,
) -> anyhow::Result<IndexResult> {
    let blocks: u64 = if quick { 250_000 } else { 1_000_000 };
    let dir = base.join("reopen");
    let builder = || {
        CacheBuilder::new()
            .engine(EngineKind::IoUring)
            .memory_capacity(0)
            .segment_size(64 * MIB)
            .max_value_size(MIB)
            .disk(DiskConfig::new(&dir, 4096 * MIB))
    };
    let values = pool(MIB as usize);
    rt.block_on(async {
        let cache = builder().open()?;
        for i in 0..blocks {
            let at = (i as usize * 64) % (MIB as usize - 512);
            cache
                .insert(key(i), values.slice(at..at + 100 + (i % 200) as usize))
                .await?;
        }
        cache.close().await;
        anyhow::Ok(())
    })?;
    // The same configuration opened empty, to subtract what does not depend on the blocks.
    let empty_dir = base.join("reopen-empty");
    let before = LIVE.load(Relaxed);
    let empty = CacheBuilder::new()
        .engine(EngineKind::IoUring)
        .memory_capacity(0)
        .segment_size(64 * MIB)
        .max_value_size(MIB)
        .disk(DiskConfig::new(&empty_dir, 4096 * MIB))
        .open()?;
    let empty_cost = LIVE.load(Relaxed) - before;
    drop(empty);
    let before = LIVE.load(Relaxed);
    let start = Instant::now();
    let cache = builder().open()?;
    let reopen_seconds = start.elapsed().as_secs_f64();
    let full_cost = LIVE.load(Relaxed) - before;
    let stats = cache.stats();
    anyhow::ensure!(
        stats.index_entries == blocks,
        "reopened with {} of {blocks} blocks",
        stats.index_entries
    );
    Ok(IndexResult {
        blocks,
        computed_bytes_per_block: stats.index_bytes as f64 / blocks as f64,
        allocated_bytes_per_block: full_cost.saturating_sub(empty_cost) as f64 / blocks as f64,
        reopen_seconds,
    })
}

/// Runs the three parts and prints (and optionally writes) the figures.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) && std::env::var_os("SLUICE_BENCH_DEBUG").is_none() {
        // `cargo xtask` builds without optimisations; figures from that build would measure
        // the compiler's debug code, so run the same command from a release build.
        println!(
            "bench engine: re-running from a release build of xtask (SLUICE_BENCH_DEBUG=1 to skip)"
        );
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args([
            "run",
            "--quiet",
            "--release",
            "--package",
            "xtask",
            "--",
            "bench",
            "engine",
        ]);
        if args.quick {
            cmd.arg("--quick");
        }
        if let Some(json) = &args.json {
            cmd.arg("--json").arg(json);
        }
        let status = cmd.status().context("running the release build")?;
        anyhow::ensure!(status.success(), "release bench failed: {status}");
        return Ok(());
    }
    let quick = args.quick;
    let base = bench_dir()?;
    println!(
        "bench engine{}: files under {}",
        if quick { " --quick" } else { "" },
        base.path().display()
    );
    let rt = runtime()?;
    println!("[1/3] disk-tier reads vs fio (io_uring, O_DIRECT, iodepth {QD})");
    let fio = fio_compare(&rt, base.path(), quick)?;
    println!("[2/3] read-mostly mix vs foyer (same memory and disk budgets)");
    let mix = foyer_compare(&rt, base.path(), quick)?;
    // A fresh runtime, and foyer's threads gone, so that the allocator count of part 3
    // sees only the cache being opened.
    rt.shutdown_timeout(Duration::from_secs(10));
    let rt = runtime()?;
    println!("[3/3] index size and reopen time");
    let idx = index_and_reopen(&rt, base.path(), quick)?;
    let reopen_1m = idx.reopen_seconds * 1_000_000.0 / idx.blocks as f64;

    let ratio = |n: &str| {
        fio.iter()
            .find(|r| r.name == n)
            .map(|r| r.ours / r.fio)
            .unwrap_or(0.0)
    };
    println!();
    println!("| figure | value | goal |");
    println!("| --- | --- | --- |");
    for r in &fio {
        println!(
            "| fio_ratio_{} | {:.2} (sluice {:.0} MiB/s, fio {:.0} MiB/s) | >= 0.9 |",
            r.name,
            r.ours / r.fio,
            r.ours / MIB as f64,
            r.fio / MIB as f64
        );
    }
    println!(
        "| foyer_ratio | {:.2} (sluice {:.0} ops/s, hit {:.2}; foyer {:.0} ops/s, hit {:.2}; {} keys) | >= 1.0 |",
        mix.ours / mix.foyer,
        mix.ours,
        mix.ours_hit,
        mix.foyer,
        mix.foyer_hit,
        mix.keys
    );
    println!(
        "| index_bytes_per_block | {:.1} allocator-counted ({:.1} computed from table size) | <= 64 |",
        idx.allocated_bytes_per_block, idx.computed_bytes_per_block
    );
    println!(
        "| reopen_seconds_1m | {:.2}{} | |",
        reopen_1m,
        if idx.blocks != 1_000_000 {
            format!(
                " (extrapolated from {} blocks in {:.2} s)",
                idx.blocks, idx.reopen_seconds
            )
        } else {
            String::new()
        }
    );
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "fio_ratio_4k": ratio("4k"),
            "fio_ratio_128k": ratio("128k"),
            "fio_ratio_1m": ratio("1m"),
            "foyer_ratio": mix.ours / mix.foyer,
            "index_bytes_per_block": idx.allocated_bytes_per_block,
            "reopen_seconds_1m": reopen_1m,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
