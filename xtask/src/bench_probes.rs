//! `cargo xtask bench probes`: what the eBPF stall probes cost.
//!
//! In one run, alternating rounds with the probes attached and detached (ABBA order, the
//! median round of each side), it measures:
//! - fio, 4 KiB random reads with psync from the page cache, several jobs, on a tmpfs the
//!   probes watch (every read is a dataset read: counted, histogrammed, sampled) and on
//!   one they do not watch (every read still passes the syscall tracepoints);
//! - the warm epoch of the epoch benchmark (random order, 8 readers) through a real
//!   `sluice agent` over a generated ImageNet-like dataset (file:// source; the warm epoch
//!   is served from the agent's memory tier, the page cache dropped before each round).
//!
//! The probes are loaded by this process with the agent's settings (the agent's own
//! observer is switched off so that only one set is attached): the dataset mount and the
//! watched tmpfs, 1 in 16 reads sampled, the ring buffer drained every 100 ms and the
//! counters read every second, as the agent's observer does.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use sluice_ebpf_probes::{ProbeConfig, Probes};

use crate::agent::{Agent, AgentSetup};
use crate::bench::BenchArgs;
use crate::workload::{self, Shape};

const READERS: usize = 8;
const FIO_JOBS: usize = 4;

/// Probes attached for one round, with a thread doing the observer's user-space work.
struct Attached {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Probes, u64)>,
    started: Instant,
}

/// What one probes-on round saw.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    reads: u64,
    samples: u64,
    lost: u64,
    secs: f64,
}

impl Attached {
    fn start(config: ProbeConfig) -> anyhow::Result<Attached> {
        let mut probes = Probes::load(config).context("loading the probes (root needed)")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = 0u64;
            let mut n = 0u64;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                samples += probes.drain_accesses().len() as u64;
                n += 1;
                if n.is_multiple_of(10) {
                    let _ = probes.snapshot();
                }
            }
            samples += probes.drain_accesses().len() as u64;
            (probes, samples)
        });
        Ok(Attached {
            stop,
            thread,
            started: Instant::now(),
        })
    }

    fn stop(self) -> anyhow::Result<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64();
        let (probes, samples) = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("probe thread panicked"))?;
        let reads = probes
            .snapshot()?
            .iter()
            .map(|s| s.calls + s.uring_reads)
            .sum();
        let lost = probes.lost_events()? + probes.lost_stat_updates()?;
        drop(probes); // detaches
        Ok(Seen {
            reads,
            samples,
            lost,
            secs,
        })
    }
}

