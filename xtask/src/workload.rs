//! Shared pieces of the dataset benchmarks: a generated ImageNet-like dataset and parallel
//! random-order readers over local files, a FUSE mount, or S3 directly.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};
use rand_distr::{Distribution, LogNormal};

/// The shape of a generated dataset.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub files: usize,
    pub dirs: usize,
    /// Median file size (lognormal, like ImageNet JPEGs).
    pub median: u64,
    pub shards: usize,
    pub shard_size: u64,
}

/// Relative path and size of every file of a generated dataset.
#[derive(Debug, Clone)]
pub struct FileSet {
    pub files: Vec<(String, u64)>,
}

impl FileSet {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.1).sum()
    }
    /// The small files only (the DataLoader pattern reads these in random order).
    pub fn samples(&self) -> Vec<(String, u64)> {
        self.files
            .iter()
            .filter(|f| !f.0.starts_with("shards/"))
            .cloned()
            .collect()
    }
}

/// Writes the dataset under `dir` (deterministic for a seed); reuses it if already there.
pub fn generate(dir: &Path, shape: Shape, seed: u64) -> anyhow::Result<FileSet> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let sizes = LogNormal::new((shape.median as f64).ln(), 0.6).expect("valid lognormal");
    let mut files = Vec::with_capacity(shape.files + shape.shards);
    for i in 0..shape.files {
        let size = (sizes.sample(&mut rng) as u64).clamp(2 << 10, 4 << 20);
        files.push((
            format!("train/n{:08}/img_{i:07}.JPEG", i % shape.dirs),
            size,
        ));
    }
    for s in 0..shape.shards {
        files.push((format!("shards/shard-{s:04}.tar"), shape.shard_size));
    }
    let marker = dir.join(".complete");
    if marker.exists() {
        return Ok(FileSet { files });
    }
    let mut buf = vec![0u8; 1 << 20];
    for (i, (rel, size)) in files.iter().enumerate() {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().expect("file has a parent"))?;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut left = *size;
        let mut frng =
            SmallRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            frng.fill_bytes(&mut buf[..n]);
            std::io::Write::write_all(&mut f, &buf[..n])?;
            left -= n as u64;
        }
    }
    std::fs::write(&marker, b"")?;
    Ok(FileSet { files })
}

/// One epoch's figures.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Epoch {
    pub files: usize,
    pub bytes: u64,
    pub secs: f64,
    pub p99_ms: f64,
    pub errors: usize,
}

impl Epoch {
    pub fn mib_s(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.secs
    }
    pub fn files_s(&self) -> f64 {
        self.files as f64 / self.secs
    }
}

/// A random order of `files` (fixed per seed, different per epoch).
pub fn shuffled(files: &[(String, u64)], seed: u64) -> Vec<(String, u64)> {
    let mut v = files.to_vec();
    v.shuffle(&mut SmallRng::seed_from_u64(seed));
    v
}

/// Reads every file under `root` in the given order with `threads` readers, as a PyTorch
/// DataLoader's workers do: each worker takes the next file and reads it whole.
pub fn read_files(root: &Path, order: &[(String, u64)], threads: usize) -> Epoch {
    let next = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(order.to_vec());
    let root: Arc<PathBuf> = Arc::new(root.to_path_buf());
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (next, order, root) = (next.clone(), order.clone(), root.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let (mut bytes, mut errors) = (0u64, 0usize);
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((rel, _)) = order.get(i) else { break };
                    let t = Instant::now();
                    match read_whole(&root.join(rel), &mut buf) {
                        Ok(n) => bytes += n,
                        Err(_) => errors += 1,
                    }
                    lat.push(t.elapsed());
                }
                (bytes, errors, lat)
            })
        })
        .collect();
    collect(
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .collect(),
        start,
    )
}

fn read_whole(path: &Path, buf: &mut [u8]) -> std::io::Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut n = 0u64;
    loop {
        match f.read(buf)? {
            0 => return Ok(n),
            k => n += k as u64,
        }
    }
}

