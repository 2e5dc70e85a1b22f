//! `s3fs` with `use_cache` (Debian package `s3fs`). s3fs has no cache size limit, so when the
//! budget is below the dataset its cache lives on a loop-mounted ext4 image of that size.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use super::{Budget, CacheFs, Mounted, Store};

pub fn version() -> String {
    super::version("s3fs", &["--version"])
}

/// Mounts the dataset's prefix with a fresh cache; `capped` puts it on a filesystem of
/// exactly the budget's size.
pub fn mount(store: &Store, dir: &Path, budget: Budget, capped: bool) -> anyhow::Result<Mounted> {
    let bin = crate::seaweed::which("s3fs")
        .context("`s3fs` not found: apt-get install s3fs (.ci/install-deps installs it)")?;
    super::clear(dir)?;
    let (mnt, cache) = (dir.join("mnt"), dir.join("cache"));
    std::fs::create_dir_all(&cache)?;
    // s3fs's only bound is `ensure_diskfree` (MiB kept free on the cache's filesystem), and it
    // refuses to start unless that is a few multipart sizes; so the image is the budget plus
    // ext4's overhead plus a 64 MiB floor, and the floor is whatever is free beyond the budget.
    let (cache_fs, diskfree_mib) = if capped {
        let fs = CacheFs::create(
            &dir.join("cache.img"),
            &cache,
            budget.disk + budget.disk / 10 + (80 << 20),
        )?;
        let keep = fs.free()?.saturating_sub(budget.disk) >> 20;
        (Some(fs), keep)
    } else {
        (None, 1)
    };
    let passwd = dir.join("passwd");
    std::fs::write(
        &passwd,
        format!(
            "{}:{}\n",
            crate::seaweed::ACCESS_KEY,
            crate::seaweed::SECRET_KEY
        ),
    )?;
    std::fs::set_permissions(&passwd, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let mut cmd = Command::new(bin);
    cmd.arg(format!("{}:/{}", store.bucket, store.prefix))
        .arg(&mnt)
        .arg("-f")
        .args([
            "-o",
            "ro",
            "-o",
            "use_path_request_style",
            "-o",
            "dbglevel=warn",
        ])
        .arg("-o")
        .arg(format!("ensure_diskfree={diskfree_mib}"))
        .arg("-o")
        .arg(format!("url={}", store.endpoint))
        .arg("-o")
        .arg(format!("passwd_file={}", passwd.display()))
        .arg("-o")
        .arg(format!("use_cache={}", cache.display()));
    let settings = format!(
        "s3fs -o use_cache,ensure_diskfree={diskfree_mib},ro,use_path_request_style{} (no memory knob; parallel_count/multireq_max defaults)",
        if capped {
            format!(
                "; cache on its own ext4 image with {} MiB usable above ensure_diskfree (s3fs has no cache size limit)",
                budget.disk >> 20
            )
        } else {
            String::new()
        }
    );
    let mut m = Mounted::spawn(cmd, &mnt, mnt.clone(), &dir.join("s3fs.log"), settings)?;
    m.cache_fs = cache_fs;
    Ok(m)
}
