//! SIGKILL while writing: a child process (this test binary re-executed) inserts without
//! end; the parent kills it and reopens. Every entry returned must be byte-exact.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use sluice_cache_engine::EngineKind;

const CHILD_ENV: &str = "SLUICE_CRASH_CHILD";
const MAX: usize = 48 << 10;

/// The child's body: runs only when re-executed by `sigkill_while_writing`.
#[test]
fn crash_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (engine, dir) = spec.split_once(':').unwrap();
    let engine = if engine == "uring" {
        EngineKind::IoUring
    } else {
        EngineKind::Psync
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cache = open(small(std::path::Path::new(dir), engine, 1 << 20));
        for i in 0u64.. {
            cache.insert(key(i), value(i, 0, MAX)).await.unwrap();
        }
    });
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_writing() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let name = if engine == EngineKind::IoUring {
            "uring"
        } else {
            "psync"
        };
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{name}:{}", dir.path().display()))
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Let it write a few segments (and be in the middle of another), then kill it.
        let deadline = Instant::now() + Duration::from_secs(120);
        while dir_bytes(dir.path()) < 14 << 20 {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the writer exited on its own"
            );
            assert!(Instant::now() < deadline, "the writer made no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
        child.wait().unwrap();

        let cache = open(small(dir.path(), engine, 0));
        let recovered = cache.stats().disks[0].1.entries;
        assert!(
            recovered > 100,
            "{engine:?}: only {recovered} entries recovered"
        );
        let mut found = 0;
        let mut i = 0;
        let mut misses_in_a_row = 0;
        while misses_in_a_row < 2000 {
            match cache.get(&key(i)).await {
                Some(v) => {
                    assert_eq!(
                        v,
                        value(i, 0, MAX),
                        "{engine:?}: block {i} is not byte-exact"
                    );
                    found += 1;
                    misses_in_a_row = 0;
                }
                None => misses_in_a_row += 1,
            }
            i += 1;
        }
        assert_eq!(
            found, recovered,
            "{engine:?}: every indexed entry reads back"
        );
        assert_eq!(cache.stats().checksum_failures, 0, "{engine:?}");
        // The cache keeps working after recovery.
        cache.insert(key(u64::MAX), value(7, 7, MAX)).await.unwrap();
        assert_eq!(cache.get(&key(u64::MAX)).await.unwrap(), value(7, 7, MAX));
        eprintln!("{engine:?}: recovered {found} entries after SIGKILL");
    }
}
