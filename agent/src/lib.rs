//! The Sluice agent as a library: configuration, secrets, sources and datasets, shared by
//! the `sluice` binary and the integration tests under `tests/`.

pub mod config;
pub mod dataset;
pub mod secret;
pub mod source;
