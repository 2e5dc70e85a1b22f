//! The command line: `sluice agent`, `sluice load`, `sluice status`, `sluice stalls`,
//! `sluice demo`.

pub mod load;
pub mod stalls;
pub mod status;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use crate::admin::AdminRequest;

/// Sluice: datasets over object stores, cached on the node, served over FUSE.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent in the foreground.
    Agent {
        /// The configuration file (agent section and Dataset documents).
        #[arg(long, short, env = "SLUICE_CONFIG")]
        config: PathBuf,
    },
    /// Preload DATASET[/PATH] into the cache, with progress.
    Load {
        /// `dataset` or `dataset/sub/dir` or `dataset/file`.
        target: String,
        /// Only list the sources again (refresh the metadata cache).
        #[arg(long)]
        metadata_only: bool,
        #[command(flatten)]
        agent: AgentAddr,
    },
    /// Per dataset: files, bytes, cached bytes, hit ratio, bytes served by origin; per tier: usage.
    Status {
        /// Print the agent's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        agent: AgentAddr,
    },
    /// Per pod or process: wall time, time stalled on dataset reads, stall ratio, MiB/s,
    /// p50/p99 read latency, hit ratio and where it waited (needs the eBPF probes).
    Stalls {
        /// Print the agent's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
        /// Refresh every second until Ctrl-C (with --json: one JSON line per second).
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        agent: AgentAddr,
    },
    /// Make a small ImageNet-like dataset, serve it, read a cold and a warm epoch (needs root).
    Demo {
        /// Number of small files.
        #[arg(long, default_value_t = 2000)]
        files: usize,
    },
    /// The fd keeper that holds FUSE connections across agent restarts (started by the agent).
    #[command(hide = true)]
    Fdstore {
        #[arg(long)]
        socket: PathBuf,
    },
}

/// How CLI commands find the running agent.
#[derive(Debug, Clone, Args)]
pub struct AgentAddr {
    /// The agent's config file (its agent.adminSocket is used).
    #[arg(long, short, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// The agent's admin socket (overrides --config).
    #[arg(long, env = "SLUICE_ADMIN_SOCKET")]
    pub admin_socket: Option<PathBuf>,
}

impl AgentAddr {
    /// The admin socket path these options point at.
    pub fn socket(&self) -> Result<PathBuf> {
        if let Some(s) = &self.admin_socket {
            return Ok(s.clone());
        }
        let config = self
            .config
            .clone()
            .unwrap_or_else(crate::daemon::default_config_path);
        if config.exists() {
            let c = sluice::config::Config::load(&config)
                .with_context(|| format!("reading {}", config.display()))?;
            return Ok(c.agent.admin_socket);
        }
        Ok(sluice::config::AgentConfig::default().admin_socket)
    }

    /// Sends `req` and returns a reader over the answer lines.
    pub fn call(&self, req: &AdminRequest) -> Result<AdminReply> {
        let path = self.socket()?;
        let conn = UnixStream::connect(&path).map_err(|e| {
            anyhow::anyhow!(
                "no agent at {} ({e}): start it with `sluice agent --config …`",
                path.display()
            )
        })?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        (&conn).write_all(&line)?;
        Ok(AdminReply {
            lines: BufReader::new(conn),
        })
    }
}

/// The answer stream of one admin request.
pub struct AdminReply {
    lines: BufReader<UnixStream>,
}

impl AdminReply {
    /// The next JSON line; errors from the agent become errors here.
    pub fn next(&mut self) -> Result<Option<serde_json::Value>> {
        let mut line = String::new();
        if self.lines.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).context("agent sent a bad answer")?;
        if v["type"] == "error" {
            bail!("{}", v["message"].as_str().unwrap_or("agent error"));
        }
        Ok(Some(v))
    }
}

/// Formats a byte count as KiB/MiB/GiB.
pub fn human_bytes(n: u64) -> String {
    sluice::config::ByteSize(n).to_string()
}
