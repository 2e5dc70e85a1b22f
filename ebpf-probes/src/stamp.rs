//! The committed objects must match their sources: `bpf/objects.stamp` (written by
//! `cargo xtask build-ebpf`) holds the sha256 of every source and object.

use sha2::{Digest, Sha256};
use std::path::Path;

fn bpf_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf"))
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn objects_are_built_from_the_current_sources() {
    let stamp = std::fs::read_to_string(bpf_dir().join("objects.stamp"))
        .expect("bpf/objects.stamp missing: run cargo xtask build-ebpf");
    let stamped: Vec<(&str, &str)> = stamp
        .lines()
        .filter_map(|l| l.split_once("  "))
        .map(|(h, n)| (n.trim(), h.trim()))
        .collect();

    // Every source file must be in the stamp, so a new header cannot slip past it.
    let mut sources: Vec<String> = std::fs::read_dir(bpf_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".c") || n.ends_with(".h"))
        .collect();
    sources.sort();
    for src in &sources {
        assert!(
            stamped.iter().any(|(n, _)| n == src),
            "bpf/{src} is not in bpf/objects.stamp: run cargo xtask build-ebpf and commit the objects"
        );
    }
    for (name, hash) in &stamped {
        let actual = sha256_hex(&bpf_dir().join(name));
        assert_eq!(
            &actual, hash,
            "bpf/{name} changed since the objects were built: run cargo xtask build-ebpf and commit the objects"
        );
    }
    assert!(
        stamped.iter().any(|(n, _)| n.ends_with(".bpf.o")),
        "no object in bpf/objects.stamp"
    );
}
