//! Prometheus metrics on `agent.metricsAddr`: cache hits/misses and usage per tier, bytes
//! served per dataset and origin, source request latency, FUSE operation latency per opcode.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sluice_cache_engine::Cache;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use sluice::dataset::Dataset;

type Labels = Vec<(String, String)>;

fn latency_histogram() -> Histogram {
    // 10 µs … ~20 s
    Histogram::new(exponential_buckets(0.00001, 2.0, 22))
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// The prefetcher's and the autoscaler's families.
    pub control: crate::control::ControlMetrics,
    fuse_op_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    source_request_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    served_bytes: Family<Labels, Counter>,
    fetched_bytes: Family<Labels, Counter>,
    cache_hits: Family<Labels, Counter>,
    cache_misses: Family<Labels, Counter>,
    cache_bytes: Family<Labels, Gauge>,
    cache_capacity_bytes: Family<Labels, Gauge>,
    /// Per-workload stall metrics (filled by the observer).
    pub stalls: crate::observe::metrics::StallMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every family registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let control = crate::control::ControlMetrics::register(&mut registry);
        let fuse_op_seconds = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let source_request_seconds =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            );
        let served_bytes = Family::<Labels, Counter>::default();
        let fetched_bytes = Family::<Labels, Counter>::default();
        let cache_hits = Family::<Labels, Counter>::default();
        let cache_misses = Family::<Labels, Counter>::default();
        let cache_bytes = Family::<Labels, Gauge>::default();
        let cache_capacity_bytes = Family::<Labels, Gauge>::default();
        registry.register(
            "fuse_op_seconds",
            "FUSE operation latency by opcode",
            fuse_op_seconds.clone(),
        );
        registry.register(
            "source_request_seconds",
            "Latency of source (object store) requests",
            source_request_seconds.clone(),
        );
        registry.register(
            "served_bytes",
            "Bytes served per dataset and origin (memory, disk, source)",
            served_bytes.clone(),
        );
        registry.register(
            "source_fetched_bytes",
            "Bytes fetched from the sources per dataset",
            fetched_bytes.clone(),
        );
        registry.register("cache_hits", "Cache hits per tier", cache_hits.clone());
        registry.register("cache_misses", "Cache misses", cache_misses.clone());
        registry.register(
            "cache_usage_bytes",
            "Bytes held per cache tier",
            cache_bytes.clone(),
        );
        registry.register(
            "cache_capacity_bytes",
            "Capacity per cache tier",
            cache_capacity_bytes.clone(),
        );
        let stalls = crate::observe::metrics::StallMetrics::default();
        stalls.register(&mut registry);
        Metrics {
            registry,
            control,
            fuse_op_seconds,
            source_request_seconds,
            served_bytes,
            fetched_bytes,
            cache_hits,
            cache_misses,
            cache_bytes,
            cache_capacity_bytes,
            stalls,
        }
    }

    /// Records one FUSE operation that started at `start`.
    pub fn fuse_op(&self, op: &'static str, start: Instant) {
        self.fuse_op_seconds
            .get_or_create(&vec![("op".into(), op.into())])
            .observe(start.elapsed().as_secs_f64());
    }

    /// Records one source request of `source_id` that started at `start`.
    pub fn source_request(&self, source_id: &str, start: Instant) {
        self.source_request_seconds
            .get_or_create(&vec![("source".into(), source_id.into())])
            .observe(start.elapsed().as_secs_f64());
    }

    /// Copies the cache's and datasets' counters into the families, then encodes them.
    pub fn render(&self, cache: &Cache, datasets: &[Arc<Dataset>]) -> String {
        let stats = cache.stats();
        let tier = |t: &str| vec![("tier".to_string(), t.to_string())];
        let set_counter = |c: &Counter, v: u64| c.inner().store(v, Ordering::Relaxed);
        set_counter(
            &self.cache_hits.get_or_create(&tier("memory")),
            stats.memory.hits,
        );
        self.cache_bytes
            .get_or_create(&tier("memory"))
            .set(stats.memory.bytes as i64);
        self.cache_capacity_bytes
            .get_or_create(&tier("memory"))
            .set(stats.memory.capacity as i64);
        let mut disk_hits = 0;
        for (path, t) in &stats.disks {
            let l = vec![
                ("tier".to_string(), "disk".to_string()),
                ("path".to_string(), path.display().to_string()),
            ];
            self.cache_bytes.get_or_create(&l).set(t.bytes as i64);
            self.cache_capacity_bytes
                .get_or_create(&l)
                .set(t.capacity as i64);
            disk_hits += t.hits;
        }
        set_counter(&self.cache_hits.get_or_create(&tier("disk")), disk_hits);
        let misses: u64 = stats.partitions.iter().map(|p| p.misses).sum();
        set_counter(&self.cache_misses.get_or_create(&vec![]), misses);
        for ds in datasets {
            for (origin, v) in [
                ("memory", &ds.served.memory),
                ("disk", &ds.served.disk),
                ("source", &ds.served.source),
            ] {
                let l = vec![
                    ("dataset".to_string(), ds.name.clone()),
                    ("origin".to_string(), origin.to_string()),
                ];
                set_counter(
                    &self.served_bytes.get_or_create(&l),
                    v.load(Ordering::Relaxed),
                );
            }
            let l = vec![("dataset".to_string(), ds.name.clone())];
            set_counter(
                &self.fetched_bytes.get_or_create(&l),
                ds.served.fetched.load(Ordering::Relaxed),
            );
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("encoding to a String cannot fail");
        out
    }
}

/// Serves `GET /metrics` on `addr` until the task is dropped.
pub async fn serve(
    addr: String,
    metrics: Arc<Metrics>,
    cache: Cache,
    datasets: Vec<Arc<Dataset>>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    tracing::info!(%addr, "metrics listening");
    loop {
        let (mut conn, _) = listener.accept().await?;
        let metrics = metrics.clone();
        let cache = cache.clone();
        let datasets = datasets.clone();
        tokio::spawn(async move {
            // A scrape is one small GET: read the head, answer, close.
            let mut buf = vec![0u8; 4096];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if head.starts_with("GET /metrics") {
                ("200 OK", metrics.render(&cache, &datasets))
            } else {
                ("404 Not Found", "try /metrics\n".to_string())
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes()).await;
        });
    }
}
