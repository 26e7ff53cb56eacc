//! Both ends of a gradient lane (issue 55, "evidence is what was sent").
//!
//! A miner's evidence for an attempt is the frames it signed; nothing in
//! its own bundle shows that the gradient it uploads is the one it sent
//! upstream: a tail or middle stage could send cheap or garbage gradients
//! and sign an honest frame afterwards for the few attempts drawn. (An
//! activation is bound already: the gradient that answers it, signed by
//! the downstream neighbour, is in the sender's own bundle.) The frame it
//! really sent is in its upstream neighbour's bundle for the same attempt
//! (a head's or middle stage's backward holds the gradient it received),
//! signed by the sender. So for every attempt drawn of a miner that sends a
//! gradient upstream, the validator also asks its upstream neighbour on the
//! attempt's pathway ([`couple`]; the orchestrator lets such an ask exceed
//! that neighbour's own draw only once the sender was asked), and holds
//! the two frame ids against each other ([`Lanes`]). Two different frames
//! its sender signed for one attempt and direction convict the sender:
//! an honest miner signs one gradient per attempt, and a receiver can show
//! only frames its sender signed, so no receiver can frame a sender.

use std::collections::{BTreeMap, BTreeSet};

use iota_core::PeerId;

/// An attempt: (shard, first sample, attempt), as the round names it.
type WorkKey = (u32, u64, u32);
/// Attempts per miner.
pub(super) type Asked = BTreeMap<PeerId, BTreeSet<WorkKey>>;
/// Per (receiver, attempt): the sender whose gradient lane waits for the
/// receiver's record.
pub(super) type Receivers = BTreeMap<(PeerId, WorkKey), PeerId>;

/// A gradient frame an evidence object shows: its id and its archived
/// header (what a proof is made of).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShownFrame {
    pub id: [u8; 32],
    pub header: Vec<u8>,
}

/// The gradient frames an evidence object shows for its attempt, each
/// only where its sender signed it for that attempt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneRecord {
    /// The gradient the miner sent upstream (a tail's or middle stage's).
    pub sent_grad: Option<ShownFrame>,
    /// The gradient it received from downstream (a head's or middle
    /// stage's), signed by its downstream neighbour.
    pub received_grad: Option<ShownFrame>,
    /// Where the check failed because an inner step's recompute, on the
    /// miner's own backend, is not what it committed: that step (among the
    /// epoch's own records), whose signed trace the round asks for to
    /// prove it (PROTOCOL.md, "A failed step as a proof").
    pub failed_step: Option<u32>,
}

/// One gradient lane of one attempt: what its sender showed and what its
/// receiver holds.
#[derive(Clone, Debug, Default)]
struct Ends {
    shown: Option<ShownFrame>,
    received: Option<ShownFrame>,
}

impl Ends {
    /// The proof, where the two ends are two different frames: the
    /// headers the sender showed and its receiver holds.
    fn proof(&self) -> Option<[Vec<u8>; 2]> {
        match (&self.shown, &self.received) {
            (Some(a), Some(b)) if a.id != b.id => Some([a.header.clone(), b.header.clone()]),
            _ => None,
        }
    }
}

/// A round's gradient lanes, by (sender, attempt). Bounded by the round's
/// draw: only drawn attempts' records are kept.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    ends: BTreeMap<(PeerId, WorkKey), Ends>,
}

impl Lanes {
    /// `sender` showed gradient frame `f` for `key`: the proof, where that
    /// contradicts what its receiver holds.
    pub(super) fn shown(&mut self, sender: PeerId, key: WorkKey, f: ShownFrame) -> Option<[Vec<u8>; 2]> {
        let e = self.ends.entry((sender, key)).or_default();
        e.shown = Some(f);
        e.proof()
    }

    /// The receiver of `sender`'s gradient for `key` holds frame `f`: the
    /// proof, where that contradicts what the sender showed.
    pub(super) fn received(&mut self, sender: PeerId, key: WorkKey, f: ShownFrame) -> Option<[Vec<u8>; 2]> {
        let e = self.ends.entry((sender, key)).or_default();
        e.received = Some(f);
        e.proof()
    }
}

