//! The admin API the CLI talks to: newline-delimited JSON over a Unix socket (mode 0600).
//!
//! One request line per connection, e.g. `{"op":"status"}`,
//! `{"op":"load","dataset":"imagenet","path":"train","metadataOnly":false}`,
//! `{"op":"refresh","dataset":"imagenet"}`, `{"op":"stalls"}`; the answer is one JSON line, or for `load` a
//! stream of `{"type":"progress",…}` lines ending in `{"type":"done",…}`. Failures are
//! `{"type":"error","message":…}`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sluice_cache_engine::Cache;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use sluice::dataset::Dataset;

use crate::fuse::pool::ReadPool;
use crate::meta::{EntryKind, MetaCache, MountListing, Tree};

/// One dataset as the daemon holds it.
#[derive(Debug)]
pub struct ServedDataset {
    pub dataset: Arc<Dataset>,
    pub meta: Arc<MetaCache>,
    /// Where its listing is persisted.
    pub meta_path: PathBuf,
    pub mount_point: PathBuf,
    /// Set once mounted: tells the kernel which cached entries a refresh made stale.
    pub notifier: std::sync::OnceLock<fuser::Notifier>,
}

impl ServedDataset {
    /// Lists every mount again, builds a new tree (keeping inode numbers of surviving
    /// paths), persists it and swaps it in.
    pub async fn refresh(&self) -> Result<(u64, u64), String> {
        let listings = list_all(&self.dataset).await?;
        let old = self.meta.snapshot();
        let tree = tokio::task::block_in_place(|| Tree::build(listings, Some(&old)));
        tree.save(&self.meta_path).map_err(|e| e.to_string())?;
        let totals = tree.totals();
        let stale: Vec<(u64, u64, String, bool)> = tree
            .changed_since(&old)
            .map(|(ino, parent, name, gone)| (ino, parent, name.to_string(), gone))
            .collect();
        self.meta.swap(tree);
        // The kernel holds entries, attributes and pages for an hour (TTL, KEEP_CACHE):
        // drop what changed. Errors mean "not cached", which is fine.
        if let Some(n) = self.notifier.get() {
            for (ino, parent, name, gone) in &stale {
                let _ = n.inval_inode(fuser::INodeNo(*ino), 0, -1);
                if *gone {
                    let _ = n.inval_entry(fuser::INodeNo(*parent), std::ffi::OsStr::new(name));
                }
            }
        }
        tracing::info!(dataset = %self.dataset.name, files = totals.0, bytes = totals.1, "metadata refreshed");
        Ok(totals)
    }
}

/// Lists all mounts of `ds` concurrently.
pub async fn list_all(ds: &Dataset) -> Result<Vec<MountListing>, String> {
    let lists = futures::future::join_all(ds.mounts.iter().map(|m| async move {
        m.source
            .list()
            .await
            .map(|objects| MountListing {
                name: m.name.clone(),
                objects,
            })
            .map_err(|e| format!("dataset {}: listing mount {:?}: {e}", ds.name, m.name))
    }))
    .await;
    lists.into_iter().collect()
}

/// What the admin API can be asked.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum AdminRequest {
    Status,
    #[serde(rename_all = "camelCase")]
    Load {
        dataset: String,
        #[serde(default)]
        path: String,
        #[serde(default)]
        metadata_only: bool,
    },
    Refresh {
        dataset: String,
    },
    /// Per-workload stalls (`sluice stalls`).
    Stalls,
}

/// `sluice status` for one dataset.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatasetStatus {
    pub name: String,
    pub mount_point: String,
    pub files: u64,
    pub bytes: u64,
    pub cached_bytes: u64,
    pub cached_percent: f64,
    /// Of the bytes readers got, the fraction the cache had when they asked (prefetch and
    /// preload lookups are not reads, so they do not count).
    pub hit_ratio: f64,
    pub served_memory: u64,
    pub served_disk: u64,
    pub served_source: u64,
    /// Bytes the sources sent (whole blocks; more than `served_source` for partial reads).
    #[serde(default)]
    pub fetched_source: u64,
}

/// `sluice status` for one cache tier.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TierStatus {
    pub tier: String,
    pub path: Option<String>,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
}

/// The whole `sluice status` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub engine: String,
    pub engine_fallback: Option<String>,
    pub datasets: Vec<DatasetStatus>,
    pub tiers: Vec<TierStatus>,
}

