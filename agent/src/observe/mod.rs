//! Stall observation: loads the eBPF probes on every dataset mount (and configured path
//! prefixes), turns their counters into per-workload figures every tick, publishes the
//! stall signal for the control loops, logs stall episodes, exports per-workload metrics
//! and keeps the report `sluice stalls` shows.
//!
//! Without privileges or kernel support the agent runs on: one warning names what is
//! missing, and nothing is published on the signal (the control loops then fall back to
//! the FUSE side's own per-process read wait, `control::FuseStalls`).

pub mod metrics;
pub mod model;
pub mod report;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sluice::config::{StallsConfig, StallsMode};
use sluice_ebpf_probes::cgroup::{CgroupResolver, Workload, cgroup2_root};
use sluice_ebpf_probes::{ProbeConfig, ProbeMode, Probes};

use crate::admin::ServedDataset;
use crate::metrics::Metrics;
use crate::signal::StallSender;
use model::{Model, ModelConfig, Namer, Served, WatchInfo, WorkloadKey};
use report::{Identity, StallsReport};

/// The latest report, shared with the admin API.
pub type SharedReport = Arc<RwLock<StallsReport>>;

/// A dataset as the observer sees it.
#[derive(Debug, Clone)]
pub struct WatchedDataset {
    pub served: Arc<ServedDataset>,
    /// Source kinds of its mounts (`s3`, `file`, …), joined with `+`.
    pub source: String,
}

/// The source kind of a `mountPoint` URL (`s3://…` → `s3`).
pub fn source_kind(mount_point: &str) -> String {
    mount_point
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_else(|| "file".into())
}

/// Starts observing; returns the shared report and the task (aborting it unloads the
/// probes). Never fails: probe problems degrade to the FUSE fallback.
pub async fn start(
    config: StallsConfig,
    datasets: Vec<WatchedDataset>,
    metrics: Arc<Metrics>,
    signal: StallSender,
) -> (SharedReport, tokio::task::JoinHandle<()>) {
    let tick = Duration::from_millis(config.tick_millis);
    let shared: SharedReport = Arc::new(RwLock::new(StallsReport {
        from: "off".into(),
        tick_seconds: tick.as_secs_f64(),
        ..Default::default()
    }));
    let mut watches = Vec::new();
    let mut probe_config = ProbeConfig::default()
        .mode(match config.mode {
            StallsMode::PerRead => ProbeMode::PerRead,
            StallsMode::StallsOnly => ProbeMode::StallsOnly,
        })
        .sample_every(config.sample_every)
        .time_every(config.time_every);
    let mut by_mount = Vec::new();
    let mut watched = Vec::new();
    for d in &datasets {
        probe_config = probe_config.watch_filesystem(&d.served.mount_point);
        watches.push(WatchInfo {
            name: d.served.dataset.name.clone(),
            source: Some(d.source.clone()),
        });
        by_mount.push(Some(d.served.clone()));
        watched.push(d.served.mount_point.display().to_string());
    }
    for p in &config.watch_prefixes {
        if !p.is_dir() {
            tracing::warn!(prefix = %p.display(), "agent.stalls.watchPrefixes: not a directory; not watched");
            continue;
        }
        probe_config = probe_config.watch_prefix(p);
        watches.push(WatchInfo {
            name: p.display().to_string(),
            source: None,
        });
        by_mount.push(None);
        watched.push(p.display().to_string());
    }
    shared.write().expect("report lock").watched = watched;

    let probes = if !config.enabled {
        Err("disabled in the configuration (agent.stalls.enabled: false)".to_string())
    } else {
        match tokio::task::spawn_blocking(move || Probes::load(probe_config)).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("loading the probes panicked: {e}")),
        }
    };
    let task = match probes {
        Ok(probes) => {
            let unavailable = probes.unavailable().to_vec();
            let unavailable_filemap = unavailable.iter().any(|u| u.starts_with("filemap/"));
            tracing::info!(
                watched = by_mount.len(),
                missing = ?unavailable,
                "stall probes loaded: per-workload stalls on"
            );
            metrics.stalls.probes_loaded.set(1);
            {
                let mut r = shared.write().expect("report lock");
                r.from = "ebpf".into();
                r.stalls_only = config.mode == StallsMode::StallsOnly;
                r.unavailable = unavailable;
            }
            let model = Model::new(
                ModelConfig {
                    episode_min_ratio: config.episode_min_ratio,
                    episode_log_every: Duration::from_secs(config.episode_log_secs.max(1)),
                    window_ticks: (10_000 / config.tick_millis.max(1)).max(1) as usize,
                    sample_every: config.sample_every,
                    misses_measured: !unavailable_filemap,
                    ..Default::default()
                },
                watches,
            );
            let namer = RealNamer::new(by_mount, config.pod_log_dir.clone());
            let observer = Observer {
                probes,
                model,
                namer,
                metrics,
                signal,
                shared: shared.clone(),
                tick,
                lost_logged: (0, 0),
                lost_logged_at: None,
            };
            tokio::spawn(observer.run())
        }
        Err(why) => {
            // The one line that says stalls are off, and why. Nothing is published on the
            // signal: the control loops then use the FUSE side's own per-process wait.
            tracing::warn!(reason = %why, "stall probes not loaded: per-workload stalls off (the control loops fall back to FUSE read wait)");
            metrics.stalls.probes_loaded.set(0);
            drop(signal);
            shared.write().expect("report lock").disabled_reason = Some(why);
            tokio::spawn(async {})
        }
    };
    (shared, task)
}

