//! The CLI against a running agent: `status --json` after reads, `load` with its summary,
//! the message when no agent runs, and `sluice demo` end to end (the README's first command).

#[path = "fuse_harness.rs"]
mod harness;

use harness::{BIN, Env};

#[test]
fn status_without_agent_says_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("admin.sock");
    let out = std::process::Command::new(BIN)
        .args(["status", "--admin-socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("no agent at {}", sock.display()))
            && err.contains("sluice agent --config"),
        "{err}"
    );
}

#[test]
fn status_json_reflects_cached_bytes_after_a_read_and_load_fills_the_rest() {
    require_fuse!();
    let mut env = Env::new(40, &[5 << 20], "1MiB");
    env.start_agent();
    let sock = env.socket().display().to_string();
    let status = |env: &Env| -> serde_json::Value {
        let (ok, out, err) = env.cli(&["status", "--json", "--admin-socket", &sock]);
        assert!(ok, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    let before = status(&env);
    assert_eq!(before["datasets"][0]["cachedBytes"], 0);
    let total = before["datasets"][0]["bytes"].as_u64().unwrap();

    let rel = "shards/shard-000.tar";
    let n = std::fs::read(env.served(rel)).unwrap().len() as u64;
    let after = status(&env);
    let d = &after["datasets"][0];
    assert!(d["cachedBytes"].as_u64().unwrap() >= n, "{after}");
    // Fetched once from the source; what the reader got adds up to the file (prefetched
    // blocks reach it from memory).
    assert!(d["fetchedSource"].as_u64().unwrap() >= n, "{after}");
    let served: u64 = ["servedMemory", "servedDisk", "servedSource"]
        .iter()
        .map(|k| d[k].as_u64().unwrap())
        .sum();
    assert_eq!(served, n, "{after}");
    assert_eq!(after["tiers"][0]["tier"], "memory");

    let (ok, out, err) = env.cli(&["load", "ds", "--admin-socket", &sock]);
    assert!(ok, "{err}");
    assert!(out.contains("ds: loaded"), "{out}");
    let loaded = status(&env);
    assert!(
        loaded["datasets"][0]["cachedBytes"].as_u64().unwrap() >= total,
        "{loaded}"
    );
    let (ok, out, _) = env.cli(&["status", "--admin-socket", &sock]);
    assert!(
        ok && out.contains("DATASET") && out.contains("100.0%"),
        "{out}"
    );

    let (ok, _, err) = env.cli(&["load", "nosuch", "--admin-socket", &sock]);
    assert!(!ok && err.contains("no dataset \"nosuch\""), "{err}");
}

#[test]
fn demo_runs_end_to_end() {
    require_fuse!();
    let out = std::process::Command::new(BIN)
        .args(["demo", "--files", "300"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in ["cold epoch:", "warm epoch:", "DATASET", "cleaned up"] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    print!("{stdout}");
}

#[test]
fn load_metadata_only_refreshes_the_listing_and_the_kernel_sees_changes() {
    require_fuse!();
    let mut env = Env::new(10, &[], "1MiB");
    env.start_agent();
    let sock = env.socket().display().to_string();
    let (gone, changed) = (env.files[0].clone(), env.files[1].clone());
    // Populate the kernel's caches (entries, attributes, pages) first.
    std::fs::read(env.served(&gone)).unwrap();
    let old = std::fs::read(env.served(&changed)).unwrap();

    std::fs::remove_file(env.source(&gone)).unwrap();
    let new_bytes = b"a different, shorter content".to_vec();
    std::thread::sleep(std::time::Duration::from_millis(1100)); // a new mtime
    std::fs::write(env.source(&changed), &new_bytes).unwrap();
    std::fs::write(env.source("added.txt"), b"new file").unwrap();
    assert_eq!(
        std::fs::read(env.served(&changed)).unwrap(),
        old,
        "served from the listing until a refresh"
    );

    let (ok, out, err) = env.cli(&["load", "ds", "--metadata-only", "--admin-socket", &sock]);
    assert!(ok, "{err}");
    assert!(out.contains("metadata refreshed"), "{out}");
    assert_eq!(std::fs::read(env.served("added.txt")).unwrap(), b"new file");
    assert_eq!(std::fs::read(env.served(&changed)).unwrap(), new_bytes);
    assert_eq!(
        std::fs::metadata(env.served(&gone))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );
}
