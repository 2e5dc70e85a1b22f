//! A cold sequential scan through a bandwidth-limited S3 source (SeaweedFS behind a
//! throttling proxy) stalls less with the prefetcher and the autoscaler on than off.
//!
//! The reader is a training loop in miniature: it reads each file of a directory of
//! shards in order, 512 KiB per read(), and "computes" 40 ms after each read. Its stall is
//! its own time blocked inside read() calls. Each arm starts a fresh agent on a cold cache
//! and a fresh mount (no page cache). The ratio is printed; only "less" is asserted.

#[path = "fuse_harness.rs"]
mod harness;
mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use harness::Env;
use support::{SeaweedFs, StallProxy};

const SHARDS: usize = 6;
const SHARD: usize = 6 << 20;
const READ: usize = 512 << 10;
const THINK: Duration = Duration::from_millis(40);
/// The source link: 12 MiB/s, so a 4 MiB block takes about a third of a second.
const RATE: u64 = 12 << 20;

/// What one arm measured.
struct Arm {
    stall: Duration,
    wall: Duration,
    log: String,
    metrics: String,
}

const OFF: &str = "  prefetch: { enabled: false }\n  autoscale: { enabled: false }\n";
const ON: &str = "  prefetch: { enabled: true }\n  autoscale: { enabled: true }\n";
/// On, but starting from a prefetch budget of 2: the autoscaler has to raise it.
const ON_LOW: &str = "  prefetch: { enabled: true, concurrency: 2 }\n  autoscale: { enabled: true, minPrefetch: 1, stallThreshold: 0.05 }\n";

/// Starts an agent on `s3` (through `proxy`) with the `switches` in its agent section,
/// scans every shard in order, and returns the reader's blocked time.
async fn arm(s3: &SeaweedFs, proxy: &StallProxy, switches: &str) -> Arm {
    let mut env = Env::new(0, &[SHARD; SHARDS], "4MiB");
    env.use_s3(
        "s3://train/scan",
        &proxy.endpoint(),
        s3.access_key(),
        s3.secret_key(),
    );
    let metrics_port = support::free_port();
    env.agent_settings(metrics_port, switches);

    tokio::task::block_in_place(|| {
        env.start_agent();
        let mut buf = vec![0u8; READ];
        let mut stall = Duration::ZERO;
        let started = Instant::now();
        for rel in env.files.clone() {
            if !rel.starts_with("shards/") {
                continue;
            }
            let want = std::fs::read(env.source(&rel)).unwrap();
            let mut f = std::fs::File::open(env.served(&rel)).unwrap();
            let mut at = 0;
            loop {
                let t = Instant::now();
                let n = f.read(&mut buf).unwrap();
                stall += t.elapsed();
                if n == 0 {
                    break;
                }
                assert!(buf[..n] == want[at..at + n], "{rel}: wrong bytes at {at}");
                at += n;
                std::thread::sleep(THINK);
            }
            assert_eq!(at, want.len(), "{rel}: short read");
        }
        let wall = started.elapsed();
        let metrics = support::raw_http(metrics_port, "GET", "/metrics", &[])
            .map(|(_, body)| String::from_utf8_lossy(&body).into_owned())
            .unwrap_or_default();
        assert!(env.stop_agent().success());
        Arm {
            stall,
            wall,
            log: env.log(0),
            metrics,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_and_autoscaler_cut_the_stall_of_a_cold_sequential_scan() {
    require_fuse!();
    let Some(s3) = SeaweedFs::start() else { return };
    s3.create_bucket("train").await;
    let env = Env::new(0, &[SHARD; SHARDS], "4MiB");
    for rel in &env.files {
        if rel.starts_with("shards/") {
            s3.put(
                "train",
                &format!("scan/{rel}"),
                std::fs::read(env.source(rel)).unwrap(),
            )
            .await;
        }
    }
    drop(env);
    let proxy = StallProxy::start(([127, 0, 0, 1], s3.port()).into()).await;
    proxy.limit_rate(RATE);

    let off = arm(&s3, &proxy, OFF).await;
    let on = arm(&s3, &proxy, ON).await;
    let low = arm(&s3, &proxy, ON_LOW).await;

    for (name, a) in [("on", &on), ("on-low", &low)] {
        for line in a.metrics.lines().filter(|l| {
            !l.starts_with('#')
                && (l.contains("prefetch")
                    || l.contains("autoscale")
                    || l.contains("source_failures"))
        }) {
            println!("{name}: {line}");
        }
        for line in a.log.lines().filter(|l| l.contains("autoscale")) {
            println!("{name}: {line}");
        }
    }
    println!(
        "cold scan of {SHARDS} x {} MiB at {} MiB/s, {} KiB reads, {} ms think after each:",
        SHARD >> 20,
        RATE >> 20,
        READ >> 10,
        THINK.as_millis(),
    );
    for (name, a) in [("off", &off), ("on", &on), ("on, budget from 2", &low)] {
        println!(
            "  {name:>18}: stall {:.2} s, wall {:.2} s, stall ratio on/off {:.2}",
            a.stall.as_secs_f64(),
            a.wall.as_secs_f64(),
            a.stall.as_secs_f64() / off.stall.as_secs_f64()
        );
    }
    // Started below what the scan needs, the budget was raised by the autoscaler.
    let raised = low
        .metrics
        .lines()
        .find(|l| {
            l.starts_with("sluice_autoscale_decisions_total")
                && l.contains("knob=\"prefetch\"")
                && l.contains("direction=\"up\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        raised >= 1.0,
        "the autoscaler never raised a budget of 2 under a stalled scan\n--- log ---\n{}",
        low.log
    );
    for (name, a) in [("on", &on), ("on, budget from 2", &low)] {
        assert!(
            a.stall < off.stall,
            "{name}: prefetch+autoscaler did not stall less: {:.2} s vs {:.2} s off\n--- log ---\n{}",
            a.stall.as_secs_f64(),
            off.stall.as_secs_f64(),
            a.log
        );
    }
}
