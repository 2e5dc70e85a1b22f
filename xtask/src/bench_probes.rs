//! `cargo xtask bench probes`: what the eBPF stall probes cost.
//!
//! In one run, in rounds that each measure four states in a rotating order ([`order`]):
//! the probes attached (per-read mode, as the agent loads them by default); the probes in
//! stalls-only mode; as the floor, empty programs on the same per-syscall hooks
//! ([`EmptySyscallHooks`]), the least any design that follows every read(2) on the node
//! costs; and nothing attached. Costs are medians of per-round pairs with "nothing"
//! ([`paired`]). It measures:
//! - fio, 4 KiB random reads with psync from the page cache, several jobs, on a tmpfs the
//!   probes watch (every read is a dataset read: counted, histogrammed, sampled) and on
//!   one they do not watch (every read still passes the syscall tracepoints);
//! - the same reads from one process pinned to one CPU (`xtask pread-loop`), in ns per
//!   read, in short rounds of their own: finer than fio's rate on a shared machine;
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
use sluice_ebpf_probes::{EmptySyscallHooks, ProbeConfig, ProbeMode, Probes};

use crate::agent::{Agent, AgentSetup};
use crate::bench::BenchArgs;
use crate::workload::{self, Shape};

const READERS: usize = 8;
const FIO_JOBS: usize = 4;
const PREAD_LOOP_READS: u64 = 200_000;

/// What is attached during a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hooks {
    /// The probes as the agent loads them by default (`ProbeMode::PerRead`).
    Probes = 0,
    /// The probes in `ProbeMode::StallsOnly`: no per-syscall hooks.
    StallsOnly = 1,
    /// Empty programs on sys_enter/sys_exit: the floor of any per-read design.
    Empty = 2,
    Nothing = 3,
}

const STATES: [Hooks; 4] = [
    Hooks::Probes,
    Hooks::StallsOnly,
    Hooks::Empty,
    Hooks::Nothing,
];

/// The order of the states in round `round`: rotated, and reversed every other cycle,
/// so that no state always runs first or last.
fn order(round: usize) -> [Hooks; 4] {
    let mut o = STATES;
    let n = o.len();
    o.rotate_left(round % n);
    if (round / n) % 2 == 1 {
        o.reverse();
    }
    o
}

/// The reader process of the pinned measurement: 4 KiB preads at pseudo-random page
/// offsets of `file` (already in the page cache), pinned to the last CPU; prints ns per
/// read. A process of its own, so that reading the unwatched file is not done by a
/// process the probes watch.
pub fn pread_loop(file: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is valid and CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus - 1, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let pages = f.metadata()?.len() / 4096;
    anyhow::ensure!(pages > 0, "{} is empty", file.display());
    let mut buf = [0u8; 4096];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut reads = |n: u64| -> anyhow::Result<f64> {
        let start = Instant::now();
        for _ in 0..n {
            // xorshift64: cheap, and no two runs need the same offsets.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f.read_at(&mut buf, (x % pages) * 4096)?;
        }
        Ok(start.elapsed().as_nanos() as f64 / n as f64)
    };
    reads(PREAD_LOOP_READS / 8)?; // warm up
    println!("{}", reads(PREAD_LOOP_READS)?);
    Ok(())
}

