//! Loading, attaching and reading the probes (aya).

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use aya::programs::{BtfTracePoint, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};

use crate::abi::{self, MAX_PREFIXES, PREFIX_LEN};
use crate::stats::{self, CgroupReadStats, FileAccess};

/// The compiled programs (`cargo xtask build-ebpf` writes it; see `bpf/objects.stamp`).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/sluice.bpf.o");

/// Programs on BTF tracepoints (`tp_btf`): (program, tracepoint). They follow every read,
/// open and context switch on the node, so they are the ones whose cost matters: a BTF
/// tracepoint calls its program directly, where a perf tracepoint (`syscalls:*`) first
/// copies a record into the perf buffer. Required: they measure the stalls.
pub const BTF_TRACEPOINTS: &[(&str, &str)] = &[
    ("sys_enter", "sys_enter"),
    ("sys_exit", "sys_exit"),
    ("sched_switch", "sched_switch"),
    ("sched_process_fork", "sched_process_fork"),
    ("sched_process_exit", "sched_process_exit"),
];

/// Programs on perf tracepoints: (program, tracepoint category, tracepoint name). Rarer
/// events (FUSE requests, io_uring reads, page-cache inserts), each category optional.
pub const TRACEPOINTS: &[(&str, &str, &str)] = &[
    ("fuse_request_send", "fuse", "fuse_request_send"),
    ("fuse_request_end", "fuse", "fuse_request_end"),
    ("io_uring_submit_req", "io_uring", "io_uring_submit_req"),
    ("io_uring_complete", "io_uring", "io_uring_complete"),
    (
        "filemap_add_to_page_cache",
        "filemap",
        "mm_filemap_add_to_page_cache",
    ),
];

/// Older names of tracepoints, tried when the current one is missing: (category, name,
/// old name). Only fields at the same offsets are read, so one program serves both.
const OLD_NAMES: &[(&str, &str, &str)] = &[
    // Renamed in 6.x; ctx, req and opcode keep offsets 8, 16 and 32 (6.1's format).
    ("io_uring", "io_uring_submit_req", "io_uring_submit_sqe"),
];

/// Categories the probes can run without (the fuse tracepoints are recent: 6.1 kernels,
/// for one, lack them).
pub const OPTIONAL_CATEGORIES: &[&str] = &["fuse", "io_uring", "filemap"];

pub(crate) const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";
const TRACEFS_CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Why the probes could not be loaded; the message names what is missing.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The process lacks the capabilities to load BPF programs.
    #[error(
        "CAP_BPF/CAP_SYS_ADMIN missing: loading eBPF probes needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN"
    )]
    MissingCapabilities,
    /// The kernel exposes no BTF, needed for CO-RE relocations.
    #[error("BTF not available: {path} is missing (kernel built without CONFIG_DEBUG_INFO_BTF)")]
    BtfUnavailable {
        /// Where BTF was looked for.
        path: PathBuf,
    },
    /// tracefs is not mounted.
    #[error(
        "tracefs not mounted at /sys/kernel/tracing or /sys/kernel/debug/tracing (mount -t tracefs nodev /sys/kernel/tracing)"
    )]
    TracefsMissing,
    /// A tracepoint the probes need does not exist on this kernel.
    #[error(
        "tracepoint {category}/{name} not found under {tracefs}/events (kernel too old, or its module not loaded)"
    )]
    TracepointMissing {
        /// Tracepoint category, e.g. `fuse`.
        category: String,
        /// Tracepoint name, e.g. `fuse_request_send`.
        name: String,
        /// The tracefs mount that was searched.
        tracefs: PathBuf,
    },
    /// A watched path in the configuration is unusable.
    #[error("watched path {path}: {reason}")]
    InvalidWatch {
        /// The path as configured.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The configuration is out of range.
    #[error("probe configuration: {0}")]
    InvalidConfig(String),
    /// aya could not parse, relocate or create the object's maps.
    #[error("loading the eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    /// A program failed to load (verifier) or attach.
    #[error("eBPF program {program}: {source}")]
    Program {
        /// The program's name.
        program: &'static str,
        /// aya's error (contains the verifier log on a load failure).
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map could not be opened, read or written.
    #[error("eBPF map {map}: {source}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
    /// The object lacks a map or program this crate expects (stale object).
    #[error("{0} missing from the eBPF object; run cargo xtask build-ebpf")]
    MissingFromObject(&'static str),
}

/// One thing to watch; its index in [`ProbeConfig::watch`] is its `mount_id` in the stats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchedPath {
    /// Every file on the filesystem that holds this path (matched by the superblock's
    /// device number): meant for a Sluice FUSE mount point or any dedicated mount.
    Filesystem(PathBuf),
    /// Files opened (openat) by an absolute path under this directory, on any filesystem.
    /// Relative paths are not matched; prefer [`WatchedPath::Filesystem`] when possible.
    Prefix(PathBuf),
}

/// How much the probes follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProbeMode {
    /// Every dataset read: calls, bytes, latency, stall time, the sampled access stream.
    /// Costs every syscall on the node the hooks on `sys_enter`/`sys_exit`.
    #[default]
    PerRead,
    /// Stall time only: no per-syscall hooks (reads that do not block cost nothing);
    /// `sched_switch` finds the reads that block from the sleeping thread's registers.
    /// No calls, bytes, latency or access stream; filesystem watches only (a path prefix
    /// watch needs the opens).
    StallsOnly,
}

