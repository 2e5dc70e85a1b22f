//! Loads Sluice's eBPF probes (written in C under `bpf/`, compiled objects committed) with
//! aya and turns their maps and ring buffer into typed per-cgroup counters and events.