fn collect(parts: Vec<(u64, usize, Vec<Duration>)>, start: Instant) -> Epoch {
    let secs = start.elapsed().as_secs_f64();
    let mut lat: Vec<Duration> = parts.iter().flat_map(|p| p.2.iter().copied()).collect();
    lat.sort();
    let p99 = lat
        .get(lat.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or_default();
    Epoch {
        files: lat.len(),
        bytes: parts.iter().map(|p| p.0).sum(),
        errors: parts.iter().map(|p| p.1).sum(),
        secs,
        p99_ms: p99.as_secs_f64() * 1e3,
    }
}

/// Reads every object in the given order straight from S3 with `parallelism` requests in
/// flight (the object_store client Sluice itself uses, so the comparison is like for like).
pub fn read_s3(
    endpoint: &str,
    bucket: &str,
    prefix: &str,
    order: &[(String, u64)],
    parallelism: usize,
) -> anyhow::Result<Epoch> {
    use futures::StreamExt;
    use object_store::ObjectStoreExt;
    let store = Arc::new(s3_store(endpoint, bucket)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let results: Vec<(u64, usize, Duration)> = rt.block_on(async {
        futures::stream::iter(order.iter().cloned())
            .map(|(rel, _)| {
                let store = store.clone();
                let path = object_store::path::Path::from(format!("{prefix}/{rel}"));
                async move {
                    let t = Instant::now();
                    let r = async { store.get(&path).await?.bytes().await }.await;
                    match r {
                        Ok(b) => (b.len() as u64, 0, t.elapsed()),
                        Err(_) => (0, 1, t.elapsed()),
                    }
                }
            })
            .buffer_unordered(parallelism)
            .collect()
            .await
    });
    let parts = vec![(
        results.iter().map(|r| r.0).sum(),
        results.iter().map(|r| r.1).sum(),
        results.iter().map(|r| r.2).collect(),
    )];
    Ok(collect(parts, start))
}

/// An S3 client for the benchmark's SeaweedFS.
pub fn s3_store(endpoint: &str, bucket: &str) -> anyhow::Result<object_store::aws::AmazonS3> {
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id(crate::seaweed::ACCESS_KEY)
        .with_secret_access_key(crate::seaweed::SECRET_KEY)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .build()
        .context("building the S3 client")
}

/// Uploads the dataset under `prefix` in the bucket, 32 PUTs in flight.
pub fn upload(
    endpoint: &str,
    bucket: &str,
    prefix: &str,
    local: &Path,
    set: &FileSet,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    use object_store::ObjectStoreExt;
    let store = Arc::new(s3_store(endpoint, bucket)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let progress = indicatif::ProgressBar::new(set.bytes()).with_message("uploading to SeaweedFS");
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    rt.block_on(async {
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(set.files.iter().cloned())
            .map(|(rel, size)| {
                let store = store.clone();
                let local = local.join(&rel);
                let progress = progress.clone();
                async move {
                    let path = object_store::path::Path::from(format!("{prefix}/{rel}"));
                    if size > 64 << 20 {
                        // Streamed, at most 8 parts in flight: `write` alone starts every part
                        // at once, and a 4 GiB checkpoint's ~800 parts stall SeaweedFS until
                        // its volume assignment times out.
                        use tokio::io::AsyncReadExt;
                        let mut file = tokio::fs::File::open(&local).await?;
                        let mut up =
                            object_store::WriteMultipart::new(store.put_multipart(&path).await?);
                        let mut buf = vec![0u8; 8 << 20];
                        loop {
                            up.wait_for_capacity(8).await?;
                            let n = file.read(&mut buf).await?;
                            if n == 0 {
                                break;
                            }
                            up.write(&buf[..n]);
                            progress.inc(n as u64);
                        }
                        up.finish().await?;
                    } else {
                        let data = tokio::fs::read(&local).await?;
                        store.put(&path, data.into()).await?;
                        progress.inc(size);
                    }
                    Ok(())
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        results.into_iter().collect::<anyhow::Result<Vec<()>>>()
    })?;
    progress.finish_and_clear();
    Ok(())
}

/// Empties the kernel's page cache so local reads come from the disk (root only).
pub fn drop_page_cache() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// Reads one big file front to back in 1 MiB reads, as a checkpoint loader does; the
/// latency figures are per read call.
pub fn read_sequential(path: &Path) -> Epoch {
    use std::io::Read;
    let start = Instant::now();
    let mut lat = Vec::new();
    let (mut bytes, mut errors) = (0u64, 0usize);
    let mut buf = vec![0u8; 1 << 20];
    match std::fs::File::open(path) {
        Ok(mut f) => loop {
            let t = Instant::now();
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes += n as u64,
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
            lat.push(t.elapsed());
        },
        Err(_) => errors += 1,
    }
    let mut e = collect(vec![(bytes, errors, lat)], start);
    e.files = 1;
    e
}