/// Programs that only [`ProbeMode::PerRead`] attaches.
const PER_READ_ONLY: &[&str] = &[
    "sys_enter",
    "sys_exit",
    "sched_process_fork",
    "sched_process_exit",
];

/// What to load: watched paths and sampling.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// What the probes follow.
    pub mode: ProbeMode,
    /// Watched filesystems and path prefixes (at most 256 filesystems and 8 prefixes).
    pub watch: Vec<WatchedPath>,
    /// Send 1 of every N dataset reads to the ring buffer (per CPU); 0 sends none.
    pub sample_every: u32,
    /// Time 1 of every N dataset reads of each thread (0 or 1: every read). Reading the
    /// clock at a read's entry and exit is the largest part of what the probes add to a
    /// page-cache read; the latency histogram of a sample is as good for quantiles.
    /// Blocked (stall) time is measured on every read regardless.
    pub time_every: u32,
    /// Ring buffer size in bytes: a power of two, at least one page.
    pub ring_buffer_bytes: u32,
    /// Fail when an optional tracepoint ([`OPTIONAL_CATEGORIES`]) is missing, instead of
    /// running without that category (see [`Probes::unavailable`]).
    pub require_all_tracepoints: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            watch: Vec::new(),
            mode: ProbeMode::PerRead,
            sample_every: 16,
            time_every: 8,
            ring_buffer_bytes: 1 << 20,
            require_all_tracepoints: false,
        }
    }
}

impl ProbeConfig {
    /// Watch a whole filesystem (the one holding `path`).
    pub fn watch_filesystem(mut self, path: impl Into<PathBuf>) -> Self {
        self.watch.push(WatchedPath::Filesystem(path.into()));
        self
    }

    /// Watch files opened by absolute paths under `dir`.
    pub fn watch_prefix(mut self, dir: impl Into<PathBuf>) -> Self {
        self.watch.push(WatchedPath::Prefix(dir.into()));
        self
    }

    /// Sample 1 of every `n` dataset reads into the ring buffer; 0 disables sampling.
    pub fn sample_every(mut self, n: u32) -> Self {
        self.sample_every = n;
        self
    }

    /// What the probes follow.
    pub fn mode(mut self, mode: ProbeMode) -> Self {
        self.mode = mode;
        self
    }

    /// Time 1 of every `n` dataset reads per thread; 1 times every read.
    pub fn time_every(mut self, n: u32) -> Self {
        self.time_every = n;
        self
    }
}

