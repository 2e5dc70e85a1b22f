//! The configuration file as a user writes it: what parses, and what the errors say.

use sluice::config::{ByteSize, Config, ConfigError};

const GOOD: &str = r#"# node settings
agent:
  mountRoot: /mnt/sluice
  stateDir: /var/lib/sluice
  metricsAddr: 127.0.0.1:9477
  adminSocket: /run/sluice/admin.sock
  cache:
    memory: 2GiB
    disks: [{ path: /nvme/sluice, capacity: 500GiB, highWatermark: 0.9, lowWatermark: 0.8 }]
---
apiVersion: sluice.io/v1alpha1
kind: Dataset
metadata: { name: imagenet }
spec:
  mounts:
    - mountPoint: s3://bucket/imagenet/train
      name: train
      options: { endpoint: http://127.0.0.1:8333, region: us-east-1, pathStyle: "true" }
      secretRefs:
        - { key: accessKeyId, env: AWS_ACCESS_KEY_ID }
        - { key: secretAccessKey, file: /etc/sluice/secret-key }
    - mountPoint: file:///data/imagenet/val
      name: val
  cache: { policy: epoch, quota: 100GiB }
---
apiVersion: sluice.io/v1alpha1
kind: Dataset
metadata: { name: coco }
spec:
  mounts:
    - mountPoint: gs://coco-bucket/2017
"#;

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

#[test]
fn a_full_file_parses_into_agent_and_datasets() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.agent.cache.memory, ByteSize(2 << 30));
    assert_eq!(c.agent.cache.disks[0].capacity, ByteSize(500 << 30));
    let names: Vec<_> = c
        .datasets
        .iter()
        .map(|d| d.metadata.name.as_str())
        .collect();
    assert_eq!(names, ["imagenet", "coco"]);
    let imagenet = &c.datasets[0];
    assert_eq!(imagenet.spec.mounts[1].name, "val");
    let p = imagenet.spec.cache.partition_config().unwrap();
    assert_eq!(p.policy, sluice_cache_engine::Policy::Epoch);
    assert_eq!(p.quota, Some(100 << 30));
    assert!(c.agent.cache_builder().is_ok());
}

#[test]
fn a_missing_field_names_file_line_and_field_path() {
    let text = "apiVersion: sluice.io/v1alpha1\nkind: Dataset\nmetadata: { name: x }\nspec:\n  mounts:\n    - name: a\n      options: {}\n";
    let e = err(text);
    assert!(e.starts_with("config.yaml line "), "{e}");
    assert!(
        e.contains("spec.mounts[0].mountPoint: missing field"),
        "{e}"
    );
}

#[test]
fn a_value_of_the_wrong_type_points_at_its_line() {
    // Line 13 of the second document is the bad quota.
    let text = GOOD.replace(
        "cache: { policy: epoch, quota: 100GiB }",
        "cache: { policy: epoch, quota: [1, 2] }",
    );
    let line = text
        .lines()
        .position(|l| l.contains("quota: [1, 2]"))
        .unwrap()
        + 1;
    let e = err(&text);
    assert!(
        e.contains(&format!("line {line}:")),
        "want line {line}: {e}"
    );
    assert!(e.contains("spec.cache.quota"), "{e}");
}

#[test]
fn a_misspelt_field_is_rejected_with_its_path() {
    let text = GOOD.replace("mountRoot:", "mountRot:");
    let e = err(&text);
    assert!(e.contains("line 3:"), "{e}");
    assert!(e.contains("mountRot"), "{e}");
}

#[test]
fn broken_yaml_syntax_reports_a_line() {
    let text = "agent:\n  mountRoot: /mnt\n   stateDir: [unclosed\n";
    let e = err(text);
    assert!(e.contains("config.yaml line "), "{e}");
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.yaml");
    std::fs::write(&path, "agent:\n  blockSize: lots\n").unwrap();
    let e = Config::load(&path).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{} line 2: agent.blockSize", path.display())),
        "{e}"
    );
    let e = Config::load(dir.path().join("absent.yaml")).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
}

#[test]
fn an_unknown_scheme_lists_the_supported_ones() {
    let text = GOOD.replace("gs://coco-bucket/2017", "ftp://coco/2017");
    let e = err(&text);
    for s in ["s3", "gs", "az", "http", "https", "file"] {
        assert!(e.contains(s), "{s} missing from {e}");
    }
    assert!(e.contains("spec.mounts[0].mountPoint"), "{e}");
    let line = text.lines().position(|l| l.contains("ftp://")).unwrap() + 1;
    assert!(e.contains(&format!("line {line}:")), "{e}");
}

#[test]
fn dataset_and_mount_names_must_be_unique_and_safe_directory_names() {
    let e = err(&GOOD.replace("name: coco", "name: imagenet"));
    assert!(e.contains("defined twice"), "{e}");
    for bad in ["\"../etc\"", "\"a/b\"", "\".hidden\"", "\"\""] {
        let e = err(&GOOD.replace("name: coco", &format!("name: {bad}")));
        assert!(
            e.contains("metadata.name") && e.contains("directory name"),
            "{bad}: {e}"
        );
    }
    let e = err(&GOOD.replace("name: val", "name: train"));
    assert!(e.contains("used twice"), "{e}");
    let e = err(&GOOD.replace("name: val", "name: \"..\""));
    assert!(e.contains("spec.mounts[1].name"), "{e}");
}

