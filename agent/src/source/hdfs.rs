//! [`HdfsSource`]: a [`Source`] over HDFS through `hdfs-native` (cargo feature `hdfs`).
//!
//! HDFS has no ETag: an object's version is `<modification time ms>-<length>`, and a read
//! first compares the file's current status with it, so a rewritten file fails with
//! [`SourceError::Changed`]. Compile-checked only: the test setup has no HDFS server.
//! Options: the common ones of [`super::RequestLimits`] (`maxConcurrency`, `requestTimeout`).

use std::ops::Range;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use hdfs_native::HdfsError;
use tokio::sync::Semaphore;

use super::{ObjectInfo, RequestLimits, Source, SourceError, key};
use crate::secret;

/// A source over one HDFS directory.
pub struct HdfsSource {
    id: String,
    client: hdfs_native::Client,
    /// Absolute directory under which keys live, without trailing `/`.
    root: String,
    permits: Semaphore,
    limits: RequestLimits,
}

impl std::fmt::Debug for HdfsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HdfsSource")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl HdfsSource {
    /// Connects lazily to the name node of `hdfs://authority/root`.
    pub fn new(
        authority: &str,
        root: &str,
        limits: RequestLimits,
    ) -> Result<HdfsSource, SourceError> {
        let id = format!("hdfs://{authority}/{root}");
        let client = hdfs_native::ClientBuilder::new()
            .with_url(format!("hdfs://{authority}"))
            .build()
            .map_err(|e| SourceError::Config {
                source_id: id.clone(),
                detail: secret::redact(&e.to_string()).into_owned(),
            })?;
        let permits = Semaphore::new(limits.max_concurrency.max(1));
        Ok(HdfsSource {
            id,
            client,
            root: format!("/{}", root.trim_matches('/')),
            permits,
            limits,
        })
    }

    fn classify(&self, key: &str, err: HdfsError) -> SourceError {
        match err {
            HdfsError::FileNotFound(_) => SourceError::NotFound {
                source_id: self.id.clone(),
                key: key.to_string(),
            },
            HdfsError::SASLError(d) => SourceError::Unauthorized {
                source_id: self.id.clone(),
                detail: secret::redact(&d).into_owned(),
            },
            e => SourceError::Other {
                source_id: self.id.clone(),
                detail: secret::redact(&e.to_string()).into_owned(),
            },
        }
    }

    async fn bounded<T>(
        &self,
        what: String,
        f: impl Future<Output = Result<T, SourceError>>,
    ) -> Result<T, SourceError> {
        let started = Instant::now();
        let run = async {
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            f.await
        };
        tokio::time::timeout(self.limits.request_timeout, run)
            .await
            .unwrap_or_else(|_| {
                Err(SourceError::Timeout {
                    source_id: self.id.clone(),
                    what,
                    secs: started.elapsed().as_secs_f64(),
                })
            })
    }
}

fn version_of(status: &hdfs_native::client::FileStatus) -> String {
    format!("{}-{}", status.modification_time, status.length)
}

#[async_trait]
impl Source for HdfsSource {
    fn id(&self) -> &str {
        &self.id
    }

    async fn list(&self) -> Result<Vec<ObjectInfo>, SourceError> {
        let statuses = self
            .bounded("listing".into(), async {
                self.client
                    .list_status(&self.root, true)
                    .await
                    .map_err(|e| self.classify("/", e))
            })
            .await?;
        let base = format!("{}/", self.root.trim_end_matches('/'));
        let objects = statuses
            .into_iter()
            .filter(|s| !s.isdir)
            .map(|s| ObjectInfo {
                version: Some(version_of(&s)),
                size: s.length as u64,
                modified: (s.modification_time / 1000) as i64,
                key: s.path.strip_prefix(&base).unwrap_or(&s.path).to_string(),
            })
            .collect();
        Ok(key::clean_listing(&self.id, objects))
    }

    async fn read(&self, object: &ObjectInfo, range: Range<u64>) -> Result<Bytes, SourceError> {
        if range.start >= range.end {
            return Ok(Bytes::new());
        }
        let path = format!("{}/{}", self.root.trim_end_matches('/'), object.key);
        self.bounded(format!("read {}", object.key), async {
            let status = self
                .client
                .get_file_info(&path)
                .await
                .map_err(|e| self.classify(&object.key, e))?;
            if let Some(want) = &object.version
                && *want != version_of(&status)
            {
                return Err(SourceError::Changed {
                    source_id: self.id.clone(),
                    key: object.key.clone(),
                    expected: want.clone(),
                });
            }
            let reader = self
                .client
                .read(&path)
                .await
                .map_err(|e| self.classify(&object.key, e))?;
            reader
                .read_range(range.start as usize, (range.end - range.start) as usize)
                .await
                .map_err(|e| self.classify(&object.key, e))
        })
        .await
    }
}
