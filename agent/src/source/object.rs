//! [`ObjectSource`]: a [`Source`] over an `object_store` store (s3, gs, az, http(s), file).
//!
//! Every request holds a permit of a per-source semaphore (`maxConcurrency`) and runs under
//! one overall deadline (`requestTimeout`) that covers object_store's own retries, so a
//! stalled or throttling store yields [`SourceError::Timeout`] within the bound instead of
//! hanging a reader. Reads are conditional on the listed ETag (`If-Match`, and the ETag of
//! the answer is checked again), so a changed object fails with [`SourceError::Changed`]
//! rather than mixing old and new bytes.
//!
//! Mount options (all strings in the config):
//!
//! | option | schemes | default | meaning |
//! | --- | --- | --- | --- |
//! | `maxConcurrency` | all | 64 | requests in flight to this source |
//! | `requestTimeout` | all | 30s | bound on one request, retries included |
//! | `connectTimeout` | all | 5s | bound on one connection attempt |
//! | `maxRetries` | all | 5 | retries of a transient failure (5xx, reset, refused) |
//! | `listConcurrency` | all | 16 | prefixes listed at once |
//! | `endpoint` | s3, gs, az | provider's | e.g. `http://127.0.0.1:8333` |
//! | `region` | s3 | us-east-1 | |
//! | `pathStyle` | s3 | true | `false` = virtual-hosted-style requests |
//! | `allowHttp` | s3, gs, az, http | true for `http://` endpoints | permit plain HTTP |
//! | `skipSignature` | s3, gs, az | false | anonymous requests (public buckets) |
//! | `account` | az | from an `abfs://c@account…` URL | storage account |
//! | `useEmulator` | az | false | Azurite |
//!
//! Secret keys (`secretRefs[].key`): s3 `accessKeyId`, `secretAccessKey`, `sessionToken`;
//! gs `serviceAccountKey` (JSON), `bearerToken`; az `accessKey`, `bearerToken`;
//! http `bearerToken`. Without secrets the store's default chain applies (instance metadata).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, RetryConfig,
};
use tokio::sync::Semaphore;

use super::mount_point::{MountPoint, Scheme};
use super::s3_list::{ListerConfig, RawObject, S3Lister};
use super::{ObjectInfo, Source, SourceError, key};
use crate::config::MountSpec;
use crate::secret::{self, Secret};

/// Limits every request to the source obeys.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Requests in flight at once.
    pub max_concurrency: usize,
    /// Bound on one request, retries included.
    pub request_timeout: Duration,
    /// Bound on one connection attempt.
    pub connect_timeout: Duration,
    /// Retries of a transient failure.
    pub max_retries: usize,
    /// Prefixes listed at once.
    pub list_concurrency: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_concurrency: 64,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_retries: 5,
            list_concurrency: 16,
        }
    }
}

/// A source backed by an `object_store` store.
#[derive(Debug)]
pub struct ObjectSource {
    id: String,
    /// Where requests go, for messages (no credentials).
    endpoint: String,
    store: Arc<dyn ObjectStore>,
    /// Keys are listed under, and read relative to, this prefix.
    prefix: Option<Path>,
    permits: Semaphore,
    limits: RequestLimits,
    /// Our own ListObjectsV2 for S3 (see `s3_list`), when the credentials allow signing here.
    s3_list: Option<S3Lister>,
}

const COMMON_OPTIONS: &[&str] = &[
    "maxConcurrency",
    "requestTimeout",
    "connectTimeout",
    "maxRetries",
    "listConcurrency",
];

