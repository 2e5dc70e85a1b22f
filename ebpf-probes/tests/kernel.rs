//! The probes on the real kernel: load/attach/detach, per-cgroup counting of watched reads
//! (read, pread, io_uring, through FUSE), prefix watches, off-CPU time inside a blocking
//! read, FUSE latency per opcode, and the sampled access stream.
//!
//! Needs root (BPF, mounts, cgroups); without it every test prints why it skipped.

use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_ebpf_probes::cgroup::{CgroupResolver, Workload, cgroup2_root};
use sluice_ebpf_probes::{CgroupReadStats, ProbeConfig, ProbeMode, Probes, ReadKind};

/// One test at a time: they read the whole machine's programs, cgroups and mounts.
static SERIAL: Mutex<()> = Mutex::new(());

/// The lock, or `None` (with the reason printed) when the test cannot run here.
fn privileged() -> Option<MutexGuard<'static, ()>> {
    // Under SLUICE_TEST_STRICT (`cargo xtask test` as root, so CI) these must run.
    let strict = std::env::var_os("SLUICE_TEST_STRICT").is_some();
    if privileged_uid() != Some(0) {
        assert!(!strict, "SLUICE_TEST_STRICT but not root");
        eprintln!("skipped: needs root to load eBPF programs, mount tmpfs and create cgroups");
        return None;
    }
    if cgroup2_root().is_none() {
        assert!(!strict, "SLUICE_TEST_STRICT but no cgroup2 hierarchy");
        eprintln!("skipped: no cgroup2 hierarchy mounted");
        return None;
    }
    if !Path::new("/sys/kernel/tracing/events").is_dir()
        && !Path::new("/sys/kernel/debug/tracing/events").is_dir()
    {
        let _ = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status();
    }
    // The fuse tracepoints live in the module.
    let _ = Command::new("modprobe")
        .arg("fuse")
        .stderr(std::process::Stdio::null())
        .status();
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

