//! The observer's arithmetic, free of kernel and clock: cumulative probe snapshots in,
//! per-workload deltas, totals, recent windows, stall episodes and the stall signal out.
//! Unit-tested on synthetic snapshots.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use sluice_ebpf_probes::{CgroupReadStats, FileAccess, LatencyHistogram};

use super::report::{DatasetFigures, Figures, Identity, Wait, WorkloadReport};
use crate::signal::StallTick;

/// Bytes per page-cache miss (the filemap tracepoint counts pages).
const PAGE: u64 = 4096;
/// Files remembered per workload for `top waits` (least waited-on dropped beyond).
const MAX_WAIT_FILES: usize = 1024;

/// Who reads: one pod (all its containers), one systemd unit, or one other cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKey {
    Pod(String),
    Unit(String),
    Cgroup(String),
}

/// A watched path (index = the probes' `mount_id`).
#[derive(Clone, Debug, Default)]
pub struct WatchInfo {
    /// Dataset name, or the prefix directory.
    pub name: String,
    /// Where misses are fetched from: `s3`, `gs`, `file`, … (`None` for a prefix).
    pub source: Option<String>,
}

/// Cumulative bytes a dataset handed to FUSE readers (the kernel's page-cache misses) and
/// bytes its sources sent, for the split of misses between Sluice's cache and the source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Bytes answered to FUSE reads, whatever their origin.
    pub served: u64,
    /// Bytes fetched from the sources (whole blocks, prefetch included).
    pub fetched: u64,
}

/// What the model asks of the outside world.
pub trait Namer {
    /// The workload a cgroup id belongs to; `None` when the cgroup cannot be found.
    fn workload(&mut self, cgroup_id: u64) -> Option<(WorkloadKey, Identity)>;
    /// Path of inode `ino` on watched path `mount_id` (for dataset mounts).
    fn path(&self, mount_id: u32, ino: u64) -> Option<String>;
    /// A process name (`comm`).
    fn process(&mut self, pid: u32) -> Option<String>;
}

/// Tunables.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// A tick whose stall ratio reaches this is part of an episode.
    pub episode_min_ratio: f64,
    /// Log an ongoing episode this often.
    pub episode_log_every: Duration,
    /// Ticks in the `recent` window.
    pub window_ticks: usize,
    /// The probes' sampling rate (1 in N reads), to scale sampled blocked time.
    pub sample_every: u32,
    /// How long a workload whose cgroups all vanished stays in reports and metrics.
    pub gone_grace: Duration,
    /// At most this many workloads are tracked (the longest idle are dropped).
    pub max_workloads: usize,
    /// Page-cache misses are counted (the filemap tracepoint exists on this kernel).
    pub misses_measured: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            episode_min_ratio: 0.1,
            episode_log_every: Duration::from_secs(30),
            window_ticks: 10,
            sample_every: 16,
            gone_grace: Duration::from_secs(60),
            max_workloads: 512,
            misses_measured: true,
        }
    }
}

/// Read counters over some span.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Acc {
    pub wall_ns: u64,
    pub blocked_ns: u64,
    pub calls: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Sum of the calls' latency.
    pub latency_ns: u64,
    /// Bytes the page cache did not have (pages added × 4 KiB, at most `bytes`).
    pub miss_bytes: u64,
    /// Of those, the estimated bytes fetched from the source (`None` part: unknown split).
    pub source_bytes: f64,
    /// Ticks in which misses were counted (else page-cache figures are unknown).
    pub misses_known: bool,
    pub hist: Vec<u64>,
}

impl Acc {
    fn add(&mut self, o: &Acc) {
        self.wall_ns += o.wall_ns;
        self.blocked_ns += o.blocked_ns;
        self.calls += o.calls;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.latency_ns += o.latency_ns;
        self.miss_bytes += o.miss_bytes;
        self.source_bytes += o.source_bytes;
        self.misses_known |= o.misses_known;
        add_hist(&mut self.hist, &o.hist);
    }

