//! A merge contribution bound to the weights it was computed from
//! (PROTOCOL.md, "Contributions bound to the weights chain").
//!
//! A participant's contribution to partition k is the slice of its
//! pseudo-gradient, the weights its epoch started from minus its last
//! committed weights, encoded with the merge codec. Both weights are
//! committed: the start is the stage's recorded merge (or the seed's), the
//! last is the last item of the participant's weights chain, whose steps
//! validators recompute (`inner_step`). Asked to store its contribution for
//! an audit, a participant also stores a [`ContributionWitness`]: both
//! weights' values over the partition, each shown against its hash
//! (`hashes::WeightsWitness`), and its weights chain's items. The auditor
//! ([`check_contribution`]) recomputes the slice from them and holds it
//! against the contribution the owners reduced: a copy of another's
//! contribution, its negation, or a scaled one is not the slice of the
//! committed weights.
//!
//! The witness is the participant's upload, hostile like any: every count
//! is bounded before anything is allocated, and nothing panics.

// Store bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use iota_core::WireCodec;
use iota_core::commitment::Chain;

use crate::hashes::{WEIGHTS_LEAF, WeightsWitness};
use crate::slices::encode_slice;

const MAGIC: &[u8; 8] = b"IOTACWT1";

/// What a participant shows with its stored contribution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContributionWitness {
    /// The weights the epoch started from, over the partition.
    pub start: WeightsWitness,
    /// Its last committed weights, over the partition.
    pub last: WeightsWitness,
    /// The items of its weights chain for the epoch.
    pub step_hashes: Vec<[u8; 32]>,
}

/// Bounds on a witness (from the run's shape and the audited partition).
#[derive(Clone, Copy, Debug)]
pub struct WitnessLimits {
    /// The stage's weight count.
    pub weights: u64,
    /// The partition's length (values shown cover it and at most two
    /// leaves more).
    pub partition: u64,
    /// Most items of a weights chain (inner steps in an epoch).
    pub max_steps: u64,
}

pub(crate) fn put_witness(b: &mut Vec<u8>, w: &WeightsWitness) {
    b.extend_from_slice(&w.n.to_le_bytes());
    b.extend_from_slice(&(w.leaves.len() as u64).to_le_bytes());
    w.leaves.iter().for_each(|l| b.extend_from_slice(l));
    b.extend_from_slice(&w.first_leaf.to_le_bytes());
    b.extend_from_slice(&(w.values.len() as u64).to_le_bytes());
    w.values.iter().for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
}

pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).ok_or("truncated")?;
        let s = self.b.get(self.at..end).ok_or("truncated")?;
        self.at = end;
        Ok(s)
    }
    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        let s: [u8; 8] = self.take(8)?.try_into().map_err(|_| "truncated")?;
        Ok(u64::from_le_bytes(s))
    }
    /// A count of at most `max` items of `len` bytes that the rest holds.
    pub(crate) fn count(&mut self, max: u64, len: usize) -> Result<usize, String> {
        let n = self.u64()?;
        if n > max {
            return Err(format!("{n} items, at most {max}"));
        }
        let n = usize::try_from(n).map_err(|_| "count")?;
        let need = n.checked_mul(len).ok_or("count")?;
        if need > self.b.len().saturating_sub(self.at) {
            return Err("truncated".into());
        }
        Ok(n)
    }
    pub(crate) fn hashes(&mut self, max: u64) -> Result<Vec<[u8; 32]>, String> {
        let n = self.count(max, 32)?;
        Ok(self.take(n.saturating_mul(32))?.chunks_exact(32).filter_map(|c| c.try_into().ok()).collect())
    }
    pub(crate) fn witness(&mut self, l: WitnessLimits) -> Result<WeightsWitness, String> {
        let n = self.u64()?;
        if n != l.weights {
            return Err(format!("a witness of {n} weights, the stage has {}", l.weights));
        }
        let leaves = self.hashes(l.weights.div_ceil(WEIGHTS_LEAF as u64))?;
        let first_leaf = self.u64()?;
        let most = l.partition.saturating_add(2u64.saturating_mul(WEIGHTS_LEAF as u64));
        let count = self.count(most, 4)?;
        let values = self.take(count.saturating_mul(4))?;
        let values = values.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect();
        Ok(WeightsWitness { n, leaves, first_leaf, values })
    }
}