/// A fresh tmpfs: its own superblock, so its s_dev identifies it like a FUSE mount's would.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount() -> Self {
        let dir = tempfile::tempdir().unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "sluice-test"])
            .arg(dir.path()));
        Self { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A test-made cgroup laid out like a Kubernetes pod's container (cgroupfs driver).
struct TestCgroup {
    dirs: Vec<PathBuf>,
    uid: String,
}

impl TestCgroup {
    fn new(tag: &str) -> Self {
        let root = cgroup2_root().unwrap();
        let uid = format!(
            "5a1ce000-0000-4000-8000-{:012x}",
            std::process::id() as u64 * 16 + tag.len() as u64
        );
        let top = root.join(format!("sluice-test-kubepods-{}-{tag}", std::process::id()));
        let pod = top.join(format!("pod{uid}"));
        let ctr = pod.join("ctr0");
        std::fs::create_dir_all(&ctr)
            .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", ctr.display()));
        Self {
            dirs: vec![ctr, pod, top],
            uid,
        }
    }

    fn id(&self) -> u64 {
        std::fs::metadata(&self.dirs[0]).unwrap().ino()
    }

    /// Run a shell script inside this cgroup and wait for it.
    fn sh(&self, script: &str) {
        let procs = self.dirs[0].join("cgroup.procs");
        run(Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {} && {script}", procs.display())));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // The exited shell may take a moment to leave the cgroup.
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn write_file(path: &Path, len: usize) {
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(path, data).unwrap();
}

fn stats_of(snapshot: &[CgroupReadStats], cgroup_id: u64) -> Vec<&CgroupReadStats> {
    snapshot
        .iter()
        .filter(|s| s.cgroup_id == cgroup_id)
        .collect()
}

fn bpffs_entries() -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/bpf")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            out.push(e.path().display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

fn loaded_program_ids() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

#[test]
fn probes_load_attach_and_detach_leaving_nothing_behind() {
    let Some(_serial) = privileged() else { return };
    let pinned_before = bpffs_entries();
    let probes = Probes::load(ProbeConfig::default()).expect("probes load on this kernel");
    // Optional categories (fuse on older kernels) are skipped whole; the rest all attach.
    let skipped: Vec<&str> = probes
        .unavailable()
        .iter()
        .filter_map(|t| t.split('/').next())
        .collect();
    if !skipped.is_empty() {
        eprintln!("this kernel lacks {:?}", probes.unavailable());
    }
    let ids = probes.program_ids();
    let expected = sluice_ebpf_probes::BTF_TRACEPOINTS.len()
        + sluice_ebpf_probes::TRACEPOINTS
            .iter()
            .filter(|t| !skipped.contains(&t.1))
            .count();
    assert_eq!(ids.len(), expected, "one program per available tracepoint");
    let loaded = loaded_program_ids();
    assert!(
        ids.iter().all(|id| loaded.contains(id)),
        "programs visible in the kernel while loaded"
    );
    assert_eq!(probes.lost_events().unwrap(), 0);
    drop(probes);

    // Program memory is freed after an RCU grace period: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let loaded = loaded_program_ids();
        let left: Vec<_> = ids.iter().filter(|id| loaded.contains(id)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "programs still loaded after drop: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        bpffs_entries(),
        pinned_before,
        "nothing pinned in /sys/fs/bpf"
    );
}

#[test]
fn watched_reads_are_counted_under_the_readers_cgroup_and_unwatched_ones_are_not() {
    let Some(_serial) = privileged() else { return };
    let mount = Tmpfs::mount();
    let watched = mount.path().join("shard-0000.tar");
    let len = (1 << 20) + 12345;
    write_file(&watched, len);
    let elsewhere = tempfile::tempdir().unwrap();
    let unwatched = elsewhere.path().join("other.bin");
    write_file(&unwatched, len);
    assert_ne!(
        std::fs::metadata(&watched).unwrap().dev(),
        std::fs::metadata(&unwatched).unwrap().dev()
    );

    let mut probes = Probes::load(
        ProbeConfig::default()
            .watch_filesystem(mount.path())
            .sample_every(1),
    )
    .expect("probes load");
    let reader = TestCgroup::new("reader");
    let other = TestCgroup::new("other");
    reader.sh(&format!(
        "exec dd if={} of=/dev/null bs=65536 status=none",
        watched.display()
    ));
    other.sh(&format!(
        "dd if={} of=/dev/null bs=65536 status=none; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
        unwatched.display()
    ));

    let snapshot = probes.snapshot().unwrap();
    let mine = stats_of(&snapshot, reader.id());
    assert_eq!(
        mine.len(),
        1,
        "one (cgroup, mount) entry for the reader: {snapshot:#?}"
    );
    let s = mine[0];
    assert_eq!(s.mount_id, 0);
    assert_eq!(s.bytes, len as u64, "bytes read by dd");
    assert_eq!(
        s.calls,
        len.div_ceil(65536) as u64 + 1,
        "one read per 64 KiB block, plus the EOF read"
    );
    assert_eq!(s.opens, 1);
    assert_eq!(s.errors, 0);
    assert_eq!(s.timed_calls, s.calls, "sampled reads are always timed");
    assert_eq!(s.latency.count(), s.calls);
    assert!(
        stats_of(&snapshot, other.id()).is_empty(),
        "no dataset reads for the other cgroup: {snapshot:#?}"
    );

    // The sampled stream (every read) describes the same reads.
    let ino = std::fs::metadata(&watched).unwrap().ino();
    let dev = std::fs::metadata(&watched).unwrap().dev();
    let events: Vec<_> = probes
        .drain_accesses()
        .into_iter()
        .filter(|e| e.cgroup_id == reader.id())
        .collect();
    assert_eq!(events.len() as u64, s.calls);
    assert!(
        events
            .iter()
            .all(|e| e.ino == ino && e.dev == dev && e.kind == ReadKind::Read && e.mount_id == 0)
    );
    let offsets: Vec<i64> = events.iter().map(|e| e.offset).collect();
    let want: Vec<i64> = (0..events.len() as i64)
        .map(|i| (i * 65536).min(len as i64))
        .collect();
    assert_eq!(offsets, want, "file offsets of successive reads");
    assert_eq!(events.iter().map(|e| e.size).sum::<u64>(), len as u64);
    assert_eq!(probes.lost_events().unwrap(), 0);

    // The cgroup id names the pod.
    let info = CgroupResolver::new(cgroup2_root().unwrap())
        .resolve(reader.id())
        .unwrap()
        .unwrap();
    assert!(
        matches!(&info.workload, Workload::Pod { uid, .. } if *uid == reader.uid),
        "{info:?}"
    );
}

/// An agent restarted under a running job: the job opened its files before the probes
/// loaded. Its reads still count, in the process itself and in children it forks.
fn loaded_program_names() -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_owned))
        .collect()
}

#[test]
fn the_benchmarks_empty_syscall_hooks_attach_and_detach() {
    let Some(_serial) = privileged() else { return };
    let count = || {
        loaded_program_names()
            .iter()
            .filter(|n| n.starts_with("floor_sys_"))
            .count()
    };
    let before = count();
    let hooks = sluice_ebpf_probes::EmptySyscallHooks::attach().expect("empty hooks attach");
    assert_eq!(count(), before + 2, "both empty programs loaded");
    drop(hooks);
    let deadline = Instant::now() + Duration::from_secs(5);
    while count() != before {
        assert!(
            Instant::now() < deadline,
            "empty programs still loaded after drop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn one_in_time_every_reads_of_a_thread_is_timed() {
    let Some(_serial) = privileged() else { return };
    let mount = Tmpfs::mount();
    let file = mount.path().join("shard.tar");
    let blocks = 37;
    write_file(&file, blocks * 4096);
    let probes = Probes::load(
        ProbeConfig::default()
            .watch_filesystem(mount.path())
            .sample_every(0)
            .time_every(4),
    )
    .expect("probes load");
    let cg = TestCgroup::new("timed");
    cg.sh(&format!(
        "exec dd if={} of=/dev/null bs=4096 status=none",
        file.display()
    ));
    let snapshot = probes.snapshot().unwrap();
    let mine = stats_of(&snapshot, cg.id());
    assert_eq!(mine.len(), 1, "{snapshot:#?}");
    let s = mine[0];
    let calls = blocks as u64 + 1; // and the EOF read
    assert_eq!(s.calls, calls, "every read is counted");
    assert_eq!(s.bytes, (blocks * 4096) as u64);
    // dd reads on one thread: its 1st, 5th, 9th... reads are timed.
    assert_eq!(s.timed_calls, calls.div_ceil(4), "{s:#?}");
    assert_eq!(s.latency.count(), s.timed_calls);
    assert!(s.latency_ns > 0);
}

#[test]
fn files_opened_before_the_probes_loaded_are_counted() {
    let Some(_serial) = privileged() else { return };
    let mount = Tmpfs::mount();
    let (a, b) = (mount.path().join("a.bin"), mount.path().join("b.bin"));
    write_file(&a, 300_000);
    write_file(&b, 200_000);
    let go = tempfile::tempdir().unwrap();
    let fifo = go.path().join("go");
    run(Command::new("mkfifo").arg(&fifo));

    let cg = TestCgroup::new("before");
    // fd 3 is read by a forked dd, fd 4 by the shell itself after exec.
    let mut job = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {procs} && exec 3< {a} 4< {b} && read go < {fifo} && \
             dd of=/dev/null bs=65536 status=none <&3 && exec dd of=/dev/null bs=65536 status=none <&4",
            procs = cg.dirs[0].join("cgroup.procs").display(),
            a = a.display(),
            b = b.display(),
            fifo = fifo.display(),
        ))
        .spawn()
        .unwrap();
    let fd4 = PathBuf::from(format!("/proc/{}/fd/4", job.id()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(&fd4).ok().as_deref() != Some(b.as_path()) {
        assert!(Instant::now() < deadline, "the job never opened its files");
        std::thread::sleep(Duration::from_millis(10));
    }

    let probes =
        Probes::load(ProbeConfig::default().watch_filesystem(mount.path())).expect("probes load");
    std::fs::write(&fifo, b"go\n").unwrap();
    assert!(job.wait().unwrap().success());

    let snapshot = probes.snapshot().unwrap();
    let mine = stats_of(&snapshot, cg.id());
    assert_eq!(mine.len(), 1, "{snapshot:#?}");
    assert_eq!(
        mine[0].bytes, 500_000,
        "both files, read after the probes loaded"
    );
    assert_eq!(mine[0].opens, 0, "opened before the probes loaded");
}

#[test]
fn a_path_prefix_watch_counts_only_files_under_that_directory() {
    let Some(_serial) = privileged() else { return };
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    let sibling = base.path().join("data2"); // same prefix as a string, another directory
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&sibling).unwrap();
    write_file(&data.join("a.bin"), 70_000);
    write_file(&sibling.join("b.bin"), 50_000);

    let probes = Probes::load(ProbeConfig::default().watch_prefix(&data)).expect("probes load");
    let cg = TestCgroup::new("prefix");
    cg.sh(&format!(
        "dd if={} of=/dev/null bs=4096 status=none && dd if={} of=/dev/null bs=4096 status=none",
        data.join("a.bin").display(),
        sibling.join("b.bin").display()
    ));
    let snapshot = probes.snapshot().unwrap();
    let mine = stats_of(&snapshot, cg.id());
    assert_eq!(mine.len(), 1, "{snapshot:#?}");
    assert_eq!(mine[0].bytes, 70_000, "only data/a.bin is a dataset read");
    assert_eq!(mine[0].opens, 1);
}

/// The cgroup v2 id of this test process.
fn own_cgroup_id() -> u64 {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("cgroup v2 line in /proc/self/cgroup");
    let dir = cgroup2_root().unwrap().join(rel.trim_start_matches('/'));
    std::fs::metadata(dir).unwrap().ino()
}

/// A reader blocks about 400 ms in one read of a FIFO on a watched tmpfs: what the
/// reader measured, and the probes' figures for this process's cgroup.
fn blocked_fifo_read(mode: ProbeMode) -> (CgroupReadStats, u64) {
    let mount = Tmpfs::mount();
    let fifo = mount.path().join("slow-source");
    run(Command::new("mkfifo").arg(&fifo));
    let probes = Probes::load(
        ProbeConfig::default()
            .mode(mode)
            .watch_filesystem(mount.path())
            .sample_every(0)
            .time_every(1),
    )
    .expect("probes load");

    let writer_path = fifo.clone();
    let writer = std::thread::spawn(move || {
        let mut w = std::fs::OpenOptions::new()
            .write(true)
            .open(writer_path)
            .unwrap();
        std::thread::sleep(Duration::from_millis(400));
        w.write_all(&[7u8; 100]).unwrap();
    });
    let mut r = std::fs::File::open(&fifo).unwrap(); // returns once the writer has opened
    let mut buf = [0u8; 100];
    let start = Instant::now();
    let n = r.read(&mut buf).unwrap();
    let measured = start.elapsed().as_nanos() as u64;
    writer.join().unwrap();
    assert_eq!(n, 100);
    assert!(measured > 200_000_000, "the read blocked ({measured} ns)");

    let snapshot = probes.snapshot().unwrap();
    let mine = stats_of(&snapshot, own_cgroup_id());
    assert_eq!(mine.len(), 1, "{snapshot:#?}");
    let s = mine[0].clone();
    let diff = s.blocked_ns.abs_diff(measured);
    assert!(
        diff * 10 <= measured,
        "blocked {} ns in the kernel vs {measured} ns measured by the reader (more than 10% apart)",
        s.blocked_ns
    );
    eprintln!(
        "{mode:?}: blocked {} ns in the kernel, {measured} ns measured by the reader",
        s.blocked_ns
    );
    (s, measured)
}

#[test]
fn time_blocked_in_a_fifo_read_matches_what_the_reader_measured() {
    let Some(_serial) = privileged() else { return };
    let (s, _) = blocked_fifo_read(ProbeMode::PerRead);
    assert_eq!((s.calls, s.bytes), (1, 100));
    assert!(s.latency_ns >= s.blocked_ns);
}

#[test]
fn stalls_only_mode_measures_the_blocked_read_without_per_syscall_hooks() {
    let Some(_serial) = privileged() else { return };
    let (s, _) = blocked_fifo_read(ProbeMode::StallsOnly);
    // Nothing follows the syscalls themselves: no calls, bytes or latency.
    assert_eq!((s.calls, s.bytes, s.latency_ns), (0, 0, 0));

    let probes =
        Probes::load(ProbeConfig::default().mode(ProbeMode::StallsOnly)).expect("probes load");
    let ids = probes.program_ids();
    let names: Vec<String> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.contains(&p.id()))
        .filter_map(|p| p.name_as_str().map(str::to_owned))
        .collect();
    assert!(names.iter().any(|n| n == "sched_switch"), "{names:?}");
    assert!(
        !names.iter().any(|n| n == "sys_enter" || n == "sys_exit"),
        "no per-syscall hooks in stalls-only mode: {names:?}"
    );
    let err = Probes::load(
        ProbeConfig::default()
            .mode(ProbeMode::StallsOnly)
            .watch_prefix("/tmp"),
    )
    .expect_err("a prefix watch needs the opens");
    assert!(err.to_string().contains("PerRead"), "{err}");
}

#[test]
fn positioned_reads_are_sampled_with_their_offsets() {
    let Some(_serial) = privileged() else { return };
    let mount = Tmpfs::mount();
    let path = mount.path().join("sample.bin");
    write_file(&path, 1 << 16);
    let mut probes = Probes::load(
        ProbeConfig::default()
            .watch_filesystem(mount.path())
            .sample_every(1),
    )
    .expect("probes load");

    let file = std::fs::File::open(&path).unwrap();
    let mut buf = [0u8; 4096];
    for offset in [8192u64, 0, 61440] {
        assert_eq!(file.read_at(&mut buf, offset).unwrap(), 4096);
    }
    drop(file);
    let me = own_cgroup_id();
    let events: Vec<_> = probes
        .drain_accesses()
        .into_iter()
        .filter(|e| e.cgroup_id == me)
        .collect();
    let got: Vec<_> = events.iter().map(|e| (e.kind, e.offset, e.size)).collect();
    assert_eq!(
        got,
        vec![
            (ReadKind::Pread64, 8192, 4096),
            (ReadKind::Pread64, 0, 4096),
            (ReadKind::Pread64, 61440, 4096)
        ]
    );
    assert!(events.iter().all(|e| e.pid == std::process::id()));

    // Sampling can be turned off at run time.
    probes.set_sample_every(0).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    file.read_at(&mut buf, 0).unwrap();
    assert!(probes.drain_accesses().is_empty());
    assert_eq!(
        probes
            .snapshot()
            .unwrap()
            .iter()
            .map(|s| s.calls)
            .sum::<u64>(),
        4
    );
}

#[test]
fn io_uring_reads_of_watched_files_are_counted() {
    let Some(_serial) = privileged() else { return };
    if Command::new("fio").arg("--version").output().is_err() {
        eprintln!("skipped: fio (the io_uring reader) is not installed");
        return;
    }
    let mount = Tmpfs::mount();
    let path = mount.path().join("uring.bin");
    write_file(&path, 1 << 16);
    let probes =
        Probes::load(ProbeConfig::default().watch_filesystem(mount.path())).expect("probes load");
    let cg = TestCgroup::new("uring");
    cg.sh(&format!(
        "exec fio --name=uring --filename={} --ioengine=io_uring --rw=read --bs=4k --size=64k --iodepth=4 \
         --output=/dev/null",
        path.display()
    ));
    let snapshot = probes.snapshot().unwrap();
    let mine = stats_of(&snapshot, cg.id());
    assert_eq!(mine.len(), 1, "{snapshot:#?}");
    assert_eq!(
        (mine[0].uring_reads, mine[0].uring_bytes),
        (16, 1 << 16),
        "{:#?}",
        mine[0]
    );
    assert!(mine[0].uring_latency_ns > 0);
}

/// Without privileges, `load` fails with one line that says what is missing. As root the
/// test re-runs itself as `nobody` through setpriv.
#[test]
fn load_without_privileges_names_the_missing_capability() {
    if std::env::var_os("SLUICE_TEST_UNPRIVILEGED").is_some() || privileged_uid() != Some(0) {
        let err =
            Probes::load(ProbeConfig::default()).expect_err("load must fail without privileges");
        assert!(
            err.to_string().contains("CAP_BPF/CAP_SYS_ADMIN missing"),
            "{err}"
        );
        return;
    }
    let util_linux = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("util-linux"));
    if !util_linux {
        eprintln!("skipped: needs util-linux setpriv to drop privileges");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(&exe)
        .args([
            "--exact",
            "load_without_privileges_names_the_missing_capability",
            "--nocapture",
        ])
        .env("SLUICE_TEST_UNPRIVILEGED", "1")
        .output();
    match out {
        Ok(out) => assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "unprivileged run failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("skipped: cannot run setpriv ({e})"),
    }
}

fn privileged_uid() -> Option<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A real FUSE mount (rclone serving a local directory), until Sluice's own FUSE front end
/// can be used here.
struct FuseMount {
    _src: tempfile::TempDir,
    mnt: tempfile::TempDir,
}

impl FuseMount {
    fn rclone(files: &[(&str, usize)]) -> Option<Self> {
        let src = tempfile::tempdir().unwrap();
        let mnt = tempfile::tempdir().unwrap();
        for (name, len) in files {
            write_file(&src.path().join(name), *len);
        }
        let status = Command::new("rclone")
            .arg("mount")
            .arg(src.path())
            .arg(mnt.path())
            .args(["--daemon", "--config", "/dev/null"])
            .status()
            .ok()?;
        let mount = Self { _src: src, mnt };
        let deadline = Instant::now() + Duration::from_secs(10);
        while status.success() && Instant::now() < deadline {
            let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
            if mounts.contains(&format!("{} fuse", mount.path().display())) {
                return Some(mount);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
    fn path(&self) -> &Path {
        self.mnt.path()
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount")
            .arg("-uz")
            .arg(self.mnt.path())
            .status();
    }
}

#[test]
fn reads_through_a_fuse_mount_report_fuse_latency_per_opcode() {
    let Some(_serial) = privileged() else { return };
    let len = 300_000;
    let Some(fuse) = FuseMount::rclone(&[("x.jpeg", len)]) else {
        eprintln!("skipped: could not mount a FUSE filesystem with rclone");
        return;
    };
    let probes = Probes::load(
        ProbeConfig::default()
            .watch_filesystem(fuse.path())
            .time_every(1),
    )
    .expect("probes load");
    if !probes.unavailable().is_empty() {
        eprintln!("skipped: this kernel lacks {:?}", probes.unavailable());
        return;
    }
    let cg = TestCgroup::new("fuse");
    cg.sh(&format!(
        "exec dd if={} of=/dev/null bs=65536 status=none",
        fuse.path().join("x.jpeg").display()
    ));
    let snapshot = probes.snapshot().unwrap();
    let mine = stats_of(&snapshot, cg.id());
    assert_eq!(mine.len(), 1, "{snapshot:#?}");
    let s = mine[0];
    assert_eq!(s.bytes, len as u64);
    assert!(
        s.page_cache_misses > 0,
        "pages fetched through FUSE are page-cache misses: {s:#?}"
    );
    const FUSE_READ: u32 = 15;
    let read = s
        .fuse
        .iter()
        .find(|f| f.opcode == FUSE_READ)
        .unwrap_or_else(|| panic!("no FUSE_READ: {s:#?}"));
    assert!(
        read.requests >= 1 && read.latency_ns > 0 && read.latency.count() == read.requests,
        "{read:#?}"
    );
    assert_eq!(read.errors, 0);
    // The reader waited for the FUSE daemon off-CPU.
    assert!(s.blocked_ns > 0 && s.blocked_ns <= s.latency_ns, "{s:#?}");
}