    /// The figures of this span.
    pub fn figures(&self) -> Figures {
        let wall = self.wall_ns as f64 / 1e9;
        let hist = LatencyHistogram {
            buckets: self.hist.clone(),
        };
        let ms = |q: f64| hist.quantile_upper_ns(q) as f64 / 1e6;
        let (hit, pc_hit) = if self.bytes > 0 && self.misses_known {
            let b = self.bytes as f64;
            (
                Some((1.0 - self.source_bytes / b).clamp(0.0, 1.0)),
                Some((1.0 - self.miss_bytes as f64 / b).clamp(0.0, 1.0)),
            )
        } else {
            (None, None)
        };
        Figures {
            wall_seconds: wall,
            stalled_seconds: self.blocked_ns as f64 / 1e9,
            stall_ratio: ratio(self.blocked_ns, self.wall_ns),
            read_calls: self.calls,
            read_bytes: self.bytes,
            read_errors: self.errors,
            mib_per_second: if wall > 0.0 {
                self.bytes as f64 / wall / (1 << 20) as f64
            } else {
                0.0
            },
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            hit_ratio: hit,
            page_cache_hit_ratio: pc_hit,
        }
    }
}

fn ratio(blocked_ns: u64, wall_ns: u64) -> f64 {
    if wall_ns == 0 {
        0.0
    } else {
        blocked_ns as f64 / wall_ns as f64
    }
}

fn add_hist(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

/// `cur - prev` of one (cgroup, mount) entry; the whole of `cur` when the entry is new or
/// its counters went backwards (forgotten and created again).
pub fn delta(cur: &CgroupReadStats, prev: Option<&CgroupReadStats>) -> CgroupReadStats {
    let Some(p) = prev else {
        return cur.clone();
    };
    let backwards = cur.calls < p.calls
        || cur.bytes < p.bytes
        || cur.blocked_ns < p.blocked_ns
        || cur.latency_ns < p.latency_ns
        || cur.page_cache_misses < p.page_cache_misses
        || cur.uring_reads < p.uring_reads;
    if backwards {
        return cur.clone();
    }
    let mut hist = cur.latency.buckets.clone();
    for (h, q) in hist.iter_mut().zip(&p.latency.buckets) {
        *h = h.saturating_sub(*q);
    }
    CgroupReadStats {
        cgroup_id: cur.cgroup_id,
        mount_id: cur.mount_id,
        opens: cur.opens - p.opens.min(cur.opens),
        calls: cur.calls - p.calls,
        bytes: cur.bytes - p.bytes,
        errors: cur.errors.saturating_sub(p.errors),
        timed_calls: cur.timed_calls.saturating_sub(p.timed_calls),
        latency_ns: cur.latency_ns - p.latency_ns,
        blocked_ns: cur.blocked_ns - p.blocked_ns,
        page_cache_misses: cur.page_cache_misses - p.page_cache_misses,
        uring_reads: cur.uring_reads - p.uring_reads,
        uring_bytes: cur.uring_bytes.saturating_sub(p.uring_bytes),
        uring_latency_ns: cur.uring_latency_ns.saturating_sub(p.uring_latency_ns),
        latency: LatencyHistogram { buckets: hist },
        fuse: Vec::new(),
    }
}

/// Per watched path: (blocked ns, bytes).
type ByMount = BTreeMap<u32, (u64, u64)>;

/// A stall episode being followed.
#[derive(Clone, Debug, Default)]
struct Episode {
    acc: Acc,
    by_mount: BTreeMap<u32, u64>,
    last_logged_ns: u64,
}

/// What to log about an episode.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeEvent {
    pub who: Identity,
    /// `false`: the episode ended; `true`: still going (periodic report).
    pub ongoing: bool,
    pub stalled: Duration,
    pub wall: Duration,
    /// Watched paths it waited on, most blocked first.
    pub datasets: Vec<String>,
    /// Share of its page-cache misses that were fetched from the source, if known.
    pub misses_from_source: Option<f64>,
    /// The source kind of the dataset it waited on most (`s3`, `file`, …).
    pub source: Option<String>,
    pub read_bytes: u64,
}

