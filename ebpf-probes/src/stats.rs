//! Typed views of what the probes aggregate and sample.

use std::collections::BTreeMap;

use crate::abi::{self, HIST_SLOTS};

/// Log2 latency histogram: `buckets[i]` counts calls that took `[2^i, 2^(i+1))` ns (the
/// last bucket also holds everything slower).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Counts per log2(ns) bucket.
    pub buckets: Vec<u64>,
}

impl LatencyHistogram {
    fn from_raw(raw: &[u64; HIST_SLOTS]) -> Self {
        Self {
            buckets: raw.to_vec(),
        }
    }

    fn add(&mut self, raw: &[u64; HIST_SLOTS]) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; HIST_SLOTS];
        }
        for (b, r) in self.buckets.iter_mut().zip(raw) {
            *b += r;
        }
    }

    /// Total number of samples.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Upper bound (ns) of the bucket holding quantile `q` (0.0..=1.0); 0 when empty.
    pub fn quantile_upper_ns(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let target = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= target {
                return 1u64 << (i + 1);
            }
        }
        u64::MAX
    }
}

/// FUSE request latency for one opcode (FUSE_READ = 15, FUSE_LOOKUP = 1, …).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuseOpStats {
    /// The FUSE opcode (`enum fuse_opcode`).
    pub opcode: u32,
    /// Requests that completed.
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Sum of send → end latency.
    pub latency_ns: u64,
    /// Latency distribution.
    pub latency: LatencyHistogram,
}

/// Dataset reads of one cgroup on one watched mount, cumulative since the probes loaded.
///
/// Counters only grow; a consumer takes two snapshots and divides the `blocked_ns`
/// difference by the wall time between them to get the stall ratio.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupReadStats {
    /// cgroup v2 id (`bpf_get_current_cgroup_id`); see [`crate::cgroup`] to name it.
    pub cgroup_id: u64,
    /// Index of the watched path in [`crate::ProbeConfig::watch`].
    pub mount_id: u32,
    /// Successful opens of watched files.
    pub opens: u64,
    /// read/pread64/readv/preadv calls on watched files.
    pub calls: u64,
    /// Bytes those calls returned.
    pub bytes: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Calls whose wall time was measured: 1 in [`crate::ProbeConfig::time_every`] per
    /// thread, an unbiased sample. `latency_ns` and `latency` cover these calls only.
    pub timed_calls: u64,
    /// Sum of the timed calls' wall time.
    pub latency_ns: u64,
    /// Time the calling threads spent off-CPU, not runnable, inside those calls: the stall.
    pub blocked_ns: u64,
    /// Pages of watched files that had to be added to the page cache (misses).
    pub page_cache_misses: u64,
    /// io_uring read completions on watched files.
    pub uring_reads: u64,
    /// Bytes those completions returned.
    pub uring_bytes: u64,
    /// Sum of io_uring submit → complete latency.
    pub uring_latency_ns: u64,
    /// Distribution of read syscall latency (of the timed calls).
    pub latency: LatencyHistogram,
    /// FUSE requests sent by this cgroup to this mount, per opcode.
    pub fuse: Vec<FuseOpStats>,
}

