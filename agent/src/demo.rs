//! `sluice demo`: no cloud account needed. Makes a small ImageNet-like dataset in a temporary
//! directory, starts an agent on it (a child `sluice agent`, `file://` source), reads one
//! cold and one warm epoch through the FUSE mount (random order, 8 threads), prints both
//! rates and the status table, and cleans up.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cli::{AgentAddr, human_bytes};

/// xorshift64*: enough randomness for sizes, contents and shuffles, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-12), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let r = self.next().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

/// Everything the demo created; removed on drop, even after an error.
struct DemoEnv {
    dir: PathBuf,
    mount: PathBuf,
    agent: Option<Child>,
}

impl Drop for DemoEnv {
    fn drop(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // In case the agent died before unmounting.
        let _ = nix::mount::umount2(&self.mount, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn generate(data: &Path, files: usize, rng: &mut Rng) -> Result<(usize, u64)> {
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..files {
        let class = data
            .join("train")
            .join(format!("n{:08}", 1_440_764 + (i % 100) as u64));
        std::fs::create_dir_all(&class)?;
        // Lognormal around 110 KiB, like ImageNet JPEGs.
        let size = ((110.0 * 1024.0) * (0.6 * rng.normal()).exp()).clamp(2048.0, (1 << 20) as f64)
            as usize;
        rng.fill(&mut buf[..size]);
        std::fs::write(class.join(format!("img_{i:05}.JPEG")), &buf[..size])?;
        total += size as u64;
    }
    let shards = data.join("shards");
    std::fs::create_dir_all(&shards)?;
    let mut f = std::fs::File::create(shards.join("shard-000000.tar"))?;
    for _ in 0..64 {
        rng.fill(&mut buf);
        f.write_all(&buf)?;
    }
    total += 64 << 20;
    Ok((files + 1, total))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            walk(&e.path(), out)?;
        } else {
            out.push(e.path());
        }
    }
    Ok(())
}

/// Reads every file once, in random order, with 8 threads; returns (bytes, seconds).
fn epoch(files: &[PathBuf], rng: &mut Rng) -> Result<(u64, f64)> {
    let mut order: Vec<usize> = (0..files.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let order = Arc::new(order);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let bytes = std::thread::scope(|s| -> Result<u64> {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (order, next) = (order.clone(), next.clone());
                s.spawn(move || -> Result<u64> {
                    let mut n = 0;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&f) = order.get(i) else { return Ok(n) };
                        n += std::fs::read(&files[f])
                            .with_context(|| format!("reading {}", files[f].display()))?
                            .len() as u64;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .sum()
    })?;
    Ok((bytes, started.elapsed().as_secs_f64()))
}

/// Runs the demo with `files` small files.
pub fn run(files: usize) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "sluice demo mounts a FUSE filesystem and needs root: run `sudo sluice demo` (or `cargo xtask demo` as root)"
        );
    }
    if !Path::new("/dev/fuse").exists() {
        bail!(
            "sluice demo needs /dev/fuse: load the module (`modprobe fuse`) or, in a container, pass --device /dev/fuse --cap-add SYS_ADMIN"
        );
    }
    let dir = std::env::temp_dir().join(format!("sluice-demo-{}", std::process::id()));
    let mut env = DemoEnv {
        mount: dir.join("mnt").join("demo"),
        dir: dir.clone(),
        agent: None,
    };
    let data = dir.join("data");
    let mut rng = Rng(0x5eed_1234_abcd_0001);

    print!(
        "making an ImageNet-like dataset ({files} files in 100 classes + one 64 MiB shard) in {} … ",
        data.display()
    );
    std::io::stdout().flush()?;
    let (n, total) = generate(&data, files, &mut rng)?;
    println!("{n} files, {}", human_bytes(total));

    let config = dir.join("sluice.yaml");
    let socket = dir.join("admin.sock");
    std::fs::write(
        &config,
        format!(
            "agent:\n  mountRoot: {mnt}\n  stateDir: {state}\n  adminSocket: {sock}\n  metricsAddr: \"\"\n  cache:\n    memory: 128MiB\n    disks: [{{ path: {cache}, capacity: 1GiB }}]\n---\napiVersion: sluice.io/v1alpha1\nkind: Dataset\nmetadata: {{ name: demo }}\nspec:\n  mounts:\n    - {{ mountPoint: \"file://{data}\", name: imagenet }}\n",
            mnt = dir.join("mnt").display(),
            state = dir.join("state").display(),
            sock = socket.display(),
            cache = dir.join("cache").display(),
            data = data.display(),
        ),
    )?;
    let log = std::fs::File::create(dir.join("agent.log"))?;
    let exe = std::env::current_exe()?;
    env.agent = Some(
        Command::new(exe)
            .arg("agent")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the agent")?,
    );
    let addr = AgentAddr {
        config: None,
        admin_socket: Some(socket),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if crate::cli::status::fetch(&addr).is_ok() {
            break;
        }
        if let Some(Ok(Some(status))) = env.agent.as_mut().map(|c| c.try_wait()) {
            let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
            bail!("the agent exited ({status}) before it was ready:\n{log}");
        }
        if Instant::now() > deadline {
            bail!(
                "the agent did not become ready in 60 s; its log is in {}",
                dir.join("agent.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("agent up, dataset mounted at {}", env.mount.display());

    let mut paths = Vec::new();
    walk(&env.mount, &mut paths).context("listing the mount")?;
    // Drop the kernel's page cache between epochs, so the warm epoch measures Sluice's
    // cache and not the kernel's.
    let drop_caches = || {
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
    };
    drop_caches();
    let (b1, s1) = epoch(&paths, &mut rng)?;
    drop_caches();
    let (b2, s2) = epoch(&paths, &mut rng)?;
    let rate = |b: u64, s: f64| {
        format!(
            "{}/s, {:.0} files/s",
            human_bytes((b as f64 / s) as u64),
            paths.len() as f64 / s
        )
    };
    println!(
        "cold epoch: {} in {s1:.2}s  ({})",
        human_bytes(b1),
        rate(b1, s1)
    );
    println!(
        "warm epoch: {} in {s2:.2}s  ({})  = {:.1}x cold",
        human_bytes(b2),
        rate(b2, s2),
        s1 / s2.max(1e-9)
    );
    println!();
    print!(
        "{}",
        crate::cli::status::table(&crate::cli::status::fetch(&addr)?)
    );
    drop(env);
    println!("cleaned up (unmounted, removed {})", dir.display());
    Ok(())
}