impl EpisodeEvent {
    /// "pod ns/x stalled 1.2 s in 3.0 s on dataset imagenet, 83% of misses from s3".
    pub fn message(&self) -> String {
        let mut m = format!(
            "{} stalled {:.1} s in {:.1} s",
            self.who.display(),
            self.stalled.as_secs_f64(),
            self.wall.as_secs_f64()
        );
        if !self.datasets.is_empty() {
            m.push_str(&format!(" on dataset {}", self.datasets.join(", ")));
        }
        if let Some(share) = self.misses_from_source {
            m.push_str(&format!(
                ", {:.0}% of misses from {}",
                share * 100.0,
                self.source.as_deref().unwrap_or("the source")
            ));
        }
        if self.ongoing {
            m.push_str(" (ongoing)");
        }
        m
    }
}

#[derive(Clone, Debug, Default)]
struct FileWait {
    blocked_ns: u64,
    samples: u64,
}

/// One workload's state.
#[derive(Clone, Debug, Default)]
struct WorkloadState {
    identity: Identity,
    total: Acc,
    window: VecDeque<Acc>,
    by_mount: ByMount,
    waits: HashMap<(u32, u64), FileWait>,
    pids: BTreeMap<u32, String>,
    episode: Option<Episode>,
    last_active_ns: u64,
    /// When its last cgroup was seen removed.
    gone_since_ns: Option<u64>,
}

/// Cumulative per-workload figures, fed one tick at a time.
#[derive(Debug, Default)]
pub struct Model {
    cfg: ModelConfig,
    watches: Vec<WatchInfo>,
    prev: HashMap<(u64, u32), CgroupReadStats>,
    prev_served: Vec<Option<Served>>,
    cgroups: HashMap<u64, WorkloadKey>,
    workloads: BTreeMap<WorkloadKey, WorkloadState>,
    now_ns: u64,
    last_events_per_second: f64,
}

/// A tick's results.
#[derive(Debug, Default)]
pub struct TickOutcome {
    pub signal: StallTick,
    pub episodes: Vec<EpisodeEvent>,
    /// Workloads forgotten this tick (their metric series go too).
    pub dropped: Vec<Identity>,
}

impl Model {
    pub fn new(cfg: ModelConfig, watches: Vec<WatchInfo>) -> Self {
        Self {
            prev_served: vec![None; watches.len()],
            cfg,
            watches,
            ..Default::default()
        }
    }