impl ContributionWitness {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        put_witness(&mut b, &self.start);
        put_witness(&mut b, &self.last);
        b.extend_from_slice(&(self.step_hashes.len() as u64).to_le_bytes());
        self.step_hashes.iter().for_each(|h| b.extend_from_slice(h));
        b
    }

    pub fn decode(bytes: &[u8], l: WitnessLimits) -> Result<ContributionWitness, String> {
        let mut r = Reader { b: bytes, at: 0 };
        if r.take(8)? != MAGIC {
            return Err("not a contribution witness".into());
        }
        let start = r.witness(l)?;
        let last = r.witness(l)?;
        let step_hashes = r.hashes(l.max_steps)?;
        if r.at != bytes.len() {
            return Err("bytes after the witness".into());
        }
        Ok(ContributionWitness { start, last, step_hashes })
    }

    /// The witness of partition `range` from the weights the epoch started
    /// from, the last committed weights, and the weights chain's items.
    pub fn of(
        start: &[f32],
        last: &[f32],
        step_hashes: &[[u8; 32]],
        range: std::ops::Range<usize>,
    ) -> ContributionWitness {
        ContributionWitness {
            start: WeightsWitness::of(start, range.clone()),
            last: WeightsWitness::of(last, range),
            step_hashes: step_hashes.to_vec(),
        }
    }
}

/// What the auditor knows of one participant without it.
pub struct Bound<'a> {
    /// Its weights chain's head for the epoch (from its `UploadDone`).
    pub committed: &'a Chain,
    /// The hashes the stage's epoch may have started from.
    pub starts: &'a [[u8; 32]],
    pub codec: WireCodec,
    /// The partition: `offset..offset + len` of the stage's weights.
    pub range: std::ops::Range<u64>,
    /// The payload hash of the contribution the owners reduced (its signed
    /// header's).
    pub payload_hash: [u8; 32],
}

/// Whether the contribution the owners reduced is the slice of `w`'s
/// committed weights: `Err(why)` when it is not (or the witness does not
/// show them).
pub fn check_contribution(w: &ContributionWitness, k: &Bound) -> Result<(), String> {
    let delta = bound_delta(w, k)?;
    let payload = encode_slice(k.codec, &delta).map_err(|e| format!("{e:#}"))?;
    if *blake3::hash(&payload).as_bytes() != k.payload_hash {
        return Err("its contribution is not the slice of its committed weights' pseudo-gradient".into());
    }
    Ok(())
}