/// ns per read of one `pread_loop` process.
fn pread_ns(file: &Path) -> anyhow::Result<f64> {
    let out = Command::new(std::env::current_exe()?)
        .arg("pread-loop")
        .arg(file)
        .output()
        .context("starting the pread loop")?;
    anyhow::ensure!(
        out.status.success(),
        "pread loop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("pread loop's output")
}

/// Attach what `hooks` names; dropping the result detaches it.
enum Holding {
    Probes(Attached),
    Empty { _hooks: EmptySyscallHooks },
    Nothing,
}

impl Holding {
    fn attach(hooks: Hooks, config: impl FnOnce() -> ProbeConfig) -> anyhow::Result<Holding> {
        Ok(match hooks {
            Hooks::Probes => Holding::Probes(Attached::start(config())?),
            Hooks::StallsOnly => {
                Holding::Probes(Attached::start(config().mode(ProbeMode::StallsOnly))?)
            }
            Hooks::Empty => Holding::Empty {
                _hooks: EmptySyscallHooks::attach()?,
            },
            Hooks::Nothing => Holding::Nothing,
        })
    }

    /// Detach; what the probes saw, if they were attached.
    fn detach(self) -> anyhow::Result<Option<Seen>> {
        match self {
            Holding::Probes(a) => a.stop().map(Some),
            Holding::Empty { .. } | Holding::Nothing => Ok(None),
        }
    }
}

/// Per round, a figure of each state (indexed by `Hooks as usize`): the median over
/// rounds of each state, and of each state's figure paired with the same round's
/// `Nothing` through `cmp` (pairs taken seconds apart cancel the drift of a shared
/// machine, which separate medians keep).
struct Paired {
    median: [f64; 4],
    vs_nothing: [f64; 4],
}

impl Paired {
    fn median_of(&self, h: Hooks) -> f64 {
        self.median[h as usize]
    }
}

fn paired(rounds: &[[f64; 4]], cmp: fn(f64, f64) -> f64) -> Paired {
    let nothing = Hooks::Nothing as usize;
    Paired {
        median: std::array::from_fn(|i| median(rounds.iter().map(|r| r[i]).collect())),
        vs_nothing: std::array::from_fn(|i| {
            median(rounds.iter().map(|r| cmp(r[i], r[nothing])).collect())
        }),
    }
}

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

/// For a time per read, more is worse: the share of the time that was added.
fn slower(t: f64, base: f64) -> f64 {
    (t - base) / t * 100.0
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
    let (rounds, pread_rounds, fio_secs, shape) = if args.quick {
        (
            3,
            9,
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
            6,
            24,
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
        // Lay the fio files out once (fio reuses them; the pread loop reads the first).
        for d in [&watched, &unwatched] {
            fio(d, 1)?;
        }
        let first_fio_file = |d: &Path| d.join("probes.0.0");

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

        let mut rounds_seen: Vec<[Round; 4]> = Vec::new();
        let mut seen = Vec::new();
        for round in 0..rounds {
            let mut this = [Round::default(); 4];
            for hooks in order(round) {
                let holding = Holding::attach(hooks, probe_config)?;
                let fio_watched = fio(&watched, fio_secs)?;
                let fio_unwatched = fio(&unwatched, fio_secs)?;
                workload::drop_page_cache();
                let e = workload::read_files(
                    &agent.mount,
                    &workload::shuffled(&samples, 100 + round as u64),
                    READERS,
                );
                let s = holding.detach()?;
                if hooks == Hooks::Probes {
                    seen.extend(s);
                }
                anyhow::ensure!(e.errors == 0, "warm epoch: {} reads failed", e.errors);
                let r = Round {
                    fio_watched,
                    fio_unwatched,
                    epoch: e.files_s(),
                };
                println!(
                    "round {round} {:<10}: fio watched {:>8.0} IOPS, unwatched {:>8.0} IOPS; warm epoch {:>6.0} files/s",
                    format!("{hooks:?}"),
                    r.fio_watched,
                    r.fio_unwatched,
                    r.epoch
                );
                this[hooks as usize] = r;
            }
            rounds_seen.push(this);
        }

        // The pinned pread loop, in short rounds of its own: each state for well under a
        // second, so that a round's states see the same machine.
        let mut preads: Vec<[(f64, f64); 4]> = Vec::new();
        for round in 0..pread_rounds {
            let mut this = [(0.0, 0.0); 4];
            for hooks in order(round) {
                let holding = Holding::attach(hooks, probe_config)?;
                let w = pread_ns(&first_fio_file(&watched))?;
                let u = pread_ns(&first_fio_file(&unwatched))?;
                holding.detach()?;
                this[hooks as usize] = (w, u);
            }
            println!(
                "pread round {round} (watched / unwatched): {}",
                STATES
                    .iter()
                    .map(|&h| {
                        let (w, u) = this[h as usize];
                        format!("{h:?} {w:.0} / {u:.0} ns")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            preads.push(this);
        }
        agent.stop();

        let pick = |f: fn(&Round) -> f64| -> Vec<[f64; 4]> {
            rounds_seen.iter().map(|r| r.each_ref().map(f)).collect()
        };
        let fw = paired(&pick(|r| r.fio_watched), overhead);
        let fu = paired(&pick(|r| r.fio_unwatched), overhead);
        let ep = paired(&pick(|r| r.epoch), overhead);
        let ns = |f: fn(&(f64, f64)) -> f64| -> Vec<[f64; 4]> {
            preads.iter().map(|r| r.each_ref().map(f)).collect()
        };
        let nw = paired(&ns(|x| x.0), slower);
        let nu = paired(&ns(|x| x.1), slower);
        let nw_diff = paired(&ns(|x| x.0), |a, b| a - b);
        let nu_diff = paired(&ns(|x| x.1), |a, b| a - b);
        let lost: u64 = seen.iter().map(|s| s.lost).sum();
        let reads: u64 = seen.iter().map(|s| s.reads).sum();
        let samples_drained: u64 = seen.iter().map(|s| s.samples).sum();
        let secs: f64 = seen.iter().map(|s| s.secs).sum();
        let (pr, so, em) = (
            Hooks::Probes as usize,
            Hooks::StallsOnly as usize,
            Hooks::Empty as usize,
        );
        let states = |p: &Paired| {
            json!({
                "probes": p.median_of(Hooks::Probes),
                "stalls_only": p.median_of(Hooks::StallsOnly),
                "empty_hooks": p.median_of(Hooks::Empty),
                "nothing": p.median_of(Hooks::Nothing),
            })
        };
        let figures = json!({
            "overhead_pct_fio": fw.vs_nothing[pr],
            "overhead_pct_fio_unwatched": fu.vs_nothing[pr],
            "overhead_pct_epoch": ep.vs_nothing[pr],
            "overhead_pct_pread": nw.vs_nothing[pr],
            "overhead_pct_pread_unwatched": nu.vs_nothing[pr],
            "stalls_only_pct_fio": fw.vs_nothing[so],
            "stalls_only_pct_fio_unwatched": fu.vs_nothing[so],
            "stalls_only_pct_epoch": ep.vs_nothing[so],
            "stalls_only_pct_pread": nw.vs_nothing[so],
            "stalls_only_pct_pread_unwatched": nu.vs_nothing[so],
            "floor_pct_fio": fw.vs_nothing[em],
            "floor_pct_fio_unwatched": fu.vs_nothing[em],
            "floor_pct_epoch": ep.vs_nothing[em],
            "floor_pct_pread": nw.vs_nothing[em],
            "floor_pct_pread_unwatched": nu.vs_nothing[em],
            "probes_ns_per_read": nw_diff.vs_nothing[pr],
            "probes_ns_per_read_unwatched": nu_diff.vs_nothing[pr],
            "stalls_only_ns_per_read": nw_diff.vs_nothing[so],
            "floor_ns_per_read": nw_diff.vs_nothing[em],
            "floor_ns_per_read_unwatched": nu_diff.vs_nothing[em],
            "lost_events": lost,
            "events_per_second": reads as f64 / secs,
            "samples_per_second": samples_drained as f64 / secs,
            "quick": args.quick,
            "rounds": rounds,
            "pread_rounds": pread_rounds,
            "fio_jobs": FIO_JOBS,
            "fio_iops": { "watched": states(&fw), "unwatched": states(&fu) },
            "pread_ns": { "watched": states(&nw), "unwatched": states(&nu) },
            "epoch_files_per_second": states(&ep),
            "epoch_files": samples.len(),
        });
        println!(
            "\nmedians (probes / stalls-only / empty hooks / nothing; {rounds} rounds, pread {pread_rounds}) and what each costs against nothing (median of per-round pairs):"
        );
        for (name, p, unit) in [
            ("fio watched", &fw, "IOPS"),
            ("fio unwatched", &fu, "IOPS"),
            ("pread watched", &nw, "ns"),
            ("pread unwatched", &nu, "ns"),
            ("warm epoch", &ep, "files/s"),
        ] {
            println!(
                "  {name:<16} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {unit:<7}  probes {:>5.1}%  stalls-only {:>5.1}%  empty hooks {:>5.1}%",
                p.median[0],
                p.median[1],
                p.median[2],
                p.median[3],
                p.vs_nothing[pr],
                p.vs_nothing[so],
                p.vs_nothing[em]
            );
        }
        println!(
            "probes_ns_per_read {:.0} (unwatched {:.0}), stalls-only {:.0}, empty hooks {:.0} (unwatched {:.0})  lost_events {lost}  events_per_second {:.0}  samples_per_second {:.0}",
            nw_diff.vs_nothing[pr],
            nu_diff.vs_nothing[pr],
            nw_diff.vs_nothing[so],
            nw_diff.vs_nothing[em],
            nu_diff.vs_nothing[em],
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

/// What one state of one round measured.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    fio_watched: f64,
    fio_unwatched: f64,
    epoch: f64,
}
