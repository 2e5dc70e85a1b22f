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
//!
//! [`Config::load`] reads the file, applies environment overrides to the agent section and
//! validates everything; errors name the file, the line and the field
//! (`config.yaml line 12: spec.mounts[0].mountPoint: missing field`).
//!
//! Environment overrides (they win over the file):
//!
//! | variable | field |
//! | --- | --- |
//! | `SLUICE_MOUNT_ROOT` | `agent.mountRoot` |
//! | `SLUICE_STATE_DIR` | `agent.stateDir` |
//! | `SLUICE_METRICS_ADDR` | `agent.metricsAddr` (empty disables metrics) |
//! | `SLUICE_ADMIN_SOCKET` | `agent.adminSocket` |
//! | `SLUICE_CACHE_MEMORY` | `agent.cache.memory` (e.g. `8GiB`) |
//! | `SLUICE_CACHE_ENGINE` | `agent.cache.engine` |
//! | `SLUICE_BLOCK_SIZE` | `agent.blockSize` |
//! | `SLUICE_STALLS_ENABLED` | `agent.stalls.enabled` (`true`/`false`) |

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

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
    /// The prefetcher (readahead, directory scans, repeated epochs).
    pub prefetch: PrefetchConfig,
    /// The AIMD autoscaler of prefetch concurrency and the memory tier.
    pub autoscale: AutoscaleConfig,
    /// Stall observation with the eBPF probes (`sluice stalls`).
    pub stalls: StallsConfig,
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
            prefetch: PrefetchConfig::default(),
            autoscale: AutoscaleConfig::default(),
            stalls: StallsConfig::default(),
        }
    }
}

/// `agent.stalls.mode`: how much the eBPF probes follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StallsMode {
    /// Every dataset read: stall time, calls, bytes, latency, hit ratio and top waits.
    /// Every syscall on the node passes two hooks.
    #[default]
    PerRead,
    /// Stall time per workload and dataset only, with no per-syscall hooks: reads that do
    /// not block cost nothing. No read counts, latency, hit ratio or top waits (the
    /// prefetcher and the autoscaler work as before).
    StallsOnly,
}

/// `agent.stalls`: which reads count as dataset reads and how the observer reports them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StallsConfig {
    /// Load the eBPF probes (the agent runs without them when they cannot load).
    pub enabled: bool,
    /// What the probes follow.
    pub mode: StallsMode,
    /// Absolute directories whose files also count as dataset reads (besides every
    /// dataset mount), e.g. a dataset copied to local disk.
    pub watch_prefixes: Vec<PathBuf>,
    /// How often the counters are read and the stall signal published.
    pub tick_millis: u64,
    /// 1 in this many dataset reads is sampled (to find the files waited on).
    pub sample_every: u32,
    /// 1 in this many dataset reads of each thread is timed for the latency histogram
    /// (1: every read); stall time is measured on every read regardless.
    pub time_every: u32,
    /// A tick in which a workload waited at least this share of the wall time is part of
    /// a stall episode.
    pub episode_min_ratio: f64,
    /// While an episode goes on, log it every this many seconds (and once when it ends).
    pub episode_log_secs: u64,
    /// Where kubelet keeps `<namespace>_<name>_<uid>` directories: names pods by UID.
    pub pod_log_dir: PathBuf,
}

