//! The systems `cargo xtask bench peers` compares, one module each. A FUSE peer is started
//! as a [`Mounted`] daemon; the direct S3 readers run as a Python process per job.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub mod juicefs;
pub mod rclone;
pub mod s3direct;
pub mod s3fs;
pub mod sluice;

/// Where the object store is, as every peer sees it (through the shaped link).
pub struct Store {
    pub endpoint: String,
    pub bucket: String,
    /// Prefix of the dataset's objects (the dataset's relative paths follow it).
    pub prefix: String,
}

/// The cache every peer gets in one workload: the same numbers for all.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Budget {
    /// In-process memory for buffers or a memory tier, bytes.
    pub memory: u64,
    /// Local disk cache, bytes.
    pub disk: u64,
    /// Reader threads per job.
    pub readers: usize,
}

/// A FUSE daemon serving the dataset, unmounted and stopped on drop.
pub struct Mounted {
    /// Where the dataset's relative paths resolve.
    pub root: PathBuf,
    mountpoint: PathBuf,
    daemon: Daemon,
    /// The command line or configuration used, for the record.
    pub settings: String,
    /// Loop-mounted filesystems holding a capped cache (s3fs), unmounted after the daemon.
    pub cache_fs: Option<CacheFs>,
}

enum Daemon {
    Child(Child),
    Agent(crate::agent::Agent),
    Gone,
}

impl Mounted {
    /// Starts `cmd` (a foreground FUSE daemon) and waits until `mountpoint` lists entries.
    pub fn spawn(
        mut cmd: Command,
        mountpoint: &Path,
        root: PathBuf,
        log: &Path,
        settings: String,
    ) -> anyhow::Result<Mounted> {
        std::fs::create_dir_all(mountpoint)?;
        let log_file = std::fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => bail!("starting {:?}: {e}", cmd.get_program()),
        };
        let mut m = Mounted {
            root,
            mountpoint: mountpoint.to_path_buf(),
            daemon: Daemon::Child(child),
            settings,
            cache_fs: None,
        };
        m.wait_ready(log)?;
        Ok(m)
    }

    pub fn agent(agent: crate::agent::Agent, settings: String) -> Mounted {
        let mountpoint = agent.mount.clone();
        Mounted {
            root: agent.mount.clone(),
            mountpoint,
            daemon: Daemon::Agent(agent),
            settings,
            cache_fs: None,
        }
    }

    fn wait_ready(&mut self, log: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if is_mounted(&self.mountpoint)
                && std::fs::read_dir(&self.root)
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(false)
            {
                return Ok(());
            }
            if let Daemon::Child(c) = &mut self.daemon
                && let Some(status) = c.try_wait()?
            {
                bail!(
                    "the daemon for {} exited with {status} before mounting; {}",
                    self.mountpoint.display(),
                    log_tail(log)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} was not mounted within 120s; {}",
                    self.root.display(),
                    log_tail(log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The daemon and every process it started.
    pub fn pids(&self) -> Vec<u32> {
        match &self.daemon {
            Daemon::Child(c) => process_tree(c.id()),
            Daemon::Agent(a) => process_tree(a.pid()),
            Daemon::Gone => Vec::new(),
        }
    }

    /// Unmounts and stops the daemon, waiting for it to exit.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        match std::mem::replace(&mut self.daemon, Daemon::Gone) {
            Daemon::Agent(a) => a.stop(),
            Daemon::Child(mut c) => {
                let _ = Command::new("umount")
                    .arg(&self.mountpoint)
                    .stderr(Stdio::null())
                    .status();
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline && !matches!(c.try_wait(), Ok(Some(_))) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let _ = c.kill();
                let _ = c.wait();
                if is_mounted(&self.mountpoint) {
                    let _ = Command::new("umount")
                        .arg("-l")
                        .arg(&self.mountpoint)
                        .stderr(Stdio::null())
                        .status();
                }
            }
            Daemon::Gone => {}
        }
        self.cache_fs = None;
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A loop-mounted ext4 image of a fixed size: a hard cap on a cache that has no size knob.
pub struct CacheFs {
    pub dir: PathBuf,
}

impl CacheFs {
    pub fn create(image: &Path, dir: &Path, bytes: u64) -> anyhow::Result<CacheFs> {
        let _ = std::fs::remove_file(image);
        std::fs::create_dir_all(dir)?;
        std::fs::File::create(image)?.set_len(bytes)?;
        quiet(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
                .arg(image),
        )?;
        quiet(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(image)
                .arg(dir),
        )?;
        Ok(CacheFs {
            dir: dir.to_path_buf(),
        })
    }

    /// Bytes free on the filesystem now.
    pub fn free(&self) -> anyhow::Result<u64> {
        let path = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes())?;
        // SAFETY: statvfs writes into the zeroed struct we own; path is NUL-terminated.
        let st = unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            if libc::statvfs(path.as_ptr(), &mut st) != 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("statvfs {}", self.dir.display()));
            }
            st
        };
        Ok(st.f_bavail as u64 * st.f_frsize as u64)
    }
}

impl Drop for CacheFs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs a setup command, keeping its output unless it fails.
pub fn quiet(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The last lines of a daemon's log, to put in an error.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "{} ends with:\n{}",
        log.display(),
        lines[lines.len().saturating_sub(5)..].join("\n")
    )
}

/// Empties a peer's work folder, first detaching whatever a crashed run left mounted in it.
pub fn clear(dir: &Path) -> anyhow::Result<()> {
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        let prefix = format!("{}/", dir.display());
        let mut stale: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        // Deepest first, so a mount inside another comes off before its parent.
        stale.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in stale {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(m)
                .stderr(Stdio::null())
                .status();
        }
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// Whether something is mounted at `path` right now.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&want))
}

/// `pid` and all its live descendants.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(stat) = proc_stat(p) {
                parents.push((p, stat.ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

struct ProcStat {
    ppid: u32,
    /// utime + stime + cutime + cstime, in seconds.
    cpu_s: f64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is field 3.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Some(ProcStat {
        ppid: num(1) as u32,
        cpu_s: (num(11) + num(12) + num(13) + num(14)) / tick,
    })
}

/// CPU seconds used so far by these processes (and their reaped children).
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|p| proc_stat(*p))
        .map(|s| s.cpu_s)
        .sum()
}

/// Peak resident set size (VmHWM) of these processes, summed, in bytes.
pub fn peak_rss(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024)
        })
        .sum()
}

/// CPU seconds this process has used (user + system), for in-process readers.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The first line of `program --version`-like output, for the record.
pub fn version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// MiB, rounded down, at least 1 (for peers whose flags take MiB).
pub fn mib(bytes: u64) -> u64 {
    (bytes >> 20).max(1)
}
