//! `cargo xtask bench <what> [--quick] [--json FILE]`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

#[derive(Args)]
pub struct BenchArgs {
    /// Which benchmark to run.
    pub what: Which,
    /// A small run that finishes in a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Which {
    /// The cache engine against fio and foyer.
    Engine,
    /// Random-order epochs through Sluice against local disk and direct S3 reads.
    Epoch,
    /// Sluice against JuiceFS, rclone, s3fs, direct S3 and local disk, over a shaped link.
    Peers,
    /// What the eBPF stall probes cost: fio page-cache reads and a warm epoch, on vs off.
    Probes,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        Which::Engine => crate::bench_engine::run(&args),
        Which::Epoch => crate::bench_epoch::run(&args),
        Which::Peers => crate::bench_peers::run(&args),
        Which::Probes => crate::bench_probes::run(&args),
    }
}