/// fio 4 KiB psync random reads of `dir` (already laid out and cached): IOPS.
fn fio(dir: &Path, secs: u64) -> anyhow::Result<f64> {
    let out = Command::new("fio")
        .args([
            "--name=probes",
            "--rw=randread",
            "--bs=4k",
            "--ioengine=psync",
            "--size=64M",
            "--time_based",
            "--group_reporting",
            "--output-format=json",
        ])
        .arg(format!("--directory={}", dir.display()))
        .arg(format!("--numjobs={FIO_JOBS}"))
        .arg(format!("--runtime={secs}"))
        .output()
        .context("running fio (apt-get install fio)")?;
    anyhow::ensure!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("fio's JSON")?;
    v["jobs"][0]["read"]["iops"].as_f64().context("fio iops")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (off - on) / off, in percent: how much throughput the probes took.
fn overhead(on: f64, off: f64) -> f64 {
    (off - on) / off * 100.0
}

fn mount_tmpfs(dir: &Path) -> anyhow::Result<()> {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status();
    std::fs::create_dir_all(dir)?;
    crate::tasks::run(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512m", "sluice-bench"])
            .arg(dir),
    )
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let (rounds, fio_secs, shape) = if args.quick {
        (
            3,
            3,
            Shape {
                files: 2_000,
                dirs: 50,
                median: 64 << 10,
                shards: 0,
                shard_size: 0,
            },
        )
    } else {
        (
            5,
            10,
            Shape {
                files: 10_000,
                dirs: 200,
                median: 110 << 10,
                shards: 0,
                shard_size: 0,
            },
        )
    };
    anyhow::ensure!(
        std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")),
        "bench probes needs root (BPF, tmpfs mounts, dropping the page cache)"
    );
    let bin = crate::agent::build()?;
    // SAFETY: no other thread runs yet (the build above is a child process); the agents
    // started below inherit it: only the probes this process loads are attached.
    unsafe { std::env::set_var("SLUICE_STALLS_ENABLED", "false") };

    let work = crate::tasks::root().join("target/bench/probes");
    std::fs::create_dir_all(&work)?;
    let watched = work.join("watched");
    let unwatched = work.join("unwatched");
    mount_tmpfs(&watched)?;
    mount_tmpfs(&unwatched)?;
    let result = (|| -> anyhow::Result<()> {
        // Lay the fio files out once (fio reuses them).
        for d in [&watched, &unwatched] {
            fio(d, 1)?;
        }

        let data = work.join(format!("data-{}", shape.files));
        println!(
            "generating {} files in {} dirs (median {} KiB)",
            shape.files,
            shape.dirs,
            shape.median >> 10
        );
        let set = workload::generate(&data, shape, 7)?;
        let samples = set.samples();
        let total = set.bytes();
        let agent_work = work.join("sluice");
        let _ = Command::new("umount")
            .arg("-l")
            .arg(agent_work.join("mnt/bench"))
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&agent_work);
        let setup = AgentSetup {
            work: &agent_work,
            dataset: "bench",
            mount_point: format!("file://{}", data.display()),
            options: String::new(),
            memory: total * 2,
            disk: total * 2,
        };
        let agent = Agent::start(&bin, &setup)?;
        // The cold epoch fills the agent's memory tier.
        let cold = workload::read_files(&agent.mount, &workload::shuffled(&samples, 1), READERS);
        println!(
            "cold epoch: {:.0} files/s ({} errors)",
            cold.files_s(),
            cold.errors
        );
        let probe_config = || {
            ProbeConfig::default()
                .watch_filesystem(agent.mount.parent().expect("dataset root"))
                .watch_filesystem(&watched)
                .sample_every(16)
        };

        let (mut fio_on, mut fio_off, mut un_on, mut un_off) = (vec![], vec![], vec![], vec![]);
        let (mut ep_on, mut ep_off) = (vec![], vec![]);
        let mut seen = Vec::new();
        for round in 0..rounds {
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for on in order {
                let attached = if on {
                    Some(Attached::start(probe_config())?)
                } else {
                    None
                };
                let a = fio(&watched, fio_secs)?;
                let b = fio(&unwatched, fio_secs)?;
                workload::drop_page_cache();
                let e = workload::read_files(
                    &agent.mount,
                    &workload::shuffled(&samples, 100 + round),
                    READERS,
                );
                anyhow::ensure!(e.errors == 0, "warm epoch: {} reads failed", e.errors);
                if let Some(att) = attached {
                    let s = att.stop()?;
                    seen.push(s);
                    fio_on.push(a);
                    un_on.push(b);
                    ep_on.push(e.files_s());
                } else {
                    fio_off.push(a);
                    un_off.push(b);
                    ep_off.push(e.files_s());
                }
                println!(
                    "round {round} probes {:<3}: fio watched {a:>9.0} IOPS, unwatched {b:>9.0} IOPS, warm epoch {:>7.0} files/s",
                    if on { "on" } else { "off" },
                    e.files_s()
                );
            }
        }
        agent.stop();

        let (fw_on, fw_off) = (median(fio_on), median(fio_off));
        let (fu_on, fu_off) = (median(un_on), median(un_off));
        let (e_on, e_off) = (median(ep_on), median(ep_off));
        let lost: u64 = seen.iter().map(|s| s.lost).sum();
        let reads: u64 = seen.iter().map(|s| s.reads).sum();
        let samples_drained: u64 = seen.iter().map(|s| s.samples).sum();
        let secs: f64 = seen.iter().map(|s| s.secs).sum();
        let figures = json!({
            "overhead_pct_fio": overhead(fw_on, fw_off),
            "overhead_pct_fio_unwatched": overhead(fu_on, fu_off),
            "overhead_pct_epoch": overhead(e_on, e_off),
            "lost_events": lost,
            "events_per_second": reads as f64 / secs,
            "samples_per_second": samples_drained as f64 / secs,
            "quick": args.quick,
            "rounds": rounds,
            "fio_jobs": FIO_JOBS,
            "fio_iops": { "watched_on": fw_on, "watched_off": fw_off, "unwatched_on": fu_on, "unwatched_off": fu_off },
            "epoch_files_per_second": { "on": e_on, "off": e_off },
            "epoch_files": samples.len(),
        });
        println!(
            "\nmedians of {rounds} rounds (ABBA): fio watched {fw_on:.0} vs {fw_off:.0} IOPS, unwatched {fu_on:.0} vs {fu_off:.0}, warm epoch {e_on:.0} vs {e_off:.0} files/s (probes on vs off)"
        );
        println!(
            "overhead_pct_fio {:.1}  overhead_pct_fio_unwatched {:.1}  overhead_pct_epoch {:.1}  lost_events {lost}  events_per_second {:.0}  samples_per_second {:.0}",
            overhead(fw_on, fw_off),
            overhead(fu_on, fu_off),
            overhead(e_on, e_off),
            reads as f64 / secs,
            samples_drained as f64 / secs
        );
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&figures)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    })();
    for d in [&watched, &unwatched] {
        let _ = Command::new("umount").arg("-l").arg(d).status();
    }
    result
}
