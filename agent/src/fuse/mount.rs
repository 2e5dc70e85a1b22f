//! Mount points: find Sluice FUSE mounts in `/proc/self/mountinfo`, clear dead ones left by
//! a killed agent ("Transport endpoint is not connected"), mount a fresh connection.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// The filesystem type Sluice mounts show in `/proc/mounts` (`fuse.sluice`).
pub const FS_TYPE: &str = "fuse.sluice";

/// Why a mount point could not be prepared or mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount point {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open /dev/fuse ({0}): is the fuse module loaded and are we root?")]
    DevFuse(std::io::Error),
    #[error("mount {path}: {source} (FUSE mounts need root / CAP_SYS_ADMIN)")]
    Mount {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
}

/// The filesystem type mounted exactly at `path`, if any (the last, i.e. top, mount wins).
pub fn mounted_fs_type(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy();
    let mut found = None;
    for line in info.lines() {
        // id parent major:minor root mountpoint opts [optional...] - fstype source superopts
        let mut parts = line.split(" - ");
        let (Some(left), Some(right)) = (parts.next(), parts.next()) else {
            continue;
        };
        let mount_point = left.split(' ').nth(4).map(unescape);
        if mount_point.as_deref() == Some(&*want) {
            found = right.split(' ').next().map(str::to_string);
        }
    }
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Makes `path` an empty directory ready to mount on: a dead FUSE mount (its daemon gone,
/// stat fails with ENOTCONN) or a stale Sluice mount is detached lazily first, so nobody has
/// to `umount -l` by hand after a crash. Returns whether something was detached.
pub fn clear_mount_point(path: &Path) -> Result<bool, MountError> {
    let io = |source| MountError::Io {
        path: path.into(),
        source,
    };
    let mut detached = false;
    // Mounts can be stacked if earlier runs crashed repeatedly: peel them all.
    for _ in 0..16 {
        let dead = matches!(std::fs::metadata(path), Err(ref e) if e.raw_os_error() == Some(libc::ENOTCONN));
        let fs = mounted_fs_type(path);
        let ours = fs
            .as_deref()
            .is_some_and(|t| t == FS_TYPE || t.starts_with("fuse"));
        if !(dead || ours) {
            break;
        }
        tracing::warn!(path = %path.display(), fs = fs.as_deref().unwrap_or("?"), dead, "detaching stale FUSE mount left by a previous agent");
        nix::mount::umount2(path, MntFlags::MNT_DETACH).map_err(|e| io(e.into()))?;
        detached = true;
    }
    std::fs::create_dir_all(path).map_err(io)?;
    Ok(detached)
}

/// Opens `/dev/fuse` and mounts it read-only at `path`; the returned fd is the new,
/// not yet initialised connection (the kernel sends INIT first).
pub fn mount_fuse(path: &Path, dataset: &str, max_read: u32) -> Result<OwnedFd, MountError> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(MountError::DevFuse)?;
    let fd: OwnedFd = dev.into();
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,max_read={max_read}",
        fd.as_raw_fd()
    );
    nix::mount::mount(
        Some(format!("sluice:{dataset}").as_str()),
        path,
        Some(FS_TYPE),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_RDONLY,
        Some(data.as_str()),
    )
    .map_err(|source| MountError::Mount {
        path: path.into(),
        source,
    })?;
    Ok(fd)
}

/// Raises the kernel's readahead for the FUSE mount at `path` to `kb`, so a sequential
/// reader's requests reach `max_read` instead of the default 128 KiB: the kernel caps a
/// new FUSE connection's readahead at that default when it answers INIT, whatever INIT
/// asked for. Call it after INIT (any request on the mount waits for INIT).
pub fn set_readahead(path: &Path, kb: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    let bdi = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    std::fs::write(&bdi, kb.to_string())
        .map_err(|e| std::io::Error::new(e.kind(), format!("{bdi}: {e}")))
}

/// Detaches the mount at `path` (lazy: open files keep working until closed).
pub fn unmount(path: &Path) -> std::io::Result<()> {
    nix::mount::umount2(path, MntFlags::MNT_DETACH).map_err(Into::into)
}
