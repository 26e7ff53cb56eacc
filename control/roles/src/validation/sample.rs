//! Which micro-batches a validator recomputes, drawn after the fact.
//!
//! A miner must not know in advance which of its micro-batches will be
//! checked, or it would do honest work on those only. So the draw is seeded
//! by a **beacon** that exists only once the epoch's work is committed:
//! BLAKE3 over every miner's final commitment heads for the epoch (sent
//! with its `UploadDone`), mixed with the validator's own secret seed (so
//! validators sample differently and a miner cannot grind the beacon
//! toward a draw it likes without also knowing the validator's seed).
//!
//! Each miner gets `max(min_per_miner, ceil(rate x n))` of its `n`
//! micro-batches (all of them if it did fewer): with `s` samples, a miner
//! that cheated on a fraction `f` of its work escapes with probability
//! `(1 - f)^s` (4 samples: 6% at f = 1/2, 0.4% at f = 3/4).

use std::collections::BTreeMap;

use iota_core::commitment::EpochHeads;
use iota_core::{PeerId, Rng};
use iota_wire::MbRef;

/// How much of each miner's work is recomputed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRate {
    /// Fraction of a miner's micro-batches, in [0, 1].
    pub rate: f64,
    /// At least this many per miner per epoch (so one epoch suffices to
    /// catch a miner that cheats on most of its work).
    pub min_per_miner: usize,
}

impl Default for SampleRate {
    fn default() -> Self {
        SampleRate { rate: 0.03, min_per_miner: 4 }
    }
}

impl SampleRate {
    /// How many of `n` micro-batches to draw.
    pub fn count(&self, n: usize) -> usize {
        let by_rate = (self.rate.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        by_rate.max(self.min_per_miner).min(n)
    }
}

/// What binds a validator's signed weights to the miners they rate: the
/// EpochWork's miners, in its order (the weights' order).
pub fn work_miners_hash(epoch: u64, miners: &[PeerId]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"iota-rs work miners v1");
    h.update(&epoch.to_le_bytes());
    h.update(&(miners.len() as u64).to_le_bytes());
    for m in miners {
        h.update(&m.0);
    }
    *h.finalize().as_bytes()
}

/// The epoch's beacon: BLAKE3 over the run, the epoch and every miner's
/// final heads, in peer order (see the module text).
pub fn beacon(run_id: u64, epoch: u64, heads: &BTreeMap<PeerId, EpochHeads>) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"iota-rs sample beacon v1");
    h.update(&run_id.to_le_bytes());
    h.update(&epoch.to_le_bytes());
    for (peer, e) in heads {
        h.update(&peer.0);
        h.update(&e.epoch.to_le_bytes());
        h.update(&e.weights.len.to_le_bytes());
        h.update(&e.weights.head);
        for (lane, c) in &e.lanes {
            h.update(&lane.peer.0);
            h.update(&[lane.direction, lane.side as u8]);
            h.update(&c.len.to_le_bytes());
            h.update(&c.head);
        }
    }
    *h.finalize().as_bytes()
}