impl ObjectSource {
    /// Builds the source a mount describes: parses the mount point, checks the options and
    /// loads the secrets. Makes no request.
    pub fn from_spec(spec: &MountSpec) -> Result<ObjectSource, SourceError> {
        let mount = MountPoint::parse(&spec.mount_point).map_err(|detail| SourceError::Config {
            source_id: spec.mount_point.clone(),
            detail,
        })?;
        let opts = &spec.options;
        let scheme_options: &[&str] = match mount.scheme {
            Scheme::S3 => &[
                "endpoint",
                "region",
                "pathStyle",
                "allowHttp",
                "skipSignature",
            ],
            Scheme::Gcs => &["endpoint", "allowHttp", "skipSignature"],
            Scheme::Azure => &[
                "endpoint",
                "account",
                "allowHttp",
                "skipSignature",
                "useEmulator",
            ],
            Scheme::Http => &["allowHttp"],
            Scheme::File | Scheme::Hdfs => &[],
        };
        let config_err = |detail: String| SourceError::Config {
            source_id: spec.mount_point.clone(),
            detail,
        };
        for name in opts.keys() {
            if !COMMON_OPTIONS.contains(&name.as_str()) && !scheme_options.contains(&name.as_str())
            {
                let mut known: Vec<&str> = COMMON_OPTIONS.to_vec();
                known.extend_from_slice(scheme_options);
                return Err(config_err(format!(
                    "unknown option {name:?}; this scheme accepts {}",
                    known.join(", ")
                )));
            }
        }
        let limits = limits_from_options(opts).map_err(config_err)?;
        let mut secrets = BTreeMap::new();
        for r in &spec.secret_refs {
            let s = Secret::load(r).map_err(|e| config_err(e.to_string()))?;
            secrets.insert(r.key.clone(), s);
        }
        let allowed_secrets: &[&str] = match mount.scheme {
            Scheme::S3 => &["accessKeyId", "secretAccessKey", "sessionToken"],
            Scheme::Gcs => &["serviceAccountKey", "bearerToken"],
            Scheme::Azure => &["accessKey", "bearerToken"],
            Scheme::Http => &["bearerToken"],
            Scheme::File | Scheme::Hdfs => &[],
        };
        if let Some(k) = secrets
            .keys()
            .find(|k| !allowed_secrets.contains(&k.as_str()))
        {
            return Err(config_err(if allowed_secrets.is_empty() {
                format!("unknown secret key {k:?}; this scheme takes no secrets")
            } else {
                format!(
                    "unknown secret key {k:?}; this scheme accepts {}",
                    allowed_secrets.join(", ")
                )
            }));
        }

        let endpoint = opts.get("endpoint").cloned();
        if let Some(e) = &endpoint {
            register_url_credentials(e);
        }
        let allow_http = match opts.get("allowHttp") {
            Some(v) => parse_bool("allowHttp", v).map_err(config_err)?,
            None => {
                endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://"))
                    || spec.mount_point.starts_with("http://")
            }
        };
        let skip_signature = opts
            .get("skipSignature")
            .map(|v| parse_bool("skipSignature", v))
            .transpose()
            .map_err(config_err)?
            .unwrap_or(false);
        let client = ClientOptions::new()
            .with_allow_http(allow_http)
            .with_connect_timeout(limits.connect_timeout)
            // The overall deadline in `call` fires first; this only frees a connection that
            // something else forgot.
            .with_timeout(limits.request_timeout + Duration::from_secs(1));
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: limits.max_retries,
            retry_timeout: limits.request_timeout,
        };
        let secret = |k: &str| secrets.get(k).map(|s| s.expose().to_string());
        let build_err =
            |e: object_store::Error| config_err(secret::redact(&e.to_string()).into_owned());

