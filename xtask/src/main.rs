//! `cargo xtask …`: build the eBPF objects, run the demo, benchmarks and VM tests.
//!
//! Each subcommand lives in its own module; this file only parses and dispatches.

use clap::{Parser, Subcommand};

mod bench;

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
    }
}