/// The micro-batch attempts to recompute, per miner: `work` is each
/// miner's completed micro-batches of the epoch (any order); the result
/// is in `work`'s sorted order, without repeats.
pub fn draw(
    beacon: &[u8; 32],
    validator_seed: u64,
    rate: SampleRate,
    work: &BTreeMap<PeerId, Vec<(MbRef, u32)>>,
) -> BTreeMap<PeerId, Vec<(MbRef, u32)>> {
    let words: Vec<u64> =
        beacon.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("32 bytes are 4 words"))).collect();
    work.iter()
        .map(|(peer, mbs)| {
            let mut mbs = mbs.clone();
            mbs.sort();
            mbs.dedup();
            // One stream per miner: a miner's draw does not depend on
            // how much work the others did.
            let peer_word = u64::from_le_bytes(peer.0[..8].try_into().expect("8 bytes"));
            let mut rng = Rng::derived(validator_seed, &[words[0], words[1], words[2], words[3], peer_word]);
            let k = rate.count(mbs.len());
            // A partial Fisher-Yates shuffle: the first k are a uniform draw.
            for i in 0..k {
                let j = i + rng.below((mbs.len() - i) as u64) as usize;
                mbs.swap(i, j);
            }
            let mut picked = mbs[..k].to_vec();
            picked.sort();
            (*peer, picked)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use iota_core::commitment::{Commitments, Side};

    use super::*;

    fn mb(i: u64) -> (MbRef, u32) {
        (MbRef { epoch: 3, shard: (i % 4) as u32, first_sample: i * 8 }, 0)
    }

    fn work(miners: u8, each: u64) -> BTreeMap<PeerId, Vec<(MbRef, u32)>> {
        (0..miners).map(|m| (PeerId([m + 1; 32]), (0..each).map(|i| mb(i + 100 * m as u64)).collect())).collect()
    }

    #[test]
    fn every_miner_gets_its_share_and_at_least_the_minimum() {
        let rate = SampleRate { rate: 0.05, min_per_miner: 4 };
        assert_eq!((rate.count(0), rate.count(3), rate.count(10), rate.count(200)), (0, 3, 4, 10));
        let w = work(3, 200);
        let d = draw(&[7; 32], 1, rate, &w);
        for (peer, picked) in &d {
            assert_eq!(picked.len(), 10);
            assert!(picked.windows(2).all(|p| p[0] < p[1]), "sorted, no repeats");
            assert!(picked.iter().all(|p| w[peer].contains(p)), "only its own work");
        }
        let small = work(1, 2);
        assert_eq!(draw(&[7; 32], 1, rate, &small).values().next().unwrap().len(), 2, "all of a little work");
    }

    #[test]
    fn the_draw_follows_the_beacon_and_the_validator_and_is_uniform() {
        let rate = SampleRate { rate: 0.0, min_per_miner: 4 };
        let w = work(2, 50);
        let a = draw(&[1; 32], 9, rate, &w);
        assert_eq!(a, draw(&[1; 32], 9, rate, &w), "reproducible");
        assert_ne!(a, draw(&[2; 32], 9, rate, &w), "another beacon, another draw");
        assert_ne!(a, draw(&[1; 32], 10, rate, &w), "another validator, another draw");
        // Over many beacons every micro-batch is drawn about equally often
        // (4 of 50 each time: expected 80 in 1,000 draws).
        let mut hits = BTreeMap::<(MbRef, u32), u32>::new();
        for b in 0..1000u32 {
            let mut beacon = [0u8; 32];
            beacon[..4].copy_from_slice(&b.to_le_bytes());
            for p in draw(&beacon, 9, rate, &w).into_values().flatten() {
                *hits.entry(p).or_default() += 1;
            }
        }
        assert_eq!(hits.len(), 100, "every micro-batch is drawn sometimes");
        assert!(hits.values().all(|&h| (45..=120).contains(&h)), "{hits:?}");
    }

    #[test]
    fn the_beacon_commits_to_every_miners_heads() {
        let mut c = Commitments::default();
        c.frame(3, PeerId([2; 32]), 0, Side::Sent, &[1; 32]);
        c.weights(3, &[5; 32]);
        let heads: BTreeMap<PeerId, EpochHeads> = [(PeerId([1; 32]), c.heads().remove(0))].into();
        let b = beacon(7, 3, &heads);
        assert_ne!(b, beacon(8, 3, &heads));
        assert_ne!(b, beacon(7, 4, &heads));
        let mut other = heads.clone();
        other.values_mut().for_each(|e| e.weights.head[0] ^= 1);
        assert_ne!(b, beacon(7, 3, &other), "a different weights history");
        let mut lane = heads.clone();
        lane.values_mut().for_each(|e| e.lanes.values_mut().for_each(|l| l.len += 1));
        assert_ne!(b, beacon(7, 3, &lane), "a different lane");
        assert_ne!(b, beacon(7, 3, &BTreeMap::new()));
    }
}
