//! Commitments: what a miner binds itself to while it works, so it cannot
//! later claim a different history.
//!
//! Every miner keeps a BLAKE3 hash chain per lane — per (epoch, peer, frame
//! direction, sent or received) — over the ids of the frames on it, and
//! one chain per epoch over the hashes of its weights after every inner
//! optimizer step, and one over the records of those steps (what each
//! stepped from, with which micro-batches, to what: `iota_checks::
//! inner_step`), so a validator can recompute any one of them. It reports the chains' heads with its heartbeat. A
//! validator that is later shown the frames of a lane (or the weights of a
//! step) recomputes the chain with [`Chain::of`] and compares it with the
//! reported head; the two ends of a lane commit to the same frames, so a
//! sender and its receiver that disagree are both on record.
//!
//! Free of I/O: the data plane feeds frame ids in, the heartbeat reads
//! snapshots out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::identity::PeerId;

/// Lanes one miner keeps chains for (per epoch kept); frames on further
/// lanes are counted in `overflow` and not committed (a miner has at most
/// a few dozen neighbours: every stage replica, both directions).
pub const MAX_LANES: usize = 256;
/// Epochs a miner keeps chains for: the current one and the one before
/// (its merge frames and late answers arrive after it moved on).
pub const KEPT_EPOCHS: u64 = 2;

/// A hash chain: `head_0 = 0`, `head_n = BLAKE3(head_{n-1} || item_n)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    /// Items chained so far.
    pub len: u64,
    pub head: [u8; 32],
}

impl Chain {
    pub fn push(&mut self, item: &[u8; 32]) {
        let mut h = blake3::Hasher::new();
        h.update(&self.head);
        h.update(item);
        self.head = *h.finalize().as_bytes();
        self.len = self.len.saturating_add(1);
    }

    /// The chain over `items`, in order (what a verifier recomputes).
    pub fn of<'a>(items: impl IntoIterator<Item = &'a [u8; 32]>) -> Chain {
        let mut c = Chain::default();
        for i in items {
            c.push(i);
        }
        c
    }

    /// Whether `self` can be an earlier state of a chain that is `later`
    /// now: a chain only grows (equal length means equal head).
    pub fn may_precede(&self, later: &Chain) -> bool {
        self.len < later.len || self == later
    }
}

/// Which end of a lane a chain is kept by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Side {
    Sent,
    Received,
}

/// One lane: the frames of an epoch, in one direction, between this miner
/// and `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Lane {
    pub peer: PeerId,
    /// `wire::Direction` as its number.
    pub direction: u8,
    pub side: Side,
}

/// The heads a miner reports for one epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochHeads {
    pub epoch: u64,
    /// Stored as a list of pairs: JSON maps take string keys only.
    #[serde(with = "lanes_as_list")]
    pub lanes: BTreeMap<Lane, Chain>,
    /// Over the BLAKE3 hash of the weights after each inner step.
    pub weights: Chain,
    /// Over the hash of each inner step's record (`iota_checks::
    /// inner_step::StepHeader`), led by the record of the last step the
    /// miner took on its stage before the epoch (the optimizer state it
    /// carries in), when it took one.
    #[serde(default)]
    pub steps: Chain,
    /// Frames not committed because the lane table was full.
    pub overflow: u64,
    /// With sparse contributions in a validated run: the hash
    /// (`iota_checks::hashes::weights_hash`) of the backlog the epoch's
    /// contributions start from (PROTOCOL.md, "Sparse contributions bound
    /// to the backlog"); set once, when the epoch's training ends.
    #[serde(default)]
    pub backlog: Option<[u8; 32]>,
}

impl EpochHeads {
    /// How `self` (an earlier report) and `later` (a later one for the same
    /// epoch) contradict each other: a lane or the weights chain that
    /// shrank or changed without growing, or a lane that disappeared.
    pub fn rewritten_by(&self, later: &EpochHeads) -> Option<String> {
        if !self.weights.may_precede(&later.weights) {
            return Some(format!("weights chain {} -> {} steps", self.weights.len, later.weights.len));
        }
        if !self.steps.may_precede(&later.steps) {
            return Some(format!("steps chain {} -> {} records", self.steps.len, later.steps.len));
        }
        if self.backlog.is_some() && later.backlog != self.backlog {
            return Some("backlog hash changed".into());
        }
        for (lane, c) in &self.lanes {
            match later.lanes.get(lane) {
                Some(l) if c.may_precede(l) => {}
                Some(l) => return Some(format!("lane {lane:?} went from {} to {} frames", c.len, l.len)),
                None => return Some(format!("lane {lane:?} disappeared")),
            }
        }
        None
    }
}

