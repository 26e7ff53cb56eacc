//! Receive pools: where frame payloads land.
//!
//! The transport reads a payload straight from QUIC's decrypted buffers into
//! a buffer taken from a pool (the one copy between socket and consumer), and
//! hands that buffer to the consumer, who returns it by dropping it. A pool
//! has a byte budget: when it is spent, the transport stops reading, QUIC
//! flow control stops the sender, and memory stays bounded.
//!
//! `HostPool` is the implementation: size classes under a budget, over a
//! `HostMemory` that supplies the bytes: `AlignedHeap` (64-byte aligned host
//! memory) on the CPU, `PinnedHeap` (page-locked, for asynchronous DMA to a
//! GPU; see `iota_cuda::pinned`) on a CUDA miner.

use std::alloc::{Layout, alloc, dealloc};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

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

/// Where a pool's bytes come from.
pub trait HostMemory: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// `bytes` (a power of two, >= `POOL_ALIGN`) aligned to `POOL_ALIGN`, or
    /// `None` when the memory cannot be had.
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>>;
    /// # Safety
    /// `ptr` came from `alloc(bytes)` of this memory and is no longer used.
    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize);
}

/// Ordinary heap memory, 64-byte aligned.
pub struct AlignedHeap;

impl HostMemory for AlignedHeap {
    fn name(&self) -> &'static str {
        "host"
    }
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>> {
        // SAFETY: the layout has non-zero size (bytes >= 64).
        NonNull::new(unsafe { alloc(HostPool::layout(bytes)) })
    }
    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: allocated by `alloc` with this layout (the caller's contract).
        unsafe { dealloc(ptr.as_ptr(), HostPool::layout(bytes)) }
    }
}

/// Page-locked host memory of one GPU's context (cached, not
/// write-combined), so received payloads can be copied to the device
/// asynchronously. Page-aligned, so `POOL_ALIGN` holds.
pub struct PinnedHeap(pub iota_cuda::pinned::PinnedAllocator);

impl HostMemory for PinnedHeap {
    fn name(&self) -> &'static str {
        "page-locked"
    }
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>> {
        self.0.alloc(bytes).ok()
    }
    unsafe fn free(&self, ptr: NonNull<u8>, _bytes: usize) {
        // SAFETY: per the caller's contract.
        unsafe { self.0.free(ptr) }
    }
}

/// Buffers under a byte budget. Freed buffers are kept by power-of-two size
/// class and reused.
pub struct HostPool {
    memory: Box<dyn HostMemory>,
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
    /// A pool of ordinary (64-byte aligned) heap memory.
    pub fn new(budget_bytes: usize) -> Arc<Self> {
        HostPool::with_memory(budget_bytes, Box::new(AlignedHeap))
    }

    pub fn with_memory(budget_bytes: usize, memory: Box<dyn HostMemory>) -> Arc<Self> {
        Arc::new(HostPool {
            memory,
            budget: budget_bytes,
            in_use: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
            free: Mutex::new(HashMap::new()),
            cached: AtomicUsize::new(0),
            notify: Notify::new(),
        })
    }

    /// The kind of memory it lends ("host", "page-locked").
    pub fn memory_kind(&self) -> &'static str {
        self.memory.name()
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
        let reused = self.free.lock().get_mut(&cap).and_then(|v| v.pop());
        let ptr = match reused {
            Some(p) => {
                self.cached.fetch_sub(cap, Ordering::SeqCst);
                p.0
            }
            None => match self.memory.alloc(cap) {
                Some(p) => p,
                None => {
                    self.in_use.fetch_sub(cap, Ordering::SeqCst);
                    return None;
                }
            },
        };
        let home: Arc<dyn BufferPool> = self;
        // SAFETY: ptr owns cap >= len bytes from this pool until given back.
        Some(unsafe { PooledBuf::from_raw(ptr, len, cap, home) })
    }

    fn give_back(&self, ptr: NonNull<u8>, capacity: usize) {
        // Keep freed memory for reuse, but never more than the budget.
        if self.cached.load(Ordering::SeqCst) + capacity <= self.budget {
            self.cached.fetch_add(capacity, Ordering::SeqCst);
            self.free.lock().entry(capacity).or_default().push(SendPtr(ptr));
        } else {
            // SAFETY: ptr came from `self.memory.alloc(capacity)` and is back from its loan.
            unsafe { self.memory.free(ptr, capacity) };
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
        for (cap, v) in self.free.get_mut().drain() {
            for p in v {
                // SAFETY: allocated by `self.memory.alloc(cap)`, not on loan.
                unsafe { self.memory.free(p.0, cap) };
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

    /// Counts what a pool asks of its memory.
    struct Counting {
        allocs: Arc<AtomicUsize>,
        frees: Arc<AtomicUsize>,
        limit: usize,
    }

    impl HostMemory for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        fn alloc(&self, bytes: usize) -> Option<NonNull<u8>> {
            if self.allocs.load(Ordering::SeqCst) >= self.limit {
                return None;
            }
            self.allocs.fetch_add(1, Ordering::SeqCst);
            AlignedHeap.alloc(bytes)
        }
        unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
            self.frees.fetch_add(1, Ordering::SeqCst);
            unsafe { AlignedHeap.free(ptr, bytes) }
        }
    }

    #[test]
    fn pool_memory_is_pluggable_reused_and_all_freed() {
        let (allocs, frees) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mem = Counting { allocs: allocs.clone(), frees: frees.clone(), limit: 2 };
        let pool = HostPool::with_memory(1 << 16, Box::new(mem));
        assert_eq!(pool.memory_kind(), "counting");
        let dynpool: Arc<dyn BufferPool> = pool.clone();
        let a = dynpool.clone().try_take(1000).unwrap();
        let b = dynpool.clone().try_take(1000).unwrap();
        // The memory refuses a third allocation: the pool says no and gives the budget back.
        assert!(dynpool.clone().try_take(1000).is_none());
        assert_eq!(dynpool.in_use_bytes(), 2048);
        drop(a);
        let c = dynpool.clone().try_take(900).unwrap();
        assert_eq!(allocs.load(Ordering::SeqCst), 2, "the freed buffer was reused, not reallocated");
        drop((b, c));
        drop(dynpool);
        drop(pool);
        assert_eq!(frees.load(Ordering::SeqCst), 2, "dropping the pool frees every cached buffer");
    }
}
