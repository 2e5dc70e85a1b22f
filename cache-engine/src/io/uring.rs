//! The io_uring engine: one dedicated thread per engine (one engine per disk directory),
//! owning one ring with a registered file table and a pool of registered read buffers.
//! Callers queue operations and wake the thread through an eventfd that the ring itself
//! watches, so the thread sleeps in `io_uring_enter` and wakes for either a completion or
//! new work; each completion goes back to tokio through a oneshot channel.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use bytes::Bytes;
use io_uring::{IoUring, opcode, types};
use tokio::sync::oneshot;

use super::{AlignedBuf, EngineParams, FileId, IoEngine, IoFuture};

/// Size of one registered read buffer. Small reads land in a registered buffer and are
/// copied out; larger ones go to a fresh buffer that becomes the returned `Bytes` as is,
/// because copying them would cost more than the page pinning registration saves.
const REG_BUF_SIZE: usize = 64 << 10;
/// user_data of the eventfd read that wakes the ring thread.
const WAKE: u64 = u64::MAX;

/// Checks that this process may create an io_uring; the error says why not.
pub(crate) fn probe() -> Result<(), String> {
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        && s.trim() == "2"
    {
        return Err("io_uring is disabled by sysctl kernel.io_uring_disabled=2".into());
    }
    match IoUring::new(4) {
        Ok(_) => Ok(()),
        Err(e) => Err(match e.raw_os_error() {
            Some(libc::EPERM) => "io_uring_setup refused with EPERM (seccomp profile, container policy or kernel.io_uring_disabled=1)".to_string(),
            Some(libc::ENOSYS) => "kernel has no io_uring (io_uring_setup: ENOSYS)".to_string(),
            _ => format!("io_uring_setup failed: {e}"),
        }),
    }
}

enum Op {
    Read {
        slot: u32,
        offset: u64,
        len: usize,
        tx: oneshot::Sender<io::Result<Bytes>>,
    },
    Write {
        slot: u32,
        offset: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
        tx: oneshot::Sender<io::Result<()>>,
    },
    /// Points a registered-file slot at `fd` (-1 clears it).
    Update {
        slot: u32,
        fd: RawFd,
        done: Option<mpsc::Sender<io::Result<()>>>,
    },
    Shutdown,
}

enum ReadBuf {
    Registered(u16),
    Owned(AlignedBuf),
}

enum Inflight {
    Read {
        buf: ReadBuf,
        tx: oneshot::Sender<io::Result<Bytes>>,
    },
    Write {
        _buf: Arc<AlignedBuf>,
        len: usize,
        tx: oneshot::Sender<io::Result<()>>,
    },
}

struct Shared {
    queue: Mutex<Vec<Op>>,
    wake: OwnedFd,
    /// The ring thread is about to sleep in `io_uring_enter`: the first operation queued
    /// after that writes the eventfd, later ones ride on the same wake-up (one syscall per
    /// wake-up, not per operation).
    idle: AtomicBool,
}

