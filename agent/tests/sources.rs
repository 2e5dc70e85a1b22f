//! Sources against real stores (SeaweedFS, moto) and broken ones (a refused port, a proxy
//! that stalls): what a user of a mount would notice.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::config::{DatasetSpec, MountSpec, SecretRef};
use sluice::dataset::{Dataset, ReadError};
use sluice::source::{self, ObjectInfo, SourceError};
use sluice_cache_engine::{Cache, CacheBuilder};
use support::{MotoServer, SeaweedFs, StallProxy};

const BLOCK: u64 = 64 << 10;

/// Secret files for a mount, kept alive as long as the mount is used.
struct Secrets {
    dir: tempfile::TempDir,
}

impl Secrets {
    fn new() -> Secrets {
        Secrets {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, key: &str, value: &str) -> SecretRef {
        let path = self.dir.path().join(key);
        std::fs::write(&path, format!("{value}\n")).unwrap();
        SecretRef {
            key: key.into(),
            env: None,
            file: Some(path),
        }
    }
}

fn mount(mount_point: &str, options: &[(&str, &str)], secret_refs: Vec<SecretRef>) -> MountSpec {
    MountSpec {
        mount_point: mount_point.into(),
        name: String::new(),
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        secret_refs,
    }
}

fn s3_mount(s3: &SeaweedFs, secrets: &Secrets, url: &str, extra: &[(&str, &str)]) -> MountSpec {
    let endpoint = s3.endpoint();
    let mut options = vec![("endpoint", endpoint.as_str())];
    options.extend_from_slice(extra);
    mount(
        url,
        &options,
        vec![
            secrets.file("accessKeyId", s3.access_key()),
            secrets.file("secretAccessKey", s3.secret_key()),
        ],
    )
}

fn dataset_spec(name: &str, mounts: Vec<MountSpec>) -> DatasetSpec {
    let yaml = format!(
        "apiVersion: sluice.io/v1alpha1\nkind: Dataset\nmetadata: {{ name: {name} }}\nspec:\n  mounts: []\n"
    );
    let mut spec: DatasetSpec = serde_yaml::from_str(&yaml).unwrap();
    spec.spec.mounts = mounts;
    spec
}

fn cache() -> Cache {
    CacheBuilder::new()
        .memory_capacity(256 << 20)
        .max_value_size(BLOCK)
        .open()
        .unwrap()
}

/// Deterministic, position-dependent bytes, different per `seed`.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn find<'a>(objects: &'a [ObjectInfo], key: &str) -> &'a ObjectInfo {
    objects
        .iter()
        .find(|o| o.key == key)
        .unwrap_or_else(|| panic!("{key} not listed in {objects:?}"))
}

fn source_error(e: &ReadError) -> &SourceError {
    match e {
        ReadError::Source { source, .. } => source,
        other => panic!("expected a source error, got {other}"),
    }
}

#[tokio::test]
async fn every_object_of_a_generated_dataset_reads_back_byte_for_byte() {
    let Some(s3) = SeaweedFs::start() else { return };
    s3.create_bucket("data").await;
    let sizes = [0usize, 1, 1000, 65_535, 65_536, 65_537, 200_000, 3 * 65_536];
    let mut expected = BTreeMap::new();
    for (i, size) in sizes.iter().enumerate() {
        let key = format!("train/class{}/img{i}.bin", i % 3);
        expected.insert(key.clone(), content(i as u64, *size));
    }
    expected.insert("README".into(), b"top-level file".to_vec());
    expected.insert("val/deep/er/still/x.bin".into(), content(99, 70_000));
    for (key, bytes) in &expected {
        s3.put("data", &format!("ds/{key}"), bytes.clone()).await;
    }
    // Outside the mount's prefix, and a sibling prefix that shares its first letters.
    s3.put("data", "other/x.bin", b"not mine".to_vec()).await;
    s3.put("data", "dsx/y.bin", b"not mine either".to_vec())
        .await;

    let secrets = Secrets::new();
    let spec = dataset_spec(
        "generated",
        vec![s3_mount(&s3, &secrets, "s3://data/ds", &[])],
    );
    let cache = cache();
    let dataset = Dataset::open(&spec, &cache, BLOCK).unwrap();
    let objects = dataset.mounts[0].source.list().await.unwrap();
    let keys: Vec<&str> = objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(
        keys,
        expected.keys().map(String::as_str).collect::<Vec<_>>()
    );

    for object in &objects {
        let want = &expected[&object.key];
        assert_eq!(object.size, want.len() as u64, "{}", object.key);
        assert!(object.version.is_some(), "{} has no ETag", object.key);
        let got = dataset.read(0, object, 0, object.size + 10).await.unwrap();
        assert_eq!(got.len(), want.len(), "{}", object.key);
        assert!(got[..] == want[..], "{}: bytes differ", object.key);
    }
    // A range across block boundaries, answered from the cache now.
    let big = find(&objects, "train/class0/img6.bin");
    let got = dataset.read(0, big, 60_000, 80_000).await.unwrap();
    assert!(got[..] == expected["train/class0/img6.bin"][60_000..140_000]);
    assert!(
        dataset
            .served
            .memory
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "second read should hit the cache"
    );
}