/// The loaded and attached probes. Dropping it detaches and unloads everything; nothing
/// is pinned in /sys/fs/bpf.
pub struct Probes {
    // Owns the programs, their tracepoint links and the maps; dropping it closes them all.
    ebpf: Ebpf,
    accesses: RingBuf<MapData>,
    config: ProbeConfig,
    unavailable: Vec<String>,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Probes {
    /// Check the kernel and privileges, load and attach every program, fill the watch maps.
    pub fn load(config: ProbeConfig) -> Result<Self, ProbeError> {
        check_capabilities()?;
        if !Path::new(BTF_PATH).exists() {
            return Err(ProbeError::BtfUnavailable {
                path: BTF_PATH.into(),
            });
        }
        let tracefs = find_or_mount_tracefs().ok_or(ProbeError::TracefsMissing)?;
        let unavailable = check_tracepoints(&tracefs, config.require_all_tracepoints)?;
        for tp in &unavailable {
            tracing::warn!(tracepoint = %tp, "tracepoint missing on this kernel: running without it");
        }
        let (devs, prefixes) = resolve_watches(&config.watch)?;
        if config.mode == ProbeMode::StallsOnly && !prefixes.is_empty() {
            return Err(ProbeError::InvalidConfig(
                "path prefix watches need ProbeMode::PerRead: only the opens tell which files a prefix covers"
                    .into(),
            ));
        }
        let watched_devs: Vec<u32> = devs.iter().map(|&(dev, _)| dev).collect();
        let ring = config.ring_buffer_bytes;
        if !ring.is_power_of_two() || ring < 4096 {
            return Err(ProbeError::InvalidConfig(format!(
                "ring_buffer_bytes {ring} must be a power of two of at least 4096"
            )));
        }

        let mut ebpf = EbpfLoader::new()
            // The kernel supports task storage (reads in flight); aya has no typed
            // wrapper for it, and user space never touches it.
            .allow_unsupported_maps()
            .map_max_entries("accesses", ring)
            .load(OBJECT)
            .map_err(ProbeError::Load)?;
        let btf = Btf::from_sys_fs().map_err(|_| ProbeError::BtfUnavailable {
            path: BTF_PATH.into(),
        })?;
        for &(program, tracepoint) in BTF_TRACEPOINTS {
            if config.mode == ProbeMode::StallsOnly && PER_READ_ONLY.contains(&program) {
                continue;
            }
            attach_btf_tracepoint(&mut ebpf, &btf, program, tracepoint)?;
        }
        for &(program, category, name) in TRACEPOINTS {
            if unavailable
                .iter()
                .any(|u| u.split('/').next() == Some(category))
            {
                continue;
            }
            let prog: &mut TracePoint = ebpf
                .program_mut(program)
                .ok_or(ProbeError::MissingFromObject(program))?
                .try_into()
                .map_err(|source| ProbeError::Program { program, source })?;
            prog.load()
                .map_err(|source| ProbeError::Program { program, source })?;
            let name = resolve_tracepoint(&tracefs, category, name).unwrap_or(name);
            prog.attach(category, name)
                .map_err(|source| ProbeError::Program { program, source })?;
        }

        {
            let mut map: HashMap<&mut MapData, u32, abi::WatchedDev> =
                map_mut(&mut ebpf, "watched_devs")?;
            for (dev, mount_id) in devs {
                map.insert(dev, abi::WatchedDev { mount_id, _pad: 0 }, 0)
                    .map_err(|source| ProbeError::Map {
                        map: "watched_devs",
                        source,
                    })?;
            }
        }
        {
            let mut map: Array<&mut MapData, abi::Prefix> = map_mut(&mut ebpf, "watched_prefixes")?;
            for (i, prefix) in prefixes.into_iter().enumerate() {
                map.set(i as u32, prefix, 0)
                    .map_err(|source| ProbeError::Map {
                        map: "watched_prefixes",
                        source,
                    })?;
            }
        }
        // The programs see opens from now on; processes that already hold a watched file
        // (a job that outlived an agent restart) are found in /proc.
        {
            let mut map: HashMap<&mut MapData, u32, u32> = map_mut(&mut ebpf, "watched_procs")?;
            let holding = match config.mode {
                ProbeMode::PerRead => processes_holding(&watched_devs),
                ProbeMode::StallsOnly => Vec::new(),
            };
            for tgid in holding {
                map.insert(tgid, 1, 0).map_err(|source| ProbeError::Map {
                    map: "watched_procs",
                    source,
                })?;
            }
        }
        let accesses = ebpf
            .take_map("accesses")
            .ok_or(ProbeError::MissingFromObject("accesses"))?;
        let accesses = RingBuf::try_from(accesses).map_err(|source| ProbeError::Map {
            map: "accesses",
            source,
        })?;
        let mut probes = Self {
            ebpf,
            accesses,
            config,
            unavailable,
        };
        probes.set_sample_every(probes.config.sample_every)?;
        Ok(probes)
    }

    /// Optional tracepoints (`category/name`) missing on this kernel, whose whole category
    /// (FUSE latency, io_uring reads or page-cache misses) is therefore not measured.
    pub fn unavailable(&self) -> &[String] {
        &self.unavailable
    }

    /// Change the sampling rate of the access stream at run time (0 stops it).
    pub fn set_sample_every(&mut self, n: u32) -> Result<(), ProbeError> {
        let mut map: Array<&mut MapData, abi::Config> = map_mut(&mut self.ebpf, "config")?;
        map.set(
            0,
            abi::Config {
                sample_every: n,
                time_every: self.config.time_every,
                stalls_only: u32::from(self.config.mode == ProbeMode::StallsOnly),
                _pad: 0,
            },
            0,
        )
        .map_err(|source| ProbeError::Map {
            map: "config",
            source,
        })?;
        self.config.sample_every = n;
        Ok(())
    }

    /// The configuration the probes run with (`mount_id` = index in `watch`).
    pub fn config(&self) -> &ProbeConfig {
        &self.config
    }

    /// Cumulative dataset-read counters per (cgroup, watched mount), summed over CPUs.
    pub fn snapshot(&self) -> Result<Vec<CgroupReadStats>, ProbeError> {
        let reads: PerCpuHashMap<&MapData, abi::ReadKey, abi::ReadStats> =
            map_ref(&self.ebpf, "read_stats")?;
        let reads = reads
            .iter()
            .map(|r| r.map(|(k, v)| (k, v.to_vec())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| ProbeError::Map {
                map: "read_stats",
                source,
            })?;
        let fuse: PerCpuHashMap<&MapData, abi::FuseKey, abi::FuseStats> =
            map_ref(&self.ebpf, "fuse_stats")?;
        let fuse = fuse
            .iter()
            .map(|r| r.map(|(k, v)| (k, v.to_vec())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| ProbeError::Map {
                map: "fuse_stats",
                source,
            })?;
        Ok(stats::merge(reads, fuse))
    }

    /// Drop the counters of a cgroup that no longer exists, so the maps do not fill up.
    pub fn forget_cgroup(&mut self, cgroup_id: u64) -> Result<(), ProbeError> {
        let mut reads: PerCpuHashMap<&mut MapData, abi::ReadKey, abi::ReadStats> =
            map_mut(&mut self.ebpf, "read_stats")?;
        let keys: Vec<_> = reads
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.cgroup_id == cgroup_id)
            .collect();
        for k in keys {
            let _ = reads.remove(&k); // already gone is fine
        }
        let mut fuse: PerCpuHashMap<&mut MapData, abi::FuseKey, abi::FuseStats> =
            map_mut(&mut self.ebpf, "fuse_stats")?;
        let keys: Vec<_> = fuse
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.cgroup_id == cgroup_id)
            .collect();
        for k in keys {
            let _ = fuse.remove(&k);
        }
        Ok(())
    }

    /// Take every sampled access waiting in the ring buffer (never blocks).
    pub fn drain_accesses(&mut self) -> Vec<FileAccess> {
        let mut out = Vec::new();
        while let Some(item) = self.accesses.next() {
            if let Some(raw) = abi::RawFileAccess::from_bytes(&item) {
                out.push(FileAccess::from_raw(&raw));
            }
        }
        out
    }

    /// A descriptor that polls readable when accesses are waiting (for `tokio::io::unix::AsyncFd`).
    pub fn accesses_fd(&self) -> BorrowedFd<'_> {
        self.accesses.as_fd()
    }

