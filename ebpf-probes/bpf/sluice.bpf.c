// SPDX-License-Identifier: GPL-2.0
/* Sluice's dataset-read probes, tracepoints only (kprobes and fentry are unavailable on
 * the target kernels).
 *
 * Reads and opens are followed on the raw syscall tracepoints (sys_enter/sys_exit, as BTF
 * tracepoints), the only hooks that every syscall of the node passes, so their fast path
 * is one lookup: a read counts only in a process in `watched_procs` (it opened a watched
 * file, forked from one that did, or held one when the probes loaded; user space finds
 * those in /proc). In such a process an fd is classified once per open file and the answer
 * kept in `fd_marks` (tgid << 32 | fd), checked against the fd's current struct file:
 *  1. by filesystem: the file's inode->i_sb->s_dev is in `watched_devs` (user space puts
 *     there the s_dev of each watched mount, e.g. the Sluice FUSE mount), so fds that were
 *     dup'ed, inherited over fork or opened by io_uring count too;
 *  2. by path: an absolute open(at) path starting with a prefix in `watched_prefixes`
 *     marks the open file (struct file *) in `watched_files`, so the mark survives dup2
 *     (dd moves its input to fd 0) and fork; the (dev, ino) check makes a recycled struct
 *     file address harmless.
 * Everything is aggregated per cgroup id (cgroup v2) and mount id in per-CPU maps; a
 * sampled stream of accesses goes to user space through a ring buffer. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "kernel_types.h"
#include "sluice.h"

char LICENSE[] SEC("license") = "GPL";

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

/* What an fd of a watched process refers to, decided once per open file: the struct file
 * and inode pointers tell whether the fd still holds the same file (a dup2 onto it or a
 * missed close changes them), so a read costs a lookup and two pointer loads, not a
 * classification. */
#define NOT_WATCHED 0xffffffffu
struct fd_mark {
	__u64 file;         /* struct file * */
	__u64 inode;        /* struct inode *: with the file, tells a reused address apart */
	__u64 ino;
	__u32 dev;
	__u32 mount_id;     /* NOT_WATCHED: looked at, not a dataset file */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, __u64); /* tgid << 32 | fd */
	__type(value, struct fd_mark);
} fd_marks SEC(".maps");

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

/* Processes (tgid) that hold, or held, an open watched file: the only ones whose reads are
 * looked at more closely. Set at openat, inherited at fork, filled at load from /proc by
 * user space, cleared when the process exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, __u32);
} watched_procs SEC(".maps");

/* Per-thread state of an openat whose path matched a prefix (tid -> mount id + 1). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} pending_opens SEC(".maps");

/* A dataset read in progress on one thread, kept in the thread's own storage: no hash
 * insert and delete per read (an LRU hash takes a lock shared by all CPUs for both), and
 * nothing to leak when a thread dies inside a read. */
