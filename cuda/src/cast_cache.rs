//! Which fp32 device ranges have a current bf16 copy.
//!
//! The bf16 GEMM path reads bf16 operands. A weight is read by every
//! micro-batch's forward and backward but changes only when the optimizer
//! steps, so casting it on every call (what the profile showed as ~17% of
//! a step) is wasted work. This ledger remembers the copies and forgets one
//! as soon as anything may have changed its source:
//!
//! - a mutable view of an overlapping range was taken (every write through
//!   the `Backend` trait goes through `view_mut`; taking the view counts as
//!   the write, so a copy is never trusted across it);
//! - memory overlapping it was allocated (the source was freed and its
//!   address handed out again);
//! - the optimizer step rewrites the copy itself (`adamw` writes the bf16
//!   value beside the fp32 one), which makes the part it rewrote current
//!   again. A copy can span several optimizer entries (q|k|v are one GEMM
//!   operand, three tensors), so a copy keeps the stale parts it has and is
//!   current once every one was rewritten after it went stale.
//!
//! Pure bookkeeping over addresses, generic over the storage of the copies,
//! so the rules are tested without a GPU.

/// Stale parts kept per copy before it counts as wholly stale.
const STALE_PARTS: usize = 64;

/// One fp32 range `[ptr, ptr + 4 len)` and its bf16 copy.
struct Entry<T> {
    ptr: u64,
    len: usize,
    copy: T,
    /// Byte ranges of the source that may have changed since the copy was
    /// made and were not rewritten since; the copy is current when empty.
    stale: Vec<(u64, u64)>,
    /// Logical time of the last use (least recently used goes first).
    used: u64,
}

pub(crate) struct CastCache<T> {
    entries: Vec<Entry<T>>,
    /// Bytes of bf16 copies held (2 per element), current or not.
    held: usize,
    limit: usize,
    clock: u64,
}

impl<T> CastCache<T> {
    /// A ledger that holds at most `limit_bytes` of copies.
    pub(crate) fn new(limit_bytes: usize) -> Self {
        CastCache { entries: Vec::new(), held: 0, limit: limit_bytes, clock: 0 }
    }

    /// The copy of exactly this range, if it is current.
    pub(crate) fn current(&mut self, ptr: u64, len: usize) -> Option<&T> {
        self.clock += 1;
        let now = self.clock;
        let e = self.entries.iter_mut().find(|e| e.ptr == ptr && e.len == len && e.stale.is_empty())?;
        e.used = now;
        Some(&e.copy)
    }

    /// The storage kept for exactly this range, current or not, to be
    /// rewritten by the caller (then `mark_current`).
    pub(crate) fn storage(&mut self, ptr: u64, len: usize) -> Option<&T> {
        self.entries.iter().find(|e| e.ptr == ptr && e.len == len).map(|e| &e.copy)
    }

    /// The caller has just written a fresh copy of this range into its storage.
    pub(crate) fn mark_current(&mut self, ptr: u64, len: usize) {
        self.clock += 1;
        let now = self.clock;
        if let Some(e) = self.entries.iter_mut().find(|e| e.ptr == ptr && e.len == len) {
            e.stale.clear();
            e.used = now;
        }
    }

    /// A copy whose range holds `[ptr, ptr + 4 len)`: its storage and the
    /// element offset of `ptr` in it (for the optimizer to rewrite that part).
    pub(crate) fn storage_holding(&self, ptr: u64, len: usize) -> Option<(&T, usize)> {
        let end = ptr + 4 * len as u64;
        self.entries
            .iter()
            .find(|e| e.ptr <= ptr && end <= e.ptr + 4 * e.len as u64)
            .map(|e| (&e.copy, ((ptr - e.ptr) / 4) as usize))
    }

    /// The caller has just rewritten `[ptr, ptr + 4 len)` of the copy that
    /// `storage_holding` named: the stale parts inside it are current again.
    pub(crate) fn refreshed(&mut self, ptr: u64, len: usize) {
        let end = ptr + 4 * len as u64;
        if let Some(e) = self.entries.iter_mut().find(|e| e.ptr <= ptr && end <= e.ptr + 4 * e.len as u64) {
            e.stale.retain(|&(a, b)| !(ptr <= a && b <= end));
        }
    }