/// The attempts each miner is to be asked for beyond its own draw: every
/// attempt drawn of a miner that sends a gradient upstream on it goes to
/// that upstream neighbour too (`upstream_of`: None where the miner is a
/// head or the neighbour did not complete the attempt). Only the attempts
/// not already in the neighbour's own draw.
pub(super) fn couple(
    drawn: &BTreeMap<PeerId, BTreeSet<WorkKey>>,
    upstream_of: impl Fn(PeerId, WorkKey) -> Option<PeerId>,
) -> BTreeMap<PeerId, BTreeSet<WorkKey>> {
    let mut extra: BTreeMap<PeerId, BTreeSet<WorkKey>> = BTreeMap::new();
    for (sender, keys) in drawn {
        for &k in keys {
            if let Some(up) = upstream_of(*sender, k)
                && !drawn.get(&up).is_some_and(|own| own.contains(&k))
            {
                extra.entry(up).or_default().insert(k);
            }
        }
    }
    extra
}

/// What a round asks of each miner: its own draw (`own`) and the
/// attempts [`couple`] adds; and per (receiver, attempt) asked of it, the
/// gradient sender whose lane waits for its record.
pub(super) fn asked_with_lanes(
    own: Asked,
    upstream_of: impl Fn(PeerId, WorkKey) -> Option<PeerId>,
) -> (Asked, Receivers) {
    let mut asked = own.clone();
    for (up, keys) in couple(&own, &upstream_of) {
        asked.entry(up).or_default().extend(keys);
    }
    let mut receivers = BTreeMap::new();
    for (sender, keys) in &asked {
        for &k in keys {
            if let Some(up) = upstream_of(*sender, k).filter(|up| asked.get(up).is_some_and(|a| a.contains(&k))) {
                receivers.insert((up, k), *sender);
            }
        }
    }
    (asked, receivers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(i: u8) -> ShownFrame {
        ShownFrame { id: [i; 32], header: vec![i; 8] }
    }

    #[test]
    fn a_lane_contradicts_only_when_both_ends_are_in_and_differ() {
        let (p, k) = (PeerId([1; 32]), (0, 8, 0));
        let mut l = Lanes::default();
        assert_eq!(l.shown(p, k, frame(1)), None, "one end alone");
        assert_eq!(l.received(p, k, frame(1)), None, "the same frame");
        assert_eq!(l.received(PeerId([2; 32]), k, frame(9)), None, "another sender's lane");
        assert_eq!(l.received(p, (0, 16, 0), frame(9)), None, "another attempt's");
        let proof = l.received(p, k, frame(2)).expect("two frames of one sender for one attempt");
        assert_eq!(proof, [vec![1; 8], vec![2; 8]], "the shown header, then the received one");
        let mut l = Lanes::default();
        assert_eq!(l.received(p, k, frame(3)), None);
        assert_eq!(l.shown(p, k, frame(4)), Some([vec![4; 8], vec![3; 8]]), "in either order");
    }

    #[test]
    fn every_drawn_attempt_of_a_gradient_sender_goes_to_its_upstream_neighbour() {
        let (head, mid, tail) = (PeerId([1; 32]), PeerId([2; 32]), PeerId([3; 32]));
        let stage = |p: PeerId| p.0[0] - 1;
        let drawn: BTreeMap<PeerId, BTreeSet<WorkKey>> = [
            (head, [(0, 0, 0)].into()),
            (mid, [(0, 0, 0), (0, 8, 0)].into()),
            (tail, [(0, 8, 0), (0, 16, 0), (0, 24, 1)].into()),
        ]
        .into();
        // One pathway for all but (0, 24, 1), whose middle stage did not
        // complete it.
        let upstream_of = |p: PeerId, k: WorkKey| match stage(p) {
            0 => None,
            1 => Some(head),
            _ => (k != (0, 24, 1)).then_some(mid),
        };
        let extra = couple(&drawn, upstream_of);
        assert_eq!(extra.get(&head), Some(&[(0, 8, 0)].into()), "the head: the middle's other draw");
        assert_eq!(extra.get(&mid), Some(&[(0, 16, 0)].into()), "the middle: the tail's draws it lacks");
        assert_eq!(extra.get(&tail), None, "nobody sends the tail a gradient");
    }
}
