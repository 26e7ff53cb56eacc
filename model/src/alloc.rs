//! Allocator settings for the binaries (mimalloc is every binary's global
//! allocator).
//!
//! A training step allocates and frees the same few hundred MB of
//! activations every step. mimalloc by default hands freed memory back to the
//! OS after a short delay, so each step faults the pages in again and the
//! kernel zeroes them (measured: ~3-8% of a `stage-cpu` step). Like the
//! caching allocators of other training stacks, we keep freed memory in the
//! process instead.

/// Tells mimalloc never to purge freed memory back to the OS. Call first thing
/// in `main`.
pub fn keep_freed_memory() {
    // mimalloc's option enum places `purge_delay` right before
    // `use_numa_nodes` (mimalloc.h, v2 and v3); -1 disables purging. The
    // Rust bindings do not export the constant itself.
    let purge_delay = libmimalloc_sys::mi_option_use_numa_nodes - 1;
    // SAFETY: plain FFI call setting an integer option; valid at any time.
    unsafe { libmimalloc_sys::mi_option_set(purge_delay, -1) };
}

/// Wraps an allocator and keeps, per thread, the bytes allocated minus the
/// bytes freed on that thread, and the highest that count has been. Work run
/// on one thread (a current-thread tokio runtime, a one-thread rayon pool)
/// can then be measured while other threads run: what a server keeps per
/// client, what a stage's forward and backward hold at their peak, in tests
/// and benchmarks. Costs one thread-local add and compare per call.
pub struct ThreadCounted<A>(pub A);

struct Counts {
    live: std::cell::Cell<i64>,
    peak: std::cell::Cell<i64>,
}

thread_local! {
    static COUNTS: Counts = const { Counts { live: std::cell::Cell::new(0), peak: std::cell::Cell::new(0) } };
}

fn count(n: i64) {
    // During thread teardown the slot may be gone: those bytes go uncounted.
    let _ = COUNTS.try_with(|c| {
        let live = c.live.get() + n;
        c.live.set(live);
        if live > c.peak.get() {
            c.peak.set(live);
        }
    });
}

/// Bytes this thread has allocated and not freed (through a `ThreadCounted`
/// global allocator).
pub fn live_on_this_thread() -> i64 {
    COUNTS.with(|c| c.live.get())
}

/// The highest `live_on_this_thread` since the thread started or the last
/// `reset_peak_on_this_thread`.
pub fn peak_on_this_thread() -> i64 {
    COUNTS.with(|c| c.peak.get())
}

/// Starts a new peak measurement from the bytes live now.
pub fn reset_peak_on_this_thread() {
    COUNTS.with(|c| c.peak.set(c.live.get()));
}

// SAFETY: every call goes to the wrapped allocator unchanged; the counter is
// a const-initialised thread-local cell, which never allocates.
unsafe impl<A: std::alloc::GlobalAlloc> std::alloc::GlobalAlloc for ThreadCounted<A> {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc(l) };
        if !p.is_null() {
            count(l.size() as i64);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        unsafe { self.0.dealloc(p, l) };
        count(-(l.size() as i64));
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc_zeroed(l) };
        if !p.is_null() {
            count(l.size() as i64);
        }
        p
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        let q = unsafe { self.0.realloc(p, l, new) };
        if !q.is_null() {
            count(new as i64 - l.size() as i64);
        }
        q
    }
}
