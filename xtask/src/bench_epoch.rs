//! `cargo xtask bench epoch`: random-order epochs over an ImageNet-like dataset in
//! SeaweedFS, through Sluice (cold, then warm from NVMe) against the same files on local disk
//! (the limit) and the same objects read directly from S3 with the same parallelism.

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use crate::agent::{Agent, AgentSetup};
use crate::bench::BenchArgs;
use crate::seaweed::SeaweedFs;
use crate::workload::{self, Epoch, Shape};

const READERS: usize = 8;
/// Alternating warm-epoch rounds of Sluice and local disk (a quick epoch lasts about a second).
const WARM_ROUNDS: u64 = 5;

/// The epoch with the median rate.
fn median(mut epochs: Vec<Epoch>) -> Epoch {
    epochs.sort_by(|a, b| a.mib_s().total_cmp(&b.mib_s()));
    epochs.swap_remove(epochs.len() / 2)
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let shape = if args.quick {
        Shape {
            files: 3_000,
            dirs: 100,
            median: 110 << 10,
            shards: 1,
            shard_size: 256 << 20,
        }
    } else {
        Shape {
            files: 20_000,
            dirs: 1_000,
            median: 110 << 10,
            shards: 2,
            shard_size: 1 << 30,
        }
    };
    let work = crate::tasks::root().join("target/bench/epoch");
    std::fs::create_dir_all(&work)?;
    let bin = crate::agent::build()?;
    if !workload::drop_page_cache() {
        eprintln!(
            "bench: cannot drop the page cache (not root?): local-disk figures will include page-cache hits"
        );
    }

    println!(
        "generating {} files in {} dirs + {} shards of {} MiB",
        shape.files,
        shape.dirs,
        shape.shards,
        shape.shard_size >> 20
    );
    let data = work.join(format!("data-{}", shape.files));
    let set = workload::generate(&data, shape, 42)?;
    let samples = set.samples();
    let total = set.bytes();

    let _ = std::fs::remove_dir_all(work.join("seaweed"));
    let s3 = SeaweedFs::start(&work.join("seaweed"))?;
    workload::upload(&s3.endpoint(), "bench", "imagenet", &data, &set)?;

    // The peer users would otherwise run: S3 directly, same parallelism.
    let direct = workload::read_s3(
        &s3.endpoint(),
        "bench",
        "imagenet",
        &workload::shuffled(&samples, 1),
        READERS,
    )?;

    // Sluice with a memory tier a quarter of the dataset: the warm epoch is served by NVMe.
    let sluice_work = work.join("sluice");
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(sluice_work.join("mnt/bench"))
        .stderr(std::process::Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(&sluice_work);
    let setup = AgentSetup {
        work: &sluice_work,
        dataset: "bench",
        mount_point: "s3://bench/imagenet".into(),
        options: format!(
            "endpoint: \"{}\", region: us-east-1, allowHttp: \"true\", pathStyle: \"true\"",
            s3.endpoint()
        ),
        memory: total / 4,
        disk: total * 2,
    };
    let agent = Agent::start(&bin, &setup)?;
    workload::drop_page_cache();
    let cold = workload::read_files(&agent.mount, &workload::shuffled(&samples, 2), READERS);
    // Warm epochs against the limit (the same files on local disk, read cold from the
    // disk), alternating so both sides see the same machine; the median round of each.
    let (mut locals, mut warms) = (Vec::new(), Vec::new());
    for round in 0..WARM_ROUNDS {
        workload::drop_page_cache();
        locals.push(workload::read_files(
            &data,
            &workload::shuffled(&samples, 10 + round),
            READERS,
        ));
        workload::drop_page_cache();
        warms.push(workload::read_files(
            &agent.mount,
            &workload::shuffled(&samples, 20 + round),
            READERS,
        ));
    }
    agent.stop();
    let (local, warm) = (median(locals), median(warms));

    let rows = [
        ("local disk (limit, median of rounds)", local),
        ("S3 direct (object_store, 8 in flight)", direct),
        ("Sluice cold", cold),
        ("Sluice warm (NVMe, median of rounds)", warm),
    ];
    println!(
        "\n{} files, {:.1} MiB of samples; {READERS} readers, random order",
        samples.len(),
        samples.iter().map(|s| s.1).sum::<u64>() as f64 / 1048576.0
    );
    println!(
        "{:<40} {:>10} {:>10} {:>9} {:>7}",
        "system", "files/s", "MiB/s", "p99 ms", "errors"
    );
    for (name, e) in &rows {
        println!(
            "{name:<40} {:>10.0} {:>10.1} {:>9.2} {:>7}",
            e.files_s(),
            e.mib_s(),
            e.p99_ms,
            e.errors
        );
    }
    let rss = rss_per_million(&bin, &work, if args.quick { 20_000 } else { 200_000 })?;
    let ratio = |a: &Epoch, b: &Epoch| a.mib_s() / b.mib_s();
    let figures = json!({
        "warm_vs_local": ratio(&warm, &local),
        "cold_vs_s3": ratio(&cold, &direct),
        "warm_vs_s3": ratio(&warm, &direct),
        "rss_mb_per_million_objects": rss,
        "quick": args.quick,
        "epochs": { "local": local, "s3_direct": direct, "sluice_cold": cold, "sluice_warm": warm },
    });
    println!(
        "\nwarm_vs_local {:.2}  cold_vs_s3 {:.2}  warm_vs_s3 {:.2}  rss_mb_per_million_objects {:.0}",
        ratio(&warm, &local),
        ratio(&cold, &direct),
        ratio(&warm, &direct),
        rss
    );
    if rows.iter().any(|r| r.1.errors > 0) {
        eprintln!(
            "bench: some reads failed (see errors column); the figures above count only successful bytes"
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Agent RSS per million objects of metadata: an agent serving `n` empty files minus one
/// serving a single file, scaled to a million.
fn rss_per_million(bin: &Path, work: &Path, n: usize) -> anyhow::Result<f64> {
    let measure = |files: usize| -> anyhow::Result<u64> {
        let src = work.join(format!("meta-src-{files}"));
        if !src.join(".complete").exists() {
            for i in 0..files {
                let p = src.join(format!("d{:04}/f{i:08}.bin", i % 1000));
                std::fs::create_dir_all(p.parent().expect("parent"))?;
                std::fs::File::create(p)?;
            }
            std::fs::write(src.join(".complete"), b"")?;
        }
        let w = work.join(format!("meta-agent-{files}"));
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(w.join("mnt/meta"))
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&w);
        let setup = AgentSetup {
            work: &w,
            dataset: "meta",
            mount_point: format!("file://{}", src.display()),
            options: String::new(),
            memory: 64 << 20,
            disk: 256 << 20,
        };
        let agent = Agent::start(bin, &setup)?;
        std::thread::sleep(std::time::Duration::from_secs(1));
        let rss = agent.rss();
        agent.stop();
        Ok(rss)
    };
    let base = measure(1)?;
    let full = measure(n)?;
    Ok(full.saturating_sub(base) as f64 / (1 << 20) as f64 * 1e6 / n as f64)
}
