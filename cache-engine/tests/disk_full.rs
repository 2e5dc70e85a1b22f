//! A quota larger than the filesystem: inserts fail with an error naming the directory and
//! the reason, are counted, and reads keep working. Needs root for a loop-mounted ext4.

mod common;

use std::process::Command;

use common::*;
use sluice_cache_engine::InsertError;

fn run(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_fails_inserts_cleanly() {
    if !is_root() {
        assert!(
            std::env::var_os("SLUICE_TEST_STRICT").is_none(),
            "SLUICE_TEST_STRICT but not root"
        );
        eprintln!(
            "skipping disk_full_fails_inserts_cleanly: needs root to loop-mount a small ext4"
        );
        return;
    }
    for engine in engines() {
        let base = tempfile::tempdir().unwrap();
        let image = base.path().join("fs.img");
        let mnt = base.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(24 << 20)
            .unwrap();
        if !run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image))
        {
            eprintln!("skipping disk_full_fails_inserts_cleanly: mkfs.ext4 failed");
            return;
        }
        // An explicit loop device, detached at the end (a plain `mount -o loop` can leave
        // it attached).
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image)
            .output()
            .unwrap();
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || !run(Command::new("mount").arg(&dev).arg(&mnt)) {
            eprintln!(
                "skipping disk_full_fails_inserts_cleanly: cannot attach or mount a loop device"
            );
            if out.status.success() {
                run(Command::new("losetup").args(["-d", &dev]));
            }
            return;
        }
        let result = std::panic::AssertUnwindSafe(scenario(engine, &mnt));
        let outcome = futures::FutureExt::catch_unwind(result).await;
        run(Command::new("umount").arg(&mnt));
        run(Command::new("losetup").args(["-d", &dev]));
        if let Err(p) = outcome {
            std::panic::resume_unwind(p);
        }
    }
}

async fn scenario(engine: sluice_cache_engine::EngineKind, mnt: &std::path::Path) {
    let dir = mnt.join("cache");
    // The quota (1 GiB) is far above the filesystem's ~20 MiB.
    let cache = open(small(&dir, engine, 0));
    let mut stored = Vec::new();
    let mut err = None;
    for i in 0..2000u64 {
        match cache.insert(key(i), value(i, 0, 64 << 10)).await {
            Ok(()) => stored.push(i),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("the filesystem never filled up");
    let text = err.to_string();
    match &err {
        InsertError::Io { path, source } => {
            assert_eq!(path, &dir, "{engine:?}: {text}");
            assert_eq!(
                source.raw_os_error(),
                Some(libc::ENOSPC),
                "{engine:?}: {text}"
            );
        }
        other => panic!("{engine:?}: unexpected error {other}"),
    }
    assert!(
        text.contains(&dir.display().to_string()) && text.to_lowercase().contains("space"),
        "{text}"
    );
    assert!(cache.stats().insert_failures >= 1);
    // Further inserts keep failing cleanly; reads keep working.
    assert!(cache.insert(key(99_999), value(1, 1, 1000)).await.is_err());
    let mut read = 0;
    for &i in &stored {
        if let Some(v) = cache.get(&key(i)).await {
            assert_eq!(v, value(i, 0, 64 << 10), "{engine:?}: block {i}");
            read += 1;
        }
    }
    assert_eq!(
        read,
        stored.len(),
        "{engine:?}: every stored block still reads"
    );
    assert_eq!(cache.stats().checksum_failures, 0);
    drop(cache);
}
