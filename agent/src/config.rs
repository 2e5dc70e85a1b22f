//! The agent's configuration file: one `agent` section and any number of `Dataset` documents
//! (Kubernetes-style, the shape the cluster CRD will have), in one multi-document YAML file.
//!
//! ```yaml
//! agent:
//!   mountRoot: /mnt/sluice
//!   stateDir: /var/lib/sluice
//!   metricsAddr: 127.0.0.1:9477
//!   adminSocket: /run/sluice/admin.sock
//!   cache:
//!     memory: 2GiB
//!     disks: [{ path: /nvme/sluice, capacity: 500GiB }]
//! ---
//! apiVersion: sluice.io/v1alpha1
//! kind: Dataset
//! metadata: { name: imagenet }
//! spec:
//!   mounts:
//!     - mountPoint: s3://bucket/imagenet/train
//!       name: train
//!       options: { endpoint: http://127.0.0.1:8333, region: us-east-1, pathStyle: "true" }
//!       secretRefs:
//!         - { key: accessKeyId, env: AWS_ACCESS_KEY_ID }
//!         - { key: secretAccessKey, file: /etc/sluice/secret-key }
//!   cache: { policy: epoch, quota: 100GiB }
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub agent: AgentConfig,
    pub datasets: Vec<DatasetSpec>,
}

/// The `agent:` document.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Each dataset is mounted at `<mountRoot>/<dataset name>`.
    pub mount_root: PathBuf,
    /// Persisted metadata (listings) and runtime state.
    pub state_dir: PathBuf,
    /// Prometheus `/metrics` listen address; empty disables it.
    pub metrics_addr: Option<String>,
    /// Admin API Unix socket (mode 0600), used by the CLI.
    pub admin_socket: PathBuf,
    pub cache: AgentCacheConfig,
    /// Block size for large objects (objects up to this size are one block).
    pub block_size: ByteSize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            mount_root: PathBuf::from("/mnt/sluice"),
            state_dir: PathBuf::from("/var/lib/sluice"),
            metrics_addr: Some("127.0.0.1:9477".into()),
            admin_socket: PathBuf::from("/run/sluice/admin.sock"),
            cache: AgentCacheConfig::default(),
            block_size: ByteSize(4 << 20),
        }
    }
}

/// The node's cache tiers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AgentCacheConfig {
    pub memory: ByteSize,
    pub disks: Vec<DiskSpec>,
    /// `auto` (io_uring if the kernel allows, else psync), `io_uring` or `psync`.
    pub engine: String,
}

impl Default for AgentCacheConfig {
    fn default() -> Self {
        AgentCacheConfig { memory: ByteSize(1 << 30), disks: Vec::new(), engine: "auto".into() }
    }
}

/// One cache directory (NVMe) and its budget.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub capacity: ByteSize,
    #[serde(default)]
    pub high_watermark: Option<f64>,
    #[serde(default)]
    pub low_watermark: Option<f64>,
}

/// A `kind: Dataset` document.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatasetSpec {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: DatasetSpecBody,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatasetSpecBody {
    pub mounts: Vec<MountSpec>,
    #[serde(default)]
    pub cache: DatasetCacheSpec,
}

/// One source shown as a subdirectory of the dataset.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MountSpec {
    /// `s3://bucket/prefix`, `gs://…`, `az://…`, `http(s)://…`, `file:///path`, `hdfs://…`.
    pub mount_point: String,
    /// Subdirectory name in the dataset; empty means the dataset root (one mount only).
    #[serde(default)]
    pub name: String,
    /// Store options: endpoint, region, pathStyle, allowHttp, … (never secrets).
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    #[serde(default)]
    pub secret_refs: Vec<SecretRef>,
}

/// A credential read from a file or an environment variable, never from the config itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretRef {
    /// Which credential: accessKeyId, secretAccessKey, sessionToken, serviceAccountKey, …
    pub key: String,
    #[serde(default)]
    pub env: Option<String>,
    #[serde(default)]
    pub file: Option<PathBuf>,
}

/// The dataset's share of the cache.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatasetCacheSpec {
    /// `general` (evict cold blocks) or `epoch` (stop admitting at the quota).
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub quota: Option<ByteSize>,
    /// Re-list the sources this often (e.g. "10m"); absent = only on demand.
    #[serde(default)]
    pub refresh_interval: Option<String>,
}

/// A byte count written as `4MiB`, `500GiB`, `1.5G` or a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let s = s.trim();
        let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let num: f64 = num.parse().map_err(|_| format!("invalid size {s:?}: expected e.g. 4MiB, 500GiB, 1024"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "ki" | "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mi" | "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gi" | "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "ti" | "tib" => 1 << 40,
            other => return Err(format!("invalid size unit {other:?} in {s:?}: use B, KiB, MiB, GiB, TiB (or K, M, G, T)")),
        };
        Ok(ByteSize((num * mult as f64) as u64))
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut i = 0;
        while v >= 1024.0 && i < UNITS.len() - 1 {
            v /= 1024.0;
            i += 1;
        }
        if i == 0 { write!(f, "{} B", self.0) } else { write!(f, "{v:.1} {}", UNITS[i]) }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}
