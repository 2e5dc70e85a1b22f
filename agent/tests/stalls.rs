//! `sluice stalls` against what a reader measured itself, on the real kernel.
//!
//! A `sluice agent` serves an S3 dataset (SeaweedFS behind a proxy limited to a few MiB/s,
//! prefetch off). A reader process in a cgroup named like a Kubernetes pod (systemd
//! driver layout) reads every file once through the mount, timing the time each read()
//! spent off CPU (wall time minus the thread's CPU time). Meanwhile a second "pod"
//! (cgroupfs layout) spins the CPU and reads a file outside the dataset. The agent must
//! report the first pod's stall within 10% of the reader's own figure, under its UID and
//! the name kubelet's log directory gives it, and no stall for the second.
//!
//! Needs root (FUSE, BPF, cgroups) and `weed`; otherwise each test prints why it skips.

#[path = "fuse_harness.rs"]
mod harness;
mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{BIN, Env};
use support::{SeaweedFs, StallProxy};

/// Set in the environment of the processes the test starts from its own binary.
const ROLE: &str = "SLUICE_STALLS_TEST_ROLE";
const FILES: &str = "SLUICE_STALLS_TEST_FILES";

const NFILES: usize = 16;
const FILE_SIZE: usize = 768 << 10;
/// The source link: 12 MiB of files at 6 MiB/s is about 2 s of waiting.
const RATE: u64 = 6 << 20;

/// Not a test: the entry point of the reader and busy processes (this binary run with
/// `ROLE` set, moved into a cgroup before it is told to go). Passes at once otherwise.
#[test]
fn child_process_entry_point() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    match role.as_str() {
        "reader" => reader(),
        "busy" => busy(),
        other => panic!("unknown role {other}"),
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reads every file named in `FILES`, 256 KiB per read(); prints its blocked time.
fn reader() {
    let files = std::env::var(FILES).unwrap();
    let mut buf = vec![0u8; 256 << 10];
    let (mut blocked, mut wall, mut bytes, mut calls) = (0u64, 0u64, 0u64, 0u64);
    for path in files.lines() {
        let mut f = std::fs::File::open(path).unwrap();
        loop {
            let (t, c) = (Instant::now(), thread_cpu_ns());
            let n = f.read(&mut buf).unwrap();
            let w = t.elapsed().as_nanos() as u64;
            let cpu = thread_cpu_ns() - c;
            wall += w;
            blocked += w.saturating_sub(cpu);
            bytes += n as u64;
            calls += 1;
            if n == 0 {
                break;
            }
        }
    }
    println!("STALLREADER {blocked} {wall} {bytes} {calls}");
}

/// Spins the CPU and reads a non-dataset file (dropping it from the page cache) for 3 s.
fn busy() {
    let path = std::env::var(FILES).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut x = 0u64;
    while Instant::now() < deadline {
        for i in 0..200_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: posix_fadvise on an fd we own; no memory is passed.
        unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 4) };
        std::io::copy(&mut &f, &mut std::io::sink()).unwrap();
    }
    println!("STALLBUSY {x}");
}

/// Test-made cgroups shaped like a pod's, removed on drop (only the directories made here).
struct PodCgroup {
    leaf: PathBuf,
    made: Vec<PathBuf>,
}

impl PodCgroup {
    /// `systemd`: kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/
    /// cri-containerd-<id>.scope; else cgroupfs: kubepods/besteffort/pod<uid>/<id>.
    fn new(uid: &str, systemd: bool) -> PodCgroup {
        let root = sluice_ebpf_probes::cgroup::cgroup2_root().expect("cgroup2 mounted");
        let ctr = format!("{:x}{:08x}", std::process::id(), uid.len());
        let rel: Vec<String> = if systemd {
            vec![
                "kubepods.slice".into(),
                "kubepods-besteffort.slice".into(),
                format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")),
                format!("cri-containerd-{ctr}.scope"),
            ]
        } else {
            vec![
                "kubepods".into(),
                "besteffort".into(),
                format!("pod{uid}"),
                ctr,
            ]
        };
        let mut dir = root;
        let mut made = Vec::new();
        for part in rel {
            dir = dir.join(part);
            if !dir.exists() {
                std::fs::create_dir(&dir)
                    .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
                made.push(dir.clone());
            }
        }
        made.reverse();
        PodCgroup { leaf: dir, made }
    }

