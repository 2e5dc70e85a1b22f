//! `sluice`: the node agent and its command line.

mod admin;
mod alloc;
mod cli;
mod control;
mod daemon;
mod demo;
mod fuse;
mod meta;
mod metrics;
mod observe;
mod signal;

use clap::Parser;
use cli::{Cli, Command};

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Client libraries log URLs and headers the agent cannot scrub where they are made.
        .with_writer(sluice::secret::RedactingWriter::new(std::io::stderr))
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Agent { config } => {
            init_logs();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(daemon::run(&config))
        }
        Command::Load {
            target,
            metadata_only,
            agent,
        } => cli::load::run(&agent, &target, metadata_only),
        Command::Status { json, agent } => cli::status::run(&agent, json),
        Command::Stalls { json, watch, agent } => cli::stalls::run(&agent, json, watch),
        Command::Demo { files } => demo::run(files),
        Command::Fdstore { socket } => Ok(fuse::fdstore::run_keeper(&socket)?),
    }
}