    /// Cgroup ids seen so far (to check which still exist).
    pub fn cgroups(&self) -> impl Iterator<Item = u64> + '_ {
        self.cgroups.keys().copied()
    }

    /// Reads counted per second in the last tick (all workloads).
    pub fn events_per_second(&self) -> f64 {
        self.last_events_per_second
    }

    /// Fold sampled accesses into the workloads' "where it waited".
    pub fn add_accesses(&mut self, accesses: &[FileAccess], namer: &mut dyn Namer) {
        for a in accesses {
            let Some(key) = self.key_of(a.cgroup_id, namer) else {
                continue;
            };
            let w = self.workloads.entry(key).or_default();
            if !w.pids.contains_key(&a.pid) && w.pids.len() < 8 {
                let comm = namer.process(a.pid).unwrap_or_default();
                w.pids.insert(a.pid, comm);
            }
            if a.blocked_ns == 0 {
                continue;
            }
            let entry = w.waits.entry((a.mount_id, a.ino)).or_default();
            entry.blocked_ns += a.blocked_ns;
            entry.samples += 1;
            if w.waits.len() > MAX_WAIT_FILES {
                // Keep the map bounded: drop the least waited-on half.
                let mut v: Vec<_> = w.waits.drain().collect();
                v.sort_by_key(|(_, f)| std::cmp::Reverse(f.blocked_ns));
                v.truncate(MAX_WAIT_FILES / 2);
                w.waits = v.into_iter().collect();
            }
        }
    }

    fn key_of(&mut self, cgroup_id: u64, namer: &mut dyn Namer) -> Option<WorkloadKey> {
        if let Some(k) = self.cgroups.get(&cgroup_id) {
            return Some(k.clone());
        }
        let (key, identity) = namer.workload(cgroup_id)?;
        self.cgroups.insert(cgroup_id, key.clone());
        let w = self.workloads.entry(key.clone()).or_default();
        if w.identity.kind.is_empty() {
            w.identity = identity;
        }
        w.gone_since_ns = None;
        Some(key)
    }

    /// One tick: `stats` is the probes' cumulative snapshot, `served` each watched path's
    /// cumulative served bytes (`None` for prefixes).
    pub fn tick(
        &mut self,
        interval: Duration,
        stats: &[CgroupReadStats],
        served: &[Option<Served>],
        namer: &mut dyn Namer,
    ) -> TickOutcome {
        let wall_ns = interval.as_nanos() as u64;
        self.now_ns += wall_ns;
        // The share of the dataset's page-cache misses (bytes it answered to FUSE reads)
        // that its sources had to send in this tick: fetched / served, at most 1. Bytes are
        // fetched in whole blocks, so counting by the origin of each FUSE request would call
        // the rest of a block a hit although the reader waited for its fetch.
        let mut source_share: Vec<Option<f64>> = vec![None; self.watches.len()];
        for (i, s) in served.iter().enumerate().take(self.watches.len()) {
            let Some(cur) = s else { continue };
            let prev = self.prev_served[i].unwrap_or_default();
            let answered = cur.served.saturating_sub(prev.served);
            let fetched = cur.fetched.saturating_sub(prev.fetched);
            source_share[i] = Some(if answered == 0 {
                0.0
            } else {
                (fetched as f64 / answered as f64).min(1.0)
            });
            self.prev_served[i] = Some(*cur);
        }

        // This tick's deltas, per workload.
        let mut ticks: BTreeMap<WorkloadKey, (Acc, ByMount)> = BTreeMap::new();
        let mut events = 0u64;
        let mut seen = HashMap::with_capacity(stats.len());
        for cur in stats {
            let k = (cur.cgroup_id, cur.mount_id);
            let d = delta(cur, self.prev.get(&k));
            seen.insert(k, cur.clone());
            let reads = d.calls + d.uring_reads;
            if reads == 0 && d.blocked_ns == 0 {
                continue;
            }
            events += reads;
            let Some(key) = self.key_of(cur.cgroup_id, namer) else {
                continue;
            };
            let bytes = d.bytes + d.uring_bytes;
            let miss = (d.page_cache_misses * PAGE).min(bytes);
            let share = source_share
                .get(cur.mount_id as usize)
                .copied()
                .flatten()
                .unwrap_or(0.0);
            let (acc, by_mount) = ticks.entry(key).or_default();
            acc.add(&Acc {
                wall_ns: 0,
                blocked_ns: d.blocked_ns,
                calls: reads,
                bytes,
                errors: d.errors,
                latency_ns: d.latency_ns + d.uring_latency_ns,
                miss_bytes: miss,
                source_bytes: miss as f64 * share,
                misses_known: self.cfg.misses_measured,
                hist: d.latency.buckets.clone(),
            });
            let m = by_mount.entry(cur.mount_id).or_default();
            m.0 += d.blocked_ns;
            m.1 += bytes;
        }
        // Entries that disappeared from the maps (forgotten) simply leave `prev`.
        self.prev = seen;
        self.last_events_per_second = events as f64 / interval.as_secs_f64().max(1e-9);

        let mut out = TickOutcome::default();
        let mut max_ratio = 0.0f64;
        let now = self.now_ns;
        for (key, w) in self.workloads.iter_mut() {
            let active = ticks.remove(key);
            // A workload is observed from its first read on: every later tick counts as wall.
            if active.is_none() && w.total.calls == 0 && w.total.blocked_ns == 0 {
                continue;
            }
            let (mut acc, by_mount) = active.unwrap_or_default();
            acc.wall_ns = wall_ns;
            if acc.calls > 0 || acc.blocked_ns > 0 {
                w.last_active_ns = now;
            }
            for (m, (b, n)) in &by_mount {
                let e = w.by_mount.entry(*m).or_default();
                e.0 += b;
                e.1 += n;
            }
            w.total.add(&acc);
            w.window.push_back(acc.clone());
            while w.window.len() > self.cfg.window_ticks.max(1) {
                w.window.pop_front();
            }
            let r = ratio(acc.blocked_ns, acc.wall_ns);
            if acc.blocked_ns > 0 {
                out.signal.stalled_workloads += 1;
            }
            max_ratio = max_ratio.max(r);

            // Episodes.
            if r >= self.cfg.episode_min_ratio && acc.blocked_ns > 0 {
                let e = w.episode.get_or_insert_with(|| Episode {
                    last_logged_ns: now - wall_ns,
                    ..Default::default()
                });
                e.acc.add(&acc);
                for (m, (b, _)) in &by_mount {
                    *e.by_mount.entry(*m).or_default() += b;
                }
                if now - e.last_logged_ns >= self.cfg.episode_log_every.as_nanos() as u64 {
                    e.last_logged_ns = now;
                    out.episodes.push(episode_event(&self.watches, w, true));
                }
            } else if w.episode.is_some() {
                out.episodes.push(episode_event(&self.watches, w, false));
                w.episode = None;
            }
        }
        out.signal.interval = interval;
        out.signal.max_stall_ratio = max_ratio.min(1.0);
        out.signal.from = "ebpf";

        // Forget workloads gone for a while, and the longest idle beyond the cap.
        let grace = self.cfg.gone_grace.as_nanos() as u64;
        let mut drop: Vec<WorkloadKey> = self
            .workloads
            .iter()
            .filter(|(_, w)| {
                w.gone_since_ns
                    .is_some_and(|t| now.saturating_sub(t) >= grace)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let over = self.workloads.len().saturating_sub(drop.len());
        if over > self.cfg.max_workloads {
            let mut idle: Vec<_> = self
                .workloads
                .iter()
                .filter(|(k, _)| !drop.contains(k))
                .map(|(k, w)| (w.last_active_ns, k.clone()))
                .collect();
            idle.sort();
            drop.extend(
                idle.into_iter()
                    .take(over - self.cfg.max_workloads)
                    .map(|(_, k)| k),
            );
        }
        for k in drop {
            if let Some(w) = self.workloads.remove(&k)
                && (w.total.calls > 0 || w.total.blocked_ns > 0)
            {
                out.dropped.push(w.identity);
            }
            self.cgroups.retain(|_, v| *v != k);
        }
        out
    }

    /// A cgroup was removed: stop following it; its workload goes once none is left.
    pub fn cgroup_gone(&mut self, cgroup_id: u64) {
        self.prev.retain(|(c, _), _| *c != cgroup_id);
        let Some(key) = self.cgroups.remove(&cgroup_id) else {
            return;
        };
        if !self.cgroups.values().any(|k| *k == key)
            && let Some(w) = self.workloads.get_mut(&key)
        {
            w.gone_since_ns.get_or_insert(self.now_ns);
        }
    }

    /// Cumulative counters of every workload with reads (for metrics).
    pub fn totals(&self) -> impl Iterator<Item = (&Identity, &Acc)> + '_ {
        self.workloads
            .values()
            .filter(|w| w.total.calls > 0 || w.total.blocked_ns > 0)
            .map(|w| (&w.identity, &w.total))
    }

    /// Every workload with reads, most stalled first.
    pub fn report(&self, namer: &dyn Namer) -> Vec<WorkloadReport> {
        let sample = u64::from(self.cfg.sample_every.max(1));
        let mut out: Vec<WorkloadReport> = self
            .workloads
            .values()
            .filter(|w| w.total.calls > 0 || w.total.blocked_ns > 0)
            .map(|w| {
                let mut recent = Acc::default();
                for a in &w.window {
                    recent.add(a);
                }
                let mut identity = w.identity.clone();
                identity.processes = w.pids.values().filter(|c| !c.is_empty()).cloned().fold(
                    Vec::new(),
                    |mut v, c| {
                        if !v.contains(&c) {
                            v.push(c);
                        }
                        v
                    },
                );
                let sampled: u64 = w.waits.values().map(|f| f.blocked_ns).sum();
                let mut files: Vec<(String, u64)> = w
                    .waits
                    .iter()
                    .map(|(&(m, ino), f)| {
                        let name = self.watches.get(m as usize).map(|x| x.name.as_str());
                        let path = match (namer.path(m, ino), name) {
                            (Some(p), Some(n)) => format!("{n}/{}", p.trim_start_matches('/')),
                            (None, Some(n)) => format!("{n}: inode {ino}"),
                            (_, None) => format!("inode {ino}"),
                        };
                        (path, f.blocked_ns)
                    })
                    .collect();
                let mut dirs: BTreeMap<String, u64> = BTreeMap::new();
                for (p, b) in &files {
                    if let Some((d, _)) = p.rsplit_once('/') {
                        *dirs.entry(format!("{d}/")).or_default() += b;
                    }
                }
                let top = |v: Vec<(String, u64)>| -> Vec<Wait> {
                    let mut v = v;
                    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                    v.into_iter()
                        .take(5)
                        .map(|(path, b)| Wait {
                            path,
                            stalled_seconds: (b * sample) as f64 / 1e9,
                            share: if sampled == 0 {
                                0.0
                            } else {
                                b as f64 / sampled as f64
                            },
                        })
                        .collect()
                };
                files.sort_unstable();
                WorkloadReport {
                    identity,
                    total: w.total.figures(),
                    recent: recent.figures(),
                    stalling: w.episode.is_some(),
                    gone: w.gone_since_ns.is_some(),
                    datasets: w
                        .by_mount
                        .iter()
                        .map(|(m, (b, n))| DatasetFigures {
                            name: self
                                .watches
                                .get(*m as usize)
                                .map(|x| x.name.clone())
                                .unwrap_or_else(|| format!("#{m}")),
                            stalled_seconds: *b as f64 / 1e9,
                            read_bytes: *n,
                        })
                        .collect(),
                    top_files: top(files),
                    top_dirs: top(dirs.into_iter().collect()),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.total
                .stalled_seconds
                .total_cmp(&a.total.stalled_seconds)
                .then_with(|| a.identity.cgroup.cmp(&b.identity.cgroup))
        });
        out
    }
}

fn episode_event(watches: &[WatchInfo], w: &WorkloadState, ongoing: bool) -> EpisodeEvent {
    let e = w.episode.as_ref().expect("an episode");
    let mut by: Vec<(u32, u64)> = e.by_mount.iter().map(|(m, b)| (*m, *b)).collect();
    by.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    let datasets = by
        .iter()
        .filter_map(|(m, _)| watches.get(*m as usize).map(|x| x.name.clone()))
        .collect();
    let source = by
        .first()
        .and_then(|(m, _)| watches.get(*m as usize))
        .and_then(|x| x.source.clone());
    EpisodeEvent {
        who: w.identity.clone(),
        ongoing,
        stalled: Duration::from_nanos(e.acc.blocked_ns),
        wall: Duration::from_nanos(e.acc.wall_ns),
        datasets,
        misses_from_source: (e.acc.miss_bytes > 0 && source.is_some())
            .then(|| (e.acc.source_bytes / e.acc.miss_bytes as f64).clamp(0.0, 1.0)),
        source,
        read_bytes: e.acc.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOTS: usize = sluice_ebpf_probes::HIST_SLOTS;

    struct FakeNamer;
    impl Namer for FakeNamer {
        fn workload(&mut self, id: u64) -> Option<(WorkloadKey, Identity)> {
            match id {
                1 | 2 => Some((
                    WorkloadKey::Pod("uid-a".into()),
                    Identity {
                        kind: "pod".into(),
                        pod_uid: Some("uid-a".into()),
                        cgroup: format!("/kubepods/poduid-a/c{id}"),
                        ..Default::default()
                    },
                )),
                3 => Some((
                    WorkloadKey::Unit("x.service".into()),
                    Identity {
                        kind: "unit".into(),
                        unit: Some("x.service".into()),
                        cgroup: "/system.slice/x.service".into(),
                        ..Default::default()
                    },
                )),
                _ => None,
            }
        }
        fn path(&self, _m: u32, ino: u64) -> Option<String> {
            Some(format!("/train/dir{}/f{ino}", ino % 2))
        }
        fn process(&mut self, _pid: u32) -> Option<String> {
            Some("python".into())
        }
    }

    fn stats(cg: u64, calls: u64, bytes: u64, blocked_ms: u64, misses: u64) -> CgroupReadStats {
        let mut buckets = vec![0; SLOTS];
        buckets[20] = calls; // ~1 ms each
        CgroupReadStats {
            cgroup_id: cg,
            mount_id: 0,
            calls,
            bytes,
            blocked_ns: blocked_ms * 1_000_000,
            latency_ns: calls * 1_000_000,
            page_cache_misses: misses,
            latency: LatencyHistogram { buckets },
            ..Default::default()
        }
    }

    fn model() -> Model {
        Model::new(
            ModelConfig {
                episode_log_every: Duration::from_secs(3),
                gone_grace: Duration::from_secs(2),
                ..Default::default()
            },
            vec![WatchInfo {
                name: "imagenet".into(),
                source: Some("s3".into()),
            }],
        )
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn deltas_of_cumulative_counters_and_reset_entries() {
        let a = stats(1, 10, 1000, 5, 0);
        let b = stats(1, 15, 1500, 8, 0);
        let d = delta(&b, Some(&a));
        assert_eq!((d.calls, d.bytes, d.blocked_ns), (5, 500, 3_000_000));
        assert_eq!(d.latency.buckets[20], 5);
        // Forgotten and recreated: counters went backwards, the new value is the delta.
        let c = stats(1, 2, 100, 1, 0);
        assert_eq!(delta(&c, Some(&b)).calls, 2);
        assert_eq!(delta(&c, None), c);
    }

    #[test]
    fn containers_of_one_pod_add_up_and_ratios_use_wall_time() {
        let mut m = model();
        let mut n = FakeNamer;
        m.tick(SEC, &[], &[None], &mut n);
        let out = m.tick(
            SEC,
            &[
                stats(1, 10, 10 << 20, 300, 0),
                stats(2, 10, 10 << 20, 200, 0),
            ],
            &[None],
            &mut n,
        );
        assert!((out.signal.max_stall_ratio - 0.5).abs() < 1e-9);
        assert_eq!(out.signal.stalled_workloads, 1);
        assert_eq!(out.signal.from, "ebpf");
        // Next tick: pod idle, unit reads without blocking.
        let out = m.tick(
            SEC,
            &[
                stats(1, 10, 10 << 20, 300, 0),
                stats(2, 10, 10 << 20, 200, 0),
                stats(3, 5, 1 << 20, 0, 0),
            ],
            &[None],
            &mut n,
        );
        assert_eq!(out.signal.stalled_workloads, 0);
        assert_eq!(out.signal.max_stall_ratio, 0.0);
        let r = m.report(&n);
        assert_eq!(r.len(), 2);
        let pod = &r[0];
        assert_eq!(pod.identity.pod_uid.as_deref(), Some("uid-a"));
        assert!((pod.total.stalled_seconds - 0.5).abs() < 1e-9);
        assert!((pod.total.wall_seconds - 2.0).abs() < 1e-9, "{pod:?}");
        assert!((pod.total.stall_ratio - 0.25).abs() < 1e-9);
        assert_eq!(pod.total.read_bytes, 20 << 20);
        assert!((pod.total.mib_per_second - 10.0).abs() < 1e-9);
        assert_eq!(pod.total.p50_ms, (1u64 << 21) as f64 / 1e6);
        assert_eq!(r[1].identity.kind, "unit");
        assert_eq!(r[1].total.stalled_seconds, 0.0);
    }

    #[test]
    fn ratios_above_one_are_clamped_only_in_the_signal() {
        let mut m = model();
        let mut n = FakeNamer;
        let out = m.tick(SEC, &[stats(1, 8, 8, 3000, 0)], &[None], &mut n);
        assert_eq!(out.signal.max_stall_ratio, 1.0);
        assert!((m.report(&n)[0].total.stall_ratio - 3.0).abs() < 1e-9);
    }

    #[test]
    fn hit_ratio_splits_page_cache_misses_by_the_datasets_source_share() {
        let mut m = model();
        let mut n = FakeNamer;
        let served = |served, fetched| [Some(Served { served, fetched })];
        m.tick(SEC, &[], &served(0, 0), &mut n);
        // 100 pages read, 50 missed the page cache; the source sent 3/4 of what FUSE served.
        m.tick(
            SEC,
            &[stats(1, 10, 100 * PAGE, 10, 50)],
            &served(400, 300),
            &mut n,
        );
        let f = &m.report(&n)[0].total;
        assert_eq!(f.page_cache_hit_ratio, Some(0.5));
        assert!((f.hit_ratio.unwrap() - 0.625).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn episodes_start_report_periodically_and_end() {
        let mut m = model();
        let mut n = FakeNamer;
        let served = |n| {
            [Some(Served {
                served: n,
                fetched: 2 * n,
            })]
        };
        let mut events = Vec::new();
        let mut blocked = 0;
        let mut misses = 0;
        for i in 1..=4u64 {
            blocked += 600;
            misses += 10;
            let out = m.tick(
                SEC,
                &[stats(1, i, i * PAGE * 10, blocked, misses)],
                &served(i * 1000),
                &mut n,
            );
            events.extend(out.episodes);
        }
        // Ongoing report after 3 s of episode.
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].ongoing);
        assert!(m.report(&n)[0].stalling);
        // A quiet tick (below 10%) ends it.
        let out = m.tick(
            SEC,
            &[stats(1, 5, 50 * PAGE, blocked + 50, misses)],
            &served(4000),
            &mut n,
        );
        assert_eq!(out.episodes.len(), 1);
        let e = &out.episodes[0];
        assert!(!e.ongoing);
        assert_eq!(e.stalled, Duration::from_millis(2400));
        assert_eq!(e.wall, Duration::from_secs(4));
        assert_eq!(e.misses_from_source, Some(1.0));
        assert_eq!(
            e.message(),
            "pod uid-a stalled 2.4 s in 4.0 s on dataset imagenet, 100% of misses from s3"
        );
        assert!(!m.report(&n)[0].stalling);
    }

    #[test]
    fn sampled_waits_name_files_and_directories() {
        let mut m = model();
        let mut n = FakeNamer;
        let access = |ino, blocked_ns| FileAccess {
            timestamp_ns: 0,
            cgroup_id: 1,
            pid: 42,
            mount_id: 0,
            dev: 0,
            ino,
            offset: 0,
            size: 4096,
            error: None,
            latency_ns: blocked_ns,
            blocked_ns,
            kind: sluice_ebpf_probes::ReadKind::Read,
        };
        m.add_accesses(
            &[access(2, 3_000_000), access(3, 1_000_000), access(4, 0)],
            &mut n,
        );
        m.tick(SEC, &[stats(1, 3, 3, 4, 0)], &[None], &mut n);
        let r = &m.report(&n)[0];
        assert_eq!(r.identity.processes, ["python"]);
        assert_eq!(r.top_files[0].path, "imagenet/train/dir0/f2");
        assert!((r.top_files[0].share - 0.75).abs() < 1e-9);
        // Scaled by the sampling rate (1 in 16).
        assert!((r.top_files[0].stalled_seconds - 0.048).abs() < 1e-9);
        assert_eq!(r.top_dirs[0].path, "imagenet/train/dir0/");
        assert_eq!(r.top_dirs[1].path, "imagenet/train/dir1/");
    }

    #[test]
    fn vanished_cgroups_are_forgotten_after_the_grace_time() {
        let mut m = model();
        let mut n = FakeNamer;
        m.tick(SEC, &[stats(3, 1, 1, 1, 0)], &[None], &mut n);
        m.cgroup_gone(3);
        assert!(m.report(&n)[0].gone);
        assert!(m.tick(SEC, &[], &[None], &mut n).dropped.is_empty());
        let out = m.tick(SEC, &[], &[None], &mut n);
        assert_eq!(out.dropped.len(), 1);
        assert_eq!(out.dropped[0].unit.as_deref(), Some("x.service"));
        assert!(m.report(&n).is_empty());
        assert_eq!(m.cgroups().count(), 0);
    }

    #[test]
    fn unknown_cgroups_are_skipped() {
        let mut m = model();
        let mut n = FakeNamer;
        let out = m.tick(SEC, &[stats(99, 1, 1, 900, 0)], &[None], &mut n);
        assert_eq!(out.signal.stalled_workloads, 0);
        assert!(m.report(&n).is_empty());
    }
}