impl Default for StallsConfig {
    fn default() -> Self {
        StallsConfig {
            enabled: true,
            mode: StallsMode::PerRead,
            watch_prefixes: Vec::new(),
            tick_millis: 1000,
            sample_every: 16,
            time_every: 8,
            episode_min_ratio: 0.1,
            episode_log_secs: 30,
            pod_log_dir: PathBuf::from("/var/log/pods"),
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
        AgentCacheConfig {
            memory: ByteSize(1 << 30),
            disks: Vec::new(),
            engine: "auto".into(),
        }
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
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let num: f64 = num
            .parse()
            .map_err(|_| format!("invalid size {s:?}: expected e.g. 4MiB, 500GiB, 1024"))?;
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
            other => {
                return Err(format!(
                    "invalid size unit {other:?} in {s:?}: use B, KiB, MiB, GiB, TiB (or K, M, G, T)"
                ));
            }
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
        if i == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[i])
        }
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

/// The apiVersion of `Dataset` documents this agent understands.
pub const API_VERSION: &str = "sluice.io/v1alpha1";

/// Why the configuration cannot be used. `Display` names the file, line and field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Bad YAML or a value of the wrong shape.
    #[error("{file}{}: {}{message}", line_suffix(*line), field_prefix(field))]
    Parse {
        file: String,
        line: Option<usize>,
        field: String,
        message: String,
    },
    /// Well-formed but not acceptable (duplicate names, unknown scheme, …).
    #[error("{file}{}: {}{message}", line_suffix(*line), field_prefix(field))]
    Invalid {
        file: String,
        line: Option<usize>,
        field: String,
        message: String,
    },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(" line {l}")).unwrap_or_default()
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() || field == "." {
        String::new()
    } else {
        format!("{field}: ")
    }
}

/// The `agent:` document's shape.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentDocument {
    agent: AgentConfig,
}

/// One YAML document of the file and the line it starts on.
struct Document<'a> {
    text: &'a str,
    /// 0-based line of the file where `text` begins.
    first_line: usize,
}

/// Splits a multi-document YAML file at its `---` lines, keeping line numbers.
fn split_documents(text: &str) -> Vec<Document<'_>> {
    let mut docs = Vec::new();
    let mut start = 0usize;
    let mut start_line = 0usize;
    let mut offset = 0usize;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end();
        if bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t") {
            docs.push(Document {
                text: &text[start..offset],
                first_line: start_line,
            });
            // A document may begin on the marker line itself (`--- {…}`); keep its line.
            start = offset + 3;
            start_line = i;
        }
        offset += line.len();
    }
    docs.push(Document {
        text: &text[start..],
        first_line: start_line,
    });
    docs
}

impl Config {
    /// Reads, overrides from the process environment and validates `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path.display().to_string();
        Config::parse_with_env(&name, &text, |var| std::env::var(var).ok())
    }

    /// Parses and validates `text` (no environment overrides); errors name the file
    /// `config.yaml`.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env("config.yaml", text, |_| None)
    }

    /// Parses `text` (named `file` in errors), applies overrides looked up with `env`, and
    /// validates.
    pub fn parse_with_env(
        file: &str,
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let mut agent_seen = false;
        let mut agent_doc: Option<Document<'_>> = None;
        // Where each dataset came from, for validation messages.
        let mut origins = Vec::new();
        for doc in split_documents(text) {
            let value: serde_yaml::Value = match serde_yaml::from_str(doc.text) {
                Ok(v) => v,
                Err(e) => return Err(parse_error(file, &doc, None, e)),
            };
            let map = match &value {
                serde_yaml::Value::Null => continue,
                serde_yaml::Value::Mapping(m) => m,
                _ => {
                    return Err(ConfigError::Parse {
                        file: file.into(),
                        line: Some(first_content_line(&doc)),
                        field: String::new(),
                        message: "expected an `agent:` section or a `kind: Dataset` document"
                            .into(),
                    });
                }
            };
            if map.contains_key("kind") || map.contains_key("apiVersion") {
                let spec: DatasetSpec = deserialize_doc(file, &doc)?;
                origins.push(doc.first_line);
                config.datasets.push(spec);
                let spec = config.datasets.last().expect("just pushed");
                validate_dataset(file, &doc, spec)?;
            } else if map.contains_key("agent") {
                if agent_seen {
                    return Err(ConfigError::Invalid {
                        file: file.into(),
                        line: Some(first_content_line(&doc)),
                        field: "agent".into(),
                        message: "a second `agent:` section; give it once".into(),
                    });
                }
                agent_seen = true;
                config.agent = deserialize_doc::<AgentDocument>(file, &doc)?.agent;
                agent_doc = Some(doc);
            } else {
                return Err(ConfigError::Parse {
                    file: file.into(),
                    line: Some(first_content_line(&doc)),
                    field: String::new(),
                    message: "expected an `agent:` section or a `kind: Dataset` document (with apiVersion, kind, metadata, spec)".into(),
                });
            }
        }
        let mut names = HashSet::new();
        for (spec, first_line) in config.datasets.iter().zip(&origins) {
            if !names.insert(spec.metadata.name.as_str()) {
                return Err(ConfigError::Invalid {
                    file: file.into(),
                    line: Some(first_line + 1),
                    field: "metadata.name".into(),
                    message: format!(
                        "dataset {:?} is defined twice; names must be unique",
                        spec.metadata.name
                    ),
                });
            }
        }
        config.agent.apply_env(env)?;
        config.agent.validate(file).map_err(|mut e| {
            // Point at the offending key's line in the agent section, if it was written there.
            if let ConfigError::Invalid { line, field, .. } = &mut e
                && let Some(doc) = &agent_doc
            {
                let key = field
                    .rsplit('.')
                    .next()
                    .unwrap_or(field)
                    .split('[')
                    .next()
                    .unwrap_or("");
                *line = doc
                    .text
                    .lines()
                    .position(|l| l.contains(&format!("{key}:")))
                    .map(|i| doc.first_line + i + 1);
            }
            e
        })?;
        Ok(config)
    }
}

