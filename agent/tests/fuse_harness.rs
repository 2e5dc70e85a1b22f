//! Shared by the FUSE, restart and CLI tests: a generated local dataset, a `sluice agent`
//! child on it with its own mount root, state dir and admin socket, torn down on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Why FUSE tests cannot run here, if they cannot.
/// Under `SLUICE_TEST_STRICT` (set by `cargo xtask test` as root, so in CI) a test that
/// cannot run fails instead of skipping: CI must not pass by skipping.
pub fn skip_reason() -> Option<String> {
    let why = if !nix::unistd::geteuid().is_root() {
        "not root: FUSE mounts need root"
    } else if !Path::new("/dev/fuse").exists() {
        "/dev/fuse is missing"
    } else {
        return None;
    };
    assert!(
        std::env::var_os("SLUICE_TEST_STRICT").is_none(),
        "cannot run under SLUICE_TEST_STRICT: {why}"
    );
    Some(why.into())
}

/// Skips the test (returns) with a printed reason when FUSE is unavailable.
#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(why) = harness::skip_reason() {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

/// xorshift64* for deterministic test data.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// A test's dataset and agent.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub agents: Vec<Child>,
    /// Agents started so far; agent n logs to `agent-n.log`.
    pub started: usize,
    /// Relative paths (under the dataset's `m` mount) of the generated files.
    pub files: Vec<String>,
}