    /// Sampled accesses dropped because the ring buffer was full, since load.
    pub fn lost_events(&self) -> Result<u64, ProbeError> {
        self.lost_counter(0)
    }

    /// Counter updates dropped because a stats map was full, since load.
    pub fn lost_stat_updates(&self) -> Result<u64, ProbeError> {
        self.lost_counter(1)
    }

    fn lost_counter(&self, index: u32) -> Result<u64, ProbeError> {
        let lost: PerCpuArray<&MapData, u64> = map_ref(&self.ebpf, "lost")?;
        let values = lost.get(&index, 0).map_err(|source| ProbeError::Map {
            map: "lost",
            source,
        })?;
        Ok(values.iter().sum())
    }

    /// Kernel ids of the loaded programs (to check from outside that they are gone after drop).
    pub fn program_ids(&self) -> Vec<u32> {
        self.ebpf
            .programs()
            .filter_map(|(_, p)| p.info().ok())
            .map(|i| i.id())
            .collect()
    }
}

fn map_ref<'a, T>(ebpf: &'a Ebpf, name: &'static str) -> Result<T, ProbeError>
where
    T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.map(name).ok_or(ProbeError::MissingFromObject(name))?;
    T::try_from(map).map_err(|source| ProbeError::Map { map: name, source })
}