impl Shared {
    fn push(&self, op: Op) {
        self.queue.lock().unwrap().push(op);
        if self.idle.swap(false, SeqCst) {
            self.wake_thread();
        }
    }
    fn wake_thread(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// The io_uring engine (see the module docs).
pub(crate) struct UringEngine {
    shared: Arc<Shared>,
    files: Mutex<Vec<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl UringEngine {
    pub(crate) fn new(params: EngineParams) -> io::Result<Self> {
        let qd = params.queue_depth.clamp(1, 4096);
        let ring: IoUring = IoUring::builder().build(qd + 1)?;
        ring.submitter().register_files_sparse(params.max_files)?;
        // SAFETY: eventfd(2) with valid flags; the result is checked before use.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: efd is a fresh descriptor that nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(efd) };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Vec::new()),
            wake,
            idle: AtomicBool::new(false),
        });
        // Built here, not in the thread, so the registered buffers exist when `new` returns.
        let ring_thread = RingThread::new(ring, shared.clone(), qd as usize);
        let thread = std::thread::Builder::new()
            .name("sluice-uring".into())
            .spawn(move || ring_thread.run())?;
        Ok(UringEngine {
            shared,
            files: Mutex::new(vec![false; params.max_files as usize]),
            thread: Some(thread),
        })
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.shared.push(Op::Shutdown);
        self.shared.wake_thread();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl IoEngine for UringEngine {
    fn add_file(&self, file: &File) -> io::Result<FileId> {
        let slot = {
            let mut files = self.files.lock().unwrap();
            let slot = files
                .iter()
                .position(|used| !used)
                .ok_or_else(|| io::Error::other("io_uring registered file table is full"))?;
            files[slot] = true;
            slot as u32
        };
        let (tx, rx) = mpsc::channel();
        let fd = file.as_raw_fd();
        // The registered table takes its own reference to the file until the slot is cleared.
        self.shared.push(Op::Update {
            slot,
            fd,
            done: Some(tx),
        });
        let res = rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("io_uring thread stopped")));
        match res {
            Ok(()) => Ok(FileId(slot)),
            Err(e) => {
                self.files.lock().unwrap()[slot as usize] = false;
                Err(e)
            }
        }
    }

    fn remove_file(&self, id: FileId) {
        self.shared.push(Op::Update {
            slot: id.0,
            fd: -1,
            done: None,
        });
        if let Some(used) = self.files.lock().unwrap().get_mut(id.0 as usize) {
            *used = false;
        }
    }

    fn read(&self, id: FileId, offset: u64, len: usize) -> IoFuture<io::Result<Bytes>> {
        let (tx, rx) = oneshot::channel();
        self.shared.push(Op::Read {
            slot: id.0,
            offset,
            len,
            tx,
        });
        Box::pin(async move {
            rx.await
                .map_err(|_| io::Error::other("io_uring thread dropped the request"))?
        })
    }

    fn write(
        &self,
        id: FileId,
        offset: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    ) -> IoFuture<io::Result<()>> {
        let (tx, rx) = oneshot::channel();
        self.shared.push(Op::Write {
            slot: id.0,
            offset,
            buf,
            len,
            tx,
        });
        Box::pin(async move {
            rx.await
                .map_err(|_| io::Error::other("io_uring thread dropped the request"))?
        })
    }
}

struct RingThread {
    ring: IoUring,
    shared: Arc<Shared>,
    qd: usize,
    registered: Vec<AlignedBuf>,
    free_registered: Vec<u16>,
    slab: Vec<Option<Inflight>>,
    free_slab: Vec<usize>,
    inflight: usize,
    backlog: VecDeque<Op>,
    wake_buf: Box<u64>,
    wake_armed: bool,
}

impl RingThread {
    fn new(ring: IoUring, shared: Arc<Shared>, qd: usize) -> Self {
        let count = qd.min(32);
        let registered: Vec<AlignedBuf> = (0..count)
            .map(|_| AlignedBuf::zeroed(REG_BUF_SIZE))
            .collect();
        let iovecs: Vec<libc::iovec> = registered
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut _,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: the buffers live in `self.registered` for as long as the ring exists (the
        // ring is dropped with `self`), and their addresses never move.
        let ok = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        let free_registered = if ok {
            (0..count as u16).collect()
        } else {
            Vec::new()
        };
        RingThread {
            ring,
            shared,
            qd,
            registered,
            free_registered,
            slab: Vec::new(),
            free_slab: Vec::new(),
            inflight: 0,
            backlog: VecDeque::new(),
            wake_buf: Box::new(0),
            wake_armed: false,
        }
    }

    fn run(mut self) {
        let mut shutdown = false;
        loop {
            self.backlog
                .extend(self.shared.queue.lock().unwrap().drain(..));
            while self.inflight < self.qd {
                let Some(op) = self.backlog.pop_front() else {
                    break;
                };
                match op {
                    Op::Shutdown => shutdown = true,
                    Op::Update { slot, fd, done } => {
                        let res = self
                            .ring
                            .submitter()
                            .register_files_update(slot, &[fd])
                            .map(drop);
                        if let Some(done) = done {
                            let _ = done.send(res);
                        }
                    }
                    op => self.start(op),
                }
            }
            if shutdown && self.inflight == 0 && self.backlog.is_empty() {
                self.teardown();
                return;
            }
            if self.inflight < self.qd {
                // Announce the sleep, then look again: an operation queued before the
                // announcement is seen here, one queued after it writes the eventfd.
                self.shared.idle.store(true, SeqCst);
                if !self.shared.queue.lock().unwrap().is_empty() {
                    self.shared.idle.store(false, SeqCst);
                    continue;
                }
            }
            if !self.wake_armed {
                let entry = opcode::Read::new(
                    types::Fd(self.shared.wake.as_raw_fd()),
                    (&mut *self.wake_buf as *mut u64).cast(),
                    8,
                )
                .build()
                .user_data(WAKE);
                // SAFETY: wake_buf is boxed (stable address) and lives as long as the ring.
                if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                    self.wake_armed = true;
                }
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if e.raw_os_error() == Some(libc::EINTR)
                        || e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    tracing::error!("io_uring_enter failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.shared.idle.store(false, SeqCst);
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, res) in done {
                if ud == WAKE {
                    self.wake_armed = false;
                } else {
                    self.complete(ud as usize, res);
                }
            }
        }
    }

    /// Completes the armed eventfd read and drops the registrations before the ring goes,
    /// so that no request or file reference outlives the engine (a file still registered
    /// would keep its filesystem busy after the cache is dropped).
    fn teardown(&mut self) {
        if self.wake_armed {
            self.shared.wake_thread();
            while self.wake_armed {
                if let Err(e) = self.ring.submit_and_wait(1)
                    && e.raw_os_error() != Some(libc::EINTR)
                {
                    break;
                }
                let done: Vec<u64> = self.ring.completion().map(|c| c.user_data()).collect();
                if done.contains(&WAKE) {
                    self.wake_armed = false;
                }
            }
        }
        let _ = self.ring.submitter().unregister_files();
        let _ = self.ring.submitter().unregister_buffers();
    }

    fn slot(&mut self, op: Inflight) -> usize {
        self.inflight += 1;
        match self.free_slab.pop() {
            Some(i) => {
                self.slab[i] = Some(op);
                i
            }
            None => {
                self.slab.push(Some(op));
                self.slab.len() - 1
            }
        }
    }

    fn start(&mut self, op: Op) {
        let entry = match op {
            Op::Read {
                slot,
                offset,
                len,
                tx,
            } => {
                if len <= REG_BUF_SIZE
                    && let Some(idx) = self.free_registered.pop()
                {
                    let ptr = self.registered[idx as usize].as_ptr() as *mut u8;
                    let ud = self.slot(Inflight::Read {
                        buf: ReadBuf::Registered(idx),
                        tx,
                    });
                    opcode::ReadFixed::new(types::Fixed(slot), ptr, len as u32, idx)
                        .offset(offset)
                        .build()
                        .user_data(ud as u64)
                } else {
                    let mut buf = super::buf::pool::take(len);
                    let ptr = buf.as_mut_ptr();
                    let ud = self.slot(Inflight::Read {
                        buf: ReadBuf::Owned(buf),
                        tx,
                    });
                    opcode::Read::new(types::Fixed(slot), ptr, len as u32)
                        .offset(offset)
                        .build()
                        .user_data(ud as u64)
                }
            }
            Op::Write {
                slot,
                offset,
                buf,
                len,
                tx,
            } => {
                let ptr = buf.as_ptr();
                let ud = self.slot(Inflight::Write { _buf: buf, len, tx });
                opcode::Write::new(types::Fixed(slot), ptr, len as u32)
                    .offset(offset)
                    .build()
                    .user_data(ud as u64)
            }
            Op::Update { .. } | Op::Shutdown => unreachable!("handled by run"),
        };
        // SAFETY: every buffer the entry points at is owned by the slab entry (or the
        // registered pool) and is released only in `complete`, after the kernel is done.
        while unsafe { self.ring.submission().push(&entry) }.is_err() {
            let _ = self.ring.submit();
        }
    }

    fn complete(&mut self, ud: usize, res: i32) {
        let Some(op) = self.slab.get_mut(ud).and_then(Option::take) else {
            return;
        };
        self.free_slab.push(ud);
        self.inflight -= 1;
        match op {
            Inflight::Read { buf, tx } => {
                let out = if res < 0 {
                    if let ReadBuf::Registered(idx) = buf {
                        self.free_registered.push(idx);
                    }
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    let n = res as usize;
                    Ok(match buf {
                        ReadBuf::Registered(idx) => {
                            let b = Bytes::copy_from_slice(&self.registered[idx as usize][..n]);
                            self.free_registered.push(idx);
                            b
                        }
                        ReadBuf::Owned(buf) => super::buf::pool::into_bytes(buf, n),
                    })
                };
                let _ = tx.send(out);
            }
            Inflight::Write { len, tx, .. } => {
                let out = if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else if res as usize != len {
                    Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short write: {res} of {len} bytes"),
                    ))
                } else {
                    Ok(())
                };
                let _ = tx.send(out);
            }
        }
    }
}
