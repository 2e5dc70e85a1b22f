// SPDX-License-Identifier: GPL-2.0
/* Empty programs on the hooks the probes use for every syscall of the node. Attached
 * alone, they show what hooking sys_enter/sys_exit costs before the probes do any work
 * (the kernel's syscall slow path and the program dispatch): the floor that
 * `cargo xtask bench probes` measures the probes against. Never loaded by the agent. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "kernel_types.h"

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/sys_enter")
int BPF_PROG(floor_sys_enter, struct pt_regs *regs, long nr)
{
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(floor_sys_exit, struct pt_regs *regs, long ret)
{
	return 0;
}
