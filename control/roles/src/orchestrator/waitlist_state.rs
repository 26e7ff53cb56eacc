//! The queue of a full run, as data (the rules that use it: waitlist.rs).
//! Kept apart from the orchestrator's module so the state it is part of
//! does not import the code that acts on it.

use std::collections::VecDeque;

use iota_core::PeerId;
use serde::{Deserialize, Serialize};

use super::state::MemoryStated;

type Ms = u64;

/// Miners queued at most; past that a newcomer is refused `Full`.
pub const MAX_WAITING: usize = 4_096;
/// How often a queued miner asks again (the miner's side of the rule).
pub use iota_wire::run_spec::QUEUE_RETRY_MS;
/// A queued miner not heard from for this long leaves the queue.
pub const WAITING_TIMEOUT_MS: Ms = 12 * QUEUE_RETRY_MS;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Waitlist {
    pub(super) queue: VecDeque<Waiting>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Waiting {
    pub(super) peer: PeerId,
    pub(super) memory: MemoryStated,
    last_seen_ms: Ms,
}

impl Waitlist {
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The queued identities, head first.
    pub fn peers(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.queue.iter().map(|w| w.peer)
    }

    /// `peer`'s place, 0 first.
    pub fn position(&self, peer: &PeerId) -> Option<usize> {
        self.queue.iter().position(|w| w.peer == *peer)
    }

    /// Keeps `peer`'s place (refreshed), or gives it the last one; `Err`
    /// (the queue's bound) when the queue is full.
    pub(super) fn keep_place(&mut self, peer: PeerId, memory: MemoryStated, now: Ms) -> Result<usize, usize> {
        if let Some(i) = self.position(&peer) {
            let w = &mut self.queue[i];
            w.last_seen_ms = now;
            w.memory = memory;
            return Ok(i);
        }
        if self.queue.len() >= MAX_WAITING {
            return Err(MAX_WAITING);
        }
        self.queue.push_back(Waiting { peer, memory, last_seen_ms: now });
        Ok(self.queue.len() - 1)
    }

    pub(super) fn leave(&mut self, peer: &PeerId) {
        self.queue.retain(|w| w.peer != *peer);
    }

    /// Those not heard from within `WAITING_TIMEOUT_MS` leave.
    pub(super) fn expire(&mut self, now: Ms) {
        self.queue.retain(|w| now.saturating_sub(w.last_seen_ms) <= WAITING_TIMEOUT_MS);
    }

    /// The orchestrator was down: nobody's silence.
    pub(super) fn resumed(&mut self, now: Ms) {
        for w in &mut self.queue {
            w.last_seen_ms = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(i: u8) -> PeerId {
        PeerId([i; 32])
    }

    #[test]
    fn places_are_kept_by_asking_and_lost_only_by_silence() {
        let mut q = Waitlist::default();
        let m = MemoryStated::default();
        for i in 0..4 {
            assert_eq!(q.keep_place(p(i), m, 0), Ok(i as usize));
        }
        // Asking again keeps the place; a later arrival goes behind.
        assert_eq!(q.keep_place(p(2), m, 40_000), Ok(2));
        assert_eq!(q.keep_place(p(9), m, 40_000), Ok(4));
        // Silence past the timeout: 0, 1 and 3 leave; 2 and 9 move up, in order.
        q.expire(WAITING_TIMEOUT_MS + 1);
        assert_eq!((q.position(&p(2)), q.position(&p(9)), q.len()), (Some(0), Some(1), 2));
        // A restart: the clocks start again, nobody leaves for the downtime.
        q.resumed(10 * WAITING_TIMEOUT_MS);
        q.expire(10 * WAITING_TIMEOUT_MS + 1);
        assert_eq!(q.len(), 2);
        q.leave(&p(2));
        assert_eq!(q.position(&p(9)), Some(0));
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut q = Waitlist::default();
        for i in 0..MAX_WAITING {
            let mut id = [0u8; 32];
            id[..8].copy_from_slice(&(i as u64).to_le_bytes());
            q.keep_place(PeerId(id), MemoryStated::default(), 0).unwrap();
        }
        assert_eq!(q.keep_place(p(0xff), MemoryStated::default(), 0), Err(MAX_WAITING));
    }
}
