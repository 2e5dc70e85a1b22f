//! Where a dataset's bytes live: object stores and local paths behind one small trait.
//!
//! A [`Source`] lists the objects under one mount point and reads byte ranges of them. The
//! object_store-backed implementation covers s3, gs, az, http(s) and file; tests and
//! benchmarks can wrap a source to slow or break it.

#[cfg(feature = "hdfs")]
mod hdfs;
mod key;
mod mount_point;
mod object;
mod s3_list;

#[cfg(feature = "hdfs")]
pub use hdfs::HdfsSource;
pub use key::unsafe_reason;
pub use mount_point::{MountPoint, Scheme, supported_schemes};
pub use object::{ObjectSource, RequestLimits, parse_duration};

use std::fmt::Debug;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

/// One object under a mount, as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObjectInfo {
    /// Path relative to the mount point, `/`-separated, already checked to be safe.
    pub key: String,
    pub size: u64,
    /// ETag or version id: part of every block key, so a changed object is never mixed with
    /// its old bytes.
    pub version: Option<String>,
    /// Last modification, seconds since the epoch.
    pub modified: i64,
}

/// Why a source operation failed. Messages never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{source_id}: object {key} not found (deleted since listing?)")]
    NotFound { source_id: String, key: String },
    #[error(
        "{source_id}: object {key} changed since listing (version {expected} no longer current)"
    )]
    Changed {
        source_id: String,
        key: String,
        expected: String,
    },
    #[error("{source_id}: access denied: check the credentials in secretRefs ({detail})")]
    Unauthorized { source_id: String, detail: String },
    #[error("{source_id}: timed out after {secs:.1}s ({what})")]
    Timeout {
        source_id: String,
        what: String,
        secs: f64,
    },
    #[error(
        "{source_id}: cannot reach {endpoint}: {detail} (is the endpoint right and the store running?)"
    )]
    Unreachable {
        source_id: String,
        endpoint: String,
        detail: String,
    },
    #[error("{source_id}: invalid mount: {detail}")]
    Config { source_id: String, detail: String },
    #[error("{source_id}: {detail}")]
    Other { source_id: String, detail: String },
}

/// Builds the source a mount describes (no request is made until `list` or `read`).
pub fn open(spec: &crate::config::MountSpec) -> Result<Arc<dyn Source>, SourceError> {
    #[cfg(feature = "hdfs")]
    if let Ok(mount) = MountPoint::parse(&spec.mount_point)
        && mount.scheme == Scheme::Hdfs
    {
        let limits =
            object::limits_from_options(&spec.options).map_err(|detail| SourceError::Config {
                source_id: spec.mount_point.clone(),
                detail,
            })?;
        return Ok(Arc::new(HdfsSource::new(
            &mount.bucket,
            &mount.prefix,
            limits,
        )?));
    }
    Ok(Arc::new(ObjectSource::from_spec(spec)?))
}

/// A store of objects under one mount point.
#[async_trait]
pub trait Source: Send + Sync + Debug {
    /// A stable identity (scheme, endpoint, bucket, prefix; never a secret), used in block
    /// keys and messages.
    fn id(&self) -> &str;
    /// Every object under the mount point.
    async fn list(&self) -> Result<Vec<ObjectInfo>, SourceError>;
    /// `range` of `object`; fails with [`SourceError::Changed`] if the object's version is
    /// no longer `object.version`.
    async fn read(&self, object: &ObjectInfo, range: Range<u64>) -> Result<Bytes, SourceError>;
}
