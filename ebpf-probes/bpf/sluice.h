/* Layouts shared by the BPF programs and the Rust loader (ebpf-probes/src/abi.rs).
 * Every struct is padded by hand to a multiple of 8 bytes with no implicit holes, so the
 * Rust #[repr(C)] mirror has the same size and field offsets. Change both together. */
#ifndef SLUICE_H
#define SLUICE_H

#define SLUICE_HIST_SLOTS 40      /* log2(ns) buckets: slot i holds [2^i, 2^(i+1)) ns */
#define SLUICE_MAX_PREFIXES 8     /* watched path prefixes matched at openat */
#define SLUICE_PREFIX_LEN 128     /* longest watched prefix, bytes, without the NUL */

/* What kind of call a sampled access came from. */
enum sluice_read_kind {
	SLUICE_READ = 0,
	SLUICE_PREAD64 = 1,
	SLUICE_READV = 2,
	SLUICE_PREADV = 3,
	SLUICE_IO_URING = 4,
};

/* Key of the per-cgroup, per-watched-mount counters. */
struct sluice_read_key {
	__u64 cgroup_id;
	__u32 mount_id;
	__u32 _pad;
};

/* Per-CPU counters of dataset reads for one (cgroup, mount). */
struct sluice_read_stats {
	__u64 opens;              /* successful openat of a watched file */
	__u64 calls;              /* read/pread64/readv/preadv calls on watched files */
	__u64 bytes;              /* bytes returned by those calls */
	__u64 errors;             /* calls that returned an error */
	__u64 timed_calls;        /* calls whose wall time was measured (1 in time_every) */
	__u64 latency_ns;         /* sum of the timed calls' wall time */
	__u64 blocked_ns;         /* sum of off-CPU (blocked) time inside those calls */
	__u64 page_cache_misses;  /* pages of watched files added to the page cache */
	__u64 uring_reads;        /* io_uring read completions on watched files */
	__u64 uring_bytes;
	__u64 uring_latency_ns;   /* submit -> complete */
	__u64 latency_hist[SLUICE_HIST_SLOTS]; /* of the timed calls */
};

/* Key of the FUSE request latency counters. */
struct sluice_fuse_key {
	__u64 cgroup_id;
	__u32 mount_id;
	__u32 opcode;
};

/* Per-CPU FUSE request counters for one (cgroup, mount, opcode). */
struct sluice_fuse_stats {
	__u64 requests;
	__u64 errors;
	__u64 latency_ns;
	__u64 _pad;
	__u64 latency_hist[SLUICE_HIST_SLOTS];
};

/* A watched filesystem (value of watched_devs, keyed by the kernel's s_dev). */
struct sluice_watched_dev {
	__u32 mount_id;
	__u32 _pad;
};

/* A watched path prefix (value of watched_prefixes, an array). len == 0: unused slot. */
struct sluice_prefix {
	__u32 len;
	__u32 mount_id;
	char path[SLUICE_PREFIX_LEN];
};

/* A file marked by a prefix watch at its open (value of watched_files, keyed by its
 * struct file *). */
struct sluice_watched_fd {
	__u64 ino;
	__u32 dev;
	__u32 mount_id;
};

/* Tunables written by user space into the one-slot config array. */
struct sluice_config {
	__u32 sample_every;       /* emit 1 of every N dataset reads; 0 = none */
	__u32 time_every;         /* time 1 of every N dataset reads per thread; 0 or 1 = all */
	__u32 stalls_only;        /* 1: sys_enter/sys_exit are not attached; sched_switch finds
				   * the reads that block from the sleeping thread's registers */
	__u32 _pad;
};

/* A sampled dataset read, sent through the ring buffer. */
struct sluice_file_access {
	__u64 ts_ns;              /* bpf_ktime_get_ns() at the call's exit */
	__u64 cgroup_id;
	__u64 ino;
	__s64 offset;             /* file offset the read started at */
	__s64 ret;                /* bytes read, or -errno */
	__u64 latency_ns;         /* sampled reads are always timed */
	__u64 blocked_ns;
	__u32 dev;
	__u32 mount_id;
	__u32 tgid;
	__u32 kind;               /* enum sluice_read_kind */
};

#endif
