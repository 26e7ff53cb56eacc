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
