//! Loads Sluice's eBPF probes (written in C under `bpf/`, compiled objects committed) with
//! aya and turns their maps and ring buffer into typed per-cgroup counters and events.
//!
//! - [`Probes::load`] checks privileges and kernel support, attaches the tracepoint
//!   programs and tells the kernel side what to watch ([`ProbeConfig`]).
//! - [`Probes::snapshot`] reads the per-cgroup, per-mount counters ([`CgroupReadStats`]);
//!   [`Probes::drain_accesses`] the sampled [`FileAccess`] stream.
//! - [`cgroup`] names a cgroup id: Kubernetes pod, systemd unit or plain cgroup.
//! - [`EmptySyscallHooks`] is the floor benchmarks measure the probes against.

mod abi;
pub mod cgroup;
mod floor;
mod probes;
#[cfg(test)]
mod stamp;
mod stats;

pub use abi::HIST_SLOTS;
pub use floor::EmptySyscallHooks;
pub use probes::{
    BTF_TRACEPOINTS, OPTIONAL_CATEGORIES, ProbeConfig, ProbeError, ProbeMode, Probes, TRACEPOINTS,
    WatchedPath,
};
pub use stats::{CgroupReadStats, FileAccess, FuseOpStats, LatencyHistogram, ReadKind};