    /// Starts this test binary in `role`, moves it into the cgroup, then lets it go.
    fn spawn(&self, role: &str, files: &str) -> Child {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_process_entry_point", "--nocapture"])
            .env(ROLE, role)
            .env(FILES, files)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        std::fs::write(self.leaf.join("cgroup.procs"), child.id().to_string()).unwrap();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        child
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for dir in &self.made {
            for _ in 0..100 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The child's output line starting with `tag`, split on spaces.
fn result_line(child: Child, tag: &str) -> Vec<u64> {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{tag} child failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(tag))
        .unwrap_or_else(|| panic!("no {tag} line in:\n{text}"));
    line.split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

fn stalls_json(env: &Env) -> serde_json::Value {
    let sock = env.socket().display().to_string();
    let (ok, out, err) = env.cli(&["stalls", "--json", "--admin-socket", &sock]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn workload<'a>(report: &'a serde_json::Value, uid: &str) -> Option<&'a serde_json::Value> {
    report["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["identity"]["podUid"] == uid)
}

/// Writes the agent config: the dataset `ds` over `endpoint` (bucket `train`, prefix
/// `imagenet`), no prefetch, quick ticks, every read sampled, pod names from `pods`, the
/// probes in `mode` (`agent.stalls.mode`).
fn configure(
    env: &Env,
    s3: &SeaweedFs,
    endpoint: &str,
    pods: &Path,
    metrics_port: u16,
    mode: &str,
) {
    env.use_s3(
        "s3://train/imagenet",
        endpoint,
        s3.access_key(),
        s3.secret_key(),
    );
    let switches = format!(
        "  prefetch: {{ enabled: false }}\n  autoscale: {{ enabled: false }}\n  stalls: {{ mode: {mode}, tickMillis: 250, sampleEvery: 1, episodeLogSecs: 1, podLogDir: {} }}\n",
        pods.display()
    );
    env.agent_settings(metrics_port, &switches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_stall_matches_what_a_pods_reader_measured_and_a_busy_pod_shows_none() {
    require_fuse!();
    if std::env::var(ROLE).is_ok() {
        return;
    }
    stall_accuracy("perRead").await;
}

/// The same in stalls-only mode: no per-syscall hooks, the stall found from the sleeping
/// reader's registers; the per-read figures are absent and the table says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_only_mode_reports_the_same_stall_without_per_read_figures() {
    require_fuse!();
    if std::env::var(ROLE).is_ok() {
        return;
    }
    stall_accuracy("stallsOnly").await;
}

async fn stall_accuracy(mode: &str) {
    let per_read = mode == "perRead";
    let Some(s3) = SeaweedFs::start() else { return };
    s3.create_bucket("train").await;
    // (A local file makes the harness's data directory; the dataset is on S3.)
    let mut env = Env::new(1, &[], "1MiB");
    let mut rng = harness::Rng(0x5eed);
    let mut rels = Vec::new();
    for i in 0..NFILES {
        let rel = format!("class{:02}/img_{i:04}.jpg", i % 4);
        s3.put("train", &format!("imagenet/{rel}"), rng.bytes(FILE_SIZE))
            .await;
        rels.push(rel);
    }
    let proxy = StallProxy::start(([127, 0, 0, 1], s3.port()).into()).await;
    proxy.limit_rate(RATE);
    let pods = env.dir.path().join("pods");
    let reader_uid = format!("5a1ce5a1-0000-4000-8000-{:012x}", std::process::id());
    let busy_uid = format!("b0000b00-0000-4000-8000-{:012x}", std::process::id());
    std::fs::create_dir_all(pods.join(format!("training_resnet-0_{reader_uid}"))).unwrap();
    let metrics_port = support::free_port();
    configure(&env, &s3, &proxy.endpoint(), &pods, metrics_port, mode);

    let pinned_before = bpffs_entries();
    tokio::task::block_in_place(|| {
        let pid = env.start_agent().id();
        let report = stalls_json(&env);
        assert_eq!(
            report["from"],
            "ebpf",
            "probes not loaded: {report}\n{}",
            env.log(0)
        );
        // The programs belong to the agent's process (held by its fds), nothing pinned.
        assert!(bpf_prog_fds(pid) > 0, "the agent holds no BPF program fds");

        let files: Vec<String> = rels
            .iter()
            .map(|r| env.served(r).display().to_string())
            .collect();
        let other = env.dir.path().join("not-a-dataset.bin");
        std::fs::write(&other, vec![1u8; 4 << 20]).unwrap();

        let reader_cg = PodCgroup::new(&reader_uid, true);
        let busy_cg = PodCgroup::new(&busy_uid, false);
        let busy = busy_cg.spawn("busy", &other.display().to_string());
        let reader = reader_cg.spawn("reader", &files.join("\n"));
        let r = result_line(reader, "STALLREADER ");
        let (blocked, wall, bytes, calls) = (r[0], r[1], r[2], r[3]);
        result_line(busy, "STALLBUSY ");
        assert_eq!(bytes, (NFILES * FILE_SIZE) as u64);

        // Two ticks for the last reads to be counted and the episode to end.
        std::thread::sleep(Duration::from_millis(800));
        let report = stalls_json(&env);
        let w = workload(&report, &reader_uid)
            .unwrap_or_else(|| panic!("no workload for pod {reader_uid}: {report:#}"));
        let stalled = (w["total"]["stalledSeconds"].as_f64().unwrap() * 1e9) as u64;
        println!(
            "reader: blocked {:.3} s in {calls} read() calls ({:.3} s wall); agent: stalled {:.3} s",
            blocked as f64 / 1e9,
            wall as f64 / 1e9,
            stalled as f64 / 1e9
        );
        assert!(
            blocked > 500_000_000,
            "the slowed source should make the reader wait: {blocked} ns"
        );
        assert!(
            stalled.abs_diff(blocked) * 10 <= blocked,
            "reported stall {stalled} ns vs the reader's {blocked} ns: more than 10% apart\n{w:#}"
        );
        let id = &w["identity"];
        assert_eq!(id["kind"], "pod");
        assert_eq!(id["qos"], "besteffort");
        assert_eq!(id["podNamespace"], "training");
        assert_eq!(id["podName"], "resnet-0");
        assert_eq!(w["datasets"][0]["name"], "ds");
        if per_read {
            assert_eq!(w["total"]["readBytes"], bytes);
            assert_eq!(w["total"]["readCalls"], calls);
            let top = w["topFiles"][0]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("no top waits\n{w:#}"));
            assert!(top.starts_with("ds/m/class"), "{w:#}");
            assert!(w["total"]["p99Ms"].as_f64().unwrap() > 0.0);
            // Cold reads of a dataset nobody read before: most bytes came from the source.
            let hit = w["total"]["hitRatio"]
                .as_f64()
                .unwrap_or_else(|| panic!("no hit ratio\n{w:#}"));
            assert!(hit < 0.5, "hit ratio {hit} of cold reads\n{w:#}");
        } else {
            assert_eq!(w["total"]["readCalls"], 0, "{w:#}");
            assert_eq!(report["stallsOnly"], true, "{report:#}");
        }

        // The busy pod did no dataset read: no stall, if it is listed at all.
        if let Some(b) = workload(&report, &busy_uid) {
            assert_eq!(b["total"]["stalledSeconds"], 0.0, "{b:#}");
        }
        assert_eq!(report["lostEvents"], 0, "{report:#}");

        // The table, the metrics and the episode log name the pod too.
        let sock = env.socket().display().to_string();
        let (ok, table, err) = env.cli(&["stalls", "--admin-socket", &sock]);
        assert!(ok, "{err}");
        assert!(table.contains("pod training/resnet-0"), "{table}");
        assert_eq!(table.contains("stalls-only mode"), !per_read, "{table}");
        print!("{table}");
        let (_, body) = support::raw_http(metrics_port, "GET", "/metrics", &[]).unwrap();
        let metrics = String::from_utf8_lossy(&body);
        let series = metrics
            .lines()
            .find(|l| {
                l.starts_with("sluice_workload_stall_seconds_total")
                    && l.contains(&format!("pod_uid=\"{reader_uid}\""))
            })
            .unwrap_or_else(|| panic!("no stall series for the pod:\n{metrics}"));
        assert!(series.contains("pod=\"resnet-0\""), "{series}");
        let log = env.log(0);
        let episode = log
            .lines()
            .find(|l| l.contains("pod training/resnet-0 stalled"))
            .unwrap_or_else(|| panic!("no stall episode logged:\n{log}"));
        assert!(episode.contains("on dataset ds"), "{episode}");
        println!("{episode}");

        drop(reader_cg);
        drop(busy_cg);
        assert!(env.stop_agent().success());
    });
    assert_eq!(
        bpffs_entries(),
        pinned_before,
        "the agent left something in /sys/fs/bpf"
    );
}

/// Open fds of `pid` that are BPF programs.
fn bpf_prog_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-prog")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Everything under /sys/fs/bpf (pins).
fn bpffs_entries() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/bpf")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
            out.push(e.path());
        }
    }
    out.sort();
    out
}

#[test]
fn stalls_say_why_when_the_probes_are_off_and_when_no_agent_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("admin.sock");
    let out = Command::new(BIN)
        .args(["stalls", "--admin-socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no agent at"), "{err}");

