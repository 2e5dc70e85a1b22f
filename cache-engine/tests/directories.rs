//! Directories the cache cannot use give a clear error naming them, never a panic.

mod common;

use common::*;
use sluice_cache_engine::OpenError;

fn expect_dir_error(
    res: Result<sluice_cache_engine::Cache, OpenError>,
    dir: &std::path::Path,
    what: &str,
) -> String {
    match res {
        Err(e @ OpenError::Directory { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&dir.display().to_string()),
                "{what}: error does not name the directory: {text}"
            );
            text
        }
        Err(e) => panic!("{what}: unexpected error {e}"),
        Ok(_) => panic!("{what}: opened"),
    }
}

#[test]
fn missing_directory_that_cannot_be_created() {
    for engine in engines() {
        let base = tempfile::tempdir().unwrap();
        let file = base.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let dir = file.join("cache");
        let text = expect_dir_error(small(&dir, engine, 0).open(), &dir, "missing");
        assert!(text.contains("cannot create"), "{text}");
    }
}

#[test]
fn missing_directory_is_created() {
    for engine in engines() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("new/cache");
        small(&dir, engine, 0).open().unwrap();
        assert!(dir.is_dir());
    }
}

#[test]
fn unwritable_directory() {
    for engine in engines() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("ro");
        std::fs::create_dir(&dir).unwrap();
        let mounted = if is_root() {
            // Root ignores permission bits: use a read-only mount instead.
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
                .arg(&dir)
                .status()
                .unwrap()
                .success();
            if !ok {
                eprintln!("skipping unwritable_directory: mount -o ro failed");
                return;
            }
            true
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
            false
        };
        let res = small(&dir, engine, 0).open();
        if mounted {
            std::process::Command::new("umount")
                .arg(&dir)
                .status()
                .unwrap();
        }
        let text = expect_dir_error(res, &dir, "unwritable");
        assert!(text.contains("not writable"), "{text}");
    }
}

/// tmpfs refused O_DIRECT until Linux 6.6; newer kernels accept it. Either the cache works
/// there, or it says that the filesystem lacks O_DIRECT.
#[tokio::test]
async fn tmpfs_directory() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipping tmpfs_directory: no /dev/shm");
        return;
    }
    for engine in engines() {
        let base = tempfile::tempdir_in(shm).unwrap();
        let dir = base.path().join("cache");
        match small(&dir, engine, 0).open() {
            Ok(cache) => {
                cache.insert(key(1), value(1, 0, 1000)).await.unwrap();
                assert_eq!(cache.get(&key(1)).await.unwrap(), value(1, 0, 1000));
            }
            Err(e) => {
                let text = expect_dir_error(Err(e), &dir, "tmpfs");
                assert!(text.contains("O_DIRECT"), "{text}");
            }
        }
    }
}

#[test]
fn invalid_configuration_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let res = small(dir.path(), sluice_cache_engine::EngineKind::Psync, 0)
        .segment_size(1 << 20)
        .open();
    assert!(matches!(res, Err(OpenError::Config(_))));
}
