//! The object store every role reads and writes weights through (uploads,
//! merged stages, momentum, undeliverable contributions).
//!
//! This is the interface; the local-directory store lives in
//! `iota-dataplane` (it writes through the data plane's file I/O thread) and
//! an S3-compatible store joins it as another implementation. Keys are
//! relative, `/`-separated names (`epoch-000001/stage-002/merged.safetensors`,
//! see [`crate::store_keys`]); [`check_key`] is the rule every
//! implementation applies before touching anything.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

/// What a store operation returns (boxed so the trait is object safe).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send + 'a>>;

pub trait ObjectStore: Send + Sync {
    /// Stores `data` under `key`, atomically (readers see all or nothing).
    fn put<'a>(&'a self, key: &'a str, data: Vec<u8>) -> StoreFuture<'a, ()>;
    /// The object under `key`; `NotFound` when there is none.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<u8>>;
    /// Keys directly under `prefix` (a folder-like prefix ending in '/'),
    /// sorted; an empty list when there are none.
    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>>;
}

/// Longest object-store key a report or an announcement may carry.
pub const MAX_KEY_LEN: usize = 512;

/// A store shared between tasks and threads.
pub type SharedStore = Arc<dyn ObjectStore>;

/// Refuses a key that could escape the store's root or name a folder:
/// empty, absolute, `.`/`..` or empty segments, a backslash or a NUL.
pub fn check_key(key: &str) -> io::Result<()> {
    let ok = !key.is_empty()
        && !key.contains(['\\', '\0'])
        && key.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
    if ok { Ok(()) } else { Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid object key '{key}'"))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules() {
        for k in ["epoch-000001/stage-002/merged.safetensors", "a", "a/b.c"] {
            assert!(check_key(k).is_ok(), "{k}");
        }
        for k in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", "a\\b", "a\0b"] {
            assert!(check_key(k).is_err(), "{k:?}");
        }
    }
}