        let mut s3_list = None;
        let prefix = match mount.prefix.as_str() {
            "" => None,
            p => Some(Path::parse(p).map_err(|e| config_err(format!("prefix {p:?}: {e}")))?),
        };
        let (id, shown_endpoint, store): (String, String, Arc<dyn ObjectStore>) = match mount.scheme
        {
            Scheme::S3 => {
                let region = opts
                    .get("region")
                    .cloned()
                    .unwrap_or_else(|| "us-east-1".into());
                let path_style = opts
                    .get("pathStyle")
                    .map(|v| parse_bool("pathStyle", v))
                    .transpose()
                    .map_err(config_err)?
                    .unwrap_or(true);
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(&mount.bucket)
                    .with_region(&region)
                    .with_virtual_hosted_style_request(!path_style)
                    .with_skip_signature(skip_signature)
                    .with_client_options(client.clone())
                    .with_retry(retry);
                if let Some(e) = &endpoint {
                    b = b.with_endpoint(e);
                }
                if let Some(v) = secret("accessKeyId") {
                    b = b.with_access_key_id(v);
                }
                if let Some(v) = secret("secretAccessKey") {
                    b = b.with_secret_access_key(v);
                }
                if let Some(v) = secret("sessionToken") {
                    b = b.with_token(v);
                }
                let shown = endpoint
                    .as_deref()
                    .map(display_url)
                    .unwrap_or_else(|| format!("s3.{region}.amazonaws.com"));
                let id = match &endpoint {
                    Some(e) => join_id("s3", &[&host_of(e), &mount.bucket, &mount.prefix]),
                    None => join_id("s3", &[&mount.bucket, &mount.prefix]),
                };
                // Static keys (or none at all) can sign our own listing requests; other
                // credential chains (instance metadata, web identity) stay with object_store.
                let credential = match (secret("accessKeyId"), secret("secretAccessKey")) {
                    (Some(key_id), Some(secret_key)) => Some(object_store::aws::AwsCredential {
                        key_id,
                        secret_key,
                        token: secret("sessionToken"),
                    }),
                    _ => None,
                };
                if credential.is_some() || skip_signature {
                    s3_list = Some(
                        S3Lister::new(ListerConfig {
                            endpoint: endpoint.as_deref(),
                            bucket: &mount.bucket,
                            region: &region,
                            path_style,
                            credential,
                            client: &client,
                            max_retries: limits.max_retries,
                            source_id: id.clone(),
                            shown_endpoint: shown.clone(),
                        })
                        .map_err(config_err)?,
                    );
                }
                (id, shown, Arc::new(b.build().map_err(build_err)?))
            }
            Scheme::Gcs => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::new()
                    .with_bucket_name(&mount.bucket)
                    .with_skip_signature(skip_signature)
                    .with_client_options(client)
                    .with_retry(retry);
                if let Some(e) = &endpoint {
                    b = b.with_base_url(e);
                }
                if let Some(v) = secret("serviceAccountKey") {
                    b = b.with_service_account_key(v);
                }
                if let Some(v) = secret("bearerToken") {
                    b = b.with_bearer_token(v);
                }
                let shown = endpoint
                    .as_deref()
                    .map(display_url)
                    .unwrap_or_else(|| "storage.googleapis.com".into());
                let id = match &endpoint {
                    Some(e) => join_id("gs", &[&host_of(e), &mount.bucket, &mount.prefix]),
                    None => join_id("gs", &[&mount.bucket, &mount.prefix]),
                };
                (id, shown, Arc::new(b.build().map_err(build_err)?))
            }
            Scheme::Azure => {
                let account = opts.get("account").cloned().or(mount.account.clone());
                let use_emulator = opts
                    .get("useEmulator")
                    .map(|v| parse_bool("useEmulator", v))
                    .transpose()
                    .map_err(config_err)?
                    .unwrap_or(false);
                let mut b = object_store::azure::MicrosoftAzureBuilder::new()
                    .with_container_name(&mount.bucket)
                    .with_use_emulator(use_emulator)
                    .with_allow_http(allow_http)
                    .with_skip_signature(skip_signature)
                    .with_client_options(client)
                    .with_retry(retry);
                if let Some(a) = &account {
                    b = b.with_account(a);
                }
                if let Some(e) = &endpoint {
                    b = b.with_endpoint(e.clone());
                }
                if let Some(v) = secret("accessKey") {
                    b = b.with_access_key(v);
                }
                if let Some(v) = secret("bearerToken") {
                    b = b.with_bearer_token_authorization(v);
                }
                let acct = account.clone().unwrap_or_default();
                let shown = endpoint
                    .as_deref()
                    .map(display_url)
                    .unwrap_or_else(|| format!("{acct}.blob.core.windows.net"));
                let id = match &endpoint {
                    Some(e) => join_id("az", &[&host_of(e), &acct, &mount.bucket, &mount.prefix]),
                    None => join_id("az", &[&acct, &mount.bucket, &mount.prefix]),
                };
                (id, shown, Arc::new(b.build().map_err(build_err)?))
            }
            Scheme::Http => {
                register_url_credentials(&mount.bucket);
                let mut client = client;
                if let Some(token) = secret("bearerToken") {
                    let mut headers = object_store::HeaderMap::new();
                    let mut v = object_store::HeaderValue::from_str(&format!("Bearer {token}"))
                        .map_err(|_| {
                            config_err("secret bearerToken is not a valid header value".into())
                        })?;
                    v.set_sensitive(true);
                    headers.insert("authorization", v);
                    client = client.with_default_headers(headers);
                }
                let b = object_store::http::HttpBuilder::new()
                    .with_url(&mount.bucket)
                    .with_client_options(client)
                    .with_retry(retry);
                let shown = display_url(&mount.bucket);
                (
                    shown.clone(),
                    shown,
                    Arc::new(b.build().map_err(build_err)?),
                )
            }
            Scheme::File => {
                let store = object_store::local::LocalFileSystem::new_with_prefix(&mount.prefix)
                    .map_err(|e| {
                        config_err(format!(
                            "{}: {}",
                            mount.prefix,
                            secret::redact(&e.to_string())
                        ))
                    })?;
                let id = format!("file://{}", mount.prefix);
                return Ok(ObjectSource::from_store(
                    id.clone(),
                    id,
                    Arc::new(store),
                    None,
                    limits,
                ));
            }
            Scheme::Hdfs => {
                return Err(config_err(
                    "hdfs mounts are accepted by this build but not served yet".into(),
                ));
            }
        };
        let mut source = ObjectSource::from_store(id, shown_endpoint, store, prefix, limits);
        source.s3_list = s3_list;
        Ok(source)
    }

    /// Wraps an already built store (tests, benchmarks, stores the config cannot describe).
    pub fn from_store(
        id: String,
        endpoint: String,
        store: Arc<dyn ObjectStore>,
        prefix: Option<Path>,
        limits: RequestLimits,
    ) -> ObjectSource {
        let permits = Semaphore::new(limits.max_concurrency.max(1));
        ObjectSource {
            id,
            endpoint,
            store,
            prefix,
            permits,
            limits,
            s3_list: None,
        }
    }

    /// The limits this source applies.
    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// Runs one request under a concurrency permit and the overall deadline.
    async fn call<T>(
        &self,
        what: &str,
        key: &str,
        request: impl Future<Output = Result<T, SourceError>>,
    ) -> Result<T, SourceError> {
        let started = Instant::now();
        let timed_out = |started: Instant| SourceError::Timeout {
            source_id: self.id.clone(),
            what: format!("{what} {key}"),
            secs: started.elapsed().as_secs_f64(),
        };
        // Waiting for a permit counts against the deadline: the reader sees the same bound.
        let result = tokio::time::timeout(self.limits.request_timeout, async {
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            request.await
        })
        .await;
        result.unwrap_or_else(|_| Err(timed_out(started)))
    }

    /// The store's path of a listed key.
    fn location(&self, key: &str) -> Path {
        // `parse` keeps the key as listed (no re-encoding); listed keys passed the safe-path
        // check, which is stricter than `parse`.
        let full = match &self.prefix {
            Some(p) => format!("{p}/{key}"),
            None => key.to_string(),
        };
        Path::parse(&full).unwrap_or_else(|_| Path::from_iter(full.split('/')))
    }

    /// Turns a store error into a [`SourceError`], scrubbing secrets from its text.
    fn classify(&self, key: &str, err: object_store::Error) -> SourceError {
        let source_id = self.id.clone();
        let detail = secret::error_chain(&err);
        tracing::debug!(source = %source_id, key, error = %detail, "store request failed");
        match err {
            object_store::Error::NotFound { .. } => SourceError::NotFound {
                source_id,
                key: key.to_string(),
            },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => {
                SourceError::Unauthorized { source_id, detail }
            }
            // Listing errors arrive as `Generic` with the HTTP status only in the text.
            ref e if detail.contains("401 Unauthorized") || detail.contains("403 Forbidden") => {
                let _ = e;
                SourceError::Unauthorized { source_id, detail }
            }
            ref e => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
                while let Some(c) = cause {
                    if let Some(h) = c.downcast_ref::<object_store::client::HttpError>() {
                        match h.kind() {
                            object_store::client::HttpErrorKind::Connect => {
                                return SourceError::Unreachable {
                                    source_id,
                                    endpoint: self.endpoint.clone(),
                                    detail,
                                };
                            }
                            object_store::client::HttpErrorKind::Timeout => {
                                return SourceError::Timeout {
                                    source_id,
                                    what: format!("request for {key}"),
                                    secs: self.limits.request_timeout.as_secs_f64(),
                                };
                            }
                            _ => {}
                        }
                    }
                    if let Some(io) = c.downcast_ref::<std::io::Error>()
                        && io.kind() == std::io::ErrorKind::ConnectionRefused
                    {
                        return SourceError::Unreachable {
                            source_id,
                            endpoint: self.endpoint.clone(),
                            detail,
                        };
                    }
                    cause = c.source();
                }
                SourceError::Other { source_id, detail }
            }
        }
    }

    /// Every object under `prefix` (recursively), page by page, each page under the deadline.
    async fn list_prefix(&self, prefix: Path) -> Result<Vec<ObjectMeta>, SourceError> {
        let what = prefix.to_string();
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let mut stream = self.store.list(Some(&prefix));
        let mut out = Vec::new();
        loop {
            let started = Instant::now();
            match tokio::time::timeout(self.limits.request_timeout, stream.next()).await {
                Err(_) => {
                    return Err(SourceError::Timeout {
                        source_id: self.id.clone(),
                        what: format!("listing {what}"),
                        secs: started.elapsed().as_secs_f64(),
                    });
                }
                Ok(None) => return Ok(out),
                Ok(Some(item)) => out.push(item.map_err(|e| self.classify(&what, e))?),
            }
        }
    }

    /// Every page under `prefix` through our own S3 listing, each page under the deadline.
    async fn list_raw_prefix(
        &self,
        lister: &S3Lister,
        prefix: String,
        delimited: bool,
    ) -> Result<(Vec<RawObject>, Vec<String>), SourceError> {
        let mut objects = Vec::new();
        let mut prefixes = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .call(
                    "listing",
                    &prefix,
                    lister.page(&prefix, delimited, token.as_deref()),
                )
                .await?;
            objects.extend(page.objects);
            prefixes.extend(page.prefixes);
            match page.next {
                Some(t) => token = Some(t),
                None => return Ok((objects, prefixes)),
            }
        }
    }

    /// [`Source::list`] through [`S3Lister`]: raw keys, so hostile ones are skipped alone.
    async fn list_raw(&self, lister: &S3Lister) -> Result<Vec<ObjectInfo>, SourceError> {
        let base = match &self.prefix {
            Some(p) => format!("{p}/"),
            None => String::new(),
        };
        let (mut raw, prefixes) = self.list_raw_prefix(lister, base.clone(), true).await?;
        let nested: Vec<(Vec<RawObject>, Vec<String>)> = futures::stream::iter(prefixes)
            .map(|p| self.list_raw_prefix(lister, p, false))
            .buffer_unordered(self.limits.list_concurrency.max(1))
            .try_collect()
            .await?;
        raw.extend(nested.into_iter().flat_map(|(o, _)| o));
        let objects = raw
            .into_iter()
            .filter_map(|o| {
                let key = o.key.strip_prefix(&base)?.to_string();
                Some(ObjectInfo {
                    key,
                    size: o.size,
                    version: o.etag,
                    modified: o.modified,
                })
            })
            .collect();
        Ok(key::clean_listing(&self.id, objects))
    }

    /// The key of `meta` relative to the mount's prefix.
    fn relative_key(&self, meta: &ObjectMeta) -> Option<String> {
        let full = meta.location.as_ref();
        match &self.prefix {
            None => Some(full.to_string()),
            Some(p) => full
                .strip_prefix(p.as_ref())?
                .strip_prefix('/')
                .map(str::to_string),
        }
    }
}

