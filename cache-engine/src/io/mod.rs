//! The I/O seam of the disk tier: one small trait, an io_uring engine and a psync engine.
//!
//! Offsets and lengths handed to an engine are multiples of [`ALIGN`] because every file is
//! opened with O_DIRECT. Engines own the files they are given and keep them open until
//! [`IoEngine::remove_file`]; in-flight operations keep working on a removed file.

pub(crate) mod buf;
mod psync;
mod uring;

use std::fs::File;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

pub(crate) use buf::{ALIGN, AlignedBuf, align_down, align_up};

use crate::api::EngineKind;

/// A boxed future returned by the engines.
pub(crate) type IoFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Handle of a file registered with an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId(pub(crate) u32);

/// Positional reads and writes on registered files, completed on the caller's runtime.
pub(crate) trait IoEngine: Send + Sync {
    /// Registers `file` (opened with O_DIRECT; the engine keeps its own reference).
    fn add_file(&self, file: &File) -> io::Result<FileId>;
    /// Closes the file once operations already submitted on it are done.
    fn remove_file(&self, id: FileId);
    /// Reads up to `len` bytes at `offset`; shorter only at end of file.
    fn read(&self, id: FileId, offset: u64, len: usize) -> IoFuture<io::Result<Bytes>>;
    /// Writes the first `len` bytes of `buf` at `offset`; a short write is an error.
    fn write(
        &self,
        id: FileId,
        offset: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    ) -> IoFuture<io::Result<()>>;
}

/// Settings shared by both engines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineParams {
    pub queue_depth: u32,
    /// Most files open at once (sizes the registered file table).
    pub max_files: u32,
}

/// Builds one engine (one per disk directory: one ring per device).
pub(crate) fn build(kind: EngineKind, params: EngineParams) -> io::Result<Arc<dyn IoEngine>> {
    match kind {
        EngineKind::IoUring => Ok(Arc::new(uring::UringEngine::new(params)?)),
        _ => Ok(Arc::new(psync::PsyncEngine::new(params))),
    }
}

/// Decides which engine `requested` resolves to, and why it fell back if it did.
pub(crate) fn resolve(requested: EngineKind) -> Result<(EngineKind, Option<String>), String> {
    match requested {
        EngineKind::Psync => Ok((EngineKind::Psync, None)),
        EngineKind::IoUring => uring::probe().map(|()| (EngineKind::IoUring, None)),
        EngineKind::Auto => match uring::probe() {
            Ok(()) => Ok((EngineKind::IoUring, None)),
            Err(reason) => Ok((EngineKind::Psync, Some(reason))),
        },
    }
}
