//! Catching a merge participant that sends different contributions to the
//! owners of one partition (equivocation).
//!
//! Every contribution travels as a `WeightSlice` frame whose header the
//! sender signed, and the header carries the blake3 of the payload. An owner
//! reports, with its result for a partition, the headers of the
//! contributions it reduced. Two headers signed by one sender for the same
//! partition of the same merge with different payload hashes are a proof
//! anyone can check with no trust in the owners that handed them on: the
//! signatures are the sender's, and an honest sender's slice of its
//! pseudo-gradient is fixed for the whole merge (re-plans keep partition
//! ranges, and the slice is encoded once).
//!
//! Without this, an equivocating sender makes the partition's two honest
//! owners disagree, and the referee that recomputes it names an honest
//! owner as the deviant.

use serde::{Deserialize, Serialize};

use super::plan::MergePlan;
use crate::identity::PeerId;
use crate::wire::{Direction, FrameHeader, parse_header};

/// The `samples` field of a contribution's `WeightSlice` header (a merged
/// update is 1).
pub const KIND_CONTRIBUTION: u32 = 0;

/// A contribution's header as an owner reported it, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedContribution {
    pub sender: PeerId,
    pub payload_hash: [u8; 32],
    /// The archived header, kept as the proof's half.
    pub header: Vec<u8>,
}

/// Which partition of which merge a contribution header must belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionOf {
    pub run_id: u64,
    pub epoch: u64,
    pub stage: u32,
    pub partition: u32,
    pub offset: u64,
}

impl PartitionOf {
    /// Partition `k` of `plan`'s merge; None if the plan has no such
    /// partition.
    pub fn of(plan: &MergePlan, run_id: u64, k: u32) -> Option<PartitionOf> {
        let part = plan.partitions.get(k as usize)?;
        Some(PartitionOf { run_id, epoch: plan.epoch, stage: plan.stage, partition: k, offset: part.offset })
    }

    /// Whether `h` is a contribution to this partition.
    fn check(&self, h: &FrameHeader) -> Result<(), String> {
        if h.direction != Direction::WeightSlice || h.samples != KIND_CONTRIBUTION {
            return Err("not a merge contribution".into());
        }
        let got = (h.run_id, u64::from(h.epoch), u32::from(h.stage), h.shard, h.first_sample);
        let want = (self.run_id, self.epoch, self.stage, self.partition, self.offset);
        if got != want {
            return Err(format!(
                "a contribution to (run, epoch, stage, partition, offset) {got:?}, this partition is {want:?}"
            ));
        }
        Ok(())
    }
}

impl SignedContribution {
    /// Parses a contribution header handed on by an owner: it must be a
    /// contribution to `to`, signed by its sender. Whether the sender takes
    /// part in the merge is the caller's to judge (after a re-plan an
    /// honest owner can report one from a participant planned out since).
    /// The sender and payload hash of a contribution header to `to`,
    /// signature not checked (see `check`): for cheap tests before one.
    pub fn unverified(bytes: &[u8], to: &PartitionOf) -> Result<(PeerId, [u8; 32]), String> {
        let h = parse_header(bytes)?;
        to.check(&h)?;
        Ok((PeerId(h.sender), h.payload_hash))
    }

    pub fn check(bytes: &[u8], to: &PartitionOf) -> Result<SignedContribution, String> {
        let h = parse_header(bytes)?;
        to.check(&h)?;
        if !h.verify_signature() {
            return Err("the sender's signature does not verify".into());
        }
        Ok(SignedContribution { sender: PeerId(h.sender), payload_hash: h.payload_hash, header: bytes.to_vec() })
    }
}

/// Two contributions to one partition, signed by one sender, with
/// different payloads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Equivocation {
    pub epoch: u64,
    pub stage: u32,
    pub partition: u32,
    pub sender: PeerId,
    /// The two archived headers.
    pub headers: [Vec<u8>; 2],
}

