//! Reading a generated dataset through the FUSE mount: bytes, listings and sizes match the
//! source; unknown names are ENOENT.

#[path = "fuse_harness.rs"]
mod harness;

use std::collections::BTreeSet;
use std::path::Path;

use harness::Env;

fn tree(root: &Path) -> BTreeSet<(String, u64)> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = e.metadata().unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            if md.is_dir() {
                stack.push(e.path());
                out.insert((rel + "/", 0));
            } else {
                out.insert((rel, md.len()));
            }
        }
    }
    out
}

#[test]
fn every_file_reads_back_byte_exact_and_listings_match() {
    require_fuse!();
    // 1 MiB blocks so the large files span many blocks (and readahead kicks in).
    let mut env = Env::new(200, &[10 << 20, (3 << 20) + 12345], "1MiB");
    env.start_agent();

    assert_eq!(
        tree(&env.mount().join("m")),
        tree(&env.dir.path().join("data")),
        "readdir/stat differ from the source"
    );
    for rel in &env.files {
        let got = std::fs::read(env.served(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let want = std::fs::read(env.source(rel)).unwrap();
        assert!(
            got == want,
            "{rel}: {} bytes served differ from the source's {}",
            got.len(),
            want.len()
        );
    }
    // The kernel's readahead on the mount is raised to the largest read (1 MiB), so a
    // sequential reader's requests are not cut to the kernel's 128 KiB default.
    let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(env.mount()).unwrap());
    let bdi = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    assert_eq!(
        std::fs::read_to_string(&bdi).unwrap().trim(),
        "1024",
        "{bdi}"
    );
    // Reads at odd offsets across block boundaries.
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(env.served("shards/shard-000.tar")).unwrap();
    let want = std::fs::read(env.source("shards/shard-000.tar")).unwrap();
    let mut buf = vec![0u8; 300_000];
    for off in [0usize, (1 << 20) - 7, 5_000_001, (10 << 20) - 100] {
        let n = f.read_at(&mut buf, off as u64).unwrap();
        assert_eq!(&buf[..n], &want[off..(off + n).min(want.len())]);
    }
    let err = std::fs::metadata(env.mount().join("m/nope")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    let err = std::fs::write(env.served("class00/new"), b"x").unwrap_err();
    assert!(
        matches!(err.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES)),
        "{err}"
    );
    assert!(env.stop_agent().success());
    assert!(
        !harness_mounted(&env.mount()),
        "clean shutdown left the mount behind"
    );
}

fn harness_mounted(p: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(&*p.to_string_lossy()))
}