mod lanes_as_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Chain, Lane};

    pub fn serialize<S: Serializer>(m: &BTreeMap<Lane, Chain>, s: S) -> Result<S::Ok, S::Error> {
        m.iter().collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<Lane, Chain>, D::Error> {
        Ok(Vec::<(Lane, Chain)>::deserialize(d)?.into_iter().collect())
    }
}

/// A miner's own commitments, fed as it works.
#[derive(Clone, Debug, Default)]
pub struct Commitments {
    epochs: BTreeMap<u64, EpochHeads>,
}

impl Commitments {
    /// The chains of `epoch`; None for an epoch older than every kept one
    /// (a straggler frame of a finished epoch, whose chains were final).
    fn epoch(&mut self, epoch: u64) -> Option<&mut EpochHeads> {
        if !self.epochs.contains_key(&epoch) {
            let full = self.epochs.len() as u64 >= KEPT_EPOCHS;
            if full && self.epochs.keys().next().is_some_and(|&oldest| epoch < oldest) {
                return None;
            }
            self.epochs.insert(epoch, EpochHeads { epoch, ..Default::default() });
            while self.epochs.len() as u64 > KEPT_EPOCHS {
                self.epochs.pop_first();
            }
        }
        self.epochs.get_mut(&epoch)
    }

    /// A frame sent or received (its id: `FrameHeader::frame_id`).
    pub fn frame(&mut self, epoch: u64, peer: PeerId, direction: u8, side: Side, id: &[u8; 32]) {
        let Some(e) = self.epoch(epoch) else { return };
        let lane = Lane { peer, direction, side };
        if !e.lanes.contains_key(&lane) && e.lanes.len() >= MAX_LANES {
            e.overflow = e.overflow.saturating_add(1);
            return;
        }
        e.lanes.entry(lane).or_default().push(id);
    }

    /// The weights after an inner optimizer step, as their BLAKE3 hash.
    pub fn weights(&mut self, epoch: u64, hash: &[u8; 32]) {
        if let Some(e) = self.epoch(epoch) {
            e.weights.push(hash);
        }
    }

    /// The record of an inner step (or, first in an epoch, of the step the
    /// epoch's optimizer state comes from), as its hash.
    pub fn step(&mut self, epoch: u64, record: &[u8; 32]) {
        if let Some(e) = self.epoch(epoch) {
            e.steps.push(record);
        }
    }

    /// The hash of the backlog `epoch`'s sparse contributions start from
    /// (once: a later call for the same epoch changes nothing, as a second
    /// value would be a second history).
    pub fn backlog(&mut self, epoch: u64, hash: [u8; 32]) {
        if let Some(e) = self.epoch(epoch) {
            e.backlog.get_or_insert(hash);
        }
    }

    /// The steps chain of `epoch` as it stands (empty if none is kept).
    pub fn steps_of(&self, epoch: u64) -> Chain {
        self.epochs.get(&epoch).map(|e| e.steps).unwrap_or_default()
    }

    /// What to report now: every kept epoch, oldest first.
    pub fn heads(&self) -> Vec<EpochHeads> {
        self.epochs.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u8) -> [u8; 32] {
        [i; 32]
    }

    #[test]
    fn a_chain_commits_to_order_and_content() {
        let a = Chain::of([&id(1), &id(2), &id(3)]);
        assert_eq!(a.len, 3);
        assert_ne!(a, Chain::of([&id(2), &id(1), &id(3)]), "order matters");
        assert_ne!(a, Chain::of([&id(1), &id(2), &id(4)]), "content matters");
        let prefix = Chain::of([&id(1), &id(2)]);
        assert!(prefix.may_precede(&a) && a.may_precede(&a));
        assert!(!a.may_precede(&prefix), "a chain never shrinks");
        let other = Chain::of([&id(1), &id(2), &id(9)]);
        assert!(!other.may_precede(&a), "same length, different head");
        // One step at a time equals all at once.
        let mut c = Chain::default();
        for i in [1, 2, 3] {
            c.push(&id(i));
        }
        assert_eq!(c, a);
    }