/// Deserializes one document, tracking the field path for errors.
fn deserialize_doc<T: serde::de::DeserializeOwned>(
    file: &str,
    doc: &Document<'_>,
) -> Result<T, ConfigError> {
    let de = serde_yaml::Deserializer::from_str(doc.text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        parse_error(file, doc, Some(path), e.into_inner())
    })
}

fn parse_error(
    file: &str,
    doc: &Document<'_>,
    path: Option<String>,
    e: serde_yaml::Error,
) -> ConfigError {
    let line = e.location().map(|l| doc.first_line + l.line());
    let mut field = path.unwrap_or_default();
    let mut message = e.to_string();
    // serde_yaml appends " at line L column C"; the line is already in front.
    if let Some(i) = message.find(" at line ") {
        message.truncate(i);
    }
    // serde_yaml may already prefix its own copy of the path.
    if let Some((head, rest)) = message.split_once(": ")
        && !head.contains(' ')
        && field.starts_with(head)
    {
        message = rest.to_string();
    }
    // `missing field `x`` is reported at the enclosing mapping: name the field itself.
    if let Some(rest) = message.strip_prefix("missing field `")
        && let Some(name) = rest.strip_suffix('`')
    {
        field = if field.is_empty() || field == "." {
            name.to_string()
        } else {
            format!("{field}.{name}")
        };
        message = "missing field".into();
    }
    ConfigError::Parse {
        file: file.into(),
        line,
        field,
        message,
    }
}

/// 1-based line of the first non-blank, non-comment line of `doc`.
fn first_content_line(doc: &Document<'_>) -> usize {
    doc.text
        .lines()
        .position(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|i| doc.first_line + i + 1)
        .unwrap_or(doc.first_line + 1)
}

/// 1-based file line of the first line of `doc` containing `needle` (best effort: where a
/// validation error points).
fn line_of(doc: &Document<'_>, needle: &str) -> usize {
    doc.text
        .lines()
        .position(|l| l.contains(needle))
        .map(|i| doc.first_line + i + 1)
        .unwrap_or_else(|| first_content_line(doc))
}