/// Sum per-CPU values into one [`CgroupReadStats`] per (cgroup, mount).
pub(crate) fn merge(
    reads: impl IntoIterator<Item = (abi::ReadKey, Vec<abi::ReadStats>)>,
    fuse: impl IntoIterator<Item = (abi::FuseKey, Vec<abi::FuseStats>)>,
) -> Vec<CgroupReadStats> {
    let mut out: BTreeMap<(u64, u32), CgroupReadStats> = BTreeMap::new();
    for (key, per_cpu) in reads {
        let s = out
            .entry((key.cgroup_id, key.mount_id))
            .or_insert_with(|| empty(key.cgroup_id, key.mount_id));
        for v in per_cpu {
            s.opens += v.opens;
            s.calls += v.calls;
            s.bytes += v.bytes;
            s.errors += v.errors;
            s.timed_calls += v.timed_calls;
            s.latency_ns += v.latency_ns;
            s.blocked_ns += v.blocked_ns;
            s.page_cache_misses += v.page_cache_misses;
            s.uring_reads += v.uring_reads;
            s.uring_bytes += v.uring_bytes;
            s.uring_latency_ns += v.uring_latency_ns;
            s.latency.add(&v.latency_hist);
        }
    }
    for (key, per_cpu) in fuse {
        let s = out
            .entry((key.cgroup_id, key.mount_id))
            .or_insert_with(|| empty(key.cgroup_id, key.mount_id));
        let mut op = FuseOpStats {
            opcode: key.opcode,
            latency: LatencyHistogram::from_raw(&[0; HIST_SLOTS]),
            ..Default::default()
        };
        for v in per_cpu {
            op.requests += v.requests;
            op.errors += v.errors;
            op.latency_ns += v.latency_ns;
            op.latency.add(&v.latency_hist);
        }
        s.fuse.push(op);
    }
    let mut out: Vec<_> = out.into_values().collect();
    for s in &mut out {
        s.fuse.sort_by_key(|f| f.opcode);
    }
    out
}

fn empty(cgroup_id: u64, mount_id: u32) -> CgroupReadStats {
    CgroupReadStats {
        cgroup_id,
        mount_id,
        latency: LatencyHistogram {
            buckets: vec![0; HIST_SLOTS],
        },
        ..Default::default()
    }
}

/// Which call a sampled access came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// read(2)
    Read,
    /// pread64(2)
    Pread64,
    /// readv(2)
    Readv,
    /// preadv(2)
    Preadv,
    /// An io_uring read.
    IoUring,
}

/// One sampled dataset read, as the prefetcher consumes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileAccess {
    /// CLOCK_MONOTONIC (ns) when the call returned.
    pub timestamp_ns: u64,
    /// cgroup v2 id of the reader.
    pub cgroup_id: u64,
    /// Process (tgid) of the reader.
    pub pid: u32,
    /// Index of the watched path in [`crate::ProbeConfig::watch`].
    pub mount_id: u32,
    /// Device of the file as user space sees it (`st_dev`).
    pub dev: u64,
    /// Inode of the file (`st_ino`).
    pub ino: u64,
    /// File offset the read started at.
    pub offset: i64,
    /// Bytes returned (0 at end of file).
    pub size: u64,
    /// `Some(errno)` when the call failed.
    pub error: Option<i32>,
    /// Wall time of the call (sampled reads are always timed).
    pub latency_ns: u64,
    /// Off-CPU time inside the call.
    pub blocked_ns: u64,
    /// The call.
    pub kind: ReadKind,
}

impl FileAccess {
    pub(crate) fn from_raw(r: &abi::RawFileAccess) -> Self {
        let kind = match r.kind {
            0 => ReadKind::Read,
            1 => ReadKind::Pread64,
            2 => ReadKind::Readv,
            3 => ReadKind::Preadv,
            _ => ReadKind::IoUring,
        };
        Self {
            timestamp_ns: r.ts_ns,
            cgroup_id: r.cgroup_id,
            pid: r.tgid,
            mount_id: r.mount_id,
            dev: crate::probes::user_dev(r.dev),
            ino: r.ino,
            offset: r.offset,
            size: r.ret.max(0) as u64,
            error: (r.ret < 0).then(|| (-r.ret) as i32),
            latency_ns: r.latency_ns,
            blocked_ns: r.blocked_ns,
            kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_use_bucket_upper_bounds() {
        let mut raw = [0u64; HIST_SLOTS];
        raw[10] = 90; // ~1 µs
        raw[20] = 10; // ~1 ms
        let h = LatencyHistogram::from_raw(&raw);
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_upper_ns(0.5), 2048);
        assert_eq!(h.quantile_upper_ns(0.99), 1 << 21);
        assert_eq!(LatencyHistogram::default().quantile_upper_ns(0.5), 0);
    }
}
