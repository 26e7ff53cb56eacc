//! Commitment heads on the wire (`HeartbeatRequest.commitments`), checked
//! on the way in: a heartbeat is a peer's input.

// Input from peers: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use iota_core::PeerId;
use iota_core::commitment::{Chain, EpochHeads, KEPT_EPOCHS, Lane, MAX_LANES, Side};

use crate::pb;

/// Highest frame direction number (`wire::Direction::Control`).
const MAX_DIRECTION: u32 = 3;

fn chain_to_pb(c: &Chain) -> pb::ChainHead {
    pb::ChainHead { len: c.len, head: c.head.to_vec() }
}

fn chain_from_pb(field: &str, c: Option<&pb::ChainHead>) -> Result<Chain, String> {
    let Some(c) = c else { return Ok(Chain::default()) };
    let head = <[u8; 32]>::try_from(c.head.as_slice()).map_err(|_| format!("{field}: head must be 32 bytes"))?;
    if (c.len == 0) != (head == [0; 32]) {
        return Err(format!("{field}: an empty chain has the zero head, and only it"));
    }
    Ok(Chain { len: c.len, head })
}

pub fn to_pb(heads: &[EpochHeads]) -> Vec<pb::EpochCommitments> {
    heads
        .iter()
        .map(|e| pb::EpochCommitments {
            epoch: e.epoch,
            lanes: e
                .lanes
                .iter()
                .map(|(l, c)| pb::LaneHead {
                    peer: l.peer.0.to_vec(),
                    direction: u32::from(l.direction),
                    sent: l.side == Side::Sent,
                    chain: Some(chain_to_pb(c)),
                })
                .collect(),
            weights: Some(chain_to_pb(&e.weights)),
            overflow: e.overflow,
            steps: Some(chain_to_pb(&e.steps)),
            backlog: e.backlog.map(|h| h.to_vec()).unwrap_or_default(),
        })
        .collect()
}

/// The heads a heartbeat carries, or why they are refused: at most 2
/// epochs in increasing order, at most 256 lanes each, every lane once,
/// 32-byte ids and heads, a known direction.
pub fn from_pb(list: &[pb::EpochCommitments]) -> Result<Vec<EpochHeads>, String> {
    if list.len() as u64 > KEPT_EPOCHS {
        return Err(format!("at most {KEPT_EPOCHS} epochs"));
    }
    let mut out: Vec<EpochHeads> = Vec::with_capacity(list.len());
    for e in list {
        if out.last().is_some_and(|prev| prev.epoch >= e.epoch) {
            return Err("epochs must increase".into());
        }
        if e.lanes.len() > MAX_LANES {
            return Err(format!("epoch {}: at most {MAX_LANES} lanes", e.epoch));
        }
        let mut heads = EpochHeads {
            epoch: e.epoch,
            weights: chain_from_pb("weights", e.weights.as_ref())?,
            steps: chain_from_pb("steps", e.steps.as_ref())?,
            overflow: e.overflow,
            backlog: match e.backlog.as_slice() {
                [] => None,
                b => Some(<[u8; 32]>::try_from(b).map_err(|_| "backlog hash must be 32 bytes")?),
            },
            ..Default::default()
        };
        for l in &e.lanes {
            let peer = PeerId(<[u8; 32]>::try_from(l.peer.as_slice()).map_err(|_| "lane peer must be 32 bytes")?);
            if l.direction > MAX_DIRECTION {
                return Err(format!("lane direction {} is not a frame direction", l.direction));
            }
            let direction = u8::try_from(l.direction).map_err(|_| "lane direction")?;
            let side = if l.sent { Side::Sent } else { Side::Received };
            let chain = chain_from_pb("lane", l.chain.as_ref())?;
            if heads.lanes.insert(Lane { peer, direction, side }, chain).is_some() {
                return Err("a lane is listed twice".into());
            }
        }
        out.push(heads);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use iota_core::commitment::Commitments;

    use super::*;

    #[test]
    fn heads_round_trip_and_malformed_ones_are_refused() {
        let mut c = Commitments::default();
        c.frame(3, PeerId([1; 32]), 0, Side::Sent, &[7; 32]);
        c.frame(4, PeerId([2; 32]), 2, Side::Received, &[8; 32]);
        c.weights(4, &[9; 32]);
        c.backlog(4, [6; 32]);
        c.backlog(4, [5; 32]);
        let heads = c.heads();
        assert_eq!(heads[1].backlog, Some([6; 32]), "set once");
        let wire = to_pb(&heads);
        assert_eq!(from_pb(&wire).unwrap(), heads);
        assert_eq!(from_pb(&[]).unwrap(), vec![]);
        let broken = |f: &dyn Fn(&mut Vec<pb::EpochCommitments>)| {
            let mut w = wire.clone();
            f(&mut w);
            from_pb(&w).unwrap_err()
        };
        assert!(broken(&|w| w.push(w[1].clone())).contains("at most 2"));
        assert!(broken(&|w| w.swap(0, 1)).contains("increase"));
        assert!(broken(&|w| w[0].lanes[0].peer.pop().map_or((), |_| ())).contains("32 bytes"));
        assert!(broken(&|w| w[0].lanes[0].direction = 4).contains("direction"));
        assert!(
            broken(&|w| {
                let l = w[0].lanes[0].clone();
                w[0].lanes.push(l)
            })
            .contains("twice")
        );
        assert!(broken(&|w| w[1].weights.as_mut().unwrap().head = vec![1; 31]).contains("32 bytes"));
        assert!(broken(&|w| w[1].weights.as_mut().unwrap().len = 0).contains("zero head"));
        assert!(broken(&|w| w[1].backlog = vec![6; 33]).contains("backlog hash"));
        let many = pb::LaneHead { peer: vec![5; 32], direction: 0, sent: true, chain: None };
        assert!(
            broken(&|w| w[0].lanes = (0..=MAX_LANES)
                .map(|i| pb::LaneHead { direction: (i % 4) as u32, peer: vec![(i / 4) as u8; 32], ..many.clone() })
                .collect())
            .contains("at most 256")
        );
    }
}