/// Whether `name` can be a directory name under the mount root without surprises.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn validate_dataset(file: &str, doc: &Document<'_>, spec: &DatasetSpec) -> Result<(), ConfigError> {
    let invalid = |needle: &str, field: String, message: String| ConfigError::Invalid {
        file: file.into(),
        line: Some(line_of(doc, needle)),
        field,
        message,
    };
    if spec.api_version != API_VERSION {
        return Err(invalid(
            "apiVersion",
            "apiVersion".into(),
            format!(
                "unsupported apiVersion {:?}; this agent reads {API_VERSION}",
                spec.api_version
            ),
        ));
    }
    if spec.kind != "Dataset" {
        return Err(invalid(
            "kind",
            "kind".into(),
            format!("unsupported kind {:?}; expected Dataset", spec.kind),
        ));
    }
    let name = &spec.metadata.name;
    if !safe_name(name) {
        return Err(invalid(
            "name",
            "metadata.name".into(),
            format!(
                "dataset name {name:?} cannot be a directory name: use letters, digits, '-', '_' and '.', not starting with '.' or '-'"
            ),
        ));
    }
    if spec.spec.mounts.is_empty() {
        return Err(invalid(
            "mounts",
            "spec.mounts".into(),
            "a dataset needs at least one mount".into(),
        ));
    }
    let mut mount_names = HashSet::new();
    for (i, m) in spec.spec.mounts.iter().enumerate() {
        let field = |f: &str| format!("spec.mounts[{i}].{f}");
        if m.name.is_empty() {
            if spec.spec.mounts.len() > 1 {
                return Err(invalid(
                    &m.mount_point,
                    field("name"),
                    "with several mounts each needs a name (its subdirectory)".into(),
                ));
            }
        } else if !safe_name(&m.name) {
            return Err(invalid(
                &m.name,
                field("name"),
                format!(
                    "mount name {:?} cannot be a directory name: use letters, digits, '-', '_' and '.', not starting with '.' or '-'",
                    m.name
                ),
            ));
        }
        if !mount_names.insert(m.name.as_str()) {
            return Err(invalid(
                &m.name,
                field("name"),
                format!("mount name {:?} is used twice in dataset {name:?}", m.name),
            ));
        }
        if let Err(message) = crate::source::MountPoint::parse(&m.mount_point) {
            return Err(invalid(&m.mount_point, field("mountPoint"), message));
        }
        for (j, r) in m.secret_refs.iter().enumerate() {
            if r.env.is_some() == r.file.is_some() {
                return Err(invalid(
                    &r.key,
                    format!("spec.mounts[{i}].secretRefs[{j}]"),
                    format!("secret {:?}: give exactly one of `env` or `file`", r.key),
                ));
            }
        }
    }
    spec.spec
        .cache
        .partition_config()
        .map_err(|message| invalid("policy", "spec.cache.policy".into(), message))?;
    Ok(())
}

impl DatasetCacheSpec {
    /// The cache partition settings this spec asks for.
    pub fn partition_config(&self) -> Result<sluice_cache_engine::PartitionConfig, String> {
        let policy = match self.policy.as_deref() {
            None | Some("general") => sluice_cache_engine::Policy::General,
            Some("epoch") => sluice_cache_engine::Policy::Epoch,
            Some(other) => {
                return Err(format!(
                    "unknown cache policy {other:?}: use general or epoch"
                ));
            }
        };
        Ok(sluice_cache_engine::PartitionConfig {
            policy,
            quota: self.quota.map(|q| q.0),
        })
    }
}

