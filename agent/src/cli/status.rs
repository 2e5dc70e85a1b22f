//! `sluice status [--json]`.

use anyhow::{Result, bail};

use super::{AgentAddr, human_bytes};
use crate::admin::{AdminRequest, Status};

/// Prints the agent's status as a table, or its JSON.
pub fn run(agent: &AgentAddr, json: bool) -> Result<()> {
    let status = fetch(agent)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", table(&status));
    }
    Ok(())
}

/// The agent's status.
pub fn fetch(agent: &AgentAddr) -> Result<Status> {
    let mut reply = agent.call(&AdminRequest::Status)?;
    let Some(v) = reply.next()? else {
        bail!("agent closed the connection without answering")
    };
    Ok(serde_json::from_value(v["status"].clone())?)
}

/// The human-readable status table.
pub fn table(s: &Status) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<16} {:>8} {:>11} {:>11} {:>7} {:>6} {:>11} {:>11} {:>11}\n",
        "DATASET",
        "FILES",
        "SIZE",
        "CACHED",
        "CACHED%",
        "HIT%",
        "FROM MEM",
        "FROM NVME",
        "FROM SOURCE"
    ));
    for d in &s.datasets {
        out.push_str(&format!(
            "{:<16} {:>8} {:>11} {:>11} {:>6.1}% {:>5.1}% {:>11} {:>11} {:>11}\n",
            d.name,
            d.files,
            human_bytes(d.bytes),
            human_bytes(d.cached_bytes),
            d.cached_percent,
            d.hit_ratio * 100.0,
            human_bytes(d.served_memory),
            human_bytes(d.served_disk),
            human_bytes(d.served_source)
        ));
    }
    out.push('\n');
    out.push_str(&format!(
        "{:<8} {:<32} {:>11} {:>11}\n",
        "TIER", "PATH", "USED", "QUOTA"
    ));
    for t in &s.tiers {
        out.push_str(&format!(
            "{:<8} {:<32} {:>11} {:>11}\n",
            t.tier,
            t.path.as_deref().unwrap_or("-"),
            human_bytes(t.used_bytes),
            human_bytes(t.capacity_bytes)
        ));
    }
    match &s.engine_fallback {
        Some(why) => out.push_str(&format!("engine: {} (fallback: {why})\n", s.engine)),
        None => out.push_str(&format!("engine: {}\n", s.engine)),
    }
    out
}