#[async_trait]
impl Source for ObjectSource {
    fn id(&self) -> &str {
        &self.id
    }

    async fn list(&self) -> Result<Vec<ObjectInfo>, SourceError> {
        if let Some(lister) = &self.s3_list {
            return self.list_raw(lister).await;
        }
        // One delimiter listing splits the tree into top-level prefixes, which are then
        // listed in parallel: a flat listing of millions of keys is one slow page chain.
        let top = self
            .call("listing", "/", async {
                self.store
                    .list_with_delimiter(self.prefix.as_ref())
                    .await
                    .map_err(|e| self.classify("/", e))
            })
            .await?;
        let mut metas = top.objects;
        let nested: Vec<Vec<ObjectMeta>> = futures::stream::iter(top.common_prefixes)
            .map(|p| self.list_prefix(p))
            .buffer_unordered(self.limits.list_concurrency.max(1))
            .try_collect()
            .await?;
        metas.extend(nested.into_iter().flatten());
        let objects = metas
            .into_iter()
            .filter_map(|m| {
                let key = self.relative_key(&m)?;
                Some(ObjectInfo {
                    key,
                    size: m.size,
                    version: m.e_tag.or(m.version),
                    modified: m.last_modified.timestamp(),
                })
            })
            .collect();
        Ok(key::clean_listing(&self.id, objects))
    }

