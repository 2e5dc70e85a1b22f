//! The FUSE front end: one read-only mount per dataset under `mountRoot/<dataset>`.
//!
//! Metadata operations are answered from the [`MetaCache`](crate::meta::MetaCache) on the
//! fuser threads; each `read` becomes a tokio task that replies when its bytes arrive, so
//! slow fetches never hold a FUSE thread. Opens and reads feed the dataset's prefetcher
//! ([`crate::control::prefetch`]: readahead, directory scans, repeated epochs), and each
//! read's wait is counted per reading process for the FUSE-side stall estimate.
//!
//! Restart survival: every mount's `/dev/fuse` fd is also held by the fd keeper
//! ([`fdstore`]); a restarted agent takes it back, adopts the live connection and asks the
//! kernel to resend what the dead agent had read but not answered.

pub mod fd;
pub mod fdstore;
pub mod mount;
pub mod pool;

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::control::FuseStalls;
use crate::control::prefetch::Prefetcher;
use crate::meta::{Entry, EntryKind, MetaCache};
use crate::metrics::Metrics;
use fdstore::FdStore;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request, Session, SessionACL,
};
use pool::ReadPool;
use sluice::dataset::Dataset;

/// The kernel keeps entries and attributes this long: the tree only changes on refresh.
const TTL: Duration = Duration::from_secs(3600);
/// Largest read the kernel sends us.
pub const MAX_READ: u32 = 1 << 20;
/// One dataset as a FUSE filesystem.
pub struct DatasetFs {
    dataset: Arc<Dataset>,
    meta: Arc<MetaCache>,
    pool: Arc<ReadPool>,
    metrics: Arc<Metrics>,
    next_fh: AtomicU64,
    /// `None` when `agent.prefetch.enabled` is off.
    prefetch: Option<Arc<Prefetcher>>,
    stalls: Arc<FuseStalls>,
}

impl DatasetFs {
    /// A filesystem serving `dataset` with the namespace in `meta`; reads run on `pool`,
    /// feed `prefetch` (if on) and count their waits in `stalls`.
    pub fn new(
        dataset: Arc<Dataset>,
        meta: Arc<MetaCache>,
        pool: Arc<ReadPool>,
        metrics: Arc<Metrics>,
        prefetch: Option<Arc<Prefetcher>>,
        stalls: Arc<FuseStalls>,
    ) -> Self {
        // Handles of a previous agent may still be open in the kernel; starting from the
        // clock makes a clash (which would only share readahead state) unlikely.
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            << 8;
        DatasetFs {
            dataset,
            meta,
            pool,
            metrics,
            next_fh: AtomicU64::new(start),
            prefetch,
            stalls,
        }
    }

