//! The control loops: the prefetcher ([`prefetch`]) and the AIMD autoscaler
//! ([`autoscale`]), and what they share: the adjustable prefetch budget ([`Limiter`]), the
//! FUSE side's own stall estimate ([`FuseStalls`], the fallback when the eBPF observer
//! publishes nothing), the source health counters ([`SourceHealth`]) and their metrics.

pub mod autoscale;
pub mod prefetch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use sluice::source::SourceError;

type Labels = Vec<(String, String)>;

/// Prefetch fetches in flight on the node, under a limit the autoscaler moves at runtime
/// (a semaphore whose size can change: acquiring never waits, a full budget means skip).
#[derive(Debug)]
pub struct Limiter {
    limit: AtomicUsize,
    in_flight: AtomicUsize,
    /// Prefetches skipped because the budget was spent (since start).
    pub full: AtomicU64,
}

/// One prefetch slot, released on drop.
#[derive(Debug)]
pub struct Permit(Arc<Limiter>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Limiter {
    pub fn new(limit: usize) -> Arc<Limiter> {
        Arc::new(Limiter {
            limit: AtomicUsize::new(limit),
            in_flight: AtomicUsize::new(0),
            full: AtomicU64::new(0),
        })
    }

    /// A slot if fewer than the limit are in flight; never waits.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let limit = self.limit.load(Ordering::Acquire);
        let got = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        if got {
            Some(Permit(self.clone()))
        } else {
            self.full.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// Changes the limit; slots already taken above a lowered limit run to completion.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Release);
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// Time FUSE reads spent waiting, per reading process: the stall estimate when the eBPF
/// probes are off. A read's time is from the kernel's request to our reply; cache hits
/// answer in microseconds, so what adds up is waiting on source fetches.
#[derive(Debug)]
pub struct FuseStalls {
    /// Sharded by pid: every read of every mount records here.
    waited: Vec<Mutex<HashMap<u32, Duration>>>,
}

const STALL_SHARDS: usize = 16;

impl Default for FuseStalls {
    fn default() -> Self {
        FuseStalls {
            waited: (0..STALL_SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl FuseStalls {
    /// Records `waited` spent in one read by process `pid`.
    pub fn record(&self, pid: u32, waited: Duration) {
        let mut map = self.waited[pid as usize % STALL_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Emptied every tick by the autoscaler; bounded for when none runs.
        if map.len() >= 256 && !map.contains_key(&pid) {
            map.clear();
        }
        *map.entry(pid).or_default() += waited;
    }

    /// The highest stall ratio of any process over `interval` (capped at 1: the kernel
    /// sends a process's readahead in parallel with its read), how many processes waited
    /// at least `threshold` of it; resets the counts.
    pub fn take(&self, interval: Duration, threshold: f64) -> (f64, usize) {
        let secs = interval.as_secs_f64().max(1e-3);
        let mut out = (0.0f64, 0);
        for shard in &self.waited {
            let waited = std::mem::take(&mut *shard.lock().unwrap_or_else(|e| e.into_inner()));
            for w in waited.values() {
                let r = (w.as_secs_f64() / secs).min(1.0);
                out = (out.0.max(r), out.1 + (r > threshold) as usize);
            }
        }
        out
    }
}

/// Source requests that failed since start, and which of them were throttling (HTTP 503,
/// 429, SlowDown, "throttl…"): what the autoscaler cuts back on.
#[derive(Debug, Default)]
pub struct SourceHealth {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub throttled: AtomicU64,
}

impl SourceHealth {
    /// Counts one request's outcome.
    pub fn record<T>(&self, result: &Result<T, SourceError>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            // A vanished or changed object is the dataset's problem, not the store's load.
            if matches!(
                e,
                SourceError::NotFound { .. } | SourceError::Changed { .. }
            ) {
                return;
            }
            self.errors.fetch_add(1, Ordering::Relaxed);
            if is_throttling(&e.to_string()) {
                self.throttled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Whether an error message says the store is shedding load.
pub fn is_throttling(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "503",
        "429",
        "slowdown",
        "slow down",
        "throttl",
        "too many requests",
        "serviceunavailable",
        "service unavailable",
        "reduce your request rate",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// The control loops' Prometheus families (registered with the agent's registry).
#[derive(Clone, Default)]
pub struct ControlMetrics {
    /// Blocks fetched ahead, by kind (readahead, dir, epoch).
    pub prefetched_blocks: Family<Labels, Counter>,
    /// Prefetched blocks a reader read later.
    pub prefetch_hits: Counter,
    /// Prefetched blocks no reader read while they were tracked.
    pub prefetch_wasted: Counter,
    /// Prefetches not issued, by reason (full: budget spent; quota: epoch partition at its
    /// quota; room: the cache has no free room for a speculative fetch).
    pub prefetch_skipped: Family<Labels, Counter>,
    /// The prefetch budget now, and how much of it is in use.
    pub prefetch_concurrency: Gauge,
    pub prefetch_in_flight: Gauge,
    /// The memory tier's budget as the autoscaler set it.
    pub memory_bytes: Gauge,
    /// Autoscaler decisions by knob (prefetch, memory) and direction (up, down, decay).
    pub autoscale_decisions: Family<Labels, Counter>,
    /// The stall ratio the autoscaler last acted on.
    pub stall_ratio: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Source request failures by kind (error, throttled).
    pub source_failures: Family<Labels, Counter>,
}

impl std::fmt::Debug for ControlMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlMetrics").finish_non_exhaustive()
    }
}

impl ControlMetrics {
    /// New families, registered in `registry`.
    pub fn register(registry: &mut Registry) -> ControlMetrics {
        let m = ControlMetrics::default();
        registry.register(
            "prefetch_blocks",
            "Blocks prefetched, by kind (readahead, dir, epoch)",
            m.prefetched_blocks.clone(),
        );
        registry.register(
            "prefetch_hits",
            "Prefetched blocks later read by a reader",
            m.prefetch_hits.clone(),
        );
        registry.register(
            "prefetch_wasted",
            "Prefetched blocks not read while tracked",
            m.prefetch_wasted.clone(),
        );
        registry.register(
            "prefetch_skipped",
            "Prefetches not issued, by reason (full, quota, room)",
            m.prefetch_skipped.clone(),
        );
        registry.register(
            "prefetch_concurrency",
            "Prefetch fetches allowed in flight (set by the autoscaler)",
            m.prefetch_concurrency.clone(),
        );
        registry.register(
            "prefetch_in_flight",
            "Prefetch fetches in flight",
            m.prefetch_in_flight.clone(),
        );
        registry.register(
            "autoscale_memory_bytes",
            "Memory tier budget set by the autoscaler",
            m.memory_bytes.clone(),
        );
        registry.register(
            "autoscale_decisions",
            "Autoscaler decisions by knob (prefetch, memory) and direction (up, down, decay)",
            m.autoscale_decisions.clone(),
        );
        registry.register(
            "autoscale_stall_ratio",
            "Highest workload stall ratio in the autoscaler's last tick",
            m.stall_ratio.clone(),
        );
        registry.register(
            "source_failures",
            "Failed source requests by kind (error, throttled)",
            m.source_failures.clone(),
        );
        m
    }

    pub fn skipped(&self, reason: &str) {
        self.prefetch_skipped
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    pub fn prefetched(&self, kind: &str) {
        self.prefetched_blocks
            .get_or_create(&vec![("kind".into(), kind.into())])
            .inc();
    }

    pub fn decision(&self, knob: &str, direction: &str) {
        self.autoscale_decisions
            .get_or_create(&vec![
                ("knob".into(), knob.into()),
                ("direction".into(), direction.into()),
            ])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_limit_moves_at_runtime() {
        let l = Limiter::new(2);
        let a = l.try_acquire().unwrap();
        let _b = l.try_acquire().unwrap();
        assert!(l.try_acquire().is_none());
        l.set_limit(3);
        let _c = l.try_acquire().unwrap();
        l.set_limit(1);
        drop(a);
        assert!(l.try_acquire().is_none(), "2 in flight over a limit of 1");
        assert_eq!(l.in_flight(), 2);
        assert_eq!(l.full.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn fuse_stalls_take_the_worst_process() {
        let s = FuseStalls::default();
        s.record(1, Duration::from_millis(300));
        s.record(1, Duration::from_millis(300));
        s.record(2, Duration::from_millis(50));
        s.record(3, Duration::from_secs(5));
        let (max, n) = s.take(Duration::from_secs(1), 0.1);
        assert_eq!(max, 1.0);
        assert_eq!(n, 2);
        assert_eq!(s.take(Duration::from_secs(1), 0.1), (0.0, 0));
    }

    #[test]
    fn throttling_is_recognised() {
        assert!(is_throttling(
            "s3: Server returned non-2xx status code: 503 Service Unavailable: SlowDown"
        ));
        assert!(is_throttling("HTTP 429 Too Many Requests"));
        assert!(!is_throttling("access denied"));
    }
}