    async fn read(&self, object: &ObjectInfo, range: Range<u64>) -> Result<Bytes, SourceError> {
        if range.start >= range.end {
            return Ok(Bytes::new());
        }
        let location = self.location(&object.key);
        let options = GetOptions {
            if_match: object.version.clone(),
            range: Some(GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let changed = || SourceError::Changed {
            source_id: self.id.clone(),
            key: object.key.clone(),
            expected: object.version.clone().unwrap_or_default(),
        };
        self.call("read", &object.key, async {
            let result = match self.store.get_opts(&location, options).await {
                Ok(r) => r,
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::NotModified { .. },
                ) => return Err(changed()),
                Err(e) => return Err(self.classify(&object.key, e)),
            };
            // Some stores ignore If-Match on ranged GETs; the answer's ETag tells the truth.
            if let (Some(want), Some(got)) = (&object.version, &result.meta.e_tag)
                && want != got
            {
                return Err(changed());
            }
            result
                .bytes()
                .await
                .map_err(|e| self.classify(&object.key, e))
        })
        .await
    }
}

/// Reads the common request options.
pub(super) fn limits_from_options(
    opts: &BTreeMap<String, String>,
) -> Result<RequestLimits, String> {
    let mut l = RequestLimits::default();
    if let Some(v) = opts.get("maxConcurrency") {
        l.max_concurrency = parse_count("maxConcurrency", v)?;
    }
    if let Some(v) = opts.get("listConcurrency") {
        l.list_concurrency = parse_count("listConcurrency", v)?;
    }
    if let Some(v) = opts.get("maxRetries") {
        l.max_retries = v
            .trim()
            .parse()
            .map_err(|_| format!("maxRetries: expected a number, got {v:?}"))?;
    }
    if let Some(v) = opts.get("requestTimeout") {
        l.request_timeout = parse_duration(v).map_err(|e| format!("requestTimeout: {e}"))?;
    }
    if let Some(v) = opts.get("connectTimeout") {
        l.connect_timeout = parse_duration(v).map_err(|e| format!("connectTimeout: {e}"))?;
    }
    Ok(l)
}

fn parse_count(name: &str, v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{name}: expected a positive number, got {v:?}")),
    }
}

