//! Published-update buffers kept from one merge for the next. An owner's
//! reduce writes each partition's encoded update into a fresh buffer (up
//! to `max_slice_bytes`, 64 MiB by default; a `1.5b` head's owner writes
//! about 470 MB a merge); a buffer fresh from the kernel is zeroed page by
//! page on first touch, which cost a reduce more than its arithmetic
//! (docs/BENCHMARKS.md). A published payload lives until its merge ends;
//! its buffer then comes back here, and the next merge's reduce writes
//! over it. Bounded: at most `POOL_BYTES` are kept, the rest freed.

use bytes::Bytes;
use std::sync::Mutex;

/// The most bytes kept between merges (a `1.5b` head's owner publishes
/// about 470 MB a merge).
pub const POOL_BYTES: usize = 512 << 20;

/// Buffers smaller than this are not worth keeping.
const MIN_POOLED: usize = 1 << 20;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer of `len` bytes for a payload that will be written whole: a
/// kept one where one is large enough (its old bytes still in it), else a
/// fresh, zeroed one.
pub fn take(len: usize) -> Vec<u8> {
    if len >= MIN_POOLED
        && let Ok(mut pool) = POOL.lock()
        && let Some(i) = best_fit(&pool, len)
    {
        let mut v = pool.swap_remove(i);
        v.truncate(len);
        v.resize(len, 0);
        return v;
    }
    vec![0u8; len]
}

/// The smallest kept buffer that holds `len` bytes.
fn best_fit(pool: &[Vec<u8>], len: usize) -> Option<usize> {
    pool.iter().enumerate().filter(|(_, v)| v.capacity() >= len).min_by_key(|(_, v)| v.capacity()).map(|(i, _)| i)
}

/// `buf` as a payload that gives its buffer back when the last reference
/// to it is dropped.
pub fn publish(buf: Vec<u8>) -> Bytes {
    if buf.capacity() < MIN_POOLED {
        return Bytes::from(buf);
    }
    Bytes::from_owner(Kept(buf))
}

/// A payload's buffer, given back to the pool when dropped.
struct Kept(Vec<u8>);

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        let Ok(mut pool) = POOL.lock() else { return };
        let kept: usize = pool.iter().map(Vec::capacity).sum();
        if kept.saturating_add(buf.capacity()) <= POOL_BYTES {
            pool.push(buf);
        }
    }
}

/// Bytes the pool keeps now.
pub fn kept_bytes() -> usize {
    POOL.lock().map(|p| p.iter().map(Vec::capacity).sum()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A published payload's buffer comes back when its last reference is
    /// dropped and is handed out again (not before), the pool never keeps
    /// more than its bound, and small buffers are not kept.
    #[test]
    fn a_payload_buffer_comes_back_once_dropped_and_the_pool_is_bounded() {
        let len = 3 << 20;
        let mut v = take(len);
        v.fill(7);
        let ptr = v.as_ptr();
        let p = publish(v);
        let clone = p.slice(10..20);
        drop(p);
        let other = take(len);
        assert_ne!(other.as_ptr(), ptr, "handed out while a reference lives");
        drop(clone);
        let again = take(len - 5);
        assert_eq!(again.as_ptr(), ptr, "the dropped payload's buffer is reused");
        assert_eq!(again.len(), len - 5);
        drop((again, other));
        // Bounded: payloads beyond the bound are freed, not kept.
        let many: Vec<Bytes> = (0..(POOL_BYTES / len + 3)).map(|_| publish(take(len))).collect();
        drop(many);
        assert!(kept_bytes() <= POOL_BYTES, "{} kept", kept_bytes());
        assert!(kept_bytes() >= POOL_BYTES - len, "the pool fills to its bound");
        drop(publish(vec![0u8; 1000]));
        assert!(kept_bytes() <= POOL_BYTES);
    }
}