    #[test]
    fn lanes_are_kept_per_epoch_peer_direction_and_side_and_bounded() {
        let (p, q) = (PeerId([1; 32]), PeerId([2; 32]));
        let mut c = Commitments::default();
        c.frame(4, p, 0, Side::Sent, &id(1));
        c.frame(4, p, 0, Side::Sent, &id(2));
        c.frame(4, p, 1, Side::Received, &id(3));
        c.frame(4, q, 0, Side::Sent, &id(4));
        c.weights(4, &id(7));
        let h = c.heads();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].lanes[&Lane { peer: p, direction: 0, side: Side::Sent }], Chain::of([&id(1), &id(2)]));
        assert_eq!(h[0].lanes.len(), 3);
        assert_eq!(h[0].weights, Chain::of([&id(7)]));
        // Two epochs are kept; the oldest goes.
        c.frame(5, p, 0, Side::Sent, &id(1));
        c.frame(6, p, 0, Side::Sent, &id(1));
        assert_eq!(c.heads().iter().map(|e| e.epoch).collect::<Vec<_>>(), vec![5, 6]);
        c.frame(3, p, 0, Side::Sent, &id(1));
        assert_eq!(c.heads().iter().map(|e| e.epoch).collect::<Vec<_>>(), vec![5, 6], "a straggler of a past epoch");
        // A full lane table counts what it cannot commit.
        for i in 0..MAX_LANES + 5 {
            let peer = PeerId([(i % 250) as u8; 32]);
            c.frame(6, peer, (i / 250) as u8, Side::Received, &id(1));
        }
        let e6 = c.heads().pop().unwrap();
        assert_eq!(e6.lanes.len(), MAX_LANES);
        assert!(e6.overflow > 0);
    }

    #[test]
    fn a_report_that_contradicts_an_earlier_one_is_named() {
        let p = PeerId([1; 32]);
        let mut c = Commitments::default();
        c.frame(1, p, 0, Side::Sent, &id(1));
        c.weights(1, &id(5));
        let early = c.heads().remove(0);
        c.frame(1, p, 0, Side::Sent, &id(2));
        c.weights(1, &id(6));
        let later = c.heads().remove(0);
        assert_eq!(early.rewritten_by(&later), None, "growth is no contradiction");
        assert_eq!(later.rewritten_by(&later), None);
        assert!(later.rewritten_by(&early).is_some(), "shrinking is");
        let mut forked = early.clone();
        forked.lanes.values_mut().for_each(|l| l.head = id(9));
        assert!(early.rewritten_by(&forked).unwrap().contains("went from 1 to 1"));
        let mut gone = later.clone();
        gone.lanes.clear();
        assert!(later.rewritten_by(&gone).unwrap().contains("disappeared"));
        let mut rewound = later.clone();
        rewound.weights = Chain::of([&id(5)]);
        assert!(later.rewritten_by(&rewound).unwrap().contains("weights"));
        c.step(1, &id(8));
        let stepped = c.heads().remove(0);
        assert_eq!(later.rewritten_by(&stepped), None);
        let mut unstepped = stepped.clone();
        unstepped.steps = Chain::default();
        assert!(stepped.rewritten_by(&unstepped).unwrap().contains("steps chain"));
        // A backlog hash, once reported, stays.
        c.backlog(1, id(3));
        let with_backlog = c.heads().remove(0);
        assert_eq!(stepped.rewritten_by(&with_backlog), None, "reported late is no contradiction");
        for other in [None, Some(id(4))] {
            let changed = EpochHeads { backlog: other, ..with_backlog.clone() };
            assert!(with_backlog.rewritten_by(&changed).unwrap().contains("backlog"), "{other:?}");
        }
    }
}
