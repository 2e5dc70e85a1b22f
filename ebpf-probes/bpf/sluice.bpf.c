// SPDX-License-Identifier: GPL-2.0
/* Sluice's dataset-read probes, tracepoints only (kprobes and fentry are unavailable on
 * the target kernels).
 *
 * A read counts as a dataset read when its file is watched, decided in the kernel:
 *  1. by filesystem: the file's inode->i_sb->s_dev is in `watched_devs` (user space puts
 *     there the s_dev of each watched mount, e.g. the Sluice FUSE mount). Checked at every
 *     read by walking current->files->fdt->fd[fd], so fds that were dup'ed, inherited over
 *     fork or opened by openat2/io_uring count too;
 *  2. by path: an absolute openat path starting with a prefix in `watched_prefixes` marks
 *     the returned fd in `watched_fds` (tgid << 32 | fd -> dev, ino), cleared at close, and
 *     its open file (struct file *) in `watched_files`, so the mark survives dup2 (dd moves
 *     its input to fd 0) and fork. A read counts when the fd resolves to that same (dev,
 *     ino); the check also makes a recycled struct file address harmless.
 * Everything is aggregated per cgroup id (cgroup v2) and mount id in per-CPU maps; a
 * sampled stream of accesses goes to user space through a ring buffer. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "kernel_types.h"
#include "sluice.h"

char LICENSE[] SEC("license") = "GPL";

#define TASK_REPORT_BLOCKED 0xff /* S, D, T, t, X, Z, P, I: not runnable */
#define PATH_SCRATCH 256

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32); /* s_dev */
	__type(value, struct sluice_watched_dev);
} watched_devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_MAX_PREFIXES);
	__type(key, __u32);
	__type(value, struct sluice_prefix);
} watched_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, __u64); /* tgid << 32 | fd */
	__type(value, struct sluice_watched_fd);
} watched_fds SEC(".maps");

/* The same marks keyed by open file; never cleared (another fd may still share the file),
 * LRU evicts old ones. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64); /* struct file * */
	__type(value, struct sluice_watched_fd);
} watched_files SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_config);
} config SEC(".maps");

/* Per-thread state of an openat whose path matched a prefix (tid -> mount id + 1). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} pending_opens SEC(".maps");

/* A dataset read in progress on one thread. */
struct inflight_read {
	__u64 start_ns;
	__u64 offcpu_since; /* 0 while on CPU */
	__u64 blocked_ns;
	__u64 ino;
	__s64 offset;
	__u32 dev;
	__u32 mount_id;
	__u32 kind;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); /* tid */
	__type(value, struct inflight_read);
} inflight_reads SEC(".maps");

struct fuse_req_key {
	__u64 unique;
	__u32 connection;
	__u32 _pad;
};

struct fuse_req {
	__u64 start_ns;
	__u64 cgroup_id;
	__u32 opcode;
	__u32 mount_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct fuse_req_key);
	__type(value, struct fuse_req);
} fuse_inflight SEC(".maps");

struct uring_req {
	__u64 start_ns;
	__u64 cgroup_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* struct io_kiocb * */
	__type(value, struct uring_req);
} uring_inflight SEC(".maps");

/* No preallocation: per-CPU values times every possible key would cost hundreds of MB on
 * a large node, while only a few hundred (cgroup, mount) pairs ever exist. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_read_key);
	__type(value, struct sluice_read_stats);
} read_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_fuse_key);
	__type(value, struct sluice_fuse_stats);
} fuse_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* user space may resize */
} accesses SEC(".maps");

/* [0]: ring buffer reservations that failed; [1]: stats entries that could not be made. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Per-CPU sampling counter and path scratch (too big for the 512-byte stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sample_tick SEC(".maps");

struct path_buf {
	char s[PATH_SCRATCH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct path_buf);
} path_scratch SEC(".maps");

static __always_inline void count_lost(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&lost, &which);
	if (n)
		*n += 1;
}

static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0;
	/* Binary search for the highest set bit; fixed shape, so no loop for the verifier. */
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r < SLUICE_HIST_SLOTS ? r : SLUICE_HIST_SLOTS - 1;
}

