//! Credentials: loaded from an environment variable or a file named by a [`SecretRef`],
//! never printed, and scrubbed from any message the agent builds from a store's error.
//!
//! Every loaded value goes on a process-wide list; [`redact`] replaces each listed value
//! (and its percent-encoded form, as it would appear in a URL) with `***`. Values shorter
//! than [`MIN_REDACTED_LEN`] bytes are not listed: replacing every `a` in a message would
//! make it unreadable, and such a short credential is not a real one.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, RwLock};

use crate::config::SecretRef;

/// Shorter values are not added to the redaction list (see the module doc).
pub const MIN_REDACTED_LEN: usize = 4;

/// What replaces a secret in any output.
pub const MASK: &str = "***";

/// A credential value. `Debug` and `Display` print `***`; use [`Secret::expose`] to hand it
/// to a store builder.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps a value and adds it to the redaction list.
    pub fn new(value: impl Into<String>) -> Secret {
        let value: String = value.into();
        register(&value);
        Secret(value.into())
    }

    /// Reads the value named by `reference` from its environment variable or file.
    pub fn load(reference: &SecretRef) -> Result<Secret, SecretError> {
        Self::load_with(reference, |name| std::env::var_os(name))
    }

    /// Like [`Secret::load`], with `env` in place of the process environment (for tests).
    pub fn load_with(
        reference: &SecretRef,
        env: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Secret, SecretError> {
        let key = reference.key.clone();
        let value = match (&reference.env, &reference.file) {
            (Some(var), None) => {
                let raw = env(var).ok_or_else(|| SecretError::EnvMissing {
                    key: key.clone(),
                    var: var.clone(),
                })?;
                raw.into_string().map_err(|_| SecretError::NotUtf8 {
                    key: key.clone(),
                    from: format!("environment variable {var}"),
                })?
            }
            (None, Some(path)) => {
                let bytes = std::fs::read(path).map_err(|source| SecretError::File {
                    key: key.clone(),
                    path: path.clone(),
                    source,
                })?;
                let text = String::from_utf8(bytes).map_err(|_| SecretError::NotUtf8 {
                    key: key.clone(),
                    from: format!("file {}", path.display()),
                })?;
                // Files written by `echo` or Kubernetes secret volumes often end in a newline.
                text.trim_end_matches(['\n', '\r']).to_string()
            }
            (Some(_), Some(_)) | (None, None) => return Err(SecretError::Ambiguous { key }),
        };
        if value.trim().is_empty() {
            let from = match (&reference.env, &reference.file) {
                (Some(var), _) => format!("environment variable {var}"),
                (_, Some(path)) => format!("file {}", path.display()),
                _ => unreachable!("checked above"),
            };
            return Err(SecretError::Empty { key, from });
        }
        Ok(Secret::new(value))
    }

    /// The value itself, for handing to a client library. Never format it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(MASK)
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(MASK)
    }
}

/// Why a secret could not be loaded. Names the reference, never the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {key}: environment variable {var} is not set")]
    EnvMissing { key: String, var: String },
    #[error("secret {key}: cannot read file {path}: {source}")]
    File {
        key: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("secret {key}: {from} is empty")]
    Empty { key: String, from: String },
    #[error("secret {key}: {from} is not valid UTF-8")]
    NotUtf8 { key: String, from: String },
    #[error("secret {key}: give exactly one of `env` or `file`")]
    Ambiguous { key: String },
}

/// Every registered secret value, with its percent-encoded form when that differs.
static REDACTED: LazyLock<RwLock<Vec<String>>> = LazyLock::new(|| RwLock::new(Vec::new()));

/// Adds `value` to the redaction list (done by [`Secret::new`]; exposed for values that
/// arrive some other way, such as a token embedded in an endpoint URL).
pub fn register(value: &str) {
    if value.len() < MIN_REDACTED_LEN {
        return;
    }
    let mut list = REDACTED.write().unwrap_or_else(|e| e.into_inner());
    for form in [value.to_string(), percent_encode(value)] {
        if !list.contains(&form) {
            list.push(form);
        }
    }
    // Longest first, so a secret that contains another is masked whole.
    list.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` with every registered secret value replaced by `***`.
pub fn redact(text: &str) -> Cow<'_, str> {
    let list = REDACTED.read().unwrap_or_else(|e| e.into_inner());
    let mut out = Cow::Borrowed(text);
    for secret in list.iter() {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), MASK));
        }
    }
    out
}

/// `err` and its chain of causes as one redacted line (`a: b: c`), skipping a cause whose
/// text its parent already includes: client errors hide the useful part ("Connection
/// refused") several sources deep.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    redact(&out).into_owned()
}

/// A `tracing_subscriber` writer that passes every log line through [`redact`]: client
/// libraries log request errors (URLs, headers) that the agent cannot scrub at the source.
/// Install it with `tracing_subscriber::fmt().with_writer(RedactingWriter::new(std::io::stderr))`.
#[derive(Debug, Clone)]
pub struct RedactingWriter<M> {
    inner: M,
}

impl<M> RedactingWriter<M> {
    /// Wraps a `MakeWriter` (a function returning an `io::Write`, or a subscriber writer).
    pub fn new(inner: M) -> Self {
        RedactingWriter { inner }
    }
}

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for RedactingWriter<M>
{
    type Writer = RedactingLine<M::Writer>;
    fn make_writer(&'a self) -> Self::Writer {
        RedactingLine {
            inner: self.inner.make_writer(),
            buf: Vec::new(),
        }
    }
}

/// One event's output, buffered so a secret split across `write` calls is still found.
#[derive(Debug)]
pub struct RedactingLine<W: std::io::Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: std::io::Write> std::io::Write for RedactingLine<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let text = String::from_utf8_lossy(&self.buf);
            self.inner.write_all(redact(&text).as_bytes())?;
            self.buf.clear();
        }
        self.inner.flush()
    }
}

impl<W: std::io::Write> Drop for RedactingLine<W> {
    fn drop(&mut self) {
        // The fmt layer drops the writer after each event without flushing it.
        let _ = std::io::Write::flush(self);
    }
}

/// RFC 3986 percent-encoding of everything but unreserved characters: how a secret shows
/// up in a URL query or userinfo.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_value() {
        let s = Secret::new("hunter2-very-secret");
        assert_eq!(format!("{s:?} {s}"), "*** ***");
        assert_eq!(redact("token=hunter2-very-secret&x=1"), "token=***&x=1");
        assert_eq!(
            redact("token=hunter2%2Dvery-secret").as_ref(),
            "token=hunter2%2Dvery-secret"
        );
        Secret::new("a/b+c=");
        assert_eq!(redact("k=a%2Fb%2Bc%3D"), "k=***");
    }
}
