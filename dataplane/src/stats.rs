//! Counters of one endpoint: what it sent and received, what it rejected and
//! why, and how many times payload bytes were copied on the way in.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::frame::FrameError;

#[derive(Debug, Default)]
pub struct Stats {
    pub frames_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub frames_received: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Copies of payload bytes between the socket layer and the consumer,
    /// counted per frame (quinn's decrypted buffer -> pool buffer is one).
    pub payload_copies: AtomicU64,
    pub connects: AtomicU64,
    pub send_failures: AtomicU64,
    rejected: Mutex<BTreeMap<&'static str, u64>>,
}

/// A point-in-time copy of `Stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub frames_sent: u64,
    pub bytes_sent: u64,
    pub frames_received: u64,
    pub bytes_received: u64,
    pub payload_copies: u64,
    pub connects: u64,
    pub send_failures: u64,
    pub rejected: BTreeMap<&'static str, u64>,
}

impl StatsSnapshot {
    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().sum()
    }
    pub fn rejected(&self, kind: &str) -> u64 {
        self.rejected.get(kind).copied().unwrap_or(0)
    }
}

impl Stats {
    pub fn reject(&self, e: &FrameError) {
        *self.rejected.lock().entry(e.kind()).or_default() += 1;
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::SeqCst);
        StatsSnapshot {
            frames_sent: l(&self.frames_sent),
            bytes_sent: l(&self.bytes_sent),
            frames_received: l(&self.frames_received),
            bytes_received: l(&self.bytes_received),
            payload_copies: l(&self.payload_copies),
            connects: l(&self.connects),
            send_failures: l(&self.send_failures),
            rejected: self.rejected.lock().clone(),
        }
    }
}

pub(crate) fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}