static __always_inline struct sluice_read_stats *read_stats_for(__u64 cgroup_id, __u32 mount_id)
{
	struct sluice_read_key key = { .cgroup_id = cgroup_id, .mount_id = mount_id };
	struct sluice_read_stats *s = bpf_map_lookup_elem(&read_stats, &key);
	if (s)
		return s;
	static const struct sluice_read_stats zero;
	bpf_map_update_elem(&read_stats, &key, &zero, BPF_NOEXIST); /* EEXIST: raced, fine */
	s = bpf_map_lookup_elem(&read_stats, &key);
	if (!s)
		count_lost(1);
	return s;
}

/* The open file behind `fd` in the current task, or NULL. */
static __always_inline struct file *fd_file(__u32 fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return 0;
	if (fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	return f;
}

/* Decide whether fd is a watched file; fills dev/ino/mount and the position for read(). */
static __always_inline int watched_read_target(__u32 tgid, __u32 fd, struct inflight_read *r)
{
	struct file *f = fd_file(fd);
	if (!f)
		return 0;
	/* Every read on the node comes through here: decide on the device first and read
	 * the rest only for watched files. */
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	r->dev = BPF_CORE_READ(inode, i_sb, s_dev);

	struct sluice_watched_dev *wd = bpf_map_lookup_elem(&watched_devs, &r->dev);
	if (wd) {
		r->mount_id = wd->mount_id;
		r->ino = BPF_CORE_READ(inode, i_ino);
		r->offset = BPF_CORE_READ(f, f_pos);
		return 1;
	}
	/* Only prefix watches mark fds and files: without one configured (user space fills
	 * the slots from 0), skip both lookups. */
	__u32 zero = 0;
	struct sluice_prefix *first = bpf_map_lookup_elem(&watched_prefixes, &zero);
	if (!first || first->len == 0)
		return 0;
	r->ino = BPF_CORE_READ(inode, i_ino);
	r->offset = BPF_CORE_READ(f, f_pos);
	__u64 key = ((__u64)tgid << 32) | fd;
	struct sluice_watched_fd *wf = bpf_map_lookup_elem(&watched_fds, &key);
	if (wf && wf->dev == r->dev && wf->ino == r->ino) {
		r->mount_id = wf->mount_id;
		return 1;
	}
	__u64 fkey = (__u64)f;
	wf = bpf_map_lookup_elem(&watched_files, &fkey);
	if (wf && wf->dev == r->dev && wf->ino == r->ino) {
		r->mount_id = wf->mount_id;
		/* A dup'ed or inherited fd of a watched file: mark it too. */
		bpf_map_update_elem(&watched_fds, &key, wf, BPF_ANY);
		return 1;
	}
	return 0;
}

static __always_inline int read_enter(struct tp_sys_enter *ctx, __u32 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, tgid = id >> 32;
	struct inflight_read r = {};

	if (!watched_read_target(tgid, (__u32)ctx->args[0], &r))
		return 0;
	r.kind = kind;
	if (kind == SLUICE_PREAD64)
		r.offset = (__s64)ctx->args[3];
	else if (kind == SLUICE_PREADV)
		r.offset = (__s64)ctx->args[3]; /* pos_l; pos_h is 0 on 64-bit */
	r.start_ns = bpf_ktime_get_ns();
	bpf_map_update_elem(&inflight_reads, &tid, &r, BPF_ANY);
	return 0;
}

static __always_inline void sample_access(struct inflight_read *r, __u64 cgroup_id, __u32 tgid,
					  __s64 ret, __u64 now, __u64 latency)
{
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->sample_every == 0)
		return;
	__u64 *tick = bpf_map_lookup_elem(&sample_tick, &zero);
	if (!tick)
		return;
	*tick += 1;
	if (*tick % cfg->sample_every != 0)
		return;

	struct sluice_file_access *e = bpf_ringbuf_reserve(&accesses, sizeof(*e), 0);
	if (!e) {
		count_lost(0);
		return;
	}
	e->ts_ns = now;
	e->cgroup_id = cgroup_id;
	e->ino = r->ino;
	e->offset = r->offset;
	e->ret = ret;
	e->latency_ns = latency;
	e->blocked_ns = r->blocked_ns;
	e->dev = r->dev;
	e->mount_id = r->mount_id;
	e->tgid = tgid;
	e->kind = r->kind;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int read_exit(struct tp_sys_exit *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct inflight_read *r = bpf_map_lookup_elem(&inflight_reads, &tid);
	if (!r)
		return 0;

	__u64 now = bpf_ktime_get_ns();
	__u64 latency = now - r->start_ns;
	__u64 cgroup_id = bpf_get_current_cgroup_id();
	__s64 ret = ctx->ret;

	struct sluice_read_stats *s = read_stats_for(cgroup_id, r->mount_id);
	if (s) {
		s->calls += 1;
		if (ret >= 0)
			s->bytes += ret;
		else
			s->errors += 1;
		s->latency_ns += latency;
		s->blocked_ns += r->blocked_ns;
		__u32 slot = log2_slot(latency);
		if (slot < SLUICE_HIST_SLOTS)
			s->latency_hist[slot] += 1;
	}
	sample_access(r, cgroup_id, id >> 32, ret, now, latency);
	bpf_map_delete_elem(&inflight_reads, &tid);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_read")
int sys_enter_read(struct tp_sys_enter *ctx) { return read_enter(ctx, SLUICE_READ); }
SEC("tracepoint/syscalls/sys_exit_read")
int sys_exit_read(struct tp_sys_exit *ctx) { return read_exit(ctx); }
SEC("tracepoint/syscalls/sys_enter_pread64")
int sys_enter_pread64(struct tp_sys_enter *ctx) { return read_enter(ctx, SLUICE_PREAD64); }
SEC("tracepoint/syscalls/sys_exit_pread64")
int sys_exit_pread64(struct tp_sys_exit *ctx) { return read_exit(ctx); }
SEC("tracepoint/syscalls/sys_enter_readv")
int sys_enter_readv(struct tp_sys_enter *ctx) { return read_enter(ctx, SLUICE_READV); }
SEC("tracepoint/syscalls/sys_exit_readv")
int sys_exit_readv(struct tp_sys_exit *ctx) { return read_exit(ctx); }
SEC("tracepoint/syscalls/sys_enter_preadv")
int sys_enter_preadv(struct tp_sys_enter *ctx) { return read_enter(ctx, SLUICE_PREADV); }
SEC("tracepoint/syscalls/sys_exit_preadv")
int sys_exit_preadv(struct tp_sys_exit *ctx) { return read_exit(ctx); }

/* Match an absolute path against the watched prefixes; returns mount id + 1, or 0. */
static __always_inline __u32 match_prefix(const char *path)
{
	for (__u32 i = 0; i < SLUICE_MAX_PREFIXES; i++) {
		__u32 idx = i;
		struct sluice_prefix *p = bpf_map_lookup_elem(&watched_prefixes, &idx);
		if (!p || p->len == 0 || p->len > SLUICE_PREFIX_LEN)
			continue;
		__u32 j;
		int same = 1;
		for (j = 0; j < SLUICE_PREFIX_LEN; j++) {
			if (j >= p->len)
				break;
			if (path[j] != p->path[j]) {
				same = 0;
				break;
			}
		}
		if (!same)
			continue;
		/* "/data/a" must not match "/data/ab": the prefix ends at a path boundary.
		 * User space strips trailing slashes, so the next byte must be '/' or NUL. */
		char next = path[p->len & (PATH_SCRATCH - 1)];
		if (next == '/' || next == 0)
			return p->mount_id + 1;
	}
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_openat")
int sys_enter_openat(struct tp_sys_enter *ctx)
{
	__u32 zero = 0;
	struct sluice_prefix *first = bpf_map_lookup_elem(&watched_prefixes, &zero);
	if (!first || first->len == 0)
		return 0; /* no prefixes configured: user space fills slots from 0 */
	struct path_buf *buf = bpf_map_lookup_elem(&path_scratch, &zero);
	if (!buf)
		return 0;
	long n = bpf_probe_read_user_str(buf->s, sizeof(buf->s), (const void *)ctx->args[1]);
	if (n <= 0 || buf->s[0] != '/')
		return 0; /* relative paths are not matched; watch the mount's s_dev instead */
	__u32 m = match_prefix(buf->s);
	if (m) {
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		bpf_map_update_elem(&pending_opens, &tid, &m, BPF_ANY);
	}
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int sys_exit_openat(struct tp_sys_exit *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, tgid = id >> 32;
	__u32 *pending = bpf_map_lookup_elem(&pending_opens, &tid);
	__u32 by_prefix = pending ? *pending : 0;
	if (pending)
		bpf_map_delete_elem(&pending_opens, &tid);
	if (ctx->ret < 0)
		return 0;

	__u32 fd = (__u32)ctx->ret;
	struct file *f = fd_file(fd);
	if (!f)
		return 0;
	struct sluice_watched_fd w = {
		.dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev),
		.ino = BPF_CORE_READ(f, f_inode, i_ino),
	};
	struct sluice_watched_dev *wd = bpf_map_lookup_elem(&watched_devs, &w.dev);
	if (wd)
		w.mount_id = wd->mount_id;
	else if (by_prefix)
		w.mount_id = by_prefix - 1;
	else
		return 0;

	__u64 key = ((__u64)tgid << 32) | fd;
	bpf_map_update_elem(&watched_fds, &key, &w, BPF_ANY);
	if (!wd) {
		__u64 fkey = (__u64)f;
		bpf_map_update_elem(&watched_files, &fkey, &w, BPF_ANY);
	}
	struct sluice_read_stats *s = read_stats_for(bpf_get_current_cgroup_id(), w.mount_id);
	if (s)
		s->opens += 1;
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_close")
int sys_enter_close(struct tp_sys_enter *ctx)
{
	__u64 key = (bpf_get_current_pid_tgid() & 0xffffffff00000000ULL) | (__u32)ctx->args[0];
	bpf_map_delete_elem(&watched_fds, &key);
	return 0;
}

/* Off-CPU time inside a dataset read: from the switch away while not runnable, to the
 * switch back in (so it includes the run-queue wait after the wakeup, which the reader
 * also spends stalled). Preemption of a running reader is not counted. */
SEC("tracepoint/sched/sched_switch")
int sched_switch(struct tp_sched_switch *ctx)
{
	__u64 now = 0;
	__u32 prev = ctx->prev_pid, next = ctx->next_pid;

	if (ctx->prev_state & TASK_REPORT_BLOCKED) {
		struct inflight_read *r = bpf_map_lookup_elem(&inflight_reads, &prev);
		if (r) {
			now = bpf_ktime_get_ns();
			r->offcpu_since = now;
		}
	}
	struct inflight_read *r = bpf_map_lookup_elem(&inflight_reads, &next);
	if (r && r->offcpu_since) {
		if (!now)
			now = bpf_ktime_get_ns();
		r->blocked_ns += now - r->offcpu_since;
		r->offcpu_since = 0;
	}
	return 0;
}

/* FUSE: latency per opcode, attributed to the cgroup that sent the request (the end event
 * runs in the FUSE daemon's context). Only connections of watched mounts are counted: a
 * FUSE connection's dev_t is its superblock's s_dev. */
SEC("tracepoint/fuse/fuse_request_send")
int fuse_request_send(struct tp_fuse_request_send *ctx)
{
	__u32 dev = ctx->connection;
	struct sluice_watched_dev *wd = bpf_map_lookup_elem(&watched_devs, &dev);
	if (!wd)
		return 0;
	struct fuse_req_key key = { .unique = ctx->unique, .connection = dev };
	struct fuse_req req = {
		.start_ns = bpf_ktime_get_ns(),
		.cgroup_id = bpf_get_current_cgroup_id(),
		.opcode = ctx->opcode,
		.mount_id = wd->mount_id,
	};
	bpf_map_update_elem(&fuse_inflight, &key, &req, BPF_ANY);
	return 0;
}

SEC("tracepoint/fuse/fuse_request_end")
int fuse_request_end(struct tp_fuse_request_end *ctx)
{
	struct fuse_req_key key = { .unique = ctx->unique, .connection = ctx->connection };
	struct fuse_req *req = bpf_map_lookup_elem(&fuse_inflight, &key);
	if (!req)
		return 0;
	__u64 latency = bpf_ktime_get_ns() - req->start_ns;
	struct sluice_fuse_key fk = {
		.cgroup_id = req->cgroup_id,
		.mount_id = req->mount_id,
		.opcode = req->opcode,
	};
	int error = ctx->error;
	bpf_map_delete_elem(&fuse_inflight, &key);

	struct sluice_fuse_stats *s = bpf_map_lookup_elem(&fuse_stats, &fk);
	if (!s) {
		static const struct sluice_fuse_stats zero;
		bpf_map_update_elem(&fuse_stats, &fk, &zero, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&fuse_stats, &fk);
		if (!s) {
			count_lost(1);
			return 0;
		}
	}
	s->requests += 1;
	if (error)
		s->errors += 1;
	s->latency_ns += latency;
	__u32 slot = log2_slot(latency);
	if (slot < SLUICE_HIST_SLOTS)
		s->latency_hist[slot] += 1;
	return 0;
}

/* io_uring reads: the file is only assigned when the request is issued, so the watched
 * check happens at completion, where req->file is still held. */
static __always_inline int is_uring_read(__u8 op)
{
	return op == 1 /* READV */ || op == 4 /* READ_FIXED */ || op == 22 /* READ */ ||
	       op == 49 /* READ_MULTISHOT */ || op == 60 /* READV_FIXED */;
}

SEC("tracepoint/io_uring/io_uring_submit_req")
int io_uring_submit_req(struct tp_io_uring_submit_req *ctx)
{
	if (!is_uring_read(ctx->opcode))
		return 0;
	__u64 key = (__u64)ctx->req;
	struct uring_req r = {
		.start_ns = bpf_ktime_get_ns(),
		.cgroup_id = bpf_get_current_cgroup_id(),
	};
	bpf_map_update_elem(&uring_inflight, &key, &r, BPF_ANY);
	return 0;
}

SEC("tracepoint/io_uring/io_uring_complete")
int io_uring_complete(struct tp_io_uring_complete *ctx)
{
	__u64 key = (__u64)ctx->req;
	struct uring_req *r = bpf_map_lookup_elem(&uring_inflight, &key);
	if (!r)
		return 0;
	__u64 latency = bpf_ktime_get_ns() - r->start_ns;
	__u64 cgroup_id = r->cgroup_id;
	__s32 res = ctx->res;
	bpf_map_delete_elem(&uring_inflight, &key);

	struct io_kiocb *req = ctx->req;
	__u32 dev = BPF_CORE_READ(req, file, f_inode, i_sb, s_dev);
	struct sluice_watched_dev *wd = bpf_map_lookup_elem(&watched_devs, &dev);
	if (!wd)
		return 0;
	struct sluice_read_stats *s = read_stats_for(cgroup_id, wd->mount_id);
	if (!s)
		return 0;
	s->uring_reads += 1;
	if (res > 0)
		s->uring_bytes += res;
	s->uring_latency_ns += latency;
	return 0;
}

/* Page-cache misses: a page of a watched file inserted into the page cache means the data
 * was not cached and had to be fetched (from the FUSE daemon for a Sluice mount). */
SEC("tracepoint/filemap/mm_filemap_add_to_page_cache")
int filemap_add_to_page_cache(struct tp_filemap_add *ctx)
{
	__u32 dev = ctx->s_dev;
	struct sluice_watched_dev *wd = bpf_map_lookup_elem(&watched_devs, &dev);
	if (!wd)
		return 0;
	struct sluice_read_stats *s = read_stats_for(bpf_get_current_cgroup_id(), wd->mount_id);
	if (s)
		s->page_cache_misses += 1ULL << (ctx->order & 31);
	return 0;
}