struct inflight_read {
	__u64 active;       /* 1 between the read's entry and exit */
	__u64 start_ns;     /* 0: this read is not timed */
	__u64 offcpu_since; /* 0 while on CPU */
	__u64 blocked_ns;
	__u64 ino;
	__u64 file;         /* struct file *, for the position of read/readv when sampled */
	__s64 offset;       /* -1: the file position, read at exit */
	__u32 dev;
	__u32 mount_id;
	__u32 kind;
	/* The fd this thread read last and what it is (a training loop reads one file many
	 * times in a row): spares the fd_marks lookup. */
	__u32 last_fd;
	__u64 last_file;    /* struct file *; 0: nothing cached */
	__u64 last_inode;   /* its struct inode *: a file closed and another opened in its
			     * place may get the same address, never the same inode too
			     * unless it is the same file */
	__u64 last_ino;
	__u32 last_dev;
	__u32 last_mount_id;
	__u32 time_tick;    /* countdown to the next timed read */
	__u32 sampled;      /* this read goes to the ring buffer at its exit */
	__u32 stall_only;   /* stalls-only mode: offcpu_since is a blocked read of mount_id */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
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

/* The open file behind `fd` in `task`, or NULL. task->files->fdt are BTF loads (no helper
 * call); the fd array holds __rcu pointers the verifier does not type, so that one slot is
 * read with a helper. */
static __always_inline struct file *task_fd_file(struct task_struct *task, __u32 fd)
{
	struct fdtable *fdt = task->files->fdt;
	if (!fdt || fd >= fdt->max_fds)
		return 0;
	struct file **fds = fdt->fd;
	struct file *f = 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	return f;
}

static __always_inline struct file *fd_file(__u32 fd)
{
	return task_fd_file(bpf_get_current_task_btf(), fd);
}

/* Decide what an open file is: a file of a watched filesystem, a file marked by a prefix
 * watch at its open (possibly under another fd, after dup2 or fork), or neither. */
static __always_inline void classify(struct file *f, struct fd_mark *m)
{
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	m->file = (__u64)f;
	m->inode = (__u64)inode;
	m->dev = BPF_CORE_READ(inode, i_sb, s_dev);
	m->ino = BPF_CORE_READ(inode, i_ino);
	m->mount_id = NOT_WATCHED;
	struct sluice_watched_dev *wd = bpf_map_lookup_elem(&watched_devs, &m->dev);
	if (wd) {
		m->mount_id = wd->mount_id;
		return;
	}
	__u64 fkey = (__u64)f;
	struct sluice_watched_fd *wf = bpf_map_lookup_elem(&watched_files, &fkey);
	if (wf && wf->dev == m->dev && wf->ino == m->ino)
		m->mount_id = wf->mount_id;
}

static __always_inline void mark_proc(__u32 tgid)
{
	__u32 one = 1;
	if (bpf_map_lookup_elem(&watched_procs, &tgid))
		return;
	if (bpf_map_update_elem(&watched_procs, &tgid, &one, BPF_ANY))
		count_lost(1);
}

/* Whether this read goes to the ring buffer: 1 in sample_every per CPU, a countdown (no
 * division per read). */
static __always_inline __u32 sample_due(struct sluice_config *cfg)
{
	if (cfg->sample_every == 0)
		return 0;
	__u32 zero = 0;
	__u64 *tick = bpf_map_lookup_elem(&sample_tick, &zero);
	if (!tick)
		return 0;
	*tick += 1;
	if (*tick < cfg->sample_every)
		return 0;
	*tick = 0;
	return 1;
}

/* Whether this read is timed: 1 in time_every per thread. */
static __always_inline __u32 time_due(struct inflight_read *r, struct sluice_config *cfg)
{
	if (r->time_tick > 1) {
		r->time_tick -= 1;
		return 0;
	}
	r->time_tick = cfg->time_every;
	return 1;
}

static __always_inline void read_enter(__u32 fd, __u32 kind, __s64 pos)
{
	struct task_struct *task = bpf_get_current_task_btf();
	/* Every read on the node comes through here. A thread that read a dataset before has
	 * storage; any other thread costs one lookup unless its process holds a watched file. */
	struct inflight_read *r = bpf_task_storage_get(&inflight_reads, task, 0, 0);
	if (!r) {
		__u32 tgid = task->tgid;
		if (!bpf_map_lookup_elem(&watched_procs, &tgid))
			return;
		r = bpf_task_storage_get(&inflight_reads, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!r) {
			count_lost(1);
			return;
		}
	}
	struct file *f = fd_file(fd);
	if (!f)
		return;
	struct inode *inode = 0;
	bpf_probe_read_kernel(&inode, sizeof(inode), &f->f_inode);
	if (r->last_file != (__u64)f || r->last_fd != fd || r->last_inode != (__u64)inode) {
		__u64 key = ((__u64)task->tgid << 32) | fd;
		struct fd_mark fresh;
		struct fd_mark *m = bpf_map_lookup_elem(&fd_marks, &key);
		if (!m || m->file != (__u64)f || m->inode != (__u64)inode) {
			classify(f, &fresh);
			bpf_map_update_elem(&fd_marks, &key, &fresh, BPF_ANY);
			m = &fresh;
		}
		r->last_fd = fd;
		r->last_file = (__u64)f;
		r->last_inode = (__u64)inode;
		r->last_ino = m->ino;
		r->last_dev = m->dev;
		r->last_mount_id = m->mount_id;
	}
	if (r->last_mount_id == NOT_WATCHED)
		return;
	r->ino = r->last_ino;
	r->file = (__u64)f;
	r->offset = pos;
	r->dev = r->last_dev;
	r->mount_id = r->last_mount_id;
	r->kind = kind;
	r->offcpu_since = 0;
	r->blocked_ns = 0;
	/* Reading the clock twice is the largest part of what the probes add to a page-cache
	 * read, so only 1 in time_every reads per thread (and every sampled one) is timed: the
	 * latency histogram is built from an unbiased sample. Blocked time does not need
	 * this: sched_switch reads the clock only when a read actually blocks. */
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&config, &zero);
	r->sampled = cfg ? sample_due(cfg) : 0;
	r->start_ns = 0;
	if (r->sampled || (cfg && time_due(r, cfg)))
		r->start_ns = bpf_ktime_get_ns();
	r->active = 1;
}

