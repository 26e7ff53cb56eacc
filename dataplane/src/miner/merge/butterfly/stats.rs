//! What one replica's merges moved and where their time went: read by the
//! merge bench and the miner's completion log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Payload bytes this replica's merges sent and received, and where its
/// time went (for the bench and the completion log).
#[derive(Debug, Default)]
pub struct MergeStats {
    pub sent_bytes: AtomicU64,
    pub recv_bytes: AtomicU64,
    pub store_fallbacks: AtomicU64,
    /// Nanoseconds spent encoding contributions.
    pub encode_ns: AtomicU64,
    /// Nanoseconds spent reducing owned partitions (decode, reduce,
    /// encode and hash the update).
    pub reduce_ns: AtomicU64,
    /// Nanoseconds spent applying accepted updates (decode, subtract).
    pub apply_ns: AtomicU64,
    /// Nanoseconds spent storing merged slices as their writer.
    pub store_ns: AtomicU64,
}

impl MergeStats {
    pub(super) fn time(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Seconds in each phase: encode, reduce, apply, store.
    pub fn phase_secs(&self) -> [f64; 4] {
        [&self.encode_ns, &self.reduce_ns, &self.apply_ns, &self.store_ns]
            .map(|c| c.load(Ordering::Relaxed) as f64 * 1e-9)
    }

    /// Seconds in each phase since `start`, an earlier `phase_secs()`: one
    /// merge's share of counters that run over a replica's life.
    pub fn phase_secs_since(&self, start: [f64; 4]) -> [f64; 4] {
        let now = self.phase_secs();
        std::array::from_fn(|i| now[i] - start[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merges_phase_seconds_leave_out_the_earlier_merges() {
        let stats = MergeStats::default();
        stats.encode_ns.fetch_add(3_000_000_000, Ordering::Relaxed);
        stats.store_ns.fetch_add(1_000_000_000, Ordering::Relaxed);
        let start = stats.phase_secs();
        assert_eq!(start, [3.0, 0.0, 0.0, 1.0]);
        stats.encode_ns.fetch_add(500_000_000, Ordering::Relaxed);
        stats.reduce_ns.fetch_add(250_000_000, Ordering::Relaxed);
        assert_eq!(stats.phase_secs_since(start), [0.5, 0.25, 0.0, 0.0]);
        assert_eq!(stats.phase_secs(), [3.5, 0.25, 0.0, 1.0]);
    }
}
