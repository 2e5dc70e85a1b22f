//! Per-workload stall metrics. Labels: `kind` (pod, unit, cgroup), `namespace`, `pod`,
//! `pod_uid`, `unit`, `cgroup` (only for kind=cgroup); series of workloads whose cgroups
//! are gone are removed, so cardinality follows the workloads alive on the node.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use super::model::Acc;
use super::report::Identity;

type Labels = Vec<(String, String)>;

/// Log2 buckets exported: upper bounds 2^(i+1) ns for i in FIRST..=LAST (1 µs … ~69 s).
const FIRST: usize = 9;
const LAST: usize = 35;

/// A histogram set from the kernel's cumulative log2 buckets (not observed value by value).
#[derive(Clone, Debug, Default)]
pub struct Log2Histogram {
    inner: Arc<Mutex<(Vec<u64>, u64)>>,
}

impl Log2Histogram {
    fn set(&self, buckets: &[u64], sum_ns: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *g = (buckets.to_vec(), sum_ns);
    }
}

impl TypedMetric for Log2Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Log2Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (buckets, sum_ns) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let count: u64 = buckets.iter().sum();
        let mut out = Vec::with_capacity(LAST - FIRST + 2);
        let below: u64 = buckets.iter().take(FIRST + 1).sum();
        out.push(((1u64 << (FIRST + 1)) as f64 / 1e9, below));
        for i in FIRST + 1..=LAST {
            out.push((
                (1u64 << (i + 1)) as f64 / 1e9,
                buckets.get(i).copied().unwrap_or(0),
            ));
        }
        let above: u64 = buckets.iter().skip(LAST + 1).sum();
        out.push((f64::MAX, above));
        encoder.encode_histogram::<NoLabelSet>(sum_ns as f64 / 1e9, count, &out, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The stall families (registered in the agent's registry by `Metrics::new`).
#[derive(Debug, Default)]
pub struct StallMetrics {
    stall_seconds: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
    wall_seconds: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
    read_bytes: Family<Labels, Counter>,
    read_calls: Family<Labels, Counter>,
    read_latency: Family<Labels, Log2Histogram>,
    lost: Family<Labels, Counter>,
    /// 1 while the probes are loaded.
    pub probes_loaded: Gauge,
}

fn labels(id: &Identity) -> Labels {
    let o = |v: &Option<String>| v.clone().unwrap_or_default();
    vec![
        ("kind".into(), id.kind.clone()),
        ("namespace".into(), o(&id.pod_namespace)),
        ("pod".into(), o(&id.pod_name)),
        ("pod_uid".into(), o(&id.pod_uid)),
        ("unit".into(), o(&id.unit)),
        (
            "cgroup".into(),
            if id.kind == "cgroup" {
                id.cgroup.clone()
            } else {
                String::new()
            },
        ),
    ]
}

impl StallMetrics {
    /// Registers every family under `registry` (prefix `sluice_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "workload_stall_seconds",
            "Time a workload's threads were blocked in dataset reads (summed over threads)",
            self.stall_seconds.clone(),
        );
        registry.register(
            "workload_wall_seconds",
            "Wall time a workload has been observed since its first dataset read",
            self.wall_seconds.clone(),
        );
        registry.register(
            "workload_read_bytes",
            "Bytes a workload's dataset reads returned",
            self.read_bytes.clone(),
        );
        registry.register(
            "workload_reads",
            "Dataset read calls of a workload",
            self.read_calls.clone(),
        );
        registry.register(
            "workload_read_latency_seconds",
            "Dataset read latency of a workload (kernel log2 buckets)",
            self.read_latency.clone(),
        );
        registry.register(
            "stall_probe_lost_events",
            "Probe events dropped by the kernel (what=samples: ring buffer full; what=counters: stats map full)",
            self.lost.clone(),
        );
        registry.register(
            "stall_probes_loaded",
            "1 while the eBPF stall probes are loaded",
            self.probes_loaded.clone(),
        );
    }

    /// Sets the lost-event counters to the kernel's totals.
    pub fn set_lost(&self, samples: u64, counters: u64) {
        for (what, v) in [("samples", samples), ("counters", counters)] {
            self.lost
                .get_or_create(&vec![("what".into(), what.into())])
                .inner()
                .store(v, Ordering::Relaxed);
        }
    }

    /// Copies every workload's totals in and removes the series of dropped workloads.
    pub fn update<'a>(
        &self,
        totals: impl Iterator<Item = (&'a Identity, &'a Acc)>,
        dropped: &[Identity],
    ) {
        for (id, acc) in totals {
            let l = labels(id);
            self.stall_seconds
                .get_or_create(&l)
                .inner()
                .store((acc.blocked_ns as f64 / 1e9).to_bits(), Ordering::Relaxed);
            self.wall_seconds
                .get_or_create(&l)
                .inner()
                .store((acc.wall_ns as f64 / 1e9).to_bits(), Ordering::Relaxed);
            self.read_bytes
                .get_or_create(&l)
                .inner()
                .store(acc.bytes, Ordering::Relaxed);
            self.read_calls
                .get_or_create(&l)
                .inner()
                .store(acc.calls, Ordering::Relaxed);
            self.read_latency
                .get_or_create(&l)
                .set(&acc.hist, acc.latency_ns);
        }
        for id in dropped {
            let l = labels(id);
            self.stall_seconds.remove(&l);
            self.wall_seconds.remove(&l);
            self.read_bytes.remove(&l);
            self.read_calls.remove(&l);
            self.read_latency.remove(&l);
        }
    }
}