fn parse_bool(name: &str, v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{name}: expected true or false, got {v:?}")),
    }
}

/// `30s`, `500ms`, `2m`, `1h`, or a plain number of seconds.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let s = v.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {v:?}: expected e.g. 30s, 500ms, 2m"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration {v:?}: expected e.g. 30s, 500ms, 2m"
            ));
        }
    };
    if secs <= 0.0 {
        return Err(format!("invalid duration {v:?}: must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A URL fit for messages: no userinfo, no query (either may carry a credential).
fn display_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest
        .split_once('/')
        .map(|(a, p)| (a, format!("/{p}")))
        .unwrap_or((rest, String::new()));
    let host = authority
        .rsplit_once('@')
        .map(|(_, h)| h)
        .unwrap_or(authority);
    let path = path.trim_end_matches('/');
    if scheme.is_empty() {
        format!("{host}{path}")
    } else {
        format!("{scheme}://{host}{path}")
    }
}

/// `host[:port]` of a URL, without userinfo.
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .map(|(_, h)| h)
        .unwrap_or(authority)
        .to_string()
}

/// Puts a password or token found in a URL (userinfo or query values) on the redaction
/// list: endpoints are config, not secrets, but people paste presigned URLs.
fn register_url_credentials(url: &str) {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        let password = userinfo.split_once(':').map(|(_, p)| p).unwrap_or(userinfo);
        secret::register(password);
    }
    if let Some((_, query)) = rest.split_once('?') {
        for pair in query.split('&') {
            if let Some((_, value)) = pair.split_once('=') {
                secret::register(value);
            }
        }
    }
}

fn join_id(scheme: &str, parts: &[&str]) -> String {
    let parts: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    format!("{scheme}://{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_in_messages_carry_no_credentials() {
        assert_eq!(
            display_url("http://user:pw@host:1/a/?sig=x"),
            "http://host:1/a"
        );
        assert_eq!(host_of("https://u:p@h:9/x"), "h:9");
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("5 parsecs").is_err());
    }
}
