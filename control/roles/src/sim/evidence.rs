//! What simulated miners keep for the validators: commitment heads with
//! every upload, the evidence of the attempts a validator asks for, and
//! their merge contributions when an audit asks (written to the simulated
//! store, as a real miner writes them with the store's signed URLs).

use iota_core::PeerId;
use iota_core::commitment::{Chain, EpochHeads};
use iota_wire::store_keys::{evidence_key, step_evidence_key};
use iota_wire::{StoredObject, pb};

use super::World;
use crate::orchestrator::Event;

/// A miner's heads for `epoch` after `work` micro-batches: chains as long
/// as its work, their heads a function of who and when (the simulated
/// recompute does not read them; the validators' beacon does).
pub(super) fn heads(peer: &PeerId, epoch: u64, work: u64) -> EpochHeads {
    let chain = |what: &[u8]| {
        let mut h = blake3::Hasher::new();
        h.update(what);
        h.update(&peer.0);
        h.update(&epoch.to_le_bytes());
        h.update(&work.to_le_bytes());
        Chain { len: work, head: *h.finalize().as_bytes() }
    };
    EpochHeads { epoch, weights: chain(b"weights"), steps: chain(b"steps"), ..EpochHeads::default() }
}

impl World {
    /// A validator's ask, relayed: each attempt's evidence is uploaded
    /// and announced (unless the miner keeps none: `adversary.rs`).
    pub(super) fn upload_evidence(&mut self, i: usize, me: PeerId, r: pb::EvidenceRequest) {
        let Some(stage) = self.o.miner(&me).map(|m| m.stage) else { return };
        for item in r.items {
            if item.trace_step > 0 {
                continue; // no step proofs in the simulation
            }
            let (shard, first, attempt) = (item.shard, item.first_sample, item.attempt);
            let key = match item.inner_step {
                true => step_evidence_key(r.epoch, &me, shard, first, attempt),
                false => evidence_key(r.epoch, &me, shard, first, attempt),
            };
            let object = StoredObject::of(&key, key.as_bytes(), me);
            let ev = Event::Stored { peer: me, epoch: r.epoch, stage, object };
            self.send_after(i, self.cfg.store_ms, ev);
        }
    }

    /// An audit asks the participants to store their contributions to
    /// the audited partitions.
    pub(super) fn store_contributions(&mut self, i: usize, me: PeerId, r: pb::ContributionRequest) {
        let (stores, as_sent) = self.stores_contribution(i);
        if !self.reachable(i) || !stores {
            return;
        }
        for k in r.partitions {
            let (stored, framed) = self.contributions.entry((r.epoch, r.stage, k)).or_default();
            if stored.insert(me) && !as_sent {
                framed.push(me);
            }
        }
    }
}
