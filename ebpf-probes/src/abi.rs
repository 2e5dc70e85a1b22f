//! Rust mirrors of the structs in `bpf/sluice.h`, and the only unsafe code of the crate.
//!
//! Every struct here is `#[repr(C)]`, made of integers only and padded by hand exactly as in
//! the C header (the size assertions below keep the two in step).

/// Buckets of the log2 latency histograms (`SLUICE_HIST_SLOTS`).
pub const HIST_SLOTS: usize = 40;
/// Watched path prefixes the kernel side can hold (`SLUICE_MAX_PREFIXES`).
pub const MAX_PREFIXES: usize = 8;
/// Longest watched prefix in bytes (`SLUICE_PREFIX_LEN`).
pub const PREFIX_LEN: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct ReadKey {
    pub cgroup_id: u64,
    pub mount_id: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadStats {
    pub opens: u64,
    pub calls: u64,
    pub bytes: u64,
    pub errors: u64,
    pub timed_calls: u64,
    pub latency_ns: u64,
    pub blocked_ns: u64,
    pub page_cache_misses: u64,
    pub uring_reads: u64,
    pub uring_bytes: u64,
    pub uring_latency_ns: u64,
    pub latency_hist: [u64; HIST_SLOTS],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct FuseKey {
    pub cgroup_id: u64,
    pub mount_id: u32,
    pub opcode: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct FuseStats {
    pub requests: u64,
    pub errors: u64,
    pub latency_ns: u64,
    pub _pad: u64,
    pub latency_hist: [u64; HIST_SLOTS],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WatchedDev {
    pub mount_id: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prefix {
    pub len: u32,
    pub mount_id: u32,
    pub path: [u8; PREFIX_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Config {
    pub sample_every: u32,
    pub time_every: u32,
    pub stalls_only: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawFileAccess {
    pub ts_ns: u64,
    pub cgroup_id: u64,
    pub ino: u64,
    pub offset: i64,
    pub ret: i64,
    pub latency_ns: u64,
    pub blocked_ns: u64,
    pub dev: u32,
    pub mount_id: u32,
    pub tgid: u32,
    pub kind: u32,
}

const _: () = {
    assert!(size_of::<ReadKey>() == 16);
    assert!(size_of::<ReadStats>() == 8 * (11 + HIST_SLOTS));
    assert!(size_of::<FuseKey>() == 16);
    assert!(size_of::<FuseStats>() == 8 * (4 + HIST_SLOTS));
    assert!(size_of::<WatchedDev>() == 8);
    assert!(size_of::<Prefix>() == 8 + PREFIX_LEN);
    assert!(size_of::<Config>() == 16);
    assert!(size_of::<RawFileAccess>() == 72);
};

// SAFETY (all impls below): aya copies these to and from kernel map memory byte for byte.
// That is sound because each type is #[repr(C)], `Copy`, built only of integers and integer
// arrays (every bit pattern is a valid value) and has no implicit padding (explicit `_pad`
// fields; sizes asserted above), so no uninitialised bytes are read or written.
unsafe impl aya::Pod for ReadKey {}
unsafe impl aya::Pod for ReadStats {}
unsafe impl aya::Pod for FuseKey {}
unsafe impl aya::Pod for FuseStats {}
unsafe impl aya::Pod for WatchedDev {}
unsafe impl aya::Pod for Prefix {}
unsafe impl aya::Pod for Config {}

impl RawFileAccess {
    /// Decode one ring buffer record; `None` if it is too short (never sent by our program).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < size_of::<Self>() {
            return None;
        }
        // SAFETY: the slice holds at least size_of::<Self>() bytes (checked above);
        // read_unaligned needs no alignment; every bit pattern is a valid RawFileAccess
        // (integers only, see the Pod invariant above).
        Some(unsafe { bytes.as_ptr().cast::<Self>().read_unaligned() })
    }
}