/// Progress of a `load`, streamed while it runs and once more at the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadProgress {
    pub files_total: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub bytes_done: u64,
    pub errors: u64,
}

/// The daemon's state as the admin API sees it.
#[derive(Debug)]
pub struct AdminState {
    pub cache: Cache,
    pub datasets: Vec<Arc<ServedDataset>>,
    /// Where block reads run (see `fuse::pool`).
    pub pool: Arc<ReadPool>,
    /// The stall observer's latest report.
    pub stalls: crate::observe::SharedReport,
}

impl AdminState {
    /// Counters for `sluice status`.
    pub fn status(&self) -> Status {
        let stats = self.cache.stats();
        let engine = self.cache.engine();
        let datasets = self
            .datasets
            .iter()
            .map(|d| {
                let (files, bytes) = d.meta.snapshot().totals();
                let p = d.dataset.cache.stats();
                let served = &d.dataset.served;
                let (memory, disk, source) = (
                    served.memory.load(Ordering::Relaxed),
                    served.disk.load(Ordering::Relaxed),
                    served.source.load(Ordering::Relaxed),
                );
                let read = memory + disk + source;
                DatasetStatus {
                    name: d.dataset.name.clone(),
                    mount_point: d.mount_point.display().to_string(),
                    files,
                    bytes,
                    cached_bytes: p.bytes,
                    cached_percent: if bytes == 0 {
                        0.0
                    } else {
                        (p.bytes as f64 * 100.0 / bytes as f64).min(100.0)
                    },
                    hit_ratio: if read == 0 {
                        0.0
                    } else {
                        (memory + disk) as f64 / read as f64
                    },
                    served_memory: memory,
                    served_disk: disk,
                    served_source: source,
                    fetched_source: served.fetched.load(Ordering::Relaxed),
                }
            })
            .collect();
        let mut tiers = vec![TierStatus {
            tier: "memory".into(),
            path: None,
            used_bytes: stats.memory.bytes,
            capacity_bytes: stats.memory.capacity,
        }];
        for (path, t) in &stats.disks {
            tiers.push(TierStatus {
                tier: "disk".into(),
                path: Some(path.display().to_string()),
                used_bytes: t.bytes,
                capacity_bytes: t.capacity,
            });
        }
        Status {
            engine: format!("{:?}", engine.kind),
            engine_fallback: engine.fallback_reason,
            datasets,
            tiers,
        }
    }

    fn dataset(&self, name: &str) -> Result<&Arc<ServedDataset>, String> {
        self.datasets
            .iter()
            .find(|d| d.dataset.name == name)
            .ok_or_else(|| {
                let known: Vec<_> = self
                    .datasets
                    .iter()
                    .map(|d| d.dataset.name.as_str())
                    .collect();
                format!(
                    "no dataset {name:?} (this agent serves: {})",
                    known.join(", ")
                )
            })
    }
}

/// Serves the admin API on `path` until the task is dropped.
pub async fn serve(path: PathBuf, state: Arc<AdminState>) -> std::io::Result<()> {
    let listener = bind(&path)?;
    tracing::info!(socket = %path.display(), "admin API listening");
    loop {
        let (conn, _) = listener.accept().await?;
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(conn, state).await {
                tracing::debug!(error = %e, "admin connection ended");
            }
        });
    }
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A socket file left by a killed agent would make bind fail.
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

async fn send(
    conn: &mut tokio::net::unix::OwnedWriteHalf,
    v: &serde_json::Value,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).expect("json");
    line.push(b'\n');
    conn.write_all(&line).await
}

