//! Parsing a mount point URL (`s3://bucket/prefix`, `file:///data`, …) into its scheme,
//! bucket and prefix.

/// Where a mount's objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    S3,
    Gcs,
    Azure,
    Http,
    File,
    Hdfs,
}

/// The schemes this build accepts, as a user would write them.
pub fn supported_schemes() -> &'static str {
    if cfg!(feature = "hdfs") {
        "s3, gs, az (or azure, abfs), http, https, file, hdfs"
    } else {
        "s3, gs, az (or azure, abfs), http, https, file (hdfs needs a build with the `hdfs` feature)"
    }
}

/// A parsed mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint {
    pub scheme: Scheme,
    /// Bucket or container (`account` too for `abfs://container@account…`); for http(s)
    /// the base URL; for hdfs the name node authority; empty for file.
    pub bucket: String,
    /// Path under the bucket, without leading or trailing `/`; for file the absolute path.
    pub prefix: String,
    /// Azure storage account from an `abfs://container@account.dfs.core.windows.net` URL.
    pub account: Option<String>,
}

impl MountPoint {
    /// Parses `url`; the error is a sentence for the user.
    pub fn parse(url: &str) -> Result<MountPoint, String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(format!(
                "mount point {url:?} has no scheme: expected one of {}, e.g. s3://bucket/prefix",
                supported_schemes()
            ));
        };
        let scheme_lc = scheme.to_ascii_lowercase();
        let scheme = match scheme_lc.as_str() {
            "s3" | "s3a" => Scheme::S3,
            "gs" | "gcs" => Scheme::Gcs,
            "az" | "azure" | "abfs" | "abfss" => Scheme::Azure,
            "http" | "https" => Scheme::Http,
            "file" => Scheme::File,
            "hdfs" if cfg!(feature = "hdfs") => Scheme::Hdfs,
            _ => {
                return Err(format!(
                    "unknown scheme {scheme:?} in mount point {url:?}: supported are {}",
                    supported_schemes()
                ));
            }
        };
        match scheme {
            Scheme::File => {
                if !rest.starts_with('/') {
                    return Err(format!(
                        "mount point {url:?}: file URLs need an absolute path, e.g. file:///data/set"
                    ));
                }
                Ok(MountPoint {
                    scheme,
                    bucket: String::new(),
                    prefix: rest.trim_end_matches('/').to_string(),
                    account: None,
                })
            }
            Scheme::Http => {
                // The whole URL is the store's base; keys are relative to it.
                Ok(MountPoint {
                    scheme,
                    bucket: url.trim_end_matches('/').to_string(),
                    prefix: String::new(),
                    account: None,
                })
            }
            _ => {
                let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
                if authority.is_empty() {
                    return Err(format!(
                        "mount point {url:?} names no bucket, e.g. {scheme_lc}://bucket/prefix"
                    ));
                }
                let (bucket, account) = match (scheme, authority.split_once('@')) {
                    (Scheme::Azure, Some((container, host))) => (
                        container.to_string(),
                        Some(host.split('.').next().unwrap_or(host).to_string()),
                    ),
                    _ => (authority.to_string(), None),
                };
                let prefix = path.trim_matches('/').to_string();
                if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
                    return Err(format!(
                        "mount point {url:?}: the prefix may not contain '.', '..' or empty components"
                    ));
                }
                Ok(MountPoint {
                    scheme,
                    bucket,
                    prefix,
                    account,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        let m = MountPoint::parse("s3://bkt/a/b/").unwrap();
        assert_eq!(
            (m.scheme, m.bucket.as_str(), m.prefix.as_str()),
            (Scheme::S3, "bkt", "a/b")
        );
        let m = MountPoint::parse("abfs://cont@acct.dfs.core.windows.net/p").unwrap();
        assert_eq!(
            (m.bucket.as_str(), m.account.as_deref()),
            ("cont", Some("acct"))
        );
        assert_eq!(
            MountPoint::parse("file:///data/x/").unwrap().prefix,
            "/data/x"
        );
        let err = MountPoint::parse("ftp://x/y").unwrap_err();
        assert!(err.contains("s3, gs, az"), "{err}");
    }
}