/* bpf_get_current_cgroup_id() without the helper call: the same kernfs id, by BTF loads. */
static __always_inline __u64 task_cgroup_id(struct task_struct *task)
{
	return task->cgroups->dfl_cgrp->kn->id;
}

static __always_inline __u64 current_cgroup_id(void)
{
	return task_cgroup_id(bpf_get_current_task_btf());
}

static __always_inline void sample_access(struct inflight_read *r, __u64 cgroup_id, __u32 tgid,
					  __s64 ret, __u64 now, __u64 latency)
{
	struct sluice_file_access *e = bpf_ringbuf_reserve(&accesses, sizeof(*e), 0);
	if (!e) {
		count_lost(0);
		return;
	}
	__s64 offset = r->offset;
	if (offset < 0) {
		/* read/readv: the position has moved past what was read. */
		struct file *f = (struct file *)r->file;
		offset = BPF_CORE_READ(f, f_pos);
		if (ret > 0)
			offset -= ret;
	}
	e->ts_ns = now;
	e->cgroup_id = cgroup_id;
	e->ino = r->ino;
	e->offset = offset;
	e->ret = ret;
	e->latency_ns = latency;
	e->blocked_ns = r->blocked_ns;
	e->dev = r->dev;
	e->mount_id = r->mount_id;
	e->tgid = tgid;
	e->kind = r->kind;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void read_exit(__s64 ret)
{
	struct inflight_read *r =
		bpf_task_storage_get(&inflight_reads, bpf_get_current_task_btf(), 0, 0);
	if (!r || !r->active)
		return;
	r->active = 0;

	__u64 now = 0, latency = 0;
	if (r->start_ns) {
		now = bpf_ktime_get_ns();
		latency = now - r->start_ns;
	}
	__u64 cgroup_id = current_cgroup_id();

	struct sluice_read_stats *s = read_stats_for(cgroup_id, r->mount_id);
	if (s) {
		s->calls += 1;
		if (ret >= 0)
			s->bytes += ret;
		else
			s->errors += 1;
		s->blocked_ns += r->blocked_ns;
		if (r->start_ns) {
			s->timed_calls += 1;
			s->latency_ns += latency;
			__u32 slot = log2_slot(latency);
			if (slot < SLUICE_HIST_SLOTS)
				s->latency_hist[slot] += 1;
		}
	}
	if (r->sampled)
		sample_access(r, cgroup_id, bpf_get_current_pid_tgid() >> 32, ret, now, latency);
}

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

/* Syscall numbers of the calls the probes follow. One BTF tracepoint on sys_enter and one
 * on sys_exit see every syscall; a perf tracepoint per syscall (syscalls:sys_enter_read...)
 * would cost each of them a record built in the perf buffer, which is most of what the
 * probes used to cost a page-cache read. */
#if defined(__TARGET_ARCH_x86)
#define NR_read 0
#define NR_open 2
#define NR_close 3
#define NR_pread64 17
#define NR_readv 19
#define NR_openat 257
#define NR_preadv 295
#define NR_preadv2 327
#define NR_openat2 437
#define SYSCALL_ARG(regs, n) ((n) == 0 ? (regs)->di : (n) == 1 ? (regs)->si : (n) == 2 ? (regs)->dx : (regs)->r10)
#define SYSCALL_NR(regs) ((regs)->orig_ax)
#elif defined(__TARGET_ARCH_arm64)
#define NR_read 63
#define NR_open -1 /* no open(2) on arm64 */
#define NR_close 57
#define NR_pread64 67
#define NR_readv 65
#define NR_openat 56
#define NR_preadv 69
#define NR_preadv2 286
#define NR_openat2 437
#define SYSCALL_ARG(regs, n) ((regs)->regs[(n)])
#define SYSCALL_NR(regs) ((regs)->syscallno)
#else
#error "syscall numbers for this architecture are not written down yet"
#endif

/* Start of an open whose path may match a prefix watch (open(2) names its path in arg 0,
 * openat and openat2 in arg 1). */
static __always_inline void open_enter(const char *upath)
{
	__u32 zero = 0;
	struct sluice_prefix *first = bpf_map_lookup_elem(&watched_prefixes, &zero);
	if (!first || first->len == 0)
		return; /* no prefixes configured: user space fills slots from 0 */
	struct path_buf *buf = bpf_map_lookup_elem(&path_scratch, &zero);
	if (!buf)
		return;
	long n = bpf_probe_read_user_str(buf->s, sizeof(buf->s), upath);
	if (n <= 0 || buf->s[0] != '/')
		return; /* relative paths are not matched; watch the mount's s_dev instead */
	__u32 m = match_prefix(buf->s);
	if (m) {
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		bpf_map_update_elem(&pending_opens, &tid, &m, BPF_ANY);
	}
}

/* An open returned `ret`: mark the fd (and the process) when the file is watched. */
static __always_inline void open_exit(__s64 ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, tgid = id >> 32;
	__u32 *pending = bpf_map_lookup_elem(&pending_opens, &tid);
	__u32 by_prefix = pending ? *pending : 0;
	if (pending)
		bpf_map_delete_elem(&pending_opens, &tid);
	if (ret < 0)
		return;

	__u32 fd = (__u32)ret;
	struct file *f = fd_file(fd);
	if (!f)
		return;
	__u64 key = ((__u64)tgid << 32) | fd;
	struct fd_mark m;
	classify(f, &m);
	if (m.mount_id == NOT_WATCHED && by_prefix) {
		m.mount_id = by_prefix - 1;
		/* Remember the open file, so the mark follows it to other fds and processes. */
		struct sluice_watched_fd w = { .ino = m.ino, .dev = m.dev, .mount_id = m.mount_id };
		__u64 fkey = (__u64)f;
		bpf_map_update_elem(&watched_files, &fkey, &w, BPF_ANY);
	}
	if (m.mount_id == NOT_WATCHED) {
		/* Only watched processes keep marks; theirs must not go stale. */
		if (bpf_map_lookup_elem(&watched_procs, &tgid))
			bpf_map_update_elem(&fd_marks, &key, &m, BPF_ANY);
		return;
	}
	mark_proc(tgid);
	bpf_map_update_elem(&fd_marks, &key, &m, BPF_ANY);
	struct sluice_read_stats *s = read_stats_for(bpf_get_current_cgroup_id(), m.mount_id);
	if (s)
		s->opens += 1;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long nr)
{
	switch (nr) {
	case NR_read:
		read_enter(SYSCALL_ARG(regs, 0), SLUICE_READ, -1);
		break;
	case NR_pread64:
		read_enter(SYSCALL_ARG(regs, 0), SLUICE_PREAD64, SYSCALL_ARG(regs, 3));
		break;
	case NR_readv:
		read_enter(SYSCALL_ARG(regs, 0), SLUICE_READV, -1);
		break;
	case NR_preadv:
	case NR_preadv2: {
		/* pos_l; pos_h is 0 on 64-bit. preadv2 with offset -1 uses the file position. */
		__s64 pos = SYSCALL_ARG(regs, 3);
		read_enter(SYSCALL_ARG(regs, 0), SLUICE_PREADV, pos < 0 ? -1 : pos);
		break;
	}
	case NR_open:
		open_enter((const char *)SYSCALL_ARG(regs, 0));
		break;
	case NR_openat:
	case NR_openat2:
		open_enter((const char *)SYSCALL_ARG(regs, 1));
		break;
	case NR_close: {
		__u64 id = bpf_get_current_pid_tgid();
		__u32 tgid = id >> 32;
		if (bpf_map_lookup_elem(&watched_procs, &tgid)) {
			__u64 key = (id & 0xffffffff00000000ULL) | (__u32)SYSCALL_ARG(regs, 0);
			bpf_map_delete_elem(&fd_marks, &key);
		}
		break;
	}
	}
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	switch (SYSCALL_NR(regs)) {
	case NR_read:
	case NR_pread64:
	case NR_readv:
	case NR_preadv:
	case NR_preadv2:
		read_exit(ret);
		break;
	case NR_open:
	case NR_openat:
	case NR_openat2:
		open_exit(ret);
		break;
	}
	return 0;
}

/* A child of a watched process may read the files it inherited. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	if (ptgid != ctgid && bpf_map_lookup_elem(&watched_procs, &ptgid))
		mark_proc(ctgid);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *p)
{
	__u32 tgid = p->tgid;
	if (p->pid == tgid)
		bpf_map_delete_elem(&watched_procs, &tgid);
	return 0;
}

#define PF_KTHREAD 0x00200000

/* Stalls-only mode, where no read is marked in flight (sys_enter/sys_exit are not
 * attached, so that reads cost nothing): a user thread that goes to sleep inside a read
 * syscall of a watched file is stalled on the dataset. Its syscall and fd are in the
 * registers it entered the kernel with. Returns the time it went to sleep, or 0. */
static __always_inline __u64 stall_begins(struct task_struct *prev)
{
	if (prev->flags & PF_KTHREAD)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(prev);
	if (!regs)
		return 0;
	long nr = SYSCALL_NR(regs);
	if (nr != NR_read && nr != NR_pread64 && nr != NR_readv && nr != NR_preadv &&
	    nr != NR_preadv2)
		return 0;
	struct file *f = task_fd_file(prev, SYSCALL_ARG(regs, 0));
	if (!f)
		return 0;
	__u32 dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	struct sluice_watched_dev *wd = bpf_map_lookup_elem(&watched_devs, &dev);
	if (!wd)
		return 0;
	struct inflight_read *r =
		bpf_task_storage_get(&inflight_reads, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!r) {
		count_lost(1);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	r->offcpu_since = now;
	r->mount_id = wd->mount_id;
	r->stall_only = 1;
	return now;
}

/* Off-CPU time inside a dataset read: from the switch away while not runnable, to the
 * switch back in (so it includes the run-queue wait after the wakeup, which the reader
 * also spends stalled). Preemption of a running reader is not counted. */
SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = 0;

	if (!preempt && prev_state) {
		struct inflight_read *r = bpf_task_storage_get(&inflight_reads, prev, 0, 0);
		if (r && r->active) {
			now = bpf_ktime_get_ns();
			r->offcpu_since = now;
		} else {
			__u32 zero = 0;
			struct sluice_config *cfg = bpf_map_lookup_elem(&config, &zero);
			if (cfg && cfg->stalls_only)
				now = stall_begins(prev);
		}
	}
	struct inflight_read *r = bpf_task_storage_get(&inflight_reads, next, 0, 0);
	if (r && r->offcpu_since) {
		if (!now)
			now = bpf_ktime_get_ns();
		__u64 blocked = now - r->offcpu_since;
		r->offcpu_since = 0;
		if (r->active) {
			r->blocked_ns += blocked;
		} else if (r->stall_only) {
			/* No read exit will come to add it up: count it now. */
			r->stall_only = 0;
			struct sluice_read_stats *s =
				read_stats_for(task_cgroup_id(next), r->mount_id);
			if (s)
				s->blocked_ns += blocked;
		}
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
