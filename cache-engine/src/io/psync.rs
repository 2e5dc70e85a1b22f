//! pread/pwrite on a small pool of dedicated threads: for kernels or sandboxes without
//! io_uring, and as the second implementation the tests run against.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{AlignedBuf, EngineParams, FileId, IoEngine, IoFuture};

type Job = Box<dyn FnOnce() + Send>;

/// The psync engine: `queue_depth` (capped at 16) threads doing blocking positional I/O.
pub(crate) struct PsyncEngine {
    jobs: Mutex<Sender<Job>>,
    files: Mutex<Vec<Option<Arc<File>>>>,
}

impl PsyncEngine {
    pub(crate) fn new(params: EngineParams) -> Self {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..params.queue_depth.clamp(1, 16) {
            let rx: Arc<Mutex<Receiver<Job>>> = rx.clone();
            std::thread::Builder::new()
                .name(format!("sluice-psync-{i}"))
                .spawn(move || {
                    loop {
                        let job = rx.lock().unwrap().recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })
                .expect("spawn psync thread");
        }
        PsyncEngine {
            jobs: Mutex::new(tx),
            files: Mutex::new(Vec::new()),
        }
    }

    fn file(&self, id: FileId) -> io::Result<Arc<File>> {
        self.files
            .lock()
            .unwrap()
            .get(id.0 as usize)
            .cloned()
            .flatten()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> IoFuture<io::Result<T>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.jobs.lock().unwrap().send(Box::new(move || {
            let _ = tx.send(f());
        }));
        Box::pin(async move {
            sent.map_err(|_| io::Error::other("psync engine stopped"))?;
            rx.await
                .map_err(|_| io::Error::other("psync engine dropped the request"))?
        })
    }
}

impl IoEngine for PsyncEngine {
    fn add_file(&self, file: &File) -> io::Result<FileId> {
        let file = Some(Arc::new(file.try_clone()?));
        let mut files = self.files.lock().unwrap();
        match files.iter().position(Option::is_none) {
            Some(i) => {
                files[i] = file;
                Ok(FileId(i as u32))
            }
            None => {
                files.push(file);
                Ok(FileId(files.len() as u32 - 1))
            }
        }
    }

    fn remove_file(&self, id: FileId) {
        if let Some(slot) = self.files.lock().unwrap().get_mut(id.0 as usize) {
            *slot = None;
        }
    }

    fn read(&self, id: FileId, offset: u64, len: usize) -> IoFuture<io::Result<Bytes>> {
        let file = match self.file(id) {
            Ok(f) => f,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        self.submit(move || {
            let mut buf = super::buf::pool::take(len);
            let mut done = 0;
            while done < len {
                match file.read_at(&mut buf[done..len], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(super::buf::pool::into_bytes(buf, done))
        })
    }

    fn write(
        &self,
        id: FileId,
        offset: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    ) -> IoFuture<io::Result<()>> {
        let file = match self.file(id) {
            Ok(f) => f,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        self.submit(move || file.write_all_at(&buf[..len], offset))
    }
}
