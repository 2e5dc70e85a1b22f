//! The agent's allocator: jemalloc, set up so the resident size follows what is live.
//!
//! Why not glibc malloc: the memory tier churns multi-MiB blocks allocated on one thread
//! (a source fetch, a disk read) and freed on another (an eviction). glibc keeps freed
//! chunks in per-thread arenas and, past its dynamic mmap threshold, in the heap, so a
//! 256 MiB tier read as a 1.5 GiB file left the agent at 1.1 GiB resident (heaptrack: 306
//! MiB live at peak), and the full peers run saw 3 GiB at a 1 GiB budget. With jemalloc,
//! one arena and freed pages handed back by a background thread within about a second, the
//! same read peaks at 354 to 451 MiB (docs/benchmarks.md, "Agent memory").

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Read by jemalloc before `main` (`MALLOC_CONF`, spelled `_RJEM_MALLOC_CONF` for this
/// prefixed build, still overrides it). One arena: the large blocks are what count, and
/// they come from one pool however many threads free them; small objects keep their
/// per-thread caches. Dirty pages go back to the kernel after a second, not ten.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 =
    &b"narenas:1,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0];

/// Hands every free page back to the kernel now (after start-up's listing, whose garbage
/// would otherwise linger until the decay).
pub fn release_free_memory() {
    // MALLCTL_ARENAS_ALL: every arena.
    let name = c"arena.4096.purge";
    // SAFETY: a void mallctl (no old or new value) with a NUL-terminated name.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        tracing::debug!(rc, "jemalloc purge failed");
    }
}