struct Observer {
    probes: Probes,
    model: Model,
    namer: RealNamer,
    metrics: Arc<Metrics>,
    signal: StallSender,
    shared: SharedReport,
    tick: Duration,
    lost_logged: (u64, u64),
    lost_logged_at: Option<Instant>,
}

/// Sampled accesses are drained this often, so the ring buffer does not fill between ticks.
const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// Removed cgroups are looked for every this many ticks.
const GONE_CHECK_TICKS: u64 = 5;

impl Observer {
    async fn run(mut self) {
        let mut drain = tokio::time::interval(DRAIN_EVERY.min(self.tick));
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The counters so far (reads before the first tick) are the baseline.
        let mut last = Instant::now();
        let mut ticks = 0u64;
        loop {
            drain.tick().await;
            let accesses = self.probes.drain_accesses();
            self.model.add_accesses(&accesses, &mut self.namer);
            let now = Instant::now();
            if now - last < self.tick {
                continue;
            }
            let interval = now - last;
            last = now;
            ticks += 1;
            if let Err(e) = self.tick(interval, ticks) {
                tracing::warn!(error = %e, "stall probes: reading the counters failed; skipping a tick");
            }
        }
    }

    fn tick(&mut self, interval: Duration, n: u64) -> Result<(), sluice_ebpf_probes::ProbeError> {
        let stats = self.probes.snapshot()?;
        let served = self.namer.served();
        let out = self.model.tick(interval, &stats, &served, &mut self.namer);
        self.signal.send_replace(out.signal);
        for e in &out.episodes {
            let who = &e.who;
            tracing::info!(
                kind = %who.kind,
                pod_uid = who.pod_uid.as_deref().unwrap_or(""),
                pod = %format!("{}/{}", who.pod_namespace.as_deref().unwrap_or(""), who.pod_name.as_deref().unwrap_or("")),
                unit = who.unit.as_deref().unwrap_or(""),
                cgroup = %who.cgroup,
                stalled_s = e.stalled.as_secs_f64(),
                wall_s = e.wall.as_secs_f64(),
                read_bytes = e.read_bytes,
                ongoing = e.ongoing,
                "{}",
                e.message()
            );
        }
        if n.is_multiple_of(GONE_CHECK_TICKS) {
            let gone: Vec<u64> = self
                .model
                .cgroups()
                .filter(|id| self.namer.is_gone(*id))
                .collect();
            for id in gone {
                self.model.cgroup_gone(id);
                self.namer.forget(id);
                if let Err(e) = self.probes.forget_cgroup(id) {
                    tracing::debug!(cgroup = id, error = %e, "forgetting a removed cgroup's counters");
                }
            }
        }
        let lost = (self.probes.lost_events()?, self.probes.lost_stat_updates()?);
        self.metrics.stalls.set_lost(lost.0, lost.1);
        if lost != self.lost_logged
            && self
                .lost_logged_at
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(
                lost_samples = lost.0 - self.lost_logged.0,
                lost_counter_updates = lost.1 - self.lost_logged.1,
                total_lost_samples = lost.0,
                total_lost_counter_updates = lost.1,
                "stall probes lost events (ring buffer or stats map full): figures undercount"
            );
            self.lost_logged = lost;
            self.lost_logged_at = Some(Instant::now());
        }
        let workloads = self.model.report(&self.namer);
        self.metrics
            .stalls
            .update(self.model.totals(), &out.dropped);
        let mut r = self.shared.write().expect("report lock");
        r.window_seconds = self.model_window_seconds();
        r.tick_seconds = self.tick.as_secs_f64();
        r.lost_events = lost.0;
        r.lost_stat_updates = lost.1;
        r.events_per_second = self.model.events_per_second();
        r.workloads = workloads;
        Ok(())
    }

    fn model_window_seconds(&self) -> f64 {
        (10_000 / self.tick.as_millis().max(1)).max(1) as f64 * self.tick.as_secs_f64()
    }
}

/// Names cgroups, pods, files and processes from the live system.
struct RealNamer {
    root: Option<PathBuf>,
    resolver: Option<CgroupResolver>,
    /// id → (workload, cgroup path), or `None` (not found; retried after a while).
    known: HashMap<u64, Result<(WorkloadKey, Identity), Instant>>,
    mounts: Vec<Option<Arc<ServedDataset>>>,
    pod_log_dir: PathBuf,
    pods: HashMap<String, (String, String)>,
    pods_scanned: Option<Instant>,
}

