//! The hybrid block cache that holds every cached byte of Sluice.
//!
//! Keys in, bytes out: the engine knows nothing of datasets, FUSE or networks. A [`Cache`]
//! has a memory tier and zero or more disk tiers; entries belong to a [`Partition`] (the
//! agent makes one per dataset) whose [`Policy`] decides between eviction and epoch-mode
//! admission control.
//!
//! Module map: `api` (the public seam), `engine` (tiers, policies, single-flight, stats),
//! `memory` (CLOCK memory tier), `disk` (segments of one directory, recovery), `segment`
//! (on-disk format), `index` (sharded compact index), `partitions` (persisted names),
//! `io` (the `IoEngine` trait, its io_uring and psync engines, aligned buffers).
//!
//! THE PUBLIC API IN THIS FILE IS THE SEAM WITH THE AGENT: keep its shape stable.

mod api;
mod disk;
mod engine;
mod index;
mod io;
mod memory;
mod partitions;
mod segment;

pub use api::*;

pub(crate) use engine::{
    Inner, close, contains, engine_choice, get, get_memory, get_or_fetch, insert, open, partition,
    partition_stats, remove, set_memory_capacity, stats,
};
