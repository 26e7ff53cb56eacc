//! The hashes a miner's frames and commitments are made of (a validator
//! recomputes them from the evidence it is shown).

// Hostile witnesses: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use rayon::prelude::*;

/// What the head's forward frame answers: the BLAKE3 hash of its input
/// tokens (u32 little-endian), so a pathway's chain starts at its data.
pub fn tokens_hash(tokens: &[u32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// Weights per leaf of `weights_hash` (64 KiB of f32).
pub const WEIGHTS_LEAF: usize = 16_384;

const ROOT_DOMAIN: &[u8] = b"iota-rs weights v2";

/// The BLAKE3 hash of one leaf's weights (f32 little-endian).
pub(crate) fn leaf_hash(leaf: &[f32]) -> [u8; 32] {
    let bytes: Vec<u8> = leaf.iter().flat_map(|v| v.to_le_bytes()).collect();
    *blake3::hash(&bytes).as_bytes()
}

/// The hashes of `params`' leaves of `WEIGHTS_LEAF` values, in order.
pub fn weights_leaves(params: &[f32]) -> Vec<[u8; 32]> {
    params.par_chunks(WEIGHTS_LEAF).map(leaf_hash).collect()
}

/// The root over `n` weights whose leaves hash to `leaves`.
pub fn weights_root(n: u64, leaves: &[[u8; 32]]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(ROOT_DOMAIN);
    h.update(&n.to_le_bytes());
    for l in leaves {
        h.update(l);
    }
    *h.finalize().as_bytes()
}

/// The hash of a stage's weights, as the weights chain commits to it after
/// every inner step: the root over the hashes of its leaves of
/// `WEIGHTS_LEAF` values, so a range of the weights can be shown against
/// it without the rest ([`WeightsWitness`]).
pub fn weights_hash(params: &[f32]) -> [u8; 32] {
    weights_root(params.len() as u64, &weights_leaves(params))
}

/// A range of weights shown against their hash: every leaf's hash, and the
/// values of the leaves that cover the range.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WeightsWitness {
    /// How many weights the whole holds.
    pub n: u64,
    pub leaves: Vec<[u8; 32]>,
    /// The first leaf whose values follow.
    pub first_leaf: u64,
    pub values: Vec<f32>,
}

impl WeightsWitness {
    /// The witness of `range` of `params` (clamped to it).
    pub fn of(params: &[f32], range: std::ops::Range<usize>) -> WeightsWitness {
        let (first, span) = WeightsWitness::covering(params.len(), range);
        WeightsWitness {
            n: params.len() as u64,
            leaves: weights_leaves(params),
            first_leaf: first as u64,
            values: params.get(span).unwrap_or(&[]).to_vec(),
        }
    }

    /// The first leaf, and the values, a witness of `range` of `n` weights
    /// shows (clamped to them): those of the leaves that cover it. For a
    /// holder that keeps the leaves' hashes and reads the values from
    /// elsewhere (a file).
    pub fn covering(n: usize, range: std::ops::Range<usize>) -> (usize, std::ops::Range<usize>) {
        let end = range.end.min(n);
        let first = range.start.min(end) / WEIGHTS_LEAF;
        let last = end.div_ceil(WEIGHTS_LEAF).max(first);
        let from = first.saturating_mul(WEIGHTS_LEAF);
        let to = last.saturating_mul(WEIGHTS_LEAF).min(n);
        (first, from..to.max(from))
    }

    /// Checks the witness against `root` and returns the values of
    /// `range` (which its leaves must cover).
    pub fn range(&self, root: &[u8; 32], range: std::ops::Range<u64>) -> Result<&[f32], String> {
        let want = self.n.div_ceil(WEIGHTS_LEAF as u64);
        if self.leaves.len() as u64 != want {
            return Err(format!("{} leaf hashes for {} weights", self.leaves.len(), self.n));
        }
        if weights_root(self.n, &self.leaves) != *root {
            return Err("the leaves are not the committed weights".into());
        }
        let leaf = WEIGHTS_LEAF as u64;
        let from = self.first_leaf.checked_mul(leaf).ok_or("leaf past the end")?;
        let to = from.checked_add(self.values.len() as u64).ok_or("values past the end")?;
        if to > self.n || range.start < from || range.end > to || range.start > range.end {
            return Err(format!("values {from}..{to} do not cover {range:?} of {}", self.n));
        }
        for (i, chunk) in self.values.chunks(WEIGHTS_LEAF).enumerate() {
            let at = usize::try_from(self.first_leaf).ok().and_then(|f| f.checked_add(i));
            let committed = at.and_then(|a| self.leaves.get(a)).ok_or("a leaf past the end")?;
            // Only the last leaf of the whole may be short.
            let whole = chunk.len() == WEIGHTS_LEAF || at.and_then(|a| a.checked_add(1)) == Some(self.leaves.len());
            if !whole || leaf_hash(chunk) != *committed {
                return Err(format!("leaf {} is not the committed one", at.unwrap_or(usize::MAX)));
            }
        }
        let a = usize::try_from(range.start.saturating_sub(from)).map_err(|_| "range")?;
        let b = usize::try_from(range.end.saturating_sub(from)).map_err(|_| "range")?;
        self.values.get(a..b).ok_or_else(|| "range".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(n: usize) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37).sin()).collect()
    }

    #[test]
    fn the_hash_commits_to_every_value_and_the_count() {
        let w = weights(3 * WEIGHTS_LEAF + 100);
        let h = weights_hash(&w);
        for i in [0, WEIGHTS_LEAF - 1, WEIGHTS_LEAF, w.len() - 1] {
            let mut x = w.clone();
            x[i] = f32::from_bits(x[i].to_bits() ^ 1);
            assert_ne!(weights_hash(&x), h, "{i}");
        }
        assert_ne!(weights_hash(&w[..w.len() - 1]), h);
        let mut zero_padded = w.clone();
        zero_padded.push(0.0);
        assert_ne!(weights_hash(&zero_padded), h);
        assert_eq!(weights_hash(&w), h, "deterministic");
    }

    #[test]
    fn a_range_is_shown_against_the_hash_and_nothing_else_passes() {
        let w = weights(3 * WEIGHTS_LEAF + 100);
        let h = weights_hash(&w);
        let n = w.len() as u64;
        for r in [0..10usize, 100..WEIGHTS_LEAF + 5, 2 * WEIGHTS_LEAF..w.len(), w.len() - 3..w.len()] {
            let wit = WeightsWitness::of(&w, r.clone());
            let got = wit.range(&h, r.start as u64..r.end as u64).unwrap();
            assert_eq!(got, &w[r.clone()], "{r:?}");
        }
        let wit = WeightsWitness::of(&w, 100..WEIGHTS_LEAF + 5);
        assert!(wit.range(&h, 0..2 * WEIGHTS_LEAF as u64 + 1).is_err(), "not covered");
        assert!(wit.range(&[7; 32], 100..200).is_err(), "another root");
        let mut forged = wit.clone();
        forged.values[150] += 1.0;
        assert!(forged.range(&h, 100..200).is_err(), "a changed value");
        let mut short = wit.clone();
        short.values.pop();
        assert!(short.range(&h, 100..200).is_err(), "a short leaf that is not the last");
        let mut shifted = wit.clone();
        shifted.first_leaf = 1;
        assert!(shifted.range(&h, WEIGHTS_LEAF as u64..WEIGHTS_LEAF as u64 + 5).is_err(), "another leaf's place");
        let mut lies = wit.clone();
        lies.n = n + 1;
        assert!(lies.range(&h, 100..200).is_err(), "another count");
        let mut beyond = wit;
        beyond.first_leaf = u64::MAX;
        assert!(beyond.range(&h, 0..1).is_err(), "no overflow");
    }
}