impl AgentConfig {
    /// Applies the `SLUICE_*` overrides found by `env` (see the module doc).
    pub fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let size = |var: &str, v: &str| {
            ByteSize::parse(v).map_err(|message| ConfigError::Env {
                var: var.into(),
                message,
            })
        };
        if let Some(v) = env("SLUICE_MOUNT_ROOT") {
            self.mount_root = v.into();
        }
        if let Some(v) = env("SLUICE_STATE_DIR") {
            self.state_dir = v.into();
        }
        if let Some(v) = env("SLUICE_METRICS_ADDR") {
            self.metrics_addr = Some(v);
        }
        if let Some(v) = env("SLUICE_ADMIN_SOCKET") {
            self.admin_socket = v.into();
        }
        if let Some(v) = env("SLUICE_CACHE_MEMORY") {
            self.cache.memory = size("SLUICE_CACHE_MEMORY", &v)?;
        }
        if let Some(v) = env("SLUICE_CACHE_ENGINE") {
            self.cache.engine = v;
        }
        if let Some(v) = env("SLUICE_BLOCK_SIZE") {
            self.block_size = size("SLUICE_BLOCK_SIZE", &v)?;
        }
        if let Some(v) = env("SLUICE_STALLS_ENABLED") {
            self.stalls.enabled = match v.trim() {
                "1" | "true" | "on" | "yes" => true,
                "0" | "false" | "off" | "no" => false,
                other => {
                    return Err(ConfigError::Env {
                        var: "SLUICE_STALLS_ENABLED".into(),
                        message: format!("{other:?}: use true or false"),
                    });
                }
            };
        }
        // "Empty disables it", whichever way the empty value arrived.
        if self
            .metrics_addr
            .as_deref()
            .is_some_and(|a| a.trim().is_empty())
        {
            self.metrics_addr = None;
        }
        Ok(())
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid {
            file: file.into(),
            line: None,
            field,
            message,
        };
        if self.block_size.0 == 0 {
            return Err(invalid(
                "agent.blockSize".into(),
                "must be more than 0".into(),
            ));
        }
        self.prefetch
            .validate()
            .map_err(|(f, m)| invalid(format!("agent.prefetch.{f}"), m))?;
        self.autoscale
            .validate(&self.prefetch, self.cache.memory.0)
            .map_err(|(f, m)| invalid(format!("agent.autoscale.{f}"), m))?;
        self.cache
            .engine_kind()
            .map_err(|m| invalid("agent.cache.engine".into(), m))?;
        let st = &self.stalls;
        if !(10..=60_000).contains(&st.tick_millis) {
            return Err(invalid(
                "agent.stalls.tickMillis".into(),
                format!("{} is not in 10..=60000", st.tick_millis),
            ));
        }
        if !(0.0..=1.0).contains(&st.episode_min_ratio) {
            return Err(invalid(
                "agent.stalls.episodeMinRatio".into(),
                format!("{} is not in [0, 1]", st.episode_min_ratio),
            ));
        }
        if st.mode == StallsMode::StallsOnly && !st.watch_prefixes.is_empty() {
            return Err(invalid(
                "agent.stalls.watchPrefixes".into(),
                "needs mode: perRead (a prefix watch follows the opens, which stallsOnly does not hook)"
                    .into(),
            ));
        }
        for (i, p) in st.watch_prefixes.iter().enumerate() {
            if !p.is_absolute() {
                return Err(invalid(
                    format!("agent.stalls.watchPrefixes[{i}]"),
                    format!("{} is not an absolute path", p.display()),
                ));
            }
        }
        for (i, d) in self.cache.disks.iter().enumerate() {
            for (name, w) in [
                ("highWatermark", d.high_watermark),
                ("lowWatermark", d.low_watermark),
            ] {
                if let Some(w) = w
                    && !(w > 0.0 && w <= 1.0)
                {
                    return Err(invalid(
                        format!("agent.cache.disks[{i}].{name}"),
                        format!("{w} is not in (0, 1]"),
                    ));
                }
            }
            if let (Some(h), Some(l)) = (d.high_watermark, d.low_watermark)
                && l > h
            {
                return Err(invalid(
                    format!("agent.cache.disks[{i}].lowWatermark"),
                    format!("{l} is above highWatermark {h}"),
                ));
            }
        }
        Ok(())
    }

    /// The cache this section describes, ready to `open`.
    pub fn cache_builder(&self) -> Result<sluice_cache_engine::CacheBuilder, String> {
        let mut b = sluice_cache_engine::CacheBuilder::new()
            .memory_capacity(self.cache.memory.0)
            .engine(self.cache.engine_kind()?)
            .max_value_size(self.block_size.0);
        for d in &self.cache.disks {
            let mut disk = sluice_cache_engine::DiskConfig::new(&d.path, d.capacity.0);
            if let Some(h) = d.high_watermark {
                disk.high_watermark = h;
            }
            if let Some(l) = d.low_watermark {
                disk.low_watermark = l;
            }
            b = b.disk(disk);
        }
        Ok(b)
    }
}

impl AgentCacheConfig {
    /// The I/O engine named by `engine`.
    pub fn engine_kind(&self) -> Result<sluice_cache_engine::EngineKind, String> {
        match self.engine.as_str() {
            "auto" | "" => Ok(sluice_cache_engine::EngineKind::Auto),
            "io_uring" | "io-uring" | "iouring" => Ok(sluice_cache_engine::EngineKind::IoUring),
            "psync" => Ok(sluice_cache_engine::EngineKind::Psync),
            other => Err(format!(
                "unknown engine {other:?}: use auto, io_uring or psync"
            )),
        }
    }
}

