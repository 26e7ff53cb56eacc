//! The orchestrator's record of refused requests: every refusal is counted
//! by reason, and logged with the caller, the method and the reason, at most
//! `LINES_PER_S` lines a second (a flood of forgeries must not become a flood
//! of log lines; what was not logged is counted and said).

use std::collections::BTreeMap;

use iota_protocol::refusal::{Reason, Rejected};
use parking_lot::Mutex;
use tracing::warn;

/// Refusal lines logged per second at most.
pub const LINES_PER_S: u32 = 20;

#[derive(Default)]
struct Window {
    /// Start of the current one-second window (ms).
    start_ms: u64,
    logged: u32,
    suppressed: u64,
}

#[derive(Default)]
pub struct Audit {
    counts: Mutex<BTreeMap<Reason, u64>>,
    window: Mutex<Window>,
}

impl Audit {
    /// Counts and (within the log budget) logs a refusal of `method`.
    pub fn refused(&self, method: &str, r: &Rejected, now_ms: u64) {
        *self.counts.lock().entry(r.reason).or_default() += 1;
        let mut w = self.window.lock();
        if now_ms.saturating_sub(w.start_ms) >= 1_000 {
            if w.suppressed > 0 {
                warn!(suppressed = w.suppressed, "refused requests not logged in the last second (counted)");
            }
            *w = Window { start_ms: now_ms, logged: 0, suppressed: 0 };
        }
        if w.logged >= LINES_PER_S {
            w.suppressed += 1;
            return;
        }
        w.logged += 1;
        // The identity is a claim unless the signature verified; either way
        // only its short form is logged, and never the request's body.
        let peer = r.peer.map_or_else(|| "unverified".to_string(), |p| p.to_string());
        warn!(peer, method, reason = r.reason.name(), message = %r.message, "request refused");
    }

    /// Refusals so far, by reason name.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().iter().map(|(r, n)| (r.name().to_string(), *n)).collect()
    }

    /// How many refusals of `reason` so far.
    pub fn count(&self, reason: Reason) -> u64 {
        self.counts.lock().get(&reason).copied().unwrap_or(0)
    }

    /// Refusals that were counted but not logged (in the current window).
    pub fn suppressed(&self) -> u64 {
        self.window.lock().suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_counted_and_logging_is_bounded() {
        let a = Audit::default();
        let r = Rejected::new(Reason::BadSignature, "bad signature");
        for i in 0..1_000u64 {
            a.refused("/iota.v1.Orchestrator/Register", &r, 5_000 + i / 10);
        }
        a.refused("/iota.v1.Orchestrator/Heartbeat", &Rejected::new(Reason::ReplayedNonce, "replayed"), 5_100);
        assert_eq!(a.count(Reason::BadSignature), 1_000);
        assert_eq!(a.counts()["replayed_nonce"], 1);
        // 1,001 refusals in 100 ms: 20 lines, the rest counted as suppressed.
        assert_eq!(a.suppressed(), 1_001 - LINES_PER_S as u64);
    }
}