fn map_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, ProbeError>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .map_mut(name)
        .ok_or(ProbeError::MissingFromObject(name))?;
    T::try_from(map).map_err(|source| ProbeError::Map { map: name, source })
}

/// Load `program` of `ebpf` and attach it to the BTF tracepoint `tracepoint`; the link
/// lives as long as `ebpf`.
pub(crate) fn attach_btf_tracepoint(
    ebpf: &mut Ebpf,
    btf: &Btf,
    program: &'static str,
    tracepoint: &str,
) -> Result<(), ProbeError> {
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or(ProbeError::MissingFromObject(program))?
        .try_into()
        .map_err(|source| ProbeError::Program { program, source })?;
    prog.load(tracepoint, btf)
        .map_err(|source| ProbeError::Program { program, source })?;
    prog.attach()
        .map_err(|source| ProbeError::Program { program, source })?;
    Ok(())
}

/// Needs CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (tracepoints are perf events).
pub(crate) fn check_capabilities() -> Result<(), ProbeError> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(ProbeError::MissingCapabilities)
    }
}

fn find_tracefs() -> Option<PathBuf> {
    TRACEFS_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// The tracefs mount; when there is none, mounts it at its standard place if we may. systemd
/// mounts it at boot, but a container, or a VM booted without systemd, may never have (a
/// fresh CI machine did not), and an agent with CAP_SYS_ADMIN would otherwise run blind.
fn find_or_mount_tracefs() -> Option<PathBuf> {
    if let Some(found) = find_tracefs() {
        return Some(found);
    }
    let target = TRACEFS_CANDIDATES[0];
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (source, dir, fstype) = (c("nodev"), c(target), c("tracefs"));
    // SAFETY: NUL-terminated strings that outlive the call; no mount data.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            dir.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot mount tracefs at {target}");
        return None;
    }
    tracing::info!("tracefs was not mounted: mounted it at {target}");
    find_tracefs()
}