impl Equivocation {
    /// Checks the proof on its own: both headers are contributions to the
    /// same partition (and offset) of run `run_id`'s merge named here, both
    /// verify under `sender`, and their payloads differ.
    pub fn verify(&self, run_id: u64) -> Result<(), String> {
        let offset = parse_header(&self.headers[0])?.first_sample;
        let to = PartitionOf { run_id, epoch: self.epoch, stage: self.stage, partition: self.partition, offset };
        let a = SignedContribution::check(&self.headers[0], &to)?;
        let b = SignedContribution::check(&self.headers[1], &to)?;
        if a.sender != self.sender || b.sender != self.sender {
            return Err("a header is not the named sender's".into());
        }
        if a.payload_hash == b.payload_hash {
            return Err("the two contributions are the same".into());
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec::WireCodec;
    use crate::identity::Identity;
    use crate::wire::{MAX_DIMS, PROTOCOL_VERSION, header_bytes};

    /// A contribution header to partition `k` (at `offset`) of epoch 2,
    /// stage 1, run 9, signed by `id`, for a payload hashing to `payload`.
    pub(crate) fn signed(id: &Identity, k: u32, offset: u64, payload: u8) -> Vec<u8> {
        let mut shape = [0u32; MAX_DIMS];
        shape[..2].copy_from_slice(&[4, 256]);
        let mut h = FrameHeader {
            version: PROTOCOL_VERSION,
            direction: Direction::WeightSlice,
            codec: WireCodec::F32.id(),
            ndim: 2,
            stage: 1,
            run_id: 9,
            epoch: 2,
            shard: k,
            first_sample: offset,
            samples: KIND_CONTRIBUTION,
            attempt: 0,
            seq_no: u64::from(payload),
            shape,
            payload_len: 4 * 256 * 4,
            payload_hash: [payload; 32],
            answers: [0; 32],
            sender: [0; 32],
            signature: [0; 64],
        };
        h.sign(id);
        header_bytes(&h)
    }

    fn to(k: u32, offset: u64) -> PartitionOf {
        PartitionOf { run_id: 9, epoch: 2, stage: 1, partition: k, offset }
    }

    #[test]
    fn a_contribution_header_is_checked_for_its_partition_and_signature() {
        let id = Identity::generate();
        let bytes = signed(&id, 3, 1024, 7);
        let c = SignedContribution::check(&bytes, &to(3, 1024)).unwrap();
        assert_eq!((c.sender, c.payload_hash), (id.peer_id(), [7; 32]));
        assert!(SignedContribution::check(&bytes, &to(2, 1024)).unwrap_err().contains("partition"));
        assert!(SignedContribution::check(&bytes, &to(3, 0)).is_err(), "another offset");
        let mut forged = bytes.clone();
        // The payload hash sits inside the archive: change one of its bytes.
        let at = forged.windows(32).position(|w| w == [7; 32]).unwrap();
        forged[at] ^= 1;
        assert!(SignedContribution::check(&forged, &to(3, 1024)).unwrap_err().contains("signature"));
        assert!(SignedContribution::check(&bytes[1..], &to(3, 1024)).is_err(), "short");
        assert!(SignedContribution::check(&[0xff; 4096], &to(3, 1024)).is_err(), "garbage");
    }

    #[test]
    fn a_proof_needs_two_payloads_from_the_named_sender() {
        let (id, other) = (Identity::generate(), Identity::generate());
        let proof = |a: Vec<u8>, b: Vec<u8>| Equivocation {
            epoch: 2,
            stage: 1,
            partition: 3,
            sender: id.peer_id(),
            headers: [a, b],
        };
        assert_eq!(proof(signed(&id, 3, 1024, 7), signed(&id, 3, 1024, 8)).verify(9), Ok(()));
        assert!(proof(signed(&id, 3, 1024, 7), signed(&id, 3, 1024, 7)).verify(9).is_err(), "same payload");
        assert!(proof(signed(&id, 3, 1024, 7), signed(&other, 3, 1024, 8)).verify(9).is_err(), "two senders");
        assert!(proof(signed(&id, 3, 1024, 7), signed(&id, 4, 1024, 8)).verify(9).is_err(), "two partitions");
        assert!(proof(signed(&id, 3, 1024, 7), signed(&id, 3, 2048, 8)).verify(9).is_err(), "two offsets");
        assert!(proof(signed(&id, 3, 1024, 7), signed(&id, 3, 1024, 8)).verify(8).is_err(), "another run");
    }
}
