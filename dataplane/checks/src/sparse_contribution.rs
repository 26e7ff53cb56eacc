//! A sparse merge contribution bound to its sender's committed weights and
//! backlog (issue 57; PROTOCOL.md, "Sparse contributions bound to the
//! backlog").
//!
//! A sparse sender's contribution is not a function of its weights alone:
//! it sends the top of its pseudo-gradient plus what its earlier
//! contributions left unsent (its backlog, `sparse::ErrorFeedback`), and
//! keeps the rest. So a sender commits to its backlog as it commits to its
//! weights: with its epoch's weights chain it reports the hash of the
//! backlog its contribution starts from (`hashes::weights_hash` of the
//! whole stage's), and for an audit it shows, over the audited partition:
//!
//! 1. its weights, as a dense sender does (`contribution`): the
//!    contribution must be `sparse::step_frame` of the pseudo-gradient
//!    and the committed backlog, bit for bit;
//! 2. where that backlog is not all zero, the epoch before's weights and
//!    backlog: the backlog must be what `step_frame` left of them. A sender
//!    cannot carry a backlog it did not earn; it may always start afresh
//!    (all zero, what an honest sender that restarted or changed stage
//!    holds), which costs nobody but itself.
//!
//! An audit draws partitions, so a lie about one partition's backlog is
//! seen with the same chance as a lie about its contribution. Check 2
//! needs the epoch before's blocks where this epoch's are: sparse plans
//! cut partitions on `SPARSE_BLOCK` multiples (`MergeSpec::partition_block`).
//!
//! The witness is the sender's upload, hostile like any: counts are bounded
//! before anything is allocated, and nothing panics.

// Store bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use iota_core::commitment::Chain;

use crate::contribution::{Bound, ContributionWitness, Reader, WitnessLimits, bound_delta, put_witness};
use crate::hashes::{WEIGHTS_LEAF, WeightsWitness};
use crate::sparse::{SPARSE_BLOCK, step_frame};

const MAGIC: &[u8; 8] = b"IOTASWT1";

/// What a sparse sender shows with its stored contribution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseWitness {
    /// Its weights this epoch (a dense contribution's witness).
    pub weights: ContributionWitness,
    /// The backlog its contribution started from, over the partition.
    pub backlog: WeightsWitness,
    /// Where that backlog is not all zero: the epoch before's weights and
    /// backlog over the same partition.
    pub before: Option<(ContributionWitness, WeightsWitness)>,
}

/// What the auditor knows of one sender's epoch without it.
pub struct EpochBound<'a> {
    /// Its weights chain's head for the epoch.
    pub committed: &'a Chain,
    /// The hashes the stage's epoch may have started from.
    pub starts: &'a [[u8; 32]],
    /// The hash of the backlog it reported for the epoch.
    pub backlog: [u8; 32],
}

/// What the auditor knows of one sparse contribution without its witness.
pub struct SparseBound<'a> {
    /// The audited epoch.
    pub now: EpochBound<'a>,
    /// The epoch before, where the sender took part in it.
    pub before: Option<EpochBound<'a>>,
    /// The partition: `offset..offset + len` of the stage's weights.
    pub range: std::ops::Range<u64>,
    /// The payload hash of the contribution the owners reduced.
    pub payload_hash: [u8; 32],
    /// Values kept per sparse block (the run's density).
    pub kept: usize,
    /// The run's backlog decay (`MergeSpec::sparse_decay`).
    pub decay: f32,
}

fn put_weights(b: &mut Vec<u8>, w: &ContributionWitness) {
    put_witness(b, &w.start);
    put_witness(b, &w.last);
    b.extend_from_slice(&(w.step_hashes.len() as u64).to_le_bytes());
    w.step_hashes.iter().for_each(|h| b.extend_from_slice(h));
}

fn read_weights(r: &mut Reader, l: WitnessLimits) -> Result<ContributionWitness, String> {
    let start = r.witness(l)?;
    let last = r.witness(l)?;
    let step_hashes = r.hashes(l.max_steps)?;
    Ok(ContributionWitness { start, last, step_hashes })
}

