//! The stall signal: what the observer measured over its last tick, for the control loops
//! (prefetcher, autoscaler). One producer (the observer, from eBPF when the probes load,
//! else from the FUSE side's own wait times), any number of readers, latest value wins.

use std::time::Duration;

/// One tick of measured stalls on this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StallTick {
    /// How long the tick covered.
    pub interval: Duration,
    /// The highest stall ratio (time blocked on dataset reads / wall time) of any workload
    /// (pod, unit or process) in the tick; 0 when nothing read. Blocked time is summed over
    /// a workload's threads, so the observer caps this at 1 (`sluice stalls` shows it
    /// uncapped).
    pub max_stall_ratio: f64,
    /// How many workloads stalled at all in the tick.
    pub stalled_workloads: usize,
    /// Where the figures came from: `"ebpf"`, or `"fuse"` when the probes are off.
    pub from: &'static str,
}

/// The observer's end.
pub type StallSender = tokio::sync::watch::Sender<StallTick>;
/// A control loop's end.
pub type StallReceiver = tokio::sync::watch::Receiver<StallTick>;

/// A channel starting at an empty tick.
pub fn channel() -> (StallSender, StallReceiver) {
    tokio::sync::watch::channel(StallTick::default())
}