/// `agent.prefetch`: what the agent fetches ahead of readers (see docs/prefetch.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PrefetchConfig {
    /// Off: no readahead, directory-scan or epoch prefetch by the agent (the kernel still
    /// reads ahead within a file).
    pub enabled: bool,
    /// Prefetch fetches in flight on the node at start (the autoscaler moves it).
    pub concurrency: usize,
    /// Largest readahead window within a file, in blocks.
    pub max_window: u64,
    /// Most files of a directory fetched ahead of a reader that scans it in listing order.
    pub dir_files: usize,
    /// Recognise a repeated epoch over a dataset's files and prefetch what is not cached.
    pub epoch: bool,
    /// Files fetched ahead of a reader that repeats the previous epoch's order.
    pub epoch_files: usize,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            enabled: true,
            concurrency: 16,
            max_window: 8,
            dir_files: 16,
            epoch: true,
            epoch_files: 32,
        }
    }
}

impl PrefetchConfig {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.concurrency == 0 {
            return Err(("concurrency", "must be more than 0".into()));
        }
        if self.max_window == 0 {
            return Err(("maxWindow", "must be more than 0".into()));
        }
        Ok(())
    }
}

/// `agent.autoscale`: AIMD on prefetch concurrency and the memory tier, driven by the
/// stall signal (see docs/prefetch.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AutoscaleConfig {
    /// Off: prefetch concurrency and the memory tier stay as configured.
    pub enabled: bool,
    /// A workload whose stall ratio (time blocked on dataset reads / wall time) in a tick
    /// is above this is stalling.
    pub stall_threshold: f64,
    /// Bounds of prefetch concurrency.
    pub min_prefetch: usize,
    pub max_prefetch: usize,
    /// Prefetch slots added per stalled tick.
    pub prefetch_step: usize,
    /// Upper bound of the memory tier; it never goes below `agent.cache.memory`. Unset,
    /// it is `agent.cache.memory`: the memory tier grows only where the operator allows.
    pub max_memory: Option<ByteSize>,
    /// Memory added per stalled tick (default: an eighth of `agent.cache.memory`).
    pub memory_step: Option<ByteSize>,
    /// On source errors or throttling both knobs are multiplied by this (0 < factor < 1).
    pub factor: f64,
    /// Calm ticks (no stall) after which a knob decays one step towards its start value.
    pub decay_after: u32,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            enabled: true,
            stall_threshold: 0.05,
            min_prefetch: 2,
            max_prefetch: 64,
            prefetch_step: 4,
            max_memory: None,
            memory_step: None,
            factor: 0.5,
            decay_after: 30,
        }
    }
}

impl AutoscaleConfig {
    fn validate(
        &self,
        prefetch: &PrefetchConfig,
        memory: u64,
    ) -> Result<(), (&'static str, String)> {
        if !(self.factor > 0.0 && self.factor < 1.0) {
            return Err(("factor", format!("{} is not in (0, 1)", self.factor)));
        }
        if !(self.stall_threshold >= 0.0 && self.stall_threshold < 1.0) {
            return Err((
                "stallThreshold",
                format!("{} is not in [0, 1)", self.stall_threshold),
            ));
        }
        if self.min_prefetch == 0 || self.min_prefetch > self.max_prefetch {
            return Err((
                "minPrefetch",
                format!(
                    "must be at least 1 and at most maxPrefetch ({})",
                    self.max_prefetch
                ),
            ));
        }
        if !(self.min_prefetch..=self.max_prefetch).contains(&prefetch.concurrency) {
            return Err((
                "maxPrefetch",
                format!(
                    "agent.prefetch.concurrency {} is outside [minPrefetch, maxPrefetch]",
                    prefetch.concurrency
                ),
            ));
        }
        if let Some(max) = self.max_memory
            && max.0 < memory
        {
            return Err((
                "maxMemory",
                format!("{} is below agent.cache.memory ({memory})", max.0),
            ));
        }
        Ok(())
    }

    /// The memory tier's upper bound for a configured memory tier of `memory` bytes.
    pub fn max_memory_for(&self, memory: u64) -> u64 {
        self.max_memory.map_or(memory, |m| m.0)
    }

    /// The memory step for a configured memory tier of `memory` bytes.
    pub fn memory_step_for(&self, memory: u64) -> u64 {
        self.memory_step.map_or((memory / 8).max(1 << 20), |m| m.0)
    }
}
