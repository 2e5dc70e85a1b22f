//! The floor the probes are measured against: empty programs on the same per-syscall
//! hooks (`bpf/floor.bpf.c`). For benchmarks only; the agent never loads them.

use aya::{Btf, Ebpf};

use crate::probes::{BTF_PATH, ProbeError, attach_btf_tracepoint, check_capabilities};

static OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/floor.bpf.o");

/// Empty programs attached to `sys_enter` and `sys_exit`: every syscall on the node takes
/// the kernel's traced path and runs a program that does nothing. What a read loses to
/// this is the least any syscall-hook design costs; the rest of what [`crate::Probes`]
/// cost is their own work. Dropping it detaches both.
pub struct EmptySyscallHooks {
    _ebpf: Ebpf,
}

impl std::fmt::Debug for EmptySyscallHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmptySyscallHooks").finish_non_exhaustive()
    }
}

impl EmptySyscallHooks {
    /// Load and attach both programs.
    pub fn attach() -> Result<Self, ProbeError> {
        check_capabilities()?;
        let btf = Btf::from_sys_fs().map_err(|_| ProbeError::BtfUnavailable {
            path: BTF_PATH.into(),
        })?;
        let mut ebpf = Ebpf::load(OBJECT).map_err(ProbeError::Load)?;
        for (program, tracepoint) in [
            ("floor_sys_enter", "sys_enter"),
            ("floor_sys_exit", "sys_exit"),
        ] {
            attach_btf_tracepoint(&mut ebpf, &btf, program, tracepoint)?;
        }
        Ok(Self { _ebpf: ebpf })
    }
}