/// Check that the tracepoints of [`TRACEPOINTS`] exist under `tracefs/events`: a missing
/// required one (or any, with `require_all`) is an error; missing optional ones are returned.
/// The name `category/name` has on this kernel (itself or an older name), if it exists.
fn resolve_tracepoint(tracefs: &Path, category: &str, name: &'static str) -> Option<&'static str> {
    let exists = |n: &str| tracefs.join("events").join(category).join(n).is_dir();
    if exists(name) {
        return Some(name);
    }
    OLD_NAMES
        .iter()
        .find(|(c, n, old)| *c == category && *n == name && exists(old))
        .map(|(_, _, old)| *old)
}

pub(crate) fn check_tracepoints(
    tracefs: &Path,
    require_all: bool,
) -> Result<Vec<String>, ProbeError> {
    let mut missing = Vec::new();
    for &(_, category, name) in TRACEPOINTS {
        if resolve_tracepoint(tracefs, category, name).is_some() {
            continue;
        }
        if require_all || !OPTIONAL_CATEGORIES.contains(&category) {
            return Err(ProbeError::TracepointMissing {
                category: category.into(),
                name: name.into(),
                tracefs: tracefs.into(),
            });
        }
        missing.push(format!("{category}/{name}"));
    }
    Ok(missing)
}

/// Processes (tgid) with an open file on one of `devs` (kernel dev_t), found through
/// /proc without touching the files themselves (a hung mount must not hang the agent):
/// each fd's `mnt_id` (fdinfo) is looked up in the process's own mountinfo.
fn processes_holding(devs: &[u32]) -> Vec<u32> {
    let mut found = Vec::new();
    if devs.is_empty() {
        return found;
    }
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in proc.flatten() {
        let Some(tgid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
            continue; // gone, or a kernel thread
        };
        let mut watched_mounts: Option<Vec<u64>> = None;
        for fd in fds.flatten() {
            // Sockets, pipes and anonymous inodes have no path.
            if !std::fs::read_link(fd.path()).is_ok_and(|t| t.is_absolute()) {
                continue;
            }
            let watched = watched_mounts.get_or_insert_with(|| {
                let text = std::fs::read_to_string(dir.join("mountinfo")).unwrap_or_default();
                mounts_on(&text, devs)
            });
            if watched.is_empty() {
                break;
            }
            let fdinfo = std::fs::read_to_string(dir.join("fdinfo").join(fd.file_name()))
                .unwrap_or_default();
            let mnt_id = fdinfo
                .lines()
                .find_map(|l| l.strip_prefix("mnt_id:"))
                .and_then(|v| v.trim().parse::<u64>().ok());
            if mnt_id.is_some_and(|id| watched.contains(&id)) {
                found.push(tgid);
                break;
            }
        }
    }
    found
}

/// Mount ids in a mountinfo text whose device (`major:minor`, field 3) is one of `devs`.
fn mounts_on(mountinfo: &str, devs: &[u32]) -> Vec<u64> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?.parse::<u64>().ok()?;
            let (major, minor) = fields.nth(1)?.split_once(':')?;
            let dev = (major.parse::<u32>().ok()? << 20) | (minor.parse::<u32>().ok()? & 0xfffff);
            devs.contains(&dev).then_some(id)
        })
        .collect()
}

/// The kernel's internal dev_t (`MAJOR << 20 | MINOR`, as in `sb->s_dev`) of a user `st_dev`.
pub(crate) fn kernel_dev(st_dev: u64) -> u32 {
    (libc::major(st_dev) << 20) | (libc::minor(st_dev) & 0xfffff)
}

/// User-space `st_dev` of a kernel `s_dev`.
pub(crate) fn user_dev(s_dev: u32) -> u64 {
    libc::makedev(s_dev >> 20, s_dev & 0xfffff)
}

type Watches = (Vec<(u32, u32)>, Vec<abi::Prefix>);