    if let Some(why) = harness::skip_reason() {
        eprintln!("SKIPPED (agent part): {why}");
        return;
    }
    let mut env = Env::new(3, &[], "1MiB");
    let config = std::fs::read_to_string(env.config()).unwrap();
    std::fs::write(
        env.config(),
        config.replacen("agent:\n", "agent:\n  stalls: { enabled: false }\n", 1),
    )
    .unwrap();
    env.start_agent();
    let sock = env.socket().display().to_string();
    let (ok, out, err) = env.cli(&["stalls", "--admin-socket", &sock]);
    assert!(ok, "{err}");
    assert!(
        out.contains("stall features are off: disabled in the configuration"),
        "{out}"
    );
    let report = stalls_json(&env);
    assert_eq!(report["from"], "off");
    let log = env.log(0);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("stall probes not loaded"))
        .collect();
    assert_eq!(lines.len(), 1, "one line says stalls are off:\n{log}");
    // Reads still work.
    let n = std::fs::read(env.served(&env.files[0].clone()))
        .unwrap()
        .len();
    assert!(n > 0);
}

#[test]
fn the_stalls_section_is_parsed_validated_and_overridden_by_the_environment() {
    use sluice::config::Config;
    let c = Config::parse("agent:\n  mountRoot: /m\n").unwrap();
    let s = &c.agent.stalls;
    assert!(s.enabled);
    assert_eq!((s.tick_millis, s.sample_every), (1000, 16));
    assert_eq!(s.pod_log_dir, Path::new("/var/log/pods"));
    let c = Config::parse(
        "agent:\n  stalls: { enabled: false, watchPrefixes: [/data/imagenet], tickMillis: 500, sampleEvery: 4, episodeMinRatio: 0.2, episodeLogSecs: 5, podLogDir: /tmp/pods }\n",
    )
    .unwrap();
    let s = &c.agent.stalls;
    assert!(!s.enabled);
    assert_eq!(s.watch_prefixes, [PathBuf::from("/data/imagenet")]);
    assert_eq!(
        (s.tick_millis, s.sample_every, s.episode_log_secs),
        (500, 4, 5)
    );
    assert_eq!(s.mode, sluice::config::StallsMode::PerRead);
    let c = Config::parse("agent:\n  stalls: { mode: stallsOnly, timeEvery: 1 }\n").unwrap();
    assert_eq!(c.agent.stalls.mode, sluice::config::StallsMode::StallsOnly);
    assert_eq!(c.agent.stalls.time_every, 1);
    for (bad, field) in [
        ("mode: sometimes", "mode"),
        (
            "mode: stallsOnly, watchPrefixes: [/data]",
            "agent.stalls.watchPrefixes",
        ),
        ("watchPrefixes: [data]", "agent.stalls.watchPrefixes[0]"),
        ("tickMillis: 0", "agent.stalls.tickMillis"),
        ("episodeMinRatio: 2", "agent.stalls.episodeMinRatio"),
        ("nosuch: 1", "nosuch"),
    ] {
        let err = Config::parse(&format!("agent:\n  stalls: {{ {bad} }}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{bad}: {err}");
    }
    let env =
        |v: &'static str| move |k: &str| (k == "SLUICE_STALLS_ENABLED").then(|| v.to_string());
    let off = Config::parse_with_env("c.yaml", "agent: {}\n", env("false")).unwrap();
    assert!(!off.agent.stalls.enabled);
    let err = Config::parse_with_env("c.yaml", "agent: {}\n", env("maybe"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("SLUICE_STALLS_ENABLED"), "{err}");
}
