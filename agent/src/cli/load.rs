//! `sluice load DATASET[/PATH] [--metadata-only]`.

use std::time::Instant;

use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressStyle};

use super::{AgentAddr, human_bytes};
use crate::admin::{AdminRequest, LoadProgress};

/// Preloads through the agent, drawing a progress bar, then prints a summary line.
pub fn run(agent: &AgentAddr, target: &str, metadata_only: bool) -> Result<()> {
    let target = target.trim_matches('/');
    let (dataset, path) = target.split_once('/').unwrap_or((target, ""));
    let started = Instant::now();
    let mut reply = agent.call(&AdminRequest::Load {
        dataset: dataset.into(),
        path: path.into(),
        metadata_only,
    })?;
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}")
            .expect("valid template"),
    );
    while let Some(v) = reply.next()? {
        let last: LoadProgress = serde_json::from_value(v["progress"].clone()).unwrap_or_default();
        bar.set_length(last.bytes_total);
        bar.set_position(last.bytes_done);
        bar.set_message(format!("{}/{} files", last.files_done, last.files_total));
        if v["type"] == "done" {
            bar.finish_and_clear();
            let secs = started.elapsed().as_secs_f64();
            if metadata_only {
                println!(
                    "{target}: metadata refreshed: {} files, {} in {secs:.1}s",
                    last.files_total,
                    human_bytes(last.bytes_total)
                );
            } else {
                println!(
                    "{target}: loaded {} files, {} in {secs:.1}s ({}/s){}",
                    last.files_done,
                    human_bytes(last.bytes_done),
                    human_bytes((last.bytes_done as f64 / secs.max(1e-3)) as u64),
                    if last.errors > 0 {
                        format!(", {} blocks failed (see the agent's log)", last.errors)
                    } else {
                        String::new()
                    }
                );
            }
            if last.errors > 0 {
                bail!("{} blocks could not be loaded", last.errors);
            }
            return Ok(());
        }
    }
    bar.abandon();
    bail!("agent closed the connection before the load finished")
}
