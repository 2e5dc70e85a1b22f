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

/// Large read buffers are recycled: a fresh multi-MiB allocation is memory the allocator
/// must zero (or the kernel fault in) on every read.
///
/// Buffers are exactly the (page-aligned) size asked for, not rounded to a size class: a
/// read's `Bytes` may live on in the memory tier, which counts the value's bytes, so a 4
/// MiB block at an unaligned offset must not sit in an 8 MiB buffer (it did, and a 1 GiB
/// memory tier held 3 GiB). The blocks of a dataset come in a few sizes, so exact sizes
/// still recycle.
pub(crate) mod pool {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::{ALIGN, AlignedBuf, align_up};

    /// Reads from this size up are recycled (smaller ones are cheap to allocate).
    const MIN: usize = 64 << 10;
    /// Idle bytes kept: about the reads in flight. What the pool holds is outside the
    /// memory budget.
    const KEEP_BYTES: usize = 32 << 20;
    /// Idle buffers kept per size.
    const KEEP_PER_SIZE: usize = 16;

    #[derive(Default)]
    struct Idle {
        by_size: HashMap<usize, Vec<AlignedBuf>>,
        bytes: usize,
    }

    static POOL: Mutex<Option<Idle>> = Mutex::new(None);

    /// A buffer of `len` bytes rounded up to [`ALIGN`], recycled when possible.
    pub(crate) fn take(len: usize) -> AlignedBuf {
        let size = align_up(len.max(ALIGN) as u64) as usize;
        if size >= MIN
            && let Some(idle) = POOL.lock().unwrap().as_mut()
            && let Some(buf) = idle.by_size.get_mut(&size).and_then(Vec::pop)
        {
            idle.bytes -= size;
            return buf;
        }
        AlignedBuf::zeroed(size)
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
            let Some(buf) = self.0.take() else { return };
            if buf.len() < MIN {
                return;
            }
            let mut pool = POOL.lock().unwrap();
            let idle = pool.get_or_insert_with(Idle::default);
            if idle.bytes + buf.len() > KEEP_BYTES {
                return;
            }
            let same = idle.by_size.entry(buf.len()).or_default();
            if same.len() < KEEP_PER_SIZE {
                idle.bytes += buf.len();
                same.push(buf);
            }
        }
    }

    /// The first `n` bytes of `buf` as `Bytes`, without a copy.
    pub(crate) fn into_bytes(buf: AlignedBuf, n: usize) -> Bytes {
        Bytes::from_owner(Pooled(Some(buf))).slice(..n)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_buffer_is_its_aligned_size_and_comes_back() {
            let len = (4 << 20) + 100;
            let buf = take(len);
            assert_eq!(
                buf.len(),
                (4 << 20) + ALIGN,
                "not rounded to a power of two"
            );
            let addr = buf.as_ptr() as usize;
            drop(into_bytes(buf, len));
            assert_eq!(take(len).as_ptr() as usize, addr, "recycled");
        }
    }
}