    /// Whether a copy of this range would fit the limit at all.
    pub(crate) fn admits(&self, len: usize) -> bool {
        2 * len <= self.limit
    }

    /// Adds storage for this range (not yet current: write the copy, then
    /// `mark_current`). Evicts the least recently used copies to stay under
    /// the limit; returns what was evicted so the caller frees it in order.
    pub(crate) fn insert(&mut self, ptr: u64, len: usize, copy: T) -> Vec<T> {
        let mut evicted = Vec::new();
        if let Some(i) = self.entries.iter().position(|e| e.ptr == ptr && e.len == len) {
            let old = self.entries.swap_remove(i);
            self.held -= 2 * old.len;
            evicted.push(old.copy);
        }
        while self.held + 2 * len > self.limit && !self.entries.is_empty() {
            let lru = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used).expect("not empty");
            let old = self.entries.swap_remove(lru);
            self.held -= 2 * old.len;
            evicted.push(old.copy);
        }
        self.clock += 1;
        self.held += 2 * len;
        self.entries.push(Entry { ptr, len, copy, stale: vec![(ptr, ptr + 4 * len as u64)], used: self.clock });
        evicted
    }

    /// The fp32 range `[ptr, ptr + 4 len)` may be written: copies of
    /// overlapping ranges stop being current (their storage is kept).
    pub(crate) fn written(&mut self, ptr: u64, len: usize) {
        let end = ptr + 4 * len as u64;
        for e in &mut self.entries {
            let e_end = e.ptr + 4 * e.len as u64;
            if e.ptr < end && ptr < e_end {
                if e.stale.len() >= STALE_PARTS {
                    // Too many parts to follow: stale as a whole until recast.
                    e.stale = vec![(e.ptr, e_end)];
                } else {
                    e.stale.push((e.ptr.max(ptr), e_end.min(end)));
                }
            }
        }
    }

    /// Memory `[ptr, ptr + bytes)` was just allocated: whatever overlapped it
    /// was freed, so its copies go, storage included.
    pub(crate) fn allocated(&mut self, ptr: u64, bytes: usize) -> Vec<T> {
        let end = ptr + bytes as u64;
        let mut dropped = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            let e = &self.entries[i];
            if e.ptr < end && ptr < e.ptr + 4 * e.len as u64 {
                let old = self.entries.swap_remove(i);
                self.held -= 2 * old.len;
                dropped.push(old.copy);
            } else {
                i += 1;
            }
        }
        dropped
    }

    /// A new limit; the least recently used copies go until the held bytes
    /// are within it (returned so the caller frees them in order).
    pub(crate) fn set_limit(&mut self, limit_bytes: usize) -> Vec<T> {
        self.limit = limit_bytes;
        let mut evicted = Vec::new();
        while self.held > self.limit && !self.entries.is_empty() {
            let lru = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used).expect("not empty");
            let old = self.entries.swap_remove(lru);
            self.held -= 2 * old.len;
            evicted.push(old.copy);
        }
        evicted
    }

    /// Bytes of copies held.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::CastCache;

    fn cache() -> CastCache<u32> {
        CastCache::new(1 << 20)
    }

    #[test]
    fn a_copy_is_current_only_after_it_is_written() {
        let mut c = cache();
        assert!(c.current(0x1000, 64).is_none());
        assert!(c.insert(0x1000, 64, 7).is_empty());
        assert!(c.current(0x1000, 64).is_none(), "storage alone is not a copy");
        c.mark_current(0x1000, 64);
        assert_eq!(c.current(0x1000, 64), Some(&7));
        // Another range of the same start is another operand.
        assert!(c.current(0x1000, 32).is_none());
    }

    #[test]
    fn a_write_anywhere_in_the_range_makes_the_copy_stale() {
        let mut c = cache();
        c.insert(0x1000, 64, 1); // [0x1000, 0x1100)
        c.insert(0x1100, 64, 2); // [0x1100, 0x1200)
        c.mark_current(0x1000, 64);
        c.mark_current(0x1100, 64);
        // The last float of the first range.
        c.written(0x10fc, 1);
        assert!(c.current(0x1000, 64).is_none());
        assert_eq!(c.current(0x1100, 64), Some(&2), "the neighbour was not touched");
        // A write that ends where a range starts leaves it alone.
        c.written(0x0f00, 64);
        assert_eq!(c.current(0x1100, 64), Some(&2));
        // A write spanning both.
        c.written(0x0ffc, 200);
        assert!(c.current(0x1100, 64).is_none());
        // Storage stays for the rewrite; marking makes it current again.
        assert_eq!(c.storage(0x1100, 64), Some(&2));
        c.mark_current(0x1100, 64);
        assert_eq!(c.current(0x1100, 64), Some(&2));
    }

    #[test]
    fn a_copy_over_several_entries_is_current_once_each_stale_part_is_rewritten() {
        let mut c = cache();
        // One copy of q|k|v: [0x1000, 0x1300), three entries of 0x100 bytes.
        c.insert(0x1000, 192, 1);
        c.mark_current(0x1000, 192);
        for p in [0x1000u64, 0x1100, 0x1200] {
            c.written(p, 64); // the optimizer's mutable view of one entry
            assert!(c.current(0x1000, 192).is_none());
            let (_, offset) = c.storage_holding(p, 64).unwrap();
            assert_eq!(offset as u64, (p - 0x1000) / 4);
            c.refreshed(p, 64); // it rewrote that part of the copy
        }
        assert_eq!(c.current(0x1000, 192), Some(&1));
        // A write the optimizer did not follow keeps it stale.
        c.written(0x1000, 64);
        c.written(0x1100, 1);
        c.refreshed(0x1000, 64);
        assert!(c.current(0x1000, 192).is_none());
        // A refresh covers only parts wholly inside it.
        c.refreshed(0x1100, 64);
        assert_eq!(c.current(0x1000, 192), Some(&1));
        // A range no copy holds.
        assert!(c.storage_holding(0x12f0, 8).is_none());
        // Past STALE_PARTS writes the copy is stale as a whole: refreshing
        // parts no longer makes it current.
        for i in 0..70u64 {
            c.written(0x1000 + 4 * (i % 64), 1);
        }
        for i in 0..64u64 {
            c.refreshed(0x1000 + 4 * i, 1);
        }
        assert!(c.current(0x1000, 192).is_none());
        c.mark_current(0x1000, 192);
        assert!(c.current(0x1000, 192).is_some());
    }

    #[test]
    fn reused_addresses_drop_the_copy_and_its_storage() {
        let mut c = cache();
        c.insert(0x1000, 64, 1);
        c.mark_current(0x1000, 64);
        let dropped = c.allocated(0x1080, 16);
        assert_eq!(dropped, vec![1]);
        assert!(c.current(0x1000, 64).is_none() && c.storage(0x1000, 64).is_none());
        assert_eq!(c.held_bytes(), 0);
    }

    #[test]
    fn the_least_recently_used_copies_make_room() {
        // Room for 3 copies of 64 floats (128 bytes each).
        let mut c: CastCache<u32> = CastCache::new(3 * 128);
        for (i, p) in [0x1000u64, 0x2000, 0x3000].into_iter().enumerate() {
            assert!(c.insert(p, 64, i as u32).is_empty());
            c.mark_current(p, 64);
        }
        assert!(c.current(0x1000, 64).is_some()); // 0x2000 is now the oldest
        assert_eq!(c.insert(0x4000, 64, 9), vec![1]);
        assert!(c.current(0x2000, 64).is_none());
        assert!(c.current(0x1000, 64).is_some() && c.current(0x3000, 64).is_some());
        assert_eq!(c.held_bytes(), 3 * 128);
        assert!(c.admits(192) && !c.admits(193));
        // Re-inserting a range replaces its storage.
        assert_eq!(c.insert(0x4000, 64, 10), vec![9]);
        assert_eq!(c.held_bytes(), 3 * 128);
        // A lower limit evicts down to it, least recently used first.
        assert!(c.current(0x1000, 64).is_some());
        let mut gone = c.set_limit(128);
        gone.sort();
        assert_eq!(gone, vec![2, 10]);
        assert!(c.current(0x1000, 64).is_some() && c.held_bytes() == 128);
        assert!(!c.admits(65));
    }
}
