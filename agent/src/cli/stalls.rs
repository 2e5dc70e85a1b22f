//! `sluice stalls [--json] [--watch]`.

use std::time::Duration;

use anyhow::{Result, bail};

use super::{AgentAddr, human_bytes};
use crate::admin::AdminRequest;
use crate::observe::report::{Figures, StallsReport};

/// Prints the per-workload stalls once, or every second with `--watch` (until Ctrl-C).
pub fn run(agent: &AgentAddr, json: bool, watch: bool) -> Result<()> {
    loop {
        let report = fetch(agent)?;
        if json {
            if watch {
                // One line per refresh (NDJSON).
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
        } else {
            if watch {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", table(&report));
        }
        if !watch {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The agent's stalls report.
pub fn fetch(agent: &AgentAddr) -> Result<StallsReport> {
    let mut reply = agent.call(&AdminRequest::Stalls)?;
    let Some(v) = reply.next()? else {
        bail!("agent closed the connection without answering")
    };
    if v["type"] != "stalls" {
        bail!("this agent does not answer `stalls` (an older version?): {v}");
    }
    Ok(serde_json::from_value(v["stalls"].clone())?)
}

fn ms(v: f64) -> String {
    if v == 0.0 {
        "-".into()
    } else if v < 1.0 {
        format!("{:.0}µs", v * 1000.0)
    } else {
        format!("{v:.1}ms")
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
}

fn secs(v: f64) -> String {
    if v >= 3600.0 {
        format!("{:.1}h", v / 3600.0)
    } else if v >= 60.0 {
        format!("{:.1}m", v / 60.0)
    } else {
        format!("{v:.1}s")
    }
}

/// Latency and hit ratio from the recent window when it saw reads, else from the total.
fn live<'a>(recent: &'a Figures, total: &'a Figures) -> &'a Figures {
    if recent.read_calls > 0 { recent } else { total }
}

/// The human-readable table.
pub fn table(r: &StallsReport) -> String {
    let mut out = String::new();
    if r.from == "off" {
        out.push_str(&format!(
            "stall features are off: {}\n",
            r.disabled_reason
                .as_deref()
                .unwrap_or("the probes are not loaded")
        ));
        return out;
    }
    if r.workloads.is_empty() {
        out.push_str(&format!(
            "no dataset reads seen yet (watching {})\n",
            if r.watched.is_empty() {
                "nothing".to_string()
            } else {
                r.watched.join(", ")
            }
        ));
    } else {
        out.push_str(&format!(
            "{:<36} {:>7} {:>8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>5}  {}\n",
            "WORKLOAD",
            "WALL",
            "STALLED",
            "RATIO",
            "NOW",
            "MiB/s",
            "P50",
            "P99",
            "HIT",
            "TOP WAITS"
        ));
        for w in &r.workloads {
            let l = live(&w.recent, &w.total);
            let mut name = w.identity.display();
            if w.gone {
                name.push_str(" (gone)");
            }
            if name.chars().count() > 36 {
                let tail: String = name
                    .chars()
                    .rev()
                    .take(35)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                name = format!("…{tail}");
            }
            let waits: Vec<String> = w
                .top_dirs
                .iter()
                .take(2)
                .map(|t| format!("{} {:.0}%", t.path, t.share * 100.0))
                .collect();
            out.push_str(&format!(
                "{:<36} {:>7} {:>8} {:>5.0}% {:>5.0}% {:>8.1} {:>8} {:>8} {:>5}  {}\n",
                name,
                secs(w.total.wall_seconds),
                secs(w.total.stalled_seconds),
                w.total.stall_ratio * 100.0,
                w.recent.stall_ratio * 100.0,
                w.recent.mib_per_second,
                ms(l.p50_ms),
                ms(l.p99_ms),
                pct(l.hit_ratio),
                if waits.is_empty() {
                    "-".into()
                } else {
                    waits.join(", ")
                }
            ));
        }
        out.push_str(&format!(
            "\nRATIO: stalled/wall since first read; NOW: over the last {:.0} s (above 100%: several threads waited at once). HIT: bytes not fetched from the source.\n",
            r.window_seconds
        ));
    }
    out.push_str(&format!(
        "probes: {:.0} dataset reads/s, lost events {} (samples) {} (counters)",
        r.events_per_second, r.lost_events, r.lost_stat_updates
    ));
    if r.stalls_only {
        out.push_str(
            "; stalls-only mode (agent.stalls.mode): reads, rates, latency, hit ratio and top waits not measured",
        );
    }
    if !r.unavailable.is_empty() {
        out.push_str(&format!(
            "; not measured here: {}",
            r.unavailable.join(", ")
        ));
    }
    out.push('\n');
    let total: u64 = r.workloads.iter().map(|w| w.total.read_bytes).sum();
    if total > 0 {
        out.push_str(&format!(
            "read through watched paths: {}\n",
            human_bytes(total)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::report::{Identity, Wait, WorkloadReport};

    #[test]
    fn the_table_says_why_stalls_are_off() {
        let r = StallsReport {
            from: "off".into(),
            disabled_reason: Some("CAP_BPF/CAP_SYS_ADMIN missing: …".into()),
            ..Default::default()
        };
        assert_eq!(
            table(&r),
            "stall features are off: CAP_BPF/CAP_SYS_ADMIN missing: …\n"
        );
    }

    #[test]
    fn the_table_has_a_row_per_workload() {
        let figures = Figures {
            wall_seconds: 10.0,
            stalled_seconds: 2.5,
            stall_ratio: 0.25,
            read_calls: 10,
            read_bytes: 30 << 20,
            mib_per_second: 3.0,
            p50_ms: 0.5,
            p99_ms: 120.0,
            hit_ratio: Some(0.4),
            ..Default::default()
        };
        let r = StallsReport {
            from: "ebpf".into(),
            window_seconds: 10.0,
            workloads: vec![WorkloadReport {
                identity: Identity {
                    kind: "pod".into(),
                    pod_uid: Some("u".into()),
                    pod_namespace: Some("ml".into()),
                    pod_name: Some("train-0".into()),
                    ..Default::default()
                },
                total: figures.clone(),
                recent: figures,
                top_dirs: vec![Wait {
                    path: "imagenet/train/n01/".into(),
                    stalled_seconds: 2.0,
                    share: 0.8,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = table(&r);
        let row = t.lines().nth(1).unwrap();
        for want in [
            "pod ml/train-0",
            "10.0s",
            "2.5s",
            "25%",
            "3.0",
            "500µs",
            "120.0ms",
            "40%",
            "imagenet/train/n01/ 80%",
        ] {
            assert!(row.contains(want), "{want:?} missing in {row:?}");
        }
        assert!(t.contains("read through watched paths: 30.0 MiB"), "{t}");
    }
}