impl RealNamer {
    fn new(mounts: Vec<Option<Arc<ServedDataset>>>, pod_log_dir: PathBuf) -> Self {
        let root = cgroup2_root();
        Self {
            resolver: root.clone().map(CgroupResolver::new),
            root,
            known: HashMap::new(),
            mounts,
            pod_log_dir,
            pods: HashMap::new(),
            pods_scanned: None,
        }
    }

    fn served(&self) -> Vec<Option<Served>> {
        self.mounts
            .iter()
            .map(|m| {
                m.as_ref().map(|d| {
                    let s = &d.dataset.served;
                    Served {
                        served: s.memory.load(Ordering::Relaxed)
                            + s.disk.load(Ordering::Relaxed)
                            + s.source.load(Ordering::Relaxed),
                        fetched: s.fetched.load(Ordering::Relaxed),
                    }
                })
            })
            .collect()
    }

    /// kubelet's `<namespace>_<name>_<uid>` directories name a pod UID.
    fn pod_name(&mut self, uid: &str) -> Option<(String, String)> {
        if !self.pods.contains_key(uid)
            && self
                .pods_scanned
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            self.pods_scanned = Some(Instant::now());
            self.pods = scan_pod_logs(&self.pod_log_dir);
        }
        self.pods.get(uid).cloned()
    }

    fn is_gone(&self, id: u64) -> bool {
        let (Some(root), Some(known)) = (&self.root, self.known.get(&id)) else {
            return false;
        };
        let ident = match known {
            Ok((_, ident)) => ident,
            // Never found: gone once it has stayed unknown for a while.
            Err(t) => return t.elapsed() >= Duration::from_secs(30),
        };
        let dir = root.join(ident.cgroup.trim_start_matches('/'));
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).map_or(true, |m| m.ino() != id)
    }

    fn forget(&mut self, id: u64) {
        self.known.remove(&id);
    }
}

fn scan_pod_logs(dir: &Path) -> HashMap<String, (String, String)> {
    let mut out = HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Namespaces and names cannot contain `_`; the UID is the last part.
        let mut parts = name.splitn(3, '_');
        if let (Some(ns), Some(pod), Some(uid)) = (parts.next(), parts.next(), parts.next()) {
            out.insert(uid.to_string(), (ns.to_string(), pod.to_string()));
        }
    }
    out
}

impl Namer for RealNamer {
    fn workload(&mut self, cgroup_id: u64) -> Option<(WorkloadKey, Identity)> {
        match self.known.get(&cgroup_id) {
            Some(Ok(v)) => return Some(v.clone()),
            Some(Err(t)) if t.elapsed() < Duration::from_secs(10) => {
                return Some(unknown(cgroup_id));
            }
            _ => {}
        }
        let info = self
            .resolver
            .as_mut()
            .and_then(|r| r.resolve(cgroup_id).ok().flatten());
        let Some(info) = info else {
            self.known.insert(cgroup_id, Err(Instant::now()));
            // Not found (removed already, or another cgroup namespace): still counted.
            return Some(unknown(cgroup_id));
        };
        let (key, identity) = match info.workload {
            Workload::Pod { uid, qos, .. } => {
                let names = self.pod_name(&uid);
                (
                    WorkloadKey::Pod(uid.clone()),
                    Identity {
                        kind: "pod".into(),
                        pod_uid: Some(uid),
                        pod_namespace: names.as_ref().map(|n| n.0.clone()),
                        pod_name: names.map(|n| n.1),
                        qos: Some(qos),
                        cgroup: info.path,
                        ..Default::default()
                    },
                )
            }
            Workload::SystemdUnit { unit } => (
                WorkloadKey::Unit(unit.clone()),
                Identity {
                    kind: "unit".into(),
                    unit: Some(unit),
                    cgroup: info.path,
                    ..Default::default()
                },
            ),
            Workload::Cgroup => (
                WorkloadKey::Cgroup(info.path.clone()),
                Identity {
                    kind: "cgroup".into(),
                    cgroup: info.path,
                    ..Default::default()
                },
            ),
        };
        self.known
            .insert(cgroup_id, Ok((key.clone(), identity.clone())));
        Some((key, identity))
    }

    fn path(&self, mount_id: u32, ino: u64) -> Option<String> {
        let d = self.mounts.get(mount_id as usize)?.as_ref()?;
        let tree = d.meta.snapshot();
        tree.get(ino)?;
        Some(tree.path_of(ino))
    }

    fn process(&mut self, pid: u32) -> Option<String> {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

fn unknown(cgroup_id: u64) -> (WorkloadKey, Identity) {
    let path = format!("<cgroup {cgroup_id}>");
    (
        WorkloadKey::Cgroup(path.clone()),
        Identity {
            kind: "cgroup".into(),
            cgroup: path,
            ..Default::default()
        },
    )
}