impl SparseWitness {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        put_weights(&mut b, &self.weights);
        put_witness(&mut b, &self.backlog);
        match &self.before {
            None => b.push(0),
            Some((w, backlog)) => {
                b.push(1);
                put_weights(&mut b, w);
                put_witness(&mut b, backlog);
            }
        }
        b
    }

    pub fn decode(bytes: &[u8], l: WitnessLimits) -> Result<SparseWitness, String> {
        let mut r = Reader { b: bytes, at: 0 };
        if r.take(8)? != MAGIC {
            return Err("not a sparse contribution witness".into());
        }
        let weights = read_weights(&mut r, l)?;
        let backlog = r.witness(l)?;
        let before = match r.take(1)? {
            [0] => None,
            [1] => Some((read_weights(&mut r, l)?, r.witness(l)?)),
            _ => return Err("a witness that neither has the epoch before nor has not".into()),
        };
        if r.at != bytes.len() {
            return Err("bytes after the witness".into());
        }
        Ok(SparseWitness { weights, backlog, before })
    }

    /// The witness of partition `range`: this epoch's weights (as
    /// `ContributionWitness::of`) and backlog, and, where the backlog is
    /// not all zero there, the epoch before's (`before`: its start, last
    /// weights, weights chain's items and backlog).
    pub fn of(
        weights: ContributionWitness,
        backlog: &[f32],
        before: Option<(ContributionWitness, &[f32])>,
        range: std::ops::Range<usize>,
    ) -> SparseWitness {
        let shown = WeightsWitness::of(backlog, range.clone());
        let before = before
            .filter(|_| SparseWitness::carries(&shown, range.clone()))
            .map(|(w, b)| (w, WeightsWitness::of(b, range)));
        SparseWitness { weights, backlog: shown, before }
    }

    /// Whether a backlog shown over `range` carries anything there (not
    /// all +0.0), so the witness must show the epoch before that left it.
    /// For a sender that builds the witness's parts itself (`of` does it
    /// from whole vectors).
    pub fn carries(backlog: &WeightsWitness, range: std::ops::Range<usize>) -> bool {
        let from = usize::try_from(backlog.first_leaf).unwrap_or(usize::MAX).saturating_mul(WEIGHTS_LEAF);
        let shown = range.start.checked_sub(from).zip(range.end.checked_sub(from));
        shown.and_then(|(a, b)| backlog.values.get(a..b)).is_some_and(|b| !all_zero(b))
    }
}

/// A backlog that holds nothing: every value +0.0 (what a sender starting
/// afresh holds; a carried backlog may hold -0.0, which is not this).
fn all_zero(b: &[f32]) -> bool {
    b.iter().all(|v| v.to_bits() == 0)
}

/// Whether the contribution the owners reduced is what the sender's
/// committed weights and backlog give, and its backlog what its epoch
/// before left: `Err(why)` when not (or the witness does not show it).
pub fn check_sparse_contribution(w: &SparseWitness, k: &SparseBound) -> Result<(), String> {
    let now = Bound {
        committed: k.now.committed,
        starts: k.now.starts,
        codec: iota_core::WireCodec::SparseTopK,
        range: k.range.clone(),
        payload_hash: k.payload_hash,
    };
    let delta = bound_delta(&w.weights, &now)?;
    let held = w.backlog.range(&k.now.backlog, k.range.clone()).map_err(|e| format!("its backlog: {e}"))?;
    if held.len() != delta.len() {
        return Err("a backlog witness of another length".into());
    }
    let mut left = held.to_vec();
    let rows = step_frame(&mut left, &delta, k.kept, k.decay);
    if *blake3::hash(&rows).as_bytes() != k.payload_hash {
        return Err("its contribution is not what its committed weights and backlog give".into());
    }
    if all_zero(held) {
        return Ok(());
    }
    let (Some(before), Some((wb, backlog_before))) = (k.before.as_ref(), w.before.as_ref()) else {
        return Err(match k.before {
            None => "a backlog carried from an epoch it took no part in".into(),
            Some(_) => "a backlog carried without the epoch before's witness".into(),
        });
    };
    let block = SPARSE_BLOCK as u64;
    let n = w.backlog.n;
    if !k.range.start.is_multiple_of(block) || !(k.range.end.is_multiple_of(block) || k.range.end == n) {
        return Err(format!("partition {:?} is not cut on sparse blocks; its backlog cannot be judged", k.range));
    }
    let then = Bound {
        committed: before.committed,
        starts: before.starts,
        codec: iota_core::WireCodec::SparseTopK,
        range: k.range.clone(),
        payload_hash: [0; 32],
    };
    let delta_before = bound_delta(wb, &then).map_err(|e| format!("the epoch before: {e}"))?;
    let mut earned = backlog_before
        .range(&before.backlog, k.range.clone())
        .map_err(|e| format!("the epoch before's backlog: {e}"))?
        .to_vec();
    if earned.len() != delta_before.len() {
        return Err("a backlog witness of another length".into());
    }
    step_frame(&mut earned, &delta_before, k.kept, k.decay);
    if earned.iter().zip(held).any(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err("its backlog is not what its contribution of the epoch before left".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