async fn handle(conn: UnixStream, state: Arc<AdminState>) -> std::io::Result<()> {
    let (read, mut write) = conn.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let req: AdminRequest = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(e) => {
            return send(
                &mut write,
                &serde_json::json!({"type": "error", "message": format!("bad request: {e}")}),
            )
            .await;
        }
    };
    match req {
        AdminRequest::Status => {
            let status = state.status();
            send(
                &mut write,
                &serde_json::json!({"type": "status", "status": status}),
            )
            .await
        }
        AdminRequest::Stalls => {
            let report = state
                .stalls
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            send(
                &mut write,
                &serde_json::json!({"type": "stalls", "stalls": report}),
            )
            .await
        }
        AdminRequest::Refresh { dataset } => {
            let reply = match state.dataset(&dataset) {
                Ok(d) => match d.refresh().await {
                    Ok((files, bytes)) => {
                        serde_json::json!({"type": "done", "files": files, "bytes": bytes})
                    }
                    Err(message) => serde_json::json!({"type": "error", "message": message}),
                },
                Err(message) => serde_json::json!({"type": "error", "message": message}),
            };
            send(&mut write, &reply).await
        }
        AdminRequest::Load {
            dataset,
            path,
            metadata_only,
        } => {
            let d = match state.dataset(&dataset) {
                Ok(d) => d.clone(),
                Err(message) => {
                    return send(
                        &mut write,
                        &serde_json::json!({"type": "error", "message": message}),
                    )
                    .await;
                }
            };
            if metadata_only {
                let reply = match d.refresh().await {
                    Ok((files, bytes)) => {
                        serde_json::json!({"type": "done", "progress": LoadProgress { files_total: files, bytes_total: bytes, files_done: files, ..Default::default() }})
                    }
                    Err(message) => serde_json::json!({"type": "error", "message": message}),
                };
                return send(&mut write, &reply).await;
            }
            load(d, &state.pool, &path, &mut write).await
        }
    }
}

/// Reads every block of every file under `path` into the cache, 16 blocks at a time,
/// streaming progress every 200 ms.
async fn load(
    d: Arc<ServedDataset>,
    pool: &ReadPool,
    path: &str,
    write: &mut tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<()> {
    let tree = d.meta.snapshot();
    let Some(root) = tree.resolve(path) else {
        let message = format!("dataset {}: no path {path:?}", d.dataset.name);
        return send(
            write,
            &serde_json::json!({"type": "error", "message": message}),
        )
        .await;
    };
    let files = tree.files_under(root.ino);
    let bytes_total: u64 = files.iter().map(|f| f.size).sum();
    let files_total = files.len() as u64;
    let files_done = Arc::new(AtomicU64::new(0));
    let bytes_done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let progress = {
        let (fd, bd, er) = (files_done.clone(), bytes_done.clone(), errors.clone());
        move || LoadProgress {
            files_total,
            bytes_total,
            files_done: fd.load(Ordering::Relaxed),
            bytes_done: bd.load(Ordering::Relaxed),
            errors: er.load(Ordering::Relaxed),
        }
    };
    let started = Instant::now();
    let (done_tx, work) = tokio::sync::oneshot::channel::<()>();
    {
        let (d, tree, fd, bd, er) = (
            d.clone(),
            tree.clone(),
            files_done.clone(),
            bytes_done.clone(),
            errors.clone(),
        );
        pool.spawn(move || async move {
            let bs = d.dataset.block_size;
            let blocks = files.iter().flat_map(|f| {
                let EntryKind::File { mount, object } = f.kind else { unreachable!("files_under returns files") };
                let n = f.size.div_ceil(bs);
                (0..n).map(move |i| (mount, object, i, i + 1 == n, f.ino))
            });
            futures::stream::iter(blocks)
                .for_each_concurrent(16, |(mount, object, index, last, ino)| {
                    let (d, tree, fd, bd, er) = (d.clone(), tree.clone(), fd.clone(), bd.clone(), er.clone());
                    async move {
                        match d.dataset.read_block(mount, tree.object(mount, object), index).await {
                            Ok(b) => {
                                bd.fetch_add(b.len() as u64, Ordering::Relaxed);
                            }
                            Err(e) => {
                                er.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(dataset = %d.dataset.name, path = %tree.path_of(ino), cause = %e, "load: block failed");
                            }
                        }
                        if last {
                            fd.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
                .await;
            let _ = done_tx.send(());
        });
    }
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tokio::pin!(work);
    loop {
        tokio::select! {
            _ = &mut work => break,
            _ = tick.tick() => {
                // The client may have gone (Ctrl-C); keep loading anyway, it is a preload.
                let _ = send(write, &serde_json::json!({"type": "progress", "progress": progress()})).await;
            }
        }
    }
    let p = progress();
    tracing::info!(dataset = %d.dataset.name, path, files = p.files_done, bytes = p.bytes_done, errors = p.errors, secs = started.elapsed().as_secs_f64(), "load finished");
    send(write, &serde_json::json!({"type": "done", "progress": p})).await
}
