//! A proof that a miner signed two different pipeline frames for one
//! micro-batch attempt and direction (issue 55, "a conviction carries its
//! proof").
//!
//! An honest miner computes each attempt's frame of a direction once and
//! signs it once (a retried send repeats the same header), so two of its
//! signatures over different frames of one attempt and direction mean it
//! showed one frame and sent another: the frame a validator was shown as
//! evidence is not the one its neighbour received (`validation::lanes`).
//! The proof is the two archived headers: anyone holding the miner's key
//! checks it with no trust in whoever hands it on (a receiver can only
//! show frames their sender signed), and it costs two signature checks.

use serde::{Deserialize, Serialize};

use crate::identity::PeerId;
use crate::wire::{Direction, FrameHeader, header_bytes, parse_header};

/// Two frames one miner signed for one attempt and direction, checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameEquivocation {
    pub miner: PeerId,
    pub epoch: u64,
    pub shard: u32,
    pub first_sample: u64,
    pub attempt: u32,
    /// `Direction` as its number.
    pub direction: u8,
    /// The two archived headers, as handed in.
    pub headers: [Vec<u8>; 2],
}

impl FrameEquivocation {
    /// Checks that `a` and `b` are archived headers of two different
    /// pipeline frames (activations or their gradients) of one attempt and
    /// direction of `run_id`, both signed by `miner`.
    pub fn check(run_id: u64, miner: PeerId, a: &[u8], b: &[u8]) -> Result<FrameEquivocation, String> {
        let (ha, hb) = (parse_header(a)?, parse_header(b)?);
        // Only the canonical archive of a header (rkyv's padding bytes are
        // outside the signature): a proof is kept and re-checked byte for
        // byte, so no two byte strings may stand for one proof.
        if header_bytes(&ha) != a || header_bytes(&hb) != b {
            return Err("a header not in its canonical archived form".into());
        }
        for h in [&ha, &hb] {
            if h.sender != miner.0 {
                return Err("a header not sent by the accused miner".into());
            }
            if !h.verify_signature() {
                return Err("a header whose signature does not verify".into());
            }
            if h.run_id != run_id {
                return Err(format!("a header of run {}, not {run_id}", h.run_id));
            }
            if !matches!(h.direction, Direction::Activation | Direction::ActivationGrad) {
                return Err("not a pipeline frame (an activation or its gradient)".into());
            }
        }
        if of_attempt(&ha) != of_attempt(&hb) {
            return Err("the two headers are not of one attempt, stage and direction".into());
        }
        if ha.payload_hash == hb.payload_hash {
            return Err("the two headers carry the same payload".into());
        }
        Ok(FrameEquivocation {
            miner,
            epoch: u64::from(ha.epoch),
            shard: ha.shard,
            first_sample: ha.first_sample,
            attempt: ha.attempt,
            direction: ha.direction as u8,
            headers: [a.to_vec(), b.to_vec()],
        })
    }
}

/// The archived header of a pipeline frame of `direction` that `id`
/// signed for attempt (shard 0, first sample 8, `attempt`) of `run_id`'s
/// `epoch`, its payload hash all `payload`: the proofs' tests here and in
/// the crates that check them (the orchestrator, the ledger) build theirs
/// with it.
#[doc(hidden)]
pub fn signed_test_header(
    id: &crate::identity::Identity,
    run_id: u64,
    epoch: u32,
    attempt: u32,
    direction: Direction,
    payload: u8,
) -> Vec<u8> {
    let mut shape = [0u32; crate::wire::MAX_DIMS];
    (shape[0], shape[1]) = (32, 8);
    let mut h = FrameHeader {
        version: 1,
        direction,
        codec: 1,
        ndim: 2,
        stage: 1,
        run_id,
        epoch,
        shard: 0,
        first_sample: 8,
        samples: 2,
        attempt,
        seq_no: 3,
        shape,
        payload_len: 256,
        payload_hash: [payload; 32],
        answers: [5; 32],
        sender: [0; 32],
        signature: [0; 64],
    };
    h.sign(id);
    header_bytes(&h)
}

/// What two frames of one attempt and direction share.
fn of_attempt(h: &FrameHeader) -> (u32, u16, u32, u64, u32, u32, Direction) {
    (h.epoch, h.stage, h.shard, h.first_sample, h.samples, h.attempt, h.direction)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    fn header(id: &Identity, payload: u8, attempt: u32, direction: Direction) -> Vec<u8> {
        signed_test_header(id, 7, 3, attempt, direction, payload)
    }

    #[test]
    fn two_frames_one_miner_signed_for_one_attempt_prove_it_and_nothing_else_does() {
        let (m, other) = (Identity::from_seed([1; 32]), Identity::from_seed([2; 32]));
        let g = Direction::ActivationGrad;
        let (a, b) = (header(&m, 1, 0, g), header(&m, 2, 0, g));
        let p = FrameEquivocation::check(7, m.peer_id(), &a, &b).unwrap();
        assert_eq!((p.epoch, p.shard, p.first_sample, p.attempt, p.direction), (3, 0, 8, 0, g as u8));
        assert!(FrameEquivocation::check(7, m.peer_id(), &b, &a).is_ok(), "in either order");
        let refused = |x: &[u8], y: &[u8], who: PeerId, run: u64, why: &str| {
            let e = FrameEquivocation::check(run, who, x, y).unwrap_err();
            assert!(e.contains(why), "{e:?} should say {why:?}");
        };
        refused(&a, &a, m.peer_id(), 7, "same payload");
        refused(&a, &header(&m, 1, 0, g), m.peer_id(), 7, "same payload");
        refused(&a, &header(&m, 2, 1, g), m.peer_id(), 7, "not of one attempt");
        refused(&a, &header(&m, 2, 0, Direction::Activation), m.peer_id(), 7, "not of one attempt");
        refused(&a, &header(&other, 2, 0, g), m.peer_id(), 7, "not sent by the accused");
        refused(&a, &b, other.peer_id(), 7, "not sent by the accused");
        refused(&a, &b, m.peer_id(), 8, "run 7");
        refused(&a, &header(&m, 2, 0, Direction::WeightSlice), m.peer_id(), 7, "not a pipeline frame");
        // A byte changed anywhere breaks the signature or the archive.
        for i in 0..b.len() {
            let mut forged = b.clone();
            forged[i] ^= 1;
            assert!(FrameEquivocation::check(7, m.peer_id(), &a, &forged).is_err(), "byte {i} altered");
        }
        refused(&a, &b[..b.len() - 1], m.peer_id(), 7, "header is");
        refused(&[], &b, m.peer_id(), 7, "header is");
    }
}