/// The pseudo-gradient over `k.range` that `w` shows, once its weights are
/// shown to be the committed ones (`Err(why)` where they are not).
pub fn bound_delta(w: &ContributionWitness, k: &Bound) -> Result<Vec<f32>, String> {
    if Chain::of(w.step_hashes.iter()) != *k.committed {
        return Err("its weights chain's items are not the committed ones".into());
    }
    let start_root = crate::hashes::weights_root(w.start.n, &w.start.leaves);
    let last_root = crate::hashes::weights_root(w.last.n, &w.last.leaves);
    // The same weights twice make a zero contribution (a replica that
    // never saw the epoch start contributes nothing), from whatever start.
    if start_root != last_root && !k.starts.contains(&start_root) {
        return Err("its start is not the weights the epoch started from".into());
    }
    // Its last committed weights: the chain's last item, or (no step, or a
    // merge that landed after it) an epoch start.
    if w.step_hashes.last() != Some(&last_root) && !k.starts.contains(&last_root) {
        return Err("its last weights are not the last its chain commits to".into());
    }
    let start = w.start.range(&start_root, k.range.clone())?;
    let last = w.last.range(&last_root, k.range.clone())?;
    // theta_prev - theta_local, as its merge computed it.
    Ok(start.iter().zip(last).map(|(s, l)| s - l).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashes::weights_hash;

    fn setup() -> (Vec<f32>, Vec<f32>, Vec<[u8; 32]>) {
        let n = 2 * WEIGHTS_LEAF + 700;
        let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).cos()).collect();
        let mid: Vec<f32> = start.iter().map(|x| x * 0.999).collect();
        let last: Vec<f32> = mid.iter().enumerate().map(|(i, x)| x - 1e-3 * (i as f32).sin()).collect();
        (start, last.clone(), vec![weights_hash(&mid), weights_hash(&last)])
    }

    #[test]
    fn an_honest_contribution_is_bound_and_copies_negations_and_scalings_are_not() {
        let (start, last, items) = setup();
        let committed = Chain::of(items.iter());
        let starts = [weights_hash(&start)];
        let range = 512u64..(WEIGHTS_LEAF as u64 + 1024);
        let r = range.start as usize..range.end as usize;
        let delta: Vec<f32> = start[r.clone()].iter().zip(&last[r.clone()]).map(|(s, l)| s - l).collect();
        let hash_of = |x: &[f32]| *blake3::hash(&encode_slice(WireCodec::Bf16, x).unwrap()).as_bytes();
        let w = ContributionWitness::of(&start, &last, &items, r.clone());
        let bytes = w.encode();
        let limits = WitnessLimits { weights: start.len() as u64, partition: range.end - range.start, max_steps: 8 };
        assert_eq!(ContributionWitness::decode(&bytes, limits).unwrap(), w);
        let k = |payload_hash| Bound {
            committed: &committed,
            starts: &starts,
            codec: WireCodec::Bf16,
            range: range.clone(),
            payload_hash,
        };
        check_contribution(&w, &k(hash_of(&delta))).unwrap();
        let negated: Vec<f32> = delta.iter().map(|d| -d).collect();
        let scaled: Vec<f32> = delta.iter().map(|d| 50.0 * d).collect();
        let other: Vec<f32> = delta.iter().map(|d| d * 1.01 + 1e-4).collect();
        for lie in [negated, scaled, other] {
            let e = check_contribution(&w, &k(hash_of(&lie))).unwrap_err();
            assert!(e.contains("not the slice"), "{e}");
        }
        // Other weights than the committed ones cannot stand in.
        let forged: Vec<f32> = last.iter().map(|x| x + 1e-3).collect();
        let fw = ContributionWitness::of(&start, &forged, &items, r.clone());
        assert!(check_contribution(&fw, &k(hash_of(&delta))).unwrap_err().contains("last weights"));
        let mut fv = w.clone();
        fv.last.values[600] += 1.0;
        assert!(check_contribution(&fv, &k(hash_of(&delta))).unwrap_err().contains("not the committed one"));
        let short = ContributionWitness { step_hashes: items[..1].to_vec(), ..w.clone() };
        assert!(check_contribution(&short, &k(hash_of(&delta))).unwrap_err().contains("chain"));
        let wrong_start = Bound { starts: &[[9; 32]], ..k(hash_of(&delta)) };
        assert!(check_contribution(&w, &wrong_start).unwrap_err().contains("start"));
    }

    #[test]
    fn hostile_witnesses_are_refused_without_panics() {
        let (start, last, items) = setup();
        let w = ContributionWitness::of(&start, &last, &items, 100..300);
        let bytes = w.encode();
        let limits = WitnessLimits { weights: start.len() as u64, partition: 200, max_steps: 8 };
        for cut in (0..bytes.len()).step_by(97) {
            assert!(ContributionWitness::decode(&bytes[..cut], limits).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(1);
        assert!(ContributionWitness::decode(&long, limits).is_err());
        let other = WitnessLimits { weights: 5, ..limits };
        assert!(ContributionWitness::decode(&bytes, other).is_err(), "another stage's size");
        let few = WitnessLimits { max_steps: 1, ..limits };
        assert!(ContributionWitness::decode(&bytes, few).is_err(), "more items than steps");
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(ContributionWitness::decode(&huge, limits).is_err(), "a leaf count past the bound");
    }
}
