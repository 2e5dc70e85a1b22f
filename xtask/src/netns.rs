//! A remote-like object store link for benchmarks: a network namespace joined to the host by
//! a veth pair, shaped with `tc tbf`, whose byte counters tell how much each system fetched.
//!
//! Addresses are the project's own (10.231.0.1 on the host side, 10.231.0.2 inside), so the
//! benchmark never talks to any other host. Everything is removed on drop, also on error.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The host side's address; the namespace side is [`Link::REMOTE_IP`].
pub const HOST_IP: &str = "10.231.0.1";

/// A veth pair into a fresh network namespace, bandwidth-limited both ways.
pub struct Link {
    pub ns: String,
    /// The host side of the veth pair: its rx counter is what came from the object store.
    pub host_if: String,
}

/// Bytes through the host side of the link.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    /// From the object store to the node.
    pub rx: u64,
    /// From the node to the object store (requests, uploads).
    pub tx: u64,
}

impl Counters {
    pub fn since(self, before: Counters) -> Counters {
        Counters {
            rx: self.rx.saturating_sub(before.rx),
            tx: self.tx.saturating_sub(before.tx),
        }
    }
}

impl Link {
    pub const REMOTE_IP: &'static str = "10.231.0.2";

    /// Creates the namespace and the shaped veth pair (root only).
    pub fn create(rate_mbit: u32) -> anyhow::Result<Link> {
        remove_stale();
        let id = std::process::id();
        let link = Link {
            ns: format!("sluice-bench-{id}"),
            host_if: format!("slb{id}h"),
        };
        let peer = format!("slb{id}n");
        // Built before the first command so that Drop cleans up whatever was made.
        ip(&["netns", "add", &link.ns])
            .context("creating a network namespace (the peers benchmark needs root)")?;
        ip(&[
            "link",
            "add",
            &link.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ])?;
        ip(&["link", "set", &peer, "netns", &link.ns])?;
        ip(&[
            "addr",
            "add",
            &format!("{HOST_IP}/30"),
            "dev",
            &link.host_if,
        ])?;
        ip(&["link", "set", &link.host_if, "up"])?;
        ip(&[
            "-n",
            &link.ns,
            "addr",
            "add",
            &format!("{}/30", Self::REMOTE_IP),
            "dev",
            &peer,
        ])?;
        ip(&["-n", &link.ns, "link", "set", &peer, "up"])?;
        ip(&["-n", &link.ns, "link", "set", "lo", "up"])?;
        // Shape both directions: downloads leave the namespace's side, uploads the host's.
        let tbf = |dev: &str, netns: Option<&str>| -> anyhow::Result<()> {
            let mut cmd = Command::new("tc");
            if let Some(n) = netns {
                cmd = Command::new("ip");
                cmd.args(["netns", "exec", n, "tc"]);
            }
            cmd.args(["qdisc", "add", "dev", dev, "root", "tbf"])
                .arg("rate")
                .arg(format!("{rate_mbit}mbit"))
                .args(["burst", "1mb", "latency", "100ms"]);
            run(&mut cmd)
        };
        tbf(&link.host_if, None)?;
        tbf(&peer, Some(&link.ns))?;
        Ok(link)
    }

    pub fn counters(&self) -> Counters {
        let read = |name: &str| {
            std::fs::read_to_string(format!("/sys/class/net/{}/statistics/{name}", self.host_if))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        Counters {
            rx: read("rx_bytes"),
            tx: read("tx_bytes"),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes both; then the namespace goes.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes namespaces left by benchmark runs that were killed (their pid is gone), with
/// their veth pairs.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if let Some(pid) = name.strip_prefix("sluice-bench-")
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = Command::new("ip")
                .args(["netns", "del", name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    run(Command::new("ip").args(args))
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
