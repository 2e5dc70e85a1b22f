//! Page-aligned heap buffers for O_DIRECT I/O (the only place that allocates them).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// Alignment of every O_DIRECT buffer, offset and length.
pub(crate) const ALIGN: usize = 4096;

/// Rounds `n` up to a multiple of [`ALIGN`].
pub(crate) fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// Rounds `n` down to a multiple of [`ALIGN`].
pub(crate) fn align_down(n: u64) -> u64 {
    n / ALIGN as u64 * ALIGN as u64
}

/// A zero-initialised, [`ALIGN`]-aligned heap buffer whose address never moves.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is uniquely owned heap memory with no interior references; moving it
// between threads moves ownership only.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only (`&self` gives `&[u8]` only).
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to [`ALIGN`] (at least one page).
    pub(crate) fn zeroed(len: usize) -> Self {
        let len = (align_up(len.max(1) as u64)) as usize;
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
    /// Capacity in bytes (a multiple of [`ALIGN`]).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// Stable address of the first byte (valid until drop).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    /// Stable mutable address of the first byte (valid until drop).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, ALIGN).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// Large read buffers are recycled: a fresh multi-MiB allocation is a fresh mmap whose
/// pages the kernel must fault in and zero on every read.
pub(crate) mod pool {
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::{ALIGN, AlignedBuf};

    /// Size classes: powers of two from 64 KiB to 8 MiB.
    const MIN_SHIFT: u32 = 16;
    const CLASSES: usize = 8;
    /// Buffers kept per class.
    const KEEP: usize = 16;

    static POOL: [Mutex<Vec<AlignedBuf>>; CLASSES] = [const { Mutex::new(Vec::new()) }; CLASSES];

    fn class(len: usize) -> Option<usize> {
        let shift = len
            .max(ALIGN)
            .next_power_of_two()
            .trailing_zeros()
            .max(MIN_SHIFT);
        let c = (shift - MIN_SHIFT) as usize;
        (c < CLASSES).then_some(c)
    }

    /// A buffer of at least `len` bytes, recycled when possible.
    pub(crate) fn take(len: usize) -> AlignedBuf {
        match class(len) {
            Some(c) => POOL[c]
                .lock()
                .unwrap()
                .pop()
                .unwrap_or_else(|| AlignedBuf::zeroed(1 << (c as u32 + MIN_SHIFT))),
            None => AlignedBuf::zeroed(len),
        }
    }

    /// Owner of a pooled buffer inside a `Bytes`: hands it back on drop.
    struct Pooled(Option<AlignedBuf>);

    impl AsRef<[u8]> for Pooled {
        fn as_ref(&self) -> &[u8] {
            self.0.as_deref().unwrap_or(&[])
        }
    }

    impl Drop for Pooled {
        fn drop(&mut self) {
            if let Some(buf) = self.0.take()
                && buf.len().is_power_of_two()
                && let Some(c) = class(buf.len())
                && buf.len() == 1 << (c as u32 + MIN_SHIFT)
            {
                let mut keep = POOL[c].lock().unwrap();
                if keep.len() < KEEP {
                    keep.push(buf);
                }
            }
        }
    }

    /// The first `n` bytes of `buf` as `Bytes`, without a copy.
    pub(crate) fn into_bytes(buf: AlignedBuf, n: usize) -> Bytes {
        Bytes::from_owner(Pooled(Some(buf))).slice(..n)
    }
}
