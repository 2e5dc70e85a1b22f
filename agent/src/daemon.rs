//! `sluice agent`: opens the cache, builds the datasets, loads (or lists) their metadata,
//! mounts them, serves the admin API and metrics, and unmounts on SIGTERM/SIGINT.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use sluice::config::Config;
use sluice::dataset::{Dataset, DatasetMount};
use sluice::source::{ObjectInfo, Source, SourceError};

use crate::admin::{AdminState, ServedDataset, list_all};
use crate::control::autoscale::Autoscaler;
use crate::control::prefetch::Prefetcher;
use crate::control::{FuseStalls, Limiter, SourceHealth};
use crate::fuse::fdstore::FdStore;
use crate::fuse::{DatasetFs, MountedDataset};
use crate::meta::{MetaCache, Tree};
use crate::metrics::Metrics;

/// A source that records each request's latency in the metrics, and its failures for the
/// autoscaler.
#[derive(Debug)]
struct TimedSource {
    inner: Arc<dyn Source>,
    metrics: Arc<Metrics>,
    health: Arc<SourceHealth>,
}

#[async_trait]
impl Source for TimedSource {
    fn id(&self) -> &str {
        self.inner.id()
    }
    async fn list(&self) -> Result<Vec<ObjectInfo>, SourceError> {
        let start = Instant::now();
        let r = self.inner.list().await;
        self.metrics.source_request(self.inner.id(), start);
        r
    }
    async fn read(
        &self,
        object: &ObjectInfo,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, SourceError> {
        let start = Instant::now();
        let r = self.inner.read(object, range).await;
        self.metrics.source_request(self.inner.id(), start);
        self.health.record(&r);
        r
    }
}

/// Parses "30s", "10m", "2h", "1d" or plain seconds.
fn parse_interval(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..split].parse().ok()?;
    let mult = match &s[split..] {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return None,
    };
    Some(Duration::from_secs(n * mult))
}