impl Env {
    /// A dataset `ds` with one mount `m` over a generated directory: `small` files of 1-300
    /// KiB in 10 directories, plus files of the given large sizes.
    pub fn new(small: usize, large: &[usize], block_size: &str) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("sluice-test-")
            .tempdir()
            .unwrap();
        let data = dir.path().join("data");
        let mut rng = Rng(0x1234_5678 ^ small as u64);
        let mut files = Vec::new();
        for i in 0..small {
            let rel = format!("class{:02}/img_{i:04}.jpg", i % 10);
            let size = 1024 + (rng.next_u64() % (300 << 10)) as usize;
            std::fs::create_dir_all(data.join(&rel).parent().unwrap()).unwrap();
            std::fs::write(data.join(&rel), rng.bytes(size)).unwrap();
            files.push(rel);
        }
        for (i, &size) in large.iter().enumerate() {
            let rel = format!("shards/shard-{i:03}.tar");
            std::fs::create_dir_all(data.join("shards")).unwrap();
            std::fs::write(data.join(&rel), rng.bytes(size)).unwrap();
            files.push(rel);
        }
        std::fs::write(data.join("empty"), b"").unwrap();
        files.push("empty".into());
        let d = dir.path();
        std::fs::write(
            d.join("sluice.yaml"),
            format!(
                "agent:\n  mountRoot: {}\n  stateDir: {}\n  adminSocket: {}\n  metricsAddr: \"\"\n  blockSize: {block_size}\n  cache:\n    memory: 256MiB\n---\napiVersion: sluice.io/v1alpha1\nkind: Dataset\nmetadata: {{ name: ds }}\nspec:\n  mounts:\n    - {{ mountPoint: \"file://{}\", name: m }}\n",
                d.join("mnt").display(),
                d.join("state").display(),
                d.join("admin.sock").display(),
                data.display()
            ),
        )
        .unwrap();
        Env {
            dir,
            agents: Vec::new(),
            started: 0,
            files,
        }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("sluice.yaml")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }
    /// The dataset's mount point.
    pub fn mount(&self) -> PathBuf {
        self.dir.path().join("mnt").join("ds")
    }
    /// A file as served through FUSE.
    pub fn served(&self, rel: &str) -> PathBuf {
        self.mount().join("m").join(rel)
    }
    /// The same file in the source directory.
    pub fn source(&self, rel: &str) -> PathBuf {
        self.dir.path().join("data").join(rel)
    }

    /// Serves mount `m` from `url` (an `s3://bucket/prefix`) on `endpoint` instead of the
    /// generated directory, the keys given as secret files.
    pub fn use_s3(&self, url: &str, endpoint: &str, access_key: &str, secret_key: &str) {
        let d = self.dir.path();
        std::fs::write(d.join("ak"), access_key).unwrap();
        std::fs::write(d.join("sk"), secret_key).unwrap();
        let config = std::fs::read_to_string(self.config()).unwrap();
        let file_mount = config.lines().last().unwrap().to_string();
        let s3_mount = format!(
            "    - mountPoint: {url}\n      name: m\n      options: {{ endpoint: \"{endpoint}\", region: us-east-1 }}\n      secretRefs:\n        - {{ key: accessKeyId, file: {} }}\n        - {{ key: secretAccessKey, file: {} }}",
            d.join("ak").display(),
            d.join("sk").display()
        );
        std::fs::write(self.config(), config.replace(&file_mount, &s3_mount)).unwrap();
    }

    /// Exposes metrics on `127.0.0.1:metrics_port` and adds `settings` (YAML lines indented
    /// by two spaces) to the `agent` section.
    pub fn agent_settings(&self, metrics_port: u16, settings: &str) {
        let config = std::fs::read_to_string(self.config())
            .unwrap()
            .replace(
                "  metricsAddr: \"\"\n",
                &format!("  metricsAddr: 127.0.0.1:{metrics_port}\n"),
            )
            .replacen("agent:\n", &format!("agent:\n{settings}"), 1);
        std::fs::write(self.config(), config).unwrap();
    }

    /// Starts `sluice agent` and waits until its admin API answers.
    pub fn start_agent(&mut self) -> &mut Child {
        let n = self.started;
        self.started += 1;
        let log = std::fs::File::create(self.dir.path().join(format!("agent-{n}.log"))).unwrap();
        let child = Command::new(BIN)
            .args(["agent", "--config"])
            .arg(self.config())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agents.push(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.status().is_none() {
            if let Ok(Some(st)) = self.agents.last_mut().unwrap().try_wait() {
                panic!("agent exited with {st}:\n{}", self.log(n));
            }
            assert!(
                Instant::now() < deadline,
                "agent not ready in 30 s:\n{}",
                self.log(n)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.agents.last_mut().unwrap()
    }

    pub fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("agent-{n}.log"))).unwrap_or_default()
    }

    /// The admin API's status answer, if an agent answers.
    pub fn status(&self) -> Option<serde_json::Value> {
        let conn = UnixStream::connect(self.socket()).ok()?;
        (&conn).write_all(b"{\"op\":\"status\"}\n").ok()?;
        let mut line = String::new();
        BufReader::new(conn).read_line(&mut line).ok()?;
        let v: serde_json::Value = serde_json::from_str(&line).ok()?;
        Some(v["status"].clone())
    }

    /// SIGKILLs the latest agent (no cleanup runs).
    pub fn kill_agent(&mut self) {
        let mut child = self.agents.pop().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        // The killed agent's socket file stays behind; the next agent replaces it.
    }

    /// SIGTERMs the latest agent and waits for it to exit.
    pub fn stop_agent(&mut self) -> std::process::ExitStatus {
        let mut child = self.agents.pop().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        child.wait().unwrap()
    }

    /// Stops the fd keeper (as if it crashed too).
    pub fn stop_fd_keeper(&self) {
        if let Ok(conn) = UnixStream::connect(self.dir.path().join("state").join("fdstore.sock")) {
            let _ = (&conn).write_all(b"EXIT\n");
            let mut s = String::new();
            let _ = BufReader::new(conn).read_line(&mut s);
        }
    }

    /// Runs the `sluice` CLI with args; returns (success, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(BIN).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        while !self.agents.is_empty() {
            self.stop_agent();
        }
        self.stop_fd_keeper();
        let _ = nix::mount::umount2(&self.mount(), nix::mount::MntFlags::MNT_DETACH);
    }
}