#[tokio::test]
async fn an_object_changed_after_listing_fails_and_never_mixes_bytes() {
    let Some(s3) = SeaweedFs::start() else { return };
    s3.create_bucket("chg").await;
    let old = content(1, 200_000);
    s3.put("chg", "f.bin", old.clone()).await;
    s3.put("chg", "gone.bin", content(2, 1000)).await;
    let secrets = Secrets::new();
    let spec = dataset_spec("changing", vec![s3_mount(&s3, &secrets, "s3://chg", &[])]);
    let cache = cache();
    let dataset = Dataset::open(&spec, &cache, BLOCK).unwrap();
    let objects = dataset.mounts[0].source.list().await.unwrap();
    let f = find(&objects, "f.bin").clone();

    // Block 0 is cached with the old bytes; then the object is replaced (same size).
    let first = dataset.read(0, &f, 0, 1000).await.unwrap();
    assert!(first[..] == old[..1000]);
    s3.put("chg", "f.bin", content(3, 200_000)).await;

    let err = dataset.read(0, &f, 0, f.size).await.unwrap_err();
    assert!(
        matches!(source_error(&err), SourceError::Changed { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("f.bin") && err.to_string().contains("changed"),
        "{err}"
    );
    // Straight from the source too, block by block.
    let err = dataset.mounts[0]
        .source
        .read(&f, 0..1000)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::Changed { .. }), "{err}");

    let gone = find(&objects, "gone.bin").clone();
    s3.delete("chg", "gone.bin").await;
    let err = dataset.read(0, &gone, 0, gone.size).await.unwrap_err();
    assert!(
        matches!(source_error(&err), SourceError::NotFound { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("gone.bin"), "{err}");

    // After a re-list the new version reads fine.
    let objects = dataset.mounts[0].source.list().await.unwrap();
    let f2 = find(&objects, "f.bin");
    assert_ne!(f2.version, f.version);
    assert!(dataset.read(0, f2, 0, f2.size).await.unwrap()[..] == content(3, 200_000)[..]);
}

#[tokio::test]
async fn wrong_credentials_are_unauthorized_and_the_secret_is_not_shown() {
    let Some(s3) = SeaweedFs::start() else { return };
    s3.create_bucket("auth").await;
    s3.put("auth", "x", b"x".to_vec()).await;
    let secrets = Secrets::new();
    let wrong = "wrong-secret-Zq8v1Ty3";
    let spec = mount(
        "s3://auth",
        &[("endpoint", &s3.endpoint())],
        vec![
            secrets.file("accessKeyId", s3.access_key()),
            secrets.file("secretAccessKey", wrong),
        ],
    );
    let source = source::open(&spec).unwrap();
    let err = source.list().await.unwrap_err();
    assert!(matches!(err, SourceError::Unauthorized { .. }), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("secretRefs"), "no hint in {shown}");
    assert!(
        !shown.contains(wrong) && !shown.contains(s3.secret_key()),
        "secret in {shown}"
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_clear_error_within_seconds() {
    let port = support::free_port();
    let secrets = Secrets::new();
    let spec = mount(
        "s3://bucket/p",
        &[("endpoint", &format!("http://127.0.0.1:{port}"))],
        vec![
            secrets.file("accessKeyId", "AKIDEXAMPLE"),
            secrets.file("secretAccessKey", "not-a-real-secret-0"),
        ],
    );
    let source = source::open(&spec).unwrap();
    let started = Instant::now();
    let err = source.list().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, SourceError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string()
            .to_lowercase()
            .contains("connection refused"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("127.0.0.1:{port}")),
        "endpoint not named: {msg}"
    );
}

#[tokio::test]
async fn a_source_that_stops_answering_mid_read_times_out_within_the_bound() {
    let Some(s3) = SeaweedFs::start() else { return };
    s3.create_bucket("slow").await;
    s3.put("slow", "big.bin", content(7, 2 << 20)).await;
    let proxy = StallProxy::start(([127, 0, 0, 1], s3.port()).into()).await;
    let secrets = Secrets::new();
    let spec = mount(
        "s3://slow",
        &[("endpoint", &proxy.endpoint()), ("requestTimeout", "2s")],
        vec![
            secrets.file("accessKeyId", s3.access_key()),
            secrets.file("secretAccessKey", s3.secret_key()),
        ],
    );
    let source = source::open(&spec).unwrap();
    let objects = source.list().await.unwrap();
    let big = find(&objects, "big.bin");
    // Headers and a little of the body get through, then nothing.
    proxy.stall_after(100 << 10);
    let started = Instant::now();
    let err = source.read(big, 0..big.size).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, SourceError::Timeout { .. }), "{err}");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    assert!(err.to_string().contains("big.bin"), "{err}");
}

#[tokio::test]
async fn hostile_keys_never_appear_as_escaping_paths() {
    let Some(moto) = MotoServer::start() else {
        return;
    };
    moto.create_bucket("hostile");
    let good = ["ok/file.bin", "top.bin", "dir/sub/x"];
    for k in good {
        assert_eq!(moto.put_raw("hostile", k, b"fine"), 200, "{k}");
    }
    for k in ["a/../b", "a//b", "./x", "dir/./y", "../escape"] {
        assert_eq!(moto.put_raw("hostile", k, b"bad"), 200, "{k:?}");
    }
    // A NUL in a key: moto may refuse it; then there is nothing to list.
    let nul_stored = moto.put_raw("hostile", "nul\0key", b"bad") == 200;
    eprintln!("key with NUL stored by moto: {nul_stored}");
    // moto checks no signature but refuses anonymous GETs of private objects: sign.
    let secrets = Secrets::new();
    let spec = mount(
        "s3://hostile",
        &[("endpoint", &moto.endpoint())],
        vec![
            secrets.file("accessKeyId", "testing"),
            secrets.file("secretAccessKey", "testing-secret"),
        ],
    );
    let source = source::open(&spec).unwrap();
    let (captured, _guard) = capture_logs();
    let objects = source.list().await.unwrap();
    let logs = captured.text();
    // The store really held them, and each was skipped with a warning naming it.
    for k in ["a/../b", "a//b", "./x", "dir/./y", "../escape"] {
        assert!(
            logs.contains(&format!("key={k} ")) || logs.contains(&format!("key={k}\n")),
            "no warning for {k:?}: {logs}"
        );
    }
    if nul_stored {
        assert!(
            logs.contains("nul\\0key"),
            "no warning for the NUL key: {logs}"
        );
    }
    let keys: Vec<&str> = objects.iter().map(|o| o.key.as_str()).collect();
    for k in &keys {
        assert!(
            source::unsafe_reason(k).is_none(),
            "unsafe key listed: {k:?}"
        );
    }
    let mut want: Vec<&str> = good.to_vec();
    want.sort();
    assert_eq!(keys, want);
    // The good ones still read.
    let o = find(&objects, "dir/sub/x");
    assert_eq!(&source.read(o, 0..4).await.unwrap()[..], b"fine");
}

/// Log output captured through the agent's redacting writer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Captures this thread's log output (through the redacting writer) until the guard drops.
fn capture_logs() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(sluice::secret::RedactingWriter::new(move || sink.clone()))
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

#[tokio::test]
async fn a_secret_in_an_endpoint_url_is_redacted_from_errors_and_logs() {
    let port = support::free_port();
    let password = "pw-Hx93kLq0";
    let token = "tok-Vb27Rn55";
    let endpoint = format!("http://admin:{password}@127.0.0.1:{port}/?token={token}");
    let (captured, _guard) = capture_logs();

    let secrets = Secrets::new();
    let spec = mount(
        "s3://bucket",
        &[("endpoint", &endpoint), ("maxRetries", "1")],
        vec![
            secrets.file("accessKeyId", "AKIDEXAMPLE"),
            secrets.file("secretAccessKey", "not-a-real-secret-1"),
        ],
    );
    let source = source::open(&spec).unwrap();
    assert!(
        !source.id().contains(password) && !source.id().contains(token),
        "{}",
        source.id()
    );
    let err = source.list().await.unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains(password) && !shown.contains(token),
        "secret in {shown}"
    );
    let logs = captured.text();
    assert!(
        logs.contains("store request failed"),
        "nothing logged: {logs}"
    );
    assert!(
        !logs.contains(password) && !logs.contains(token),
        "secret in logs: {logs}"
    );
}