#[test]
fn cache_policy_and_watermarks_are_checked() {
    let e = err(&GOOD.replace("policy: epoch", "policy: lru"));
    assert!(e.contains("general or epoch"), "{e}");
    let e = err(&GOOD.replace("highWatermark: 0.9", "highWatermark: 1.5"));
    assert!(e.contains("highWatermark") && e.contains("(0, 1]"), "{e}");
    assert!(e.contains("line 9:"), "{e}");
    let e = err("agent:\n  cache: { memory: 1 Zib }\n");
    assert_eq!(
        e,
        "config.yaml line 2: agent.cache.memory: invalid size unit \"zib\" in \"1 Zib\": use B, KiB, MiB, GiB, TiB (or K, M, G, T)"
    );
    let e = err(&GOOD.replace("lowWatermark: 0.8", "lowWatermark: 0"));
    assert!(e.contains("lowWatermark"), "{e}");
}

#[test]
fn api_version_and_kind_are_checked() {
    let e = err(&GOOD.replace("sluice.io/v1alpha1", "sluice.io/v2"));
    assert!(e.contains("sluice.io/v1alpha1"), "{e}");
    let e = err(&GOOD.replace("kind: Dataset", "kind: Datasett"));
    assert!(e.contains("Dataset"), "{e}");
}

#[test]
fn a_secret_ref_needs_exactly_one_source() {
    let e = err(&GOOD.replace(
        "{ key: accessKeyId, env: AWS_ACCESS_KEY_ID }",
        "{ key: accessKeyId }",
    ));
    assert!(
        e.contains("secretRefs[0]") && e.contains("exactly one"),
        "{e}"
    );
}

#[test]
fn environment_overrides_win_over_the_file() {
    let env = |var: &str| match var {
        "SLUICE_MOUNT_ROOT" => Some("/srv/data".to_string()),
        "SLUICE_STATE_DIR" => Some("/srv/state".to_string()),
        "SLUICE_METRICS_ADDR" => Some(String::new()),
        "SLUICE_ADMIN_SOCKET" => Some("/tmp/s.sock".to_string()),
        "SLUICE_CACHE_MEMORY" => Some("8GiB".to_string()),
        _ => None,
    };
    let c = Config::parse_with_env("f.yaml", GOOD, env).unwrap();
    assert_eq!(c.agent.mount_root.to_str(), Some("/srv/data"));
    assert_eq!(c.agent.state_dir.to_str(), Some("/srv/state"));
    assert_eq!(c.agent.metrics_addr, None, "empty disables metrics");
    assert_eq!(c.agent.admin_socket.to_str(), Some("/tmp/s.sock"));
    assert_eq!(c.agent.cache.memory, ByteSize(8 << 30));
    let e = Config::parse_with_env("f.yaml", GOOD, |v| {
        (v == "SLUICE_CACHE_MEMORY").then(|| "lots".into())
    })
    .unwrap_err();
    assert!(e.to_string().contains("SLUICE_CACHE_MEMORY"), "{e}");
}

#[test]
fn a_file_with_only_datasets_gets_agent_defaults() {
    let text = GOOD
        .split("---\n")
        .skip(1)
        .collect::<Vec<_>>()
        .join("---\n");
    let c = Config::parse(&text).unwrap();
    assert_eq!(c.datasets.len(), 2);
    assert_eq!(c.agent.block_size, ByteSize(4 << 20));
}

#[test]
fn prefetch_and_autoscale_sections_parse_and_are_checked() {
    let c = Config::parse("agent:\n  cache: { memory: 1GiB }\n").unwrap();
    assert!(c.agent.prefetch.enabled && c.agent.autoscale.enabled);
    assert_eq!(c.agent.prefetch.concurrency, 16);
    assert_eq!(
        c.agent.autoscale.max_memory_for(1 << 30),
        1 << 30,
        "the memory tier grows only when maxMemory says so"
    );
    let c = Config::parse(
        "agent:\n  prefetch: { enabled: false, maxWindow: 4 }\n  autoscale: { maxPrefetch: 32, maxMemory: 4GiB, factor: 0.7 }\n",
    )
    .unwrap();
    assert!(!c.agent.prefetch.enabled);
    assert_eq!(c.agent.prefetch.max_window, 4);
    assert_eq!(c.agent.autoscale.max_prefetch, 32);
    assert_eq!(c.agent.autoscale.max_memory, Some(ByteSize(4 << 30)));
    let e = err("agent:\n  autoscale: { factor: 1.5 }\n");
    assert!(
        e.contains("agent.autoscale.factor") && e.contains("(0, 1)"),
        "{e}"
    );
    assert!(e.contains("line 2:"), "{e}");
    let e = err("agent:\n  cache: { memory: 2GiB }\n  autoscale: { maxMemory: 1GiB }\n");
    assert!(e.contains("agent.autoscale.maxMemory"), "{e}");
    let e = err("agent:\n  prefetch: { concurrency: 100 }\n");
    assert!(e.contains("maxPrefetch"), "{e}");
    let e = err("agent:\n  prefetch: { windw: 3 }\n");
    assert!(e.contains("windw"), "{e}");
}
