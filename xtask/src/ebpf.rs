//! `cargo xtask build-ebpf`: compile `ebpf-probes/bpf/*.bpf.c` with clang into the committed
//! `*.bpf.o` objects and write `objects.stamp`, the sha256 of every source and object.
//!
//! The stamp lets `cargo test -p sluice-ebpf-probes` notice a source edited without a
//! rebuild, while `cargo build` itself never needs clang.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Name of the stamp file written next to the objects.
const STAMP: &str = "objects.stamp";

/// Compile every BPF program and rewrite the stamp.
pub fn build() -> anyhow::Result<()> {
    let dir = bpf_dir();
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    let sources = files_with_suffix(&dir, &[".bpf.c"])?;
    if sources.is_empty() {
        bail!("no *.bpf.c under {}", dir.display());
    }
    for src in &sources {
        let obj = src.with_extension("o");
        let mut cmd = Command::new(&clang);
        cmd.current_dir(&dir)
            .args(["-O2", "-g", "-target", "bpf", "-Wall"])
            .arg(format!("-D__TARGET_ARCH_{}", target_arch()))
            .arg("-I.");
        // <linux/bpf.h> needs <asm/types.h>, which Debian keeps under the multiarch dir.
        let multiarch = PathBuf::from(format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH));
        if multiarch.is_dir() {
            cmd.arg("-I").arg(&multiarch);
        }
        cmd.arg("-c").arg(src).arg("-o").arg(&obj);
        let status = cmd
            .status()
            .with_context(|| format!("running {clang} (install clang, or set CLANG=clang-19)"))?;
        if !status.success() {
            bail!("{clang} failed on {}", src.display());
        }
        // Drop DWARF but keep BTF (.BTF/.BTF.ext): the loader needs BTF for CO-RE, and the
        // committed objects stay small and reproducible.
        let strip = Command::new("llvm-strip").arg("-g").arg(&obj).status();
        if !matches!(strip, Ok(s) if s.success()) {
            eprintln!(
                "llvm-strip not found or failed: keeping {} with DWARF",
                obj.display()
            );
        }
        println!("built {}", obj.display());
    }
    write_stamp(&dir)
}

fn bpf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf-probes/bpf")
}

fn target_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        "riscv64" => "riscv",
        _ => "x86",
    }
}

fn files_with_suffix(dir: &Path, suffixes: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if suffixes.iter().any(|s| name.ends_with(s)) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// `sha256sum` format, one line per file, sources then objects, names relative to `bpf/`.
/// The unit test in ebpf-probes (`stamp::tests`) recomputes exactly this.
fn write_stamp(dir: &Path) -> anyhow::Result<()> {
    let mut names = Vec::new();
    for path in files_with_suffix(dir, &[".c", ".h"])?
        .into_iter()
        .chain(files_with_suffix(dir, &[".bpf.o"])?)
    {
        names.push(
            path.file_name()
                .and_then(|n| n.to_str())
                .context("non-UTF-8 name")?
                .to_owned(),
        );
    }
    let out = Command::new("sha256sum")
        .current_dir(dir)
        .args(&names)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::write(dir.join(STAMP), &out.stdout)?;
    println!("wrote {}", dir.join(STAMP).display());
    Ok(())
}

/// Run ebpf-probes' kernel tests in qemu on Debian's 6.1 and 6.12 cloud kernels
/// (`vm-tests/run.sh`; `versions` empty means both).
pub fn vm_test(versions: &[String]) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vm-tests/run.sh");
    let status = Command::new("sh")
        .arg(&script)
        .args(versions)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        bail!("VM tests failed ({status}); consoles are in vm-tests/.cache/console-*.log");
    }
    Ok(())
}