#[test]
fn a_missing_or_empty_secret_names_the_reference_not_the_value() {
    let secrets = Secrets::new();
    let empty = secrets.file("secretAccessKey", "");
    let missing_file = SecretRef {
        key: "secretAccessKey".into(),
        env: None,
        file: Some("/nonexistent/sluice-key".into()),
    };
    let missing_env = SecretRef {
        key: "accessKeyId".into(),
        env: Some("SLUICE_TEST_SURELY_UNSET_VAR".into()),
        file: None,
    };
    for (r, needle) in [
        (empty, "is empty"),
        (missing_file, "/nonexistent/sluice-key"),
        (missing_env, "SLUICE_TEST_SURELY_UNSET_VAR"),
    ] {
        let spec = mount("s3://b", &[("endpoint", "http://127.0.0.1:1")], vec![r]);
        let err = source::open(&spec).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
        assert!(err.contains("secret"), "{err}");
    }
}

#[tokio::test]
async fn a_local_directory_mount_lists_reads_and_notices_changes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("train/cats")).unwrap();
    std::fs::write(root.join("train/cats/1.jpg"), content(1, 150_000)).unwrap();
    std::fs::write(root.join("train/cats/2.jpg"), content(2, 10)).unwrap();
    std::fs::write(root.join("labels.txt"), b"cat\n").unwrap();
    let spec = dataset_spec(
        "local",
        vec![mount(&format!("file://{}", root.display()), &[], vec![])],
    );
    let cache = cache();
    let dataset = Dataset::open(&spec, &cache, BLOCK).unwrap();
    assert_eq!(
        dataset.mounts[0].source.id(),
        format!("file://{}", root.display())
    );
    let objects = dataset.mounts[0].source.list().await.unwrap();
    let keys: Vec<&str> = objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["labels.txt", "train/cats/1.jpg", "train/cats/2.jpg"]);
    let big = find(&objects, "train/cats/1.jpg").clone();
    assert!(dataset.read(0, &big, 0, big.size).await.unwrap()[..] == content(1, 150_000)[..]);

    // Replaced with different bytes and size: the listed version no longer matches.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(root.join("train/cats/1.jpg"), content(9, 150_001)).unwrap();
    let err = dataset.mounts[0]
        .source
        .read(&big, 0..100)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::Changed { .. }), "{err}");
    std::fs::remove_file(root.join("labels.txt")).unwrap();
    let err = dataset.mounts[0]
        .source
        .read(find(&objects, "labels.txt"), 0..4)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::NotFound { .. }), "{err}");
}

