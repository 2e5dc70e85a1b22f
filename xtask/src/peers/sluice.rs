//! Sluice itself: a real `sluice agent` (see `crate::agent`) serving the dataset's prefix.

use std::path::{Path, PathBuf};

use super::{Budget, Mounted, Store};
use crate::agent::{Agent, AgentSetup};

/// Builds the release agent; the error says why Sluice's rows will be missing.
pub fn build() -> anyhow::Result<PathBuf> {
    crate::agent::build()
}

/// Starts the agent with a fresh cache; `epoch_quota` sets `spec.cache: { policy: epoch,
/// quota }` on the Dataset.
pub fn mount(
    bin: &Path,
    store: &Store,
    dir: &Path,
    budget: Budget,
    epoch_quota: Option<u64>,
) -> anyhow::Result<Mounted> {
    super::clear(dir)?;
    let setup = AgentSetup {
        work: dir,
        dataset: "bench",
        mount_point: format!("s3://{}/{}", store.bucket, store.prefix),
        options: format!(
            "endpoint: \"{}\", region: us-east-1, allowHttp: \"true\", pathStyle: \"true\"",
            store.endpoint
        ),
        memory: budget.memory,
        disk: budget.disk,
    };
    let cache = epoch_quota
        .map(|q| format!("{{ policy: epoch, quota: {q} }}"))
        .unwrap_or_default();
    let agent = Agent::start_with_cache(bin, &setup, &cache)?;
    let settings = format!(
        "sluice agent: cache.memory={} MiB, disk capacity={} MiB{}",
        budget.memory >> 20,
        budget.disk >> 20,
        epoch_quota
            .map(|q| format!(", spec.cache {{ policy: epoch, quota: {} MiB }}", q >> 20))
            .unwrap_or_default()
    );
    Ok(Mounted::agent(agent, settings))
}
