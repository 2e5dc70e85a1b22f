//! The README's two commands: `cargo xtask demo` and `cargo xtask test`.
//!
//! Both install what they need first (`.ci/install-deps`: apt and pip packages), so they
//! work on a fresh Debian 12 machine with only Rust present.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a command in the workspace root and fails with its name if it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .current_dir(root())
        .status()
        .with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// Installs the apt/pip packages the tests, demo and benchmarks use.
pub fn install_deps() -> anyhow::Result<()> {
    run(Command::new("bash").arg(".ci/install-deps"))
}

/// `cargo xtask demo`: builds the agent and runs `sluice demo` (needs root for FUSE).
pub fn demo() -> anyhow::Result<()> {
    install_deps()?;
    run(Command::new("cargo").args(["build", "--release", "-p", "sluice"]))?;
    let bin = root().join("target/release/sluice");
    if is_root() {
        run(Command::new(&bin).arg("demo"))
    } else {
        eprintln!("xtask: the demo mounts FUSE, which needs root: running it with sudo");
        run(Command::new("sudo").arg(&bin).arg("demo"))
    }
}

/// `cargo xtask test`: every test of the workspace, with FUSE and eBPF tests for real when
/// run as root (they skip with a reason otherwise).
pub fn test(extra: &[String]) -> anyhow::Result<()> {
    install_deps()?;
    if !is_root() {
        eprintln!(
            "xtask: not root: FUSE, eBPF and fault-injection tests will skip (CI runs them as root)"
        );
    }
    let mut cargo = Command::new("cargo");
    if is_root() {
        // As root everything can run: a test that would skip fails instead (CI runs as root).
        cargo.env("SLUICE_TEST_STRICT", "1");
    }
    run(cargo
        .args([
            "test",
            "--workspace",
            "--exclude",
            "xtask",
            "--no-fail-fast",
        ])
        .args(extra))
}
