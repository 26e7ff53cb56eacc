//! The queue of a full run. A newcomer that finds every stage's places
//! taken is not turned away: it is queued, told its position, and keeps
//! its place by asking again (every `QUEUE_RETRY_MS`); a place that frees
//! goes to the queue's head first (among those whose memory fits a stage
//! with room). Positions only move forward: one changes when someone ahead
//! takes a place or leaves (silent for `WAITING_TIMEOUT_MS`), never
//! because of a restart (the queue is part of the saved state and its
//! clocks restart with the orchestrator) or a later arrival.

use iota_core::PeerId;

use super::waitlist_state::Waitlist;
use super::{MemoryStated, Ms, Orchestrator, Refusal};

impl Orchestrator {
    /// The stage a newcomer takes, or its place in the queue
    /// (`Refusal::Queued`): a place with room goes to it only when fewer
    /// queued miners ahead of it could take one than there are places.
    pub(super) fn admit_or_queue(&mut self, now: Ms, peer: PeerId, memory: MemoryStated) -> Result<u32, Refusal> {
        let free = self.free_places(now);
        let fits_free = |m: &MemoryStated| free.iter().any(|&(s, _)| self.fits(s, m).is_ok());
        let mine = self.waitlist.position(&peer).unwrap_or(self.waitlist.len());
        let ahead = self.waitlist.queue.iter().take(mine).filter(|w| fits_free(&w.memory)).count();
        let places: usize = free.iter().map(|&(_, n)| n).sum();
        if places > ahead {
            match self.stage_for_newcomer(now, &memory) {
                Ok(stage) => {
                    self.waitlist.leave(&peer);
                    return Ok(stage);
                }
                // Room, but not a stage it fits: it waits for one, if any
                // stage of the run would hold it at all.
                Err(Refusal::DoesNotFit(why)) if !(0..self.spec.stages).any(|s| self.fits(s, &memory).is_ok()) => {
                    self.waitlist.leave(&peer);
                    return Err(Refusal::DoesNotFit(why));
                }
                Err(_) => {}
            }
        }
        let position = self.waitlist.keep_place(peer, memory, now).map_err(Refusal::Full)?;
        Err(Refusal::Queued { position: position + 1, length: self.waitlist.len() })
    }

    /// The queue of the full run.
    pub fn waitlist(&self) -> &Waitlist {
        &self.waitlist
    }
}