/// Turn the configured paths into (s_dev, mount_id) pairs and prefix slots.
fn resolve_watches(watch: &[WatchedPath]) -> Result<Watches, ProbeError> {
    let mut devs = Vec::new();
    let mut prefixes = Vec::new();
    for (mount_id, w) in watch.iter().enumerate() {
        let mount_id = mount_id as u32;
        match w {
            WatchedPath::Filesystem(path) => {
                let meta = std::fs::metadata(path).map_err(|e| ProbeError::InvalidWatch {
                    path: path.clone(),
                    reason: format!("cannot stat it: {e}"),
                })?;
                let dev = kernel_dev(meta.dev());
                if let Some(&(_, other)) = devs.iter().find(|(d, _)| *d == dev) {
                    return Err(ProbeError::InvalidWatch {
                        path: path.clone(),
                        reason: format!("same filesystem as watched path #{other}"),
                    });
                }
                let parent_dev = path
                    .canonicalize()
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_owned));
                if parent_dev
                    .and_then(|p| std::fs::metadata(p).ok())
                    .is_some_and(|m| m.dev() == meta.dev())
                {
                    tracing::warn!(path = %path.display(), "not a mount point: every file of its filesystem is watched");
                }
                devs.push((dev, mount_id));
            }
            WatchedPath::Prefix(path) => {
                let invalid = |reason: &str| ProbeError::InvalidWatch {
                    path: path.clone(),
                    reason: reason.into(),
                };
                let full = path.canonicalize().unwrap_or_else(|_| path.clone());
                let text = full
                    .to_str()
                    .ok_or_else(|| invalid("not UTF-8"))?
                    .trim_end_matches('/');
                if !text.starts_with('/') {
                    return Err(invalid("must be absolute"));
                }
                if text.is_empty() {
                    return Err(invalid(
                        "'/' would watch every file; watch a filesystem instead",
                    ));
                }
                if text.len() > PREFIX_LEN {
                    return Err(invalid(&format!("longer than {PREFIX_LEN} bytes")));
                }
                if prefixes.len() == MAX_PREFIXES {
                    return Err(invalid(&format!(
                        "at most {MAX_PREFIXES} prefixes can be watched"
                    )));
                }
                let mut slot = abi::Prefix {
                    len: text.len() as u32,
                    mount_id,
                    path: [0; PREFIX_LEN],
                };
                slot.path[..text.len()].copy_from_slice(text.as_bytes());
                prefixes.push(slot);
            }
        }
    }
    Ok((devs, prefixes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tracepoints_are_named_and_optional_ones_tolerated() {
        let root = tempfile::tempdir().unwrap();
        let make = |cat: &str, name: &str| {
            std::fs::create_dir_all(root.path().join("events").join(cat).join(name)).unwrap()
        };
        for &(_, cat, name) in TRACEPOINTS {
            if cat != "fuse" {
                make(cat, name);
            }
        }
        // A 6.1 kernel: no fuse tracepoints. Tolerated unless everything is required.
        let missing = check_tracepoints(root.path(), false).unwrap();
        assert_eq!(missing, ["fuse/fuse_request_send", "fuse/fuse_request_end"]);
        let err = check_tracepoints(root.path(), true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tracepoint fuse/fuse_request_send not found"),
            "{err}"
        );
        make("fuse", "fuse_request_send");
        make("fuse", "fuse_request_end");
        assert!(check_tracepoints(root.path(), true).unwrap().is_empty());
        // 6.1 calls io_uring_submit_req io_uring_submit_sqe.
        std::fs::remove_dir(root.path().join("events/io_uring/io_uring_submit_req")).unwrap();
        assert_eq!(
            check_tracepoints(root.path(), false).unwrap(),
            ["io_uring/io_uring_submit_req"]
        );
        make("io_uring", "io_uring_submit_sqe");
        assert!(check_tracepoints(root.path(), true).unwrap().is_empty());
        assert_eq!(
            resolve_tracepoint(root.path(), "io_uring", "io_uring_submit_req"),
            Some("io_uring_submit_sqe")
        );
    }

    #[test]
    fn mounts_of_watched_devices_are_found_in_mountinfo() {
        let text = "\
22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw
95 29 0:52 / /mnt/sluice/imagenet rw,nosuid,nodev,relatime shared:40 - fuse.sluice sluice rw
96 29 259:3 /data /srv/data rw shared:41 - ext4 /dev/nvme0n1p3 rw
";
        assert_eq!(mounts_on(text, &[52]), [95]);
        assert_eq!(mounts_on(text, &[(259 << 20) | 3, 52]), [95, 96]);
        assert!(mounts_on(text, &[53]).is_empty());
        assert!(mounts_on("garbage\n\n", &[52]).is_empty());
    }

    #[test]
    fn device_numbers_round_trip_between_kernel_and_user_encodings() {
        let st_dev = libc::makedev(259, 1_048_575);
        assert_eq!(kernel_dev(st_dev), (259 << 20) | 1_048_575);
        assert_eq!(user_dev(kernel_dev(st_dev)), st_dev);
        assert_eq!(kernel_dev(libc::makedev(0, 52)), 52);
    }

    #[test]
    fn prefixes_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let (_, p) = resolve_watches(&[WatchedPath::Prefix(dir.path().join("data/"))]).unwrap();
        let want = dir.path().join("data");
        assert_eq!(
            &p[0].path[..p[0].len as usize],
            want.to_str().unwrap().as_bytes()
        );
        assert!(resolve_watches(&[WatchedPath::Prefix("relative".into())]).is_err());
        assert!(resolve_watches(&[WatchedPath::Prefix("/".into())]).is_err());
        let long = format!("/{}", "x".repeat(PREFIX_LEN));
        assert!(resolve_watches(&[WatchedPath::Prefix(long.into())]).is_err());
        let err =
            resolve_watches(&[WatchedPath::Filesystem("/nonexistent/sluice".into())]).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/sluice"), "{err}");
    }
}
