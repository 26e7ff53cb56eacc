//! Receive pools: where frame payloads land.
//!
//! The transport reads a payload straight from QUIC's decrypted buffers into
//! a buffer taken from a pool (the one copy between socket and consumer), and
//! hands that buffer to the consumer, who returns it by dropping it. A pool
//! has a byte budget: when it is spent, the transport stops reading, QUIC
//! flow control stops the sender, and memory stays bounded.
//!
//! `HostPool` is the CPU implementation (64-byte aligned host memory); the
//! CUDA backend provides one over page-locked memory behind the same trait.

use std::alloc::{Layout, alloc, dealloc};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Alignment of pooled buffers (a cache line; lets payloads be read as f32/bf16 in place).
pub const POOL_ALIGN: usize = 64;

/// Memory a pool hands out. `give_back` receives exactly what `take` produced.
pub trait BufferPool: Send + Sync + 'static {
    /// A buffer of at least `len` bytes if the budget allows now.
    fn try_take(self: Arc<Self>, len: usize) -> Option<PooledBuf>;
    /// Returns a buffer's memory (called when a `PooledBuf` drops).
    fn give_back(&self, ptr: NonNull<u8>, capacity: usize);
    /// Woken whenever memory is given back.
    fn notify(&self) -> &Notify;
    fn budget_bytes(&self) -> usize;
    fn in_use_bytes(&self) -> usize;
    fn high_water_bytes(&self) -> usize;
}

/// Waits until `pool` can lend `len` bytes. Fails at once if `len` exceeds
/// the whole budget (it could never be served).
pub async fn take(pool: &Arc<dyn BufferPool>, len: usize) -> Option<PooledBuf> {
    if len > pool.budget_bytes() {
        return None;
    }
    loop {
        let woken = pool.notify().notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if let Some(b) = pool.clone().try_take(len) {
            return Some(b);
        }
        woken.await;
    }
}

/// A buffer on loan from a pool; goes back when dropped.
pub struct PooledBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    home: Arc<dyn BufferPool>,
}

// SAFETY: the buffer is uniquely owned memory; the pool it returns to is Sync.
unsafe impl Send for PooledBuf {}
unsafe impl Sync for PooledBuf {}

impl PooledBuf {
    /// # Safety
    /// `ptr` must point to `capacity` bytes owned by `home`, valid until
    /// `home.give_back` is called with them, and `len <= capacity`.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, capacity: usize, home: Arc<dyn BufferPool>) -> Self {
        PooledBuf { ptr, len, capacity, home }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes while we own the loan.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and the loan is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        self.home.give_back(self.ptr, self.capacity);
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuf({} bytes)", self.len)
    }
}

/// 64-byte aligned host memory under a byte budget. Freed buffers are kept
/// by power-of-two size class and reused.
pub struct HostPool {
    budget: usize,
    in_use: AtomicUsize,
    high_water: AtomicUsize,
    free: Mutex<HashMap<usize, Vec<SendPtr>>>,
    cached: AtomicUsize,
    notify: Notify,
}

struct SendPtr(NonNull<u8>);
// SAFETY: a free buffer is plain memory nobody references.
unsafe impl Send for SendPtr {}

fn class(len: usize) -> usize {
    len.max(POOL_ALIGN).next_power_of_two()
}

impl HostPool {
    pub fn new(budget_bytes: usize) -> Arc<Self> {
        Arc::new(HostPool {
            budget: budget_bytes,
            in_use: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
            free: Mutex::new(HashMap::new()),
            cached: AtomicUsize::new(0),
            notify: Notify::new(),
        })
    }

    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap, POOL_ALIGN).expect("pool size class fits a layout")
    }
}

impl BufferPool for HostPool {
    fn try_take(self: Arc<Self>, len: usize) -> Option<PooledBuf> {
        let cap = class(len);
        // Reserve budget first (compare-and-swap so concurrent takers never overshoot).
        let mut cur = self.in_use.load(Ordering::SeqCst);
        loop {
            let next = cur.checked_add(cap)?;
            if next > self.budget {
                return None;
            }
            match self.in_use.compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    self.high_water.fetch_max(next, Ordering::SeqCst);
                    break;
                }
                Err(now) => cur = now,
            }
        }
        let reused = self.free.lock().unwrap().get_mut(&cap).and_then(|v| v.pop());
        let ptr = match reused {
            Some(p) => {
                self.cached.fetch_sub(cap, Ordering::SeqCst);
                p.0
            }
            None => {
                // SAFETY: the layout has non-zero size (cap >= 64).
                match NonNull::new(unsafe { alloc(Self::layout(cap)) }) {
                    Some(p) => p,
                    None => {
                        self.in_use.fetch_sub(cap, Ordering::SeqCst);
                        return None;
                    }
                }
            }
        };
        let home: Arc<dyn BufferPool> = self;
        // SAFETY: ptr owns cap >= len bytes from this pool until given back.
        Some(unsafe { PooledBuf::from_raw(ptr, len, cap, home) })
    }

    fn give_back(&self, ptr: NonNull<u8>, capacity: usize) {
        // Keep freed memory for reuse, but never more than the budget.
        if self.cached.load(Ordering::SeqCst) + capacity <= self.budget {
            self.cached.fetch_add(capacity, Ordering::SeqCst);
            self.free.lock().unwrap().entry(capacity).or_default().push(SendPtr(ptr));
        } else {
            // SAFETY: ptr was allocated by `alloc` with this layout.
            unsafe { dealloc(ptr.as_ptr(), Self::layout(capacity)) };
        }
        self.in_use.fetch_sub(capacity, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn notify(&self) -> &Notify {
        &self.notify
    }
    fn budget_bytes(&self) -> usize {
        self.budget
    }
    fn in_use_bytes(&self) -> usize {
        self.in_use.load(Ordering::SeqCst)
    }
    fn high_water_bytes(&self) -> usize {
        self.high_water.load(Ordering::SeqCst)
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        for (cap, v) in self.free.get_mut().unwrap().drain() {
            for p in v {
                // SAFETY: allocated by `alloc` with this layout, not on loan.
                unsafe { dealloc(p.0.as_ptr(), Self::layout(cap)) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn budget_is_enforced_and_waiters_wake() {
        let pool: Arc<dyn BufferPool> = HostPool::new(1 << 20);
        let a = take(&pool, 600 << 10).await.unwrap(); // 1 MiB class
        assert_eq!(a.as_ptr() as usize % POOL_ALIGN, 0);
        assert_eq!(pool.in_use_bytes(), 1 << 20);
        assert!(pool.clone().try_take(10).is_none(), "budget spent");
        assert!(take(&pool, 2 << 20).await.is_none(), "larger than the whole budget");
        let p2 = pool.clone();
        let waiter = tokio::spawn(async move { take(&p2, 1000).await.map(|b| b.len()) });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(a);
        assert_eq!(waiter.await.unwrap(), Some(1000));
        assert_eq!(pool.high_water_bytes(), 1 << 20);
        assert_eq!(pool.in_use_bytes(), 0);
    }

    #[test]
    fn buffers_are_reused_and_writable() {
        let pool: Arc<dyn BufferPool> = HostPool::new(1 << 16);
        let mut b = pool.clone().try_take(100).unwrap();
        b.fill(7);
        let p = b.as_ptr();
        drop(b);
        let b2 = pool.clone().try_take(120).unwrap();
        assert_eq!(b2.as_ptr(), p, "same size class reuses the buffer");
        assert_eq!(b2.len(), 120);
    }
}
