//! Runs a real `sluice agent` for benchmarks: writes its config, starts the release binary,
//! waits for the mount, measures its RSS, and stops it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running agent serving one dataset.
pub struct Agent {
    child: Child,
    pub mount: PathBuf,
}

/// What the benchmark's agent serves and with how much cache.
pub struct AgentSetup<'a> {
    pub work: &'a Path,
    pub dataset: &'a str,
    /// `mountPoint` of the dataset's single mount, and its `options` as YAML flow pairs.
    pub mount_point: String,
    pub options: String,
    pub memory: u64,
    pub disk: u64,
}

/// Builds the release `sluice` binary once.
pub fn build() -> anyhow::Result<PathBuf> {
    crate::tasks::run(Command::new("cargo").args(["build", "--release", "-p", "sluice"]))?;
    Ok(crate::tasks::root().join("target/release/sluice"))
}

impl Agent {
    pub fn start(bin: &Path, setup: &AgentSetup) -> anyhow::Result<Agent> {
        Self::start_with_cache(bin, setup, "")
    }

    /// Like [`Agent::start`], with the Dataset's `spec.cache` as a YAML flow mapping
    /// (e.g. `{ policy: epoch, quota: 1073741824 }`); empty for the default.
    pub fn start_with_cache(bin: &Path, setup: &AgentSetup, cache: &str) -> anyhow::Result<Agent> {
        let work = setup.work;
        for d in ["mnt", "state", "cache"] {
            std::fs::create_dir_all(work.join(d))?;
        }
        let config = format!(
            r#"agent:
  mountRoot: {work}/mnt
  stateDir: {work}/state
  adminSocket: {work}/admin.sock
  metricsAddr: 127.0.0.1:{metrics}
  cache:
    memory: {memory}
    disks: [{{ path: {work}/cache, capacity: {disk} }}]
---
apiVersion: sluice.io/v1alpha1
kind: Dataset
metadata: {{ name: {dataset} }}
spec:
{cache}  mounts:
    - mountPoint: {mount_point}
      name: data
      options: {{ {options} }}
{secrets}"#,
            work = work.display(),
            metrics = crate::seaweed::free_port(),
            memory = setup.memory,
            disk = setup.disk,
            dataset = setup.dataset,
            mount_point = setup.mount_point,
            options = setup.options,
            // Only object stores take credentials (a file:// mount refuses them).
            secrets = if setup.mount_point.starts_with("s3://") {
                "      secretRefs:\n        - { key: accessKeyId, env: SLUICE_BENCH_AK }\n        - { key: secretAccessKey, env: SLUICE_BENCH_SK }\n"
            } else {
                ""
            },
            cache = if cache.is_empty() {
                String::new()
            } else {
                format!("  cache: {cache}\n")
            },
        );
        let config_path = work.join("sluice.yaml");
        std::fs::write(&config_path, config)?;
        let log = std::fs::File::create(work.join("agent.log"))?;
        let child = Command::new(bin)
            .args(["agent", "--config"])
            .arg(&config_path)
            .env("SLUICE_BENCH_AK", crate::seaweed::ACCESS_KEY)
            .env("SLUICE_BENCH_SK", crate::seaweed::SECRET_KEY)
            .env("SLUICE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting sluice agent")?;
        let mut agent = Agent {
            child,
            mount: work.join("mnt").join(setup.dataset).join("data"),
        };
        agent.wait_ready(work)?;
        Ok(agent)
    }

    fn wait_ready(&mut self, work: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if std::fs::read_dir(&self.mount)
                .map(|mut d| d.next().is_some())
                .unwrap_or(false)
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "sluice agent exited with {status}; see {}",
                    work.join("agent.log").display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not appear within 600s; see {}",
                    self.mount.display(),
                    work.join("agent.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's process id (for CPU-time and peak-RSS figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size of the agent process, in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// Stops the agent with SIGTERM (it unmounts) and waits for it.
    pub fn stop(mut self) {
        // SAFETY: kill with a pid we spawned and still own (not yet waited for).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // A killed agent may leave its mount behind; detach it so the next run can mount.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.mount.parent().unwrap_or(&self.mount))
            .stderr(Stdio::null())
            .status();
    }
}