#[tokio::test]
async fn max_concurrency_bounds_requests_in_flight() {
    use object_store::throttle::{ThrottleConfig, ThrottledStore};
    use object_store::{ObjectStoreExt, PutPayload, memory::InMemory, path::Path};
    let inner = InMemory::new();
    for i in 0..6 {
        inner
            .put(
                &Path::from(format!("f{i}")),
                PutPayload::from_static(b"0123456789"),
            )
            .await
            .unwrap();
    }
    // Every GET takes 200 ms: six at two at a time take three rounds.
    let config = ThrottleConfig {
        wait_get_per_call: Duration::from_millis(200),
        ..Default::default()
    };
    let store = Arc::new(ThrottledStore::new(inner, config));
    let time_six_reads = |max_concurrency: usize| {
        let limits = source::RequestLimits {
            max_concurrency,
            ..Default::default()
        };
        let source = source::ObjectSource::from_store(
            "mem://t".into(),
            "memory".into(),
            store.clone(),
            None,
            limits,
        );
        async move {
            let objects = source::Source::list(&source).await.unwrap();
            assert_eq!(objects.len(), 6);
            let started = Instant::now();
            let reads = objects
                .iter()
                .map(|o| source::Source::read(&source, o, 0..10));
            for r in futures::future::join_all(reads).await {
                assert_eq!(&r.unwrap()[..], b"0123456789");
            }
            started.elapsed()
        }
    };
    let bounded = time_six_reads(2).await;
    let unbounded = time_six_reads(64).await;
    assert!(
        bounded >= Duration::from_millis(590),
        "maxConcurrency 2: {bounded:?}"
    );
    assert!(
        unbounded < Duration::from_millis(400),
        "maxConcurrency 64: {unbounded:?}"
    );
}
