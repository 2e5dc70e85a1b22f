//! ListObjectsV2 done here rather than by object_store, for S3 mounts with static or no
//! credentials.
//!
//! object_store turns every listed key into a `Path` and fails the whole page when one key
//! is not a valid path (`a/../b`, `a//b`, a NUL): one hostile key would hide a whole
//! directory, or the whole mount. Here keys come back raw (`encoding-type=url`, so even a
//! NUL survives the XML) and the listing clean-up skips the bad ones with a warning.

use std::time::Duration;

use object_store::ClientOptions;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{HttpClient, HttpConnector, HttpErrorKind, ReqwestConnector};
use serde::Deserialize;

use super::SourceError;
use crate::secret;

/// One listed object, key relative to the bucket and not yet checked.
#[derive(Debug)]
pub struct RawObject {
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
    pub modified: i64,
}

/// One page of a listing.
#[derive(Debug, Default)]
pub struct Page {
    pub objects: Vec<RawObject>,
    pub prefixes: Vec<String>,
    pub next: Option<String>,
}

/// Signs and sends ListObjectsV2 requests for one bucket.
#[derive(Debug)]
pub struct S3Lister {
    client: HttpClient,
    /// `https://host/bucket` (path style) or `https://bucket.host` (virtual host), no `/`.
    bucket_url: String,
    region: String,
    credential: Option<AwsCredential>,
    max_retries: usize,
    /// For messages.
    source_id: String,
    endpoint: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListBucketResult {
    #[serde(default)]
    contents: Vec<Contents>,
    #[serde(default)]
    common_prefixes: Vec<CommonPrefix>,
    #[serde(default)]
    next_continuation_token: Option<String>,
    #[serde(default)]
    encoding_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Contents {
    key: String,
    size: u64,
    #[serde(default)]
    last_modified: Option<String>,
    #[serde(rename = "ETag", default)]
    e_tag: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CommonPrefix {
    prefix: String,
}

/// Settings of an [`S3Lister`].
pub struct ListerConfig<'a> {
    pub endpoint: Option<&'a str>,
    pub bucket: &'a str,
    pub region: &'a str,
    pub path_style: bool,
    pub credential: Option<AwsCredential>,
    pub client: &'a ClientOptions,
    pub max_retries: usize,
    pub source_id: String,
    pub shown_endpoint: String,
}

impl S3Lister {
    pub fn new(c: ListerConfig<'_>) -> Result<S3Lister, String> {
        let client = ReqwestConnector::default()
            .connect(c.client)
            .map_err(|e| e.to_string())?;
        let host = c
            .endpoint
            .map(|e| e.trim_end_matches('/').to_string())
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", c.region));
        let bucket_url = if c.path_style {
            format!("{host}/{}", c.bucket)
        } else {
            let (scheme, rest) = host.split_once("://").unwrap_or(("https", &host));
            format!("{scheme}://{}.{rest}", c.bucket)
        };
        Ok(S3Lister {
            client,
            bucket_url,
            region: c.region.to_string(),
            credential: c.credential,
            max_retries: c.max_retries,
            source_id: c.source_id,
            endpoint: c.shown_endpoint,
        })
    }

    /// One page of keys under `prefix` (raw, e.g. `ds/`), with `/` as delimiter if asked.
    pub async fn page(
        &self,
        prefix: &str,
        delimited: bool,
        token: Option<&str>,
    ) -> Result<Page, SourceError> {
        let mut query = vec![
            ("list-type", "2".to_string()),
            ("encoding-type", "url".to_string()),
        ];
        if !prefix.is_empty() {
            query.push(("prefix", prefix.to_string()));
        }
        if delimited {
            query.push(("delimiter", "/".to_string()));
        }
        if let Some(t) = token {
            query.push(("continuation-token", t.to_string()));
        }
        let query: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        let url = format!("{}?{}", self.bucket_url, query.join("&"));
        let mut attempt = 0;
        loop {
            match self.send(&url).await {
                Ok(body) => return self.parse(&body),
                Err((retryable, err)) if retryable && attempt < self.max_retries => {
                    attempt += 1;
                    tracing::debug!(source = %self.source_id, attempt, error = %err, "listing page failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50 << attempt.min(6))).await;
                }
                Err((_, err)) => return Err(err),
            }
        }
    }

    /// Sends one signed GET; the error says whether a retry may help.
    async fn send(&self, url: &str) -> Result<Vec<u8>, (bool, SourceError)> {
        let mut request = http::Request::builder()
            .method("GET")
            .uri(url)
            .body(Vec::<u8>::new().into())
            .map_err(|e| (false, self.other(e.to_string())))?;
        if let Some(cred) = &self.credential {
            AwsAuthorizer::new(cred, "s3", &self.region)
                .try_authorize(&mut request, None)
                .map_err(|e| (false, self.other(e.to_string())))?;
        }
        let response = match self.client.execute(request).await {
            Ok(r) => r,
            Err(e) => {
                let detail = secret::error_chain(&e);
                tracing::debug!(source = %self.source_id, error = %detail, "store request failed");
                return Err(match e.kind() {
                    HttpErrorKind::Connect => (
                        true,
                        SourceError::Unreachable {
                            source_id: self.source_id.clone(),
                            endpoint: self.endpoint.clone(),
                            detail,
                        },
                    ),
                    _ => (true, self.other(detail)),
                });
            }
        };
        let status = response.status();
        let body = response
            .into_body()
            .bytes()
            .await
            .map_err(|e| (true, self.other(e.to_string())))?;
        if status.is_success() {
            return Ok(body.to_vec());
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
        let detail =
            secret::redact(&format!("listing failed with HTTP {status}: {text}")).into_owned();
        tracing::debug!(source = %self.source_id, error = %detail, "store request failed");
        Err(match status.as_u16() {
            401 | 403 => (
                false,
                SourceError::Unauthorized {
                    source_id: self.source_id.clone(),
                    detail,
                },
            ),
            s => (s >= 500 || s == 429, self.other(detail)),
        })
    }

    fn parse(&self, body: &[u8]) -> Result<Page, SourceError> {
        let text = std::str::from_utf8(body)
            .map_err(|_| self.other("listing response is not UTF-8".into()))?;
        let result: ListBucketResult = quick_xml::de::from_str(text)
            .map_err(|e| self.other(format!("cannot parse listing response: {e}")))?;
        let encoded = result.encoding_type.as_deref() == Some("url");
        let decode_key = |k: String| if encoded { decode(&k) } else { k };
        Ok(Page {
            objects: result
                .contents
                .into_iter()
                .map(|c| RawObject {
                    key: decode_key(c.key),
                    size: c.size,
                    etag: c.e_tag,
                    modified: c
                        .last_modified
                        .and_then(|m| chrono::DateTime::parse_from_rfc3339(&m).ok())
                        .map(|t| t.timestamp())
                        .unwrap_or(0),
                })
                .collect(),
            prefixes: result
                .common_prefixes
                .into_iter()
                .map(|p| decode_key(p.prefix))
                .collect(),
            next: result.next_continuation_token,
        })
    }

    fn other(&self, detail: String) -> SourceError {
        SourceError::Other {
            source_id: self.source_id.clone(),
            detail: secret::redact(&detail).into_owned(),
        }
    }
}

/// RFC 3986 encoding for query values (what SigV4's canonical query expects).
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Undoes `encoding-type=url` (form encoding: `+` is a space).
fn decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_round_trips_hostile_keys() {
        assert_eq!(decode("a%2F..%2Fb+c%00d%"), "a/../b c\0d%");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }
}
