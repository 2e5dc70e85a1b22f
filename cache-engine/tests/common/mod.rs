//! Helpers shared by the fault tests: deterministic values, both engines, cache setup.
#![allow(dead_code)]

use std::path::Path;

use bytes::Bytes;
use sluice_cache_engine::{Cache, CacheBuilder, DiskConfig, EngineKind, Key, OpenError};

/// Both engines; io_uring is skipped (with a message) only where the kernel refuses it.
pub fn engines() -> Vec<EngineKind> {
    let mut out = vec![EngineKind::Psync];
    let dir = tempfile::tempdir().unwrap();
    match small(dir.path(), EngineKind::IoUring, 0).open() {
        Ok(_) => out.insert(0, EngineKind::IoUring),
        Err(OpenError::IoUringUnavailable(why)) => eprintln!("skipping the io_uring engine: {why}"),
        Err(e) => panic!("{e}"),
    }
    out
}

/// The key of block `i`.
pub fn key(i: u64) -> Key {
    Key::hash(&[b"block", &i.to_le_bytes()])
}

/// The value of block `i` (length and bytes derived from `i` and `version`).
pub fn value(i: u64, version: u64, max: usize) -> Bytes {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ version.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ 0x1234_5678;
    let len = 1 + (x % max as u64) as usize;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

/// A small cache on one directory: 4 MiB segments, 256 KiB largest value.
pub fn small(dir: &Path, engine: EngineKind, memory: u64) -> CacheBuilder {
    CacheBuilder::new()
        .engine(engine)
        .memory_capacity(memory)
        .segment_size(4 << 20)
        .max_value_size(256 << 10)
        .queue_depth(16)
        .disk(DiskConfig::new(dir, 1 << 30))
}

/// Opens `builder`, panicking with the error's text.
pub fn open(builder: CacheBuilder) -> Cache {
    builder.open().unwrap_or_else(|e| panic!("open: {e}"))
}

/// Whether the tests run as root (loop mounts need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
