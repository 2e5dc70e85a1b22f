//! `rclone mount` with the full VFS cache (Debian package `rclone`), s3 backend on SeaweedFS.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use super::{Budget, Mounted, Store, mib};

pub fn version() -> String {
    super::version("rclone", &["version"])
}

/// Mounts the dataset's prefix with a fresh cache of the budget's size.
pub fn mount(store: &Store, dir: &Path, budget: Budget) -> anyhow::Result<Mounted> {
    let bin = crate::seaweed::which("rclone")
        .context("`rclone` not found: apt-get install rclone (.ci/install-deps installs it)")?;
    super::clear(dir)?;
    let (mnt, cache) = (dir.join("mnt"), dir.join("cache"));
    std::fs::create_dir_all(&cache)?;
    // Per open file read-ahead: the memory budget shared by the readers.
    let buffer = mib(budget.memory / budget.readers as u64);
    let mut cmd = Command::new(bin);
    // The endpoint is plain HTTP; a CA bundle from the environment makes rclone's S3 backend
    // refuse to start ("unable to load custom CA bundle").
    cmd.env_remove("AWS_CA_BUNDLE")
        .env("RCLONE_CONFIG_BENCH_TYPE", "s3")
        .env("RCLONE_CONFIG_BENCH_PROVIDER", "Other")
        .env("RCLONE_CONFIG_BENCH_ENDPOINT", &store.endpoint)
        .env(
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID",
            crate::seaweed::ACCESS_KEY,
        )
        .env(
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY",
            crate::seaweed::SECRET_KEY,
        )
        .env("RCLONE_CONFIG_BENCH_REGION", "us-east-1")
        .env("RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE", "true")
        .arg("mount")
        .arg(format!("bench:{}/{}", store.bucket, store.prefix))
        .arg(&mnt)
        .args([
            "--read-only",
            "--vfs-cache-mode",
            "full",
            "--dir-cache-time",
            "1h",
            "--log-level",
            "NOTICE",
        ])
        .arg("--cache-dir")
        .arg(&cache)
        .arg(format!("--vfs-cache-max-size={}M", mib(budget.disk)))
        .arg("--vfs-cache-poll-interval=5s")
        .arg(format!("--buffer-size={buffer}M"));
    let settings = format!(
        "rclone mount --vfs-cache-mode full --vfs-cache-max-size={}M --vfs-cache-poll-interval=5s --buffer-size={buffer}M --dir-cache-time 1h --read-only",
        mib(budget.disk)
    );
    Mounted::spawn(cmd, &mnt, mnt.clone(), &dir.join("rclone.log"), settings)
}
