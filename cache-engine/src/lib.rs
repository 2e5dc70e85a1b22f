//! The hybrid block cache that holds every cached byte of Sluice.
//!
//! Keys in, bytes out: the engine knows nothing of datasets, FUSE or networks. A [`Cache`]
//! has a memory tier and zero or more disk tiers; entries belong to a [`Partition`] (the
//! agent makes one per dataset) whose [`Policy`] decides between eviction and epoch-mode
//! admission control.
//!
//! THE PUBLIC API IN THIS FILE IS THE SEAM WITH THE AGENT: keep its shape stable.

mod api;

pub use api::*;
mod bootstrap;

pub(crate) use bootstrap::{
    Inner, close, contains, engine_choice, get, get_or_fetch, insert, open, partition,
    partition_stats, remove, stats,
};
