/* The few kernel types the probes read, declared by hand instead of a 3 MB vmlinux.h.
 * preserve_access_index makes every field access a CO-RE relocation: the loader (aya)
 * rewrites the offsets from the running kernel's BTF, so only the field names and types
 * must match the kernel, not the layout. */
#ifndef SLUICE_KERNEL_TYPES_H
#define SLUICE_KERNEL_TYPES_H

typedef _Bool bool;

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)
struct super_block {
	__u32 s_dev;
};
struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
};
struct file {
	struct inode *f_inode;
	long long f_pos;
};
struct fdtable {
	unsigned int max_fds;
	struct file **fd;
};
struct files_struct {
	struct fdtable *fdt;
};
struct kernfs_node {
	__u64 id;
};
struct cgroup {
	struct kernfs_node *kn;
};
struct css_set {
	struct cgroup *dfl_cgrp;
};
struct task_struct {
	unsigned int flags;
	int pid;
	int tgid;
	struct files_struct *files;
	struct css_set *cgroups;
};
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long r10;
	unsigned long orig_ax;
};
#elif defined(__TARGET_ARCH_arm64)
struct pt_regs {
	__u64 regs[31];
	__s32 syscallno;
};
#endif
struct io_kiocb {
	struct file *file; /* inside an anonymous union in the kernel; CO-RE finds it */
};
#pragma clang attribute pop

/* Tracepoint records, from /sys/kernel/tracing/events/<category>/<name>/format. These are
 * stable ABI (not relocated): the offsets are those the format files give. */
struct trace_common {
	__u16 type;
	__u8 flags;
	__u8 preempt_count;
	__s32 pid;
};

/* fuse/fuse_request_send */
struct tp_fuse_request_send {
	struct trace_common common;
	__u32 connection;
	__u32 _pad;
	__u64 unique;
	__u32 opcode;
	__u32 len;
};

/* fuse/fuse_request_end */
struct tp_fuse_request_end {
	struct trace_common common;
	__u32 connection;
	__u32 _pad;
	__u64 unique;
	__u32 len;
	__s32 error;
};

/* io_uring/io_uring_submit_req */
struct tp_io_uring_submit_req {
	struct trace_common common;
	void *ctx;
	void *req;
	__u64 user_data;
	__u8 opcode;
};

/* io_uring/io_uring_complete */
struct tp_io_uring_complete {
	struct trace_common common;
	void *ctx;
	void *req;
	__u64 user_data;
	__s32 res;
	__u32 cflags;
};

/* filemap/mm_filemap_add_to_page_cache */
struct tp_filemap_add {
	struct trace_common common;
	unsigned long pfn;
	unsigned long i_ino;
	unsigned long index;
	__u32 s_dev;
	__u8 order;
};

#endif