/// Runs the agent in the foreground until SIGTERM or SIGINT.
pub async fn run(config_path: &Path) -> Result<()> {
    let config =
        Config::load(config_path).with_context(|| format!("loading {}", config_path.display()))?;
    let agent = config.agent.clone();
    // Two agents on one kept FUSE connection would answer each other's requests.
    if std::os::unix::net::UnixStream::connect(&agent.admin_socket).is_ok() {
        anyhow::bail!(
            "an agent is already running on {}: stop it first",
            agent.admin_socket.display()
        );
    }
    std::fs::create_dir_all(&agent.state_dir)
        .with_context(|| format!("creating stateDir {}", agent.state_dir.display()))?;

    let builder = agent.cache_builder().map_err(anyhow::Error::msg)?;
    let cache = tokio::task::spawn_blocking(move || builder.open())
        .await?
        .context("opening the cache")?;
    let engine = cache.engine();
    match &engine.fallback_reason {
        Some(why) => {
            tracing::warn!(engine = ?engine.kind, fallback_reason = %why, "cache engine (fallback)")
        }
        None => tracing::info!(engine = ?engine.kind, "cache engine"),
    }

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(SourceHealth::default());
    let mut served = Vec::new();
    for spec in &config.datasets {
        let mut ds = Dataset::open(spec, &cache, agent.block_size.0)?;
        for m in &mut ds.mounts {
            *m = DatasetMount {
                name: m.name.clone(),
                source: Arc::new(TimedSource {
                    inner: m.source.clone(),
                    metrics: metrics.clone(),
                    health: health.clone(),
                }),
            };
        }
        let ds = Arc::new(ds);
        let meta_path = agent
            .state_dir
            .join("meta")
            .join(format!("{}.json", ds.name));
        let tree = match Tree::load(&meta_path) {
            Ok(Some(t))
                if t.mounts.len() == ds.mounts.len()
                    && t.mounts
                        .iter()
                        .zip(&ds.mounts)
                        .all(|(a, b)| a.name == b.name) =>
            {
                tracing::info!(dataset = %ds.name, path = %meta_path.display(), "metadata loaded from stateDir (no listing)");
                t
            }
            other => {
                if let Err(e) = other {
                    tracing::warn!(dataset = %ds.name, error = %e, "ignoring persisted metadata");
                }
                let started = Instant::now();
                let listings = list_all(&ds).await.map_err(anyhow::Error::msg)?;
                let t = Tree::build(listings, None);
                t.save(&meta_path)?;
                let (files, bytes) = t.totals();
                tracing::info!(dataset = %ds.name, files, bytes, secs = started.elapsed().as_secs_f64(), "listed");
                t
            }
        };
        served.push(Arc::new(ServedDataset {
            mount_point: agent.mount_root.join(&ds.name),
            dataset: ds,
            meta: Arc::new(MetaCache::new(tree)),
            meta_path,
            notifier: std::sync::OnceLock::new(),
        }));
    }

    // Listing and parsing left their transient allocations (every key as a String, the JSON
    // of the persisted tree) in the allocator's free pages; give them back so the agent's
    // resident size is what the compact trees hold.
    crate::alloc::release_free_memory();

    // The fd keeper outlives us, so a crash leaves mounts alive for the next agent.
    let store = match FdStore::connect_or_spawn(&agent.state_dir.join("fdstore.sock")) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no fd keeper: mounts will be remounted (not resumed) after a crash");
            None
        }
    };

    let pool = Arc::new(crate::fuse::pool::ReadPool::new(4)?);
    // The control loops: one prefetch budget for the node, a prefetcher per dataset, the
    // FUSE side's stall estimate (the autoscaler's signal while the observer is silent).
    let limiter = agent
        .prefetch
        .enabled
        .then(|| Limiter::new(agent.prefetch.concurrency));
    if let Some(l) = &limiter {
        metrics.control.prefetch_concurrency.set(l.limit() as i64);
    }
    let fuse_stalls = Arc::new(FuseStalls::default());
    let mut mounted: Vec<MountedDataset> = Vec::new();
    for (d, spec) in served.iter().zip(&config.datasets) {
        let prefetch = limiter.as_ref().map(|l| {
            let policy = spec
                .spec
                .cache
                .partition_config()
                .map(|p| p.policy)
                .unwrap_or_default();
            Arc::new(Prefetcher::new(
                d.dataset.clone(),
                cache.clone(),
                policy,
                pool.clone(),
                l.clone(),
                metrics.control.clone(),
                agent.prefetch.clone(),
            ))
        });
        let fs = DatasetFs::new(
            d.dataset.clone(),
            d.meta.clone(),
            pool.clone(),
            metrics.clone(),
            prefetch,
            fuse_stalls.clone(),
        );
        let mp = d.mount_point.clone();
        let st = store.clone();
        let m =
            tokio::task::spawn_blocking(move || crate::fuse::serve(fs, &mp, st.as_ref())).await??;
        tracing::info!(dataset = %d.dataset.name, resumed = m.resumed, "serving");
        let _ = d.notifier.set(m.notifier());
        mounted.push(m);
    }

    // The stall signal: the observer produces it, the control loops subscribe to
    // `stall_rx` (clone it; the latest tick wins).
    let (stall_tx, stall_rx) = crate::signal::channel();
    let watched = served
        .iter()
        .zip(&config.datasets)
        .map(|(d, spec)| {
            let mut kinds: Vec<String> = spec
                .spec
                .mounts
                .iter()
                .map(|m| crate::observe::source_kind(&m.mount_point))
                .collect();
            kinds.dedup();
            crate::observe::WatchedDataset {
                served: d.clone(),
                source: kinds.join("+"),
            }
        })
        .collect();
    let (stalls, observer) =
        crate::observe::start(agent.stalls.clone(), watched, metrics.clone(), stall_tx).await;

    let state = Arc::new(AdminState {
        cache: cache.clone(),
        datasets: served.clone(),
        pool: pool.clone(),
        stalls,
    });
    let mut tasks = vec![observer];
    if agent.autoscale.enabled {
        let scaler = Autoscaler::new(
            &agent,
            cache.clone(),
            limiter.clone(),
            stall_rx.clone(),
            fuse_stalls.clone(),
            health.clone(),
            metrics.control.clone(),
        );
        tracing::info!(
            prefetch = ?limiter.as_ref().map(|l| l.limit()),
            memory = agent.cache.memory.0,
            "autoscaler on"
        );
        tasks.push(tokio::spawn(scaler.run()));
    }
    tasks.push(tokio::spawn({
        let (path, state) = (agent.admin_socket.clone(), state.clone());
        async move {
            if let Err(e) = crate::admin::serve(path.clone(), state).await {
                tracing::error!(socket = %path.display(), error = %e, "admin API stopped");
            }
        }
    }));
    if let Some(addr) = agent.metrics_addr.clone() {
        let datasets: Vec<_> = served.iter().map(|d| d.dataset.clone()).collect();
        let (m, c) = (metrics.clone(), cache.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(addr.clone(), m, c, datasets).await {
                tracing::error!(%addr, error = %e, "metrics endpoint stopped");
            }
        }));
    }
    for (d, spec) in served.iter().zip(&config.datasets) {
        let Some(every) = spec.spec.cache.refresh_interval.as_deref() else {
            continue;
        };
        let Some(every) = parse_interval(every) else {
            tracing::warn!(dataset = %d.dataset.name, value = every, "unusable refreshInterval (use e.g. 30s, 10m, 1h)");
            continue;
        };
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = d.refresh().await {
                    tracing::warn!(dataset = %d.dataset.name, error = %e, "refresh failed; keeping the previous listing");
                }
            }
        }));
    }
    tracing::info!(datasets = served.len(), mount_root = %agent.mount_root.display(), "agent ready");

    wait_for_shutdown().await;
    tracing::info!("shutting down: unmounting");
    for t in tasks {
        t.abort();
        // Dropping the observer's task unloads the probes before the mounts go.
        let _ = t.await;
    }
    drop(stall_rx);
    for m in mounted {
        m.unmount(store.as_ref());
    }
    if let Some(store) = &store {
        let _ = store.exit();
    }
    let _ = std::fs::remove_file(&agent.admin_socket);
    cache.close().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The default config file, for CLI commands given neither `--config` nor `--admin-socket`.
pub fn default_config_path() -> PathBuf {
    PathBuf::from("/etc/sluice/sluice.yaml")
}