    fn attr(&self, e: &Entry) -> FileAttr {
        let t = UNIX_EPOCH + Duration::from_secs(e.mtime.max(0) as u64);
        let dir = e.kind == EntryKind::Dir;
        FileAttr {
            ino: INodeNo(e.ino),
            size: e.size,
            blocks: e.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if dir { 0o555 } else { 0o444 },
            nlink: if dir { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 128 << 10,
            flags: 0,
        }
    }

    fn readdir_entries(&self, ino: u64, offset: u64) -> Option<Vec<(u64, String, Entry)>> {
        let tree = self.meta.snapshot();
        let me = tree.get(ino).filter(|e| e.kind == EntryKind::Dir)?;
        let parent = tree.get(tree.parent(ino)).unwrap_or(me);
        let mut out = Vec::new();
        // Offsets: 1 = ".", 2 = "..", 3 + i = i-th child; the kernel passes back the last one.
        if offset < 1 {
            out.push((1, ".".to_string(), me));
        }
        if offset < 2 {
            out.push((2, "..".to_string(), parent));
        }
        let skip = offset.saturating_sub(2) as usize;
        for (i, (name, e)) in tree.children_from(ino, skip).enumerate() {
            out.push((3 + (skip + i) as u64, name.to_string(), e));
            if out.len() >= 4096 {
                break;
            }
        }
        Some(out)
    }
}

impl Filesystem for DatasetFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Best effort: a resumed connection's synthetic INIT offers no capabilities.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        if let Err(max) = config.set_max_readahead(MAX_READ) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let start = Instant::now();
        let tree = self.meta.snapshot();
        match name.to_str().and_then(|n| tree.lookup(parent.0, n)) {
            Some(e) => reply.entry(&TTL, &self.attr(&e), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
        self.metrics.fuse_op("lookup", start);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let start = Instant::now();
        match self.meta.snapshot().get(ino.0) {
            Some(e) => reply.attr(&TTL, &self.attr(&e)),
            None => reply.error(Errno::ENOENT),
        }
        self.metrics.fuse_op("getattr", start);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let start = Instant::now();
        match self.meta.snapshot().get(ino.0) {
            Some(Entry {
                kind: EntryKind::File { .. },
                ..
            }) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
                if let Some(p) = &self.prefetch {
                    guard("open", || p.on_open(&self.meta.snapshot(), ino.0, fh));
                }
            }
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
        self.metrics.fuse_op("open", start);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let start = Instant::now();
        let tree = self.meta.snapshot();
        let Some(Entry {
            kind: EntryKind::File { mount, object },
            ..
        }) = tree.get(ino.0)
        else {
            reply.error(if tree.get(ino.0).is_some() {
                Errno::EISDIR
            } else {
                Errno::ENOENT
            });
            return;
        };
        let pid = req.pid();
        if let Some(bytes) =
            self.dataset
                .read_from_memory(mount, tree.object(mount, object), offset, size as u64)
        {
            // A warm read: answered here, without two thread hand-offs.
            reply.data(&bytes);
            self.metrics.fuse_op("read", start);
            self.stalls.record(pid, start.elapsed());
        } else {
            let ds = self.dataset.clone();
            let metrics = self.metrics.clone();
            let stalls = self.stalls.clone();
            let t = tree.clone();
            self.pool.spawn(move || async move {
                let obj = t.object(mount, object);
                match ds.read(mount, obj, offset, size as u64).await {
                    Ok(bytes) => reply.data(&bytes),
                    Err(e) => {
                        tracing::error!(dataset = %ds.name, path = %t.path_of(ino.0), cause = %e, "read failed: EIO");
                        reply.error(Errno::EIO);
                    }
                }
                metrics.fuse_op("read", start);
                stalls.record(pid, start.elapsed());
            });
        }

        // A handle opened by a previous agent is unknown there: its state starts fresh.
        if let Some(p) = &self.prefetch {
            guard("read", || {
                p.on_read(&tree, ino.0, fh.0, offset, size as u64)
            });
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(p) = &self.prefetch {
            guard("release", || p.on_release(fh.0));
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.meta.snapshot().get(ino.0) {
            Some(Entry {
                kind: EntryKind::Dir,
                ..
            }) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let start = Instant::now();
        let Some(entries) = self.readdir_entries(ino.0, offset) else {
            reply.error(Errno::ENOTDIR);
            return;
        };
        for (off, name, e) in entries {
            let kind = if e.kind == EntryKind::Dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(e.ino), off, kind, &name) {
                break;
            }
        }
        reply.ok();
        self.metrics.fuse_op("readdir", start);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let start = Instant::now();
        let Some(entries) = self.readdir_entries(ino.0, offset) else {
            reply.error(Errno::ENOTDIR);
            return;
        };
        for (off, name, e) in entries {
            if reply.add(
                INodeNo(e.ino),
                off,
                &name,
                &TTL,
                &self.attr(&e),
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
        self.metrics.fuse_op("readdirplus", start);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let tree = self.meta.snapshot();
        let (_, bytes) = tree.totals();
        reply.statfs(
            bytes.div_ceil(4096),
            0,
            0,
            tree.inode_count(),
            0,
            4096,
            255,
            4096,
        );
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

/// Runs a prefetcher hook: a bug there must cost a prefetch, never a FUSE thread (a
/// request it held would go unanswered and its reader hang).
fn guard(what: &'static str, hook: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook)).is_err() {
        tracing::error!(
            hook = what,
            "prefetcher panicked; the request is served without it"
        );
    }
}

/// Why a dataset could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Mount(#[from] mount::MountError),
    #[error("dataset {dataset}: FUSE session at {path}: {source}")]
    Session {
        dataset: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A mounted, serving dataset.
#[derive(Debug)]
pub struct MountedDataset {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// True if this agent adopted a connection kept from a previous agent.
    pub resumed: bool,
    _session: fuser::BackgroundSession,
}

impl MountedDataset {
    /// Sends invalidations to the kernel for this mount.
    pub fn notifier(&self) -> fuser::Notifier {
        self._session.notifier()
    }

    /// Unmounts (lazily) and tells the keeper to forget the fd; the session threads end when
    /// the kernel closes the connection.
    pub fn unmount(self, store: Option<&FdStore>) {
        if let Err(e) = mount::unmount(&self.mount_point) {
            tracing::warn!(path = %self.mount_point.display(), error = %e, "unmount failed");
        }
        if let Some(store) = store {
            let _ = store.drop_key(&self.mount_point.to_string_lossy());
        }
        // Not joined: files still open on a lazily detached mount keep the session alive;
        // dropping the handle detaches its threads, which end when the kernel closes it.
        drop(self._session);
    }
}

fn session_config() -> fuser::Config {
    let mut c = fuser::Config::default();
    c.acl = SessionACL::All;
    // Several threads read the same fd (no FUSE_DEV_IOC_CLONE): requests read by a thread of
    // a killed agent then stay on the connection's one device, which the keeper holds open,
    // so FUSE_NOTIFY_RESEND can requeue them; a cloned fd would fail them on close.
    c.n_threads = Some(4);
    c.clone_fd = false;
    c
}

/// Mounts `fs` at `mount_point`, or adopts the live connection kept in `store` from a
/// previous agent. Stale mounts with no kept connection are detached first.
pub fn serve(
    fs: DatasetFs,
    mount_point: &Path,
    store: Option<&FdStore>,
) -> Result<MountedDataset, ServeError> {
    let dataset = fs.dataset.name.clone();
    let key = mount_point.to_string_lossy().to_string();
    let session_err = |source| ServeError::Session {
        dataset: dataset.clone(),
        path: mount_point.into(),
        source,
    };

    if let Some(store) = store
        && mount::mounted_fs_type(mount_point).as_deref() == Some(mount::FS_TYPE)
    {
        match store.get(&key) {
            Ok(Some(dev)) => {
                let session = adopt(fs, &dev).map_err(session_err)?;
                if let Err(e) = fd::notify_resend(&dev) {
                    tracing::warn!(%dataset, error = %e, "FUSE_NOTIFY_RESEND failed (kernel < 6.9?): requests the old agent had read will fail");
                }
                tracing::info!(%dataset, path = %mount_point.display(), "resumed the kept FUSE connection");
                return Ok(MountedDataset {
                    mount_point: mount_point.into(),
                    resumed: true,
                    _session: session,
                });
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(%dataset, error = %e, "fd keeper unavailable; remounting"),
        }
    }

    mount::clear_mount_point(mount_point)?;
    let dev = mount::mount_fuse(mount_point, &dataset, MAX_READ)?;
    if let Some(store) = store
        && let Err(e) = store.put(&key, dev.as_fd())
    {
        tracing::warn!(%dataset, error = %e, "could not hand the FUSE fd to the keeper: this mount will not survive an agent crash");
    }
    let session =
        Session::from_fd(fs, dev, SessionACL::All, session_config()).map_err(session_err)?;
    let session = session.spawn().map_err(session_err)?;
    if let Err(e) = mount::set_readahead(mount_point, MAX_READ / 1024) {
        tracing::warn!(%dataset, error = %e, "kernel readahead left at 128 KiB: sequential reads take more requests");
    }
    tracing::info!(%dataset, path = %mount_point.display(), "mounted");
    Ok(MountedDataset {
        mount_point: mount_point.into(),
        resumed: false,
        _session: session,
    })
}

/// Runs fuser's handshake against a synthetic INIT on a socket, then swaps the socket for
/// the kept `/dev/fuse` connection (whose real INIT the previous agent already answered).
fn adopt(fs: DatasetFs, dev: &OwnedFd) -> std::io::Result<fuser::BackgroundSession> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    nix::unistd::write(&theirs, &fd::synthetic_init(MAX_READ))?;
    let session = Session::from_fd(fs, ours, SessionACL::All, session_config())?;
    // No thread uses the session's fd between the handshake and spawn(): swap it now.
    fd::replace_fd(session.as_fd().as_raw_fd(), dev.as_fd())?;
    drop(theirs);
    session.spawn()
}
