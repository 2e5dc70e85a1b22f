//! Reading S3 directly, without a cache: boto3 with a thread pool, or s3torchconnector, each
//! job a Python process running `s3_reader.py` with the same parallelism as the other readers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde_json::json;

use super::Store;
use crate::workload::Epoch;

const SCRIPT: &str = include_str!("s3_reader.py");

/// Which Python S3 client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Boto3,
    S3TorchConnector,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Boto3 => "boto3",
            Client::S3TorchConnector => "s3torchconnector",
        }
    }

    /// The installed version, or why the client cannot run.
    pub fn check(self) -> anyhow::Result<String> {
        let module = self.name();
        let out = Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import importlib.metadata as m; import {module}; print(m.version('{module}'))"
                ),
            ])
            .output()
            .context("running python3")?;
        if !out.status.success() {
            let hint = match self {
                Client::Boto3 => "pip install boto3",
                Client::S3TorchConnector => {
                    "pip install s3torchconnector (pulls PyTorch, about 5 GB)"
                }
            };
            bail!(
                "python3 cannot import {module}: {hint}\n{}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// What one reader process reports.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
pub struct Report {
    pub files: usize,
    pub bytes: u64,
    pub secs: f64,
    pub p99_ms: f64,
    pub errors: usize,
    pub cpu_s: f64,
    pub maxrss_kb: u64,
}

impl Report {
    pub fn epoch(&self) -> Epoch {
        Epoch {
            files: self.files,
            bytes: self.bytes,
            secs: self.secs,
            p99_ms: self.p99_ms,
            errors: self.errors,
        }
    }
}

/// One reader job, started but not yet waited for: several run at once for the shared case.
pub struct Job {
    child: std::process::Child,
    _config: PathBuf,
}

/// Starts a job reading `keys` (relative to the store's prefix). `sequential` streams the
/// single key in 1 MiB reads; otherwise `threads` workers each read whole objects.
pub fn start(
    client: Client,
    store: &Store,
    work: &Path,
    tag: &str,
    keys: &[String],
    threads: usize,
    sequential: bool,
) -> anyhow::Result<Job> {
    std::fs::create_dir_all(work)?;
    let script = work.join("s3_reader.py");
    std::fs::write(&script, SCRIPT)?;
    let config = work.join(format!("job-{tag}.json"));
    let cfg = json!({
        "endpoint": store.endpoint,
        "bucket": store.bucket,
        "keys": keys.iter().map(|k| format!("{}/{k}", store.prefix)).collect::<Vec<_>>(),
        "threads": threads,
        "client": client.name(),
        "mode": if sequential { "seq" } else { "files" },
        "access_key": crate::seaweed::ACCESS_KEY,
        "secret_key": crate::seaweed::SECRET_KEY,
    });
    std::fs::write(&config, serde_json::to_vec(&cfg)?)?;
    let child = Command::new("python3")
        .arg(&script)
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting python3")?;
    Ok(Job {
        child,
        _config: config,
    })
}

impl Job {
    pub fn wait(self) -> anyhow::Result<Report> {
        let out = self.child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout.lines().last().map(serde_json::from_str::<Report>) {
            Some(Ok(r)) if out.status.success() => Ok(r),
            _ => bail!(
                "S3 reader failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }
}
