//! `cargo xtask …`: build the eBPF objects, run the demo, benchmarks and VM tests.
//!
//! Each subcommand lives in its own module; this file only parses and dispatches.

use clap::{Parser, Subcommand};

mod agent;
mod bench;
mod bench_engine;
mod bench_epoch;
mod bench_peers;
mod bench_probes;
mod ebpf;
mod netns;
mod peers;
mod plot;
mod seaweed;
mod tasks;
mod workload;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Sluice's developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks: results as ratios against a named peer or limit, measured in one run.
    Bench(bench::BenchArgs),
    /// Compile ebpf-probes/bpf/*.bpf.c with clang and refresh the committed objects' stamp.
    BuildEbpf,
    /// Run the eBPF probes' kernel tests in qemu on Debian's 6.1 and 6.12 cloud kernels.
    VmTest {
        /// Kernel versions to boot (default: 6.1 6.12).
        versions: Vec<String>,
    },
    /// The README's first command: a local dataset read cold and warm through a Sluice mount.
    Demo,
    /// The README's second command: installs what the tests need, then runs them all.
    Test {
        /// Passed on to `cargo test` (e.g. a test name filter after `--`).
        #[arg(trailing_var_arg = true)]
        extra: Vec<String>,
    },
    /// `bench probes`' reader process: preads FILE and prints ns per read.
    #[command(hide = true)]
    PreadLoop { file: std::path::PathBuf },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::BuildEbpf => ebpf::build(),
        Command::VmTest { versions } => ebpf::vm_test(&versions),
        Command::Demo => tasks::demo(),
        Command::Test { extra } => tasks::test(&extra),
        Command::PreadLoop { file } => bench_probes::pread_loop(&file),
    }
}
