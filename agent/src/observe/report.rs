//! What `sluice stalls` shows: the admin API's `stalls` answer (JSON, camelCase).

use serde::{Deserialize, Serialize};

/// The whole answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StallsReport {
    /// `ebpf` (per-workload figures from the probes) or `off` (probes not loaded: see
    /// `disabledReason`).
    pub from: String,
    /// Why the probes are not running, when they are not.
    pub disabled_reason: Option<String>,
    /// `stallsOnly` when the probes measure stall time only (`agent.stalls.mode`): read
    /// counts, bytes, latency, hit ratio and top waits are then not measured.
    #[serde(default)]
    pub stalls_only: bool,
    /// Optional tracepoints this kernel lacks (`fuse/…`, `filemap/…`): what they measure is
    /// missing from the figures.
    #[serde(default)]
    pub unavailable: Vec<String>,
    /// Tick length.
    pub tick_seconds: f64,
    /// The `recent` figures cover this many seconds (at most).
    pub window_seconds: f64,
    /// Watched paths: dataset mounts and configured prefixes.
    #[serde(default)]
    pub watched: Vec<String>,
    /// Sampled accesses the kernel could not hand over (ring buffer full), since start.
    pub lost_events: u64,
    /// Counter updates the kernel dropped (stats map full), since start.
    pub lost_stat_updates: u64,
    /// Dataset reads the probes counted per second over the last tick (all workloads).
    pub events_per_second: f64,
    /// One entry per pod, systemd unit or other cgroup that read a watched path.
    pub workloads: Vec<WorkloadReport>,
}

/// Who a workload is, as far as the node can tell.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// `pod`, `unit` or `cgroup`.
    pub kind: String,
    pub pod_uid: Option<String>,
    /// From kubelet's pod log directory (`<namespace>_<name>_<uid>`), when present.
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    /// QoS class of the pod.
    pub qos: Option<String>,
    /// systemd unit.
    pub unit: Option<String>,
    /// A cgroup path of the workload (for a pod: one of its containers' or its own).
    pub cgroup: String,
    /// Names (comm) of processes seen reading, from the sampled accesses.
    #[serde(default)]
    pub processes: Vec<String>,
}

impl Identity {
    /// A short name for tables and logs: `pod ns/name`, `pod <uid>`, `unit x.service`,
    /// `cgroup /path (comm)`.
    pub fn display(&self) -> String {
        match self.kind.as_str() {
            "pod" => match (&self.pod_namespace, &self.pod_name) {
                (Some(ns), Some(name)) => format!("pod {ns}/{name}"),
                _ => format!("pod {}", self.pod_uid.as_deref().unwrap_or("?")),
            },
            "unit" => format!("unit {}", self.unit.as_deref().unwrap_or("?")),
            _ => match self.processes.first() {
                Some(p) => format!("{} ({p})", self.cgroup),
                None => self.cgroup.clone(),
            },
        }
    }
}

/// Figures over a span of time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    /// Wall time covered (ticks in which the workload was observed).
    pub wall_seconds: f64,
    /// Time its threads spent blocked (off CPU, not runnable) inside dataset reads, summed
    /// over threads: the fetch stall.
    pub stalled_seconds: f64,
    /// stalled / wall; above 1 when several threads waited at once.
    pub stall_ratio: f64,
    pub read_calls: u64,
    pub read_bytes: u64,
    pub read_errors: u64,
    pub mib_per_second: f64,
    /// Read latency quantiles (upper bound of the log2 bucket), milliseconds.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Share of the read bytes that Sluice did not have to fetch from the source (page
    /// cache, or Sluice's memory/disk tiers). Page-cache misses are the kernel's count for
    /// this workload; the share of them fetched from the source is the dataset's (bytes
    /// fetched / bytes answered to FUSE reads, over the same ticks, prefetch included), so
    /// with several readers on one dataset it is an estimate. `None` without reads or
    /// without the filemap tracepoint.
    pub hit_ratio: Option<f64>,
    /// Share of the read bytes the page cache had (kernel count for this workload).
    pub page_cache_hit_ratio: Option<f64>,
}

/// Where a workload waited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Wait {
    /// `dataset/path` for a dataset file, a directory ending in `/`, or `dev:ino` when the
    /// file cannot be named.
    pub path: String,
    /// Estimated blocked seconds (sampled accesses × sampling rate).
    pub stalled_seconds: f64,
    /// Share of this workload's sampled blocked time.
    pub share: f64,
}

/// One workload's dataset reads on one watched path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatasetFigures {
    /// Dataset name or watched prefix.
    pub name: String,
    pub stalled_seconds: f64,
    pub read_bytes: u64,
}

/// One workload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    pub identity: Identity,
    /// Since the workload's first dataset read seen by this agent.
    pub total: Figures,
    /// Over the last `windowSeconds`.
    pub recent: Figures,
    /// In a stall episode now.
    pub stalling: bool,
    /// Every cgroup of the workload has been removed (kept a while, then forgotten).
    pub gone: bool,
    pub datasets: Vec<DatasetFigures>,
    /// Files with the most blocked time (sampled), most first.
    pub top_files: Vec<Wait>,
    /// Directories with the most blocked time (sampled), most first.
    pub top_dirs: Vec<Wait>,
}
