//! A global allocator that keeps, per thread, the bytes allocated minus the
//! bytes freed on that thread: work run on one thread (a current-thread
//! tokio runtime) can be measured while other tests run on other threads.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

pub struct Counting;

fn add(n: i64) {
    // During thread teardown the slot may be gone: those bytes go uncounted.
    let _ = LIVE.try_with(|c| c.set(c.get() + n));
}

// SAFETY: every call is passed to `System` unchanged; the counter is a
// const-initialised thread-local cell, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            add(l.size() as i64);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        add(-(l.size() as i64));
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            add(l.size() as i64);
        }
        p
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            add(new as i64 - l.size() as i64);
        }
        q
    }
}

/// Bytes this thread has allocated and not freed.
pub fn live_on_this_thread() -> i64 {
    LIVE.with(|c| c.get())
}
