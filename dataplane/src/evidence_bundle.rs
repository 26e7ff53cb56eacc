//! The evidence object a miner uploads for one sampled micro-batch attempt
//! (PROTOCOL.md, "Validation"): the frames it received and sent for it, the
//! weights it computed with, and the items of its weights chain, so a
//! validator can check each link of `evidence::check_forward` without
//! trusting anything the miner says.
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! magic  b"IOTAEVD1"
//! u32    flags            bit 0: an input frame follows
//! u64    input_len        (0 when absent)
//! u64    output_len
//! u64    weights          count of f32 values
//! u64    steps            count of 32-byte step hashes
//! bytes  input frame, output frame, weights (f32), step hashes
//! ```
//!
//! Nothing else may follow. The object is read from the store after its
//! size and hash were checked against the miner's signed announcement, but
//! the miner chose the bytes: every length is bounded by [`BundleLimits`]
//! before anything is allocated, and nothing panics.

// Store bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use crate::evidence::ForwardEvidence;

const MAGIC: &[u8; 8] = b"IOTAEVD1";
const HEADER_LEN: usize = 8 + 4 + 8 * 4;

/// What the bundle holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvidenceBundle {
    /// The whole activation frame the miner received (absent at the head).
    pub input_frame: Option<Vec<u8>>,
    /// The whole frame it sent for the attempt.
    pub output_frame: Vec<u8>,
    /// The stage weights it computed with.
    pub weights: Vec<f32>,
    /// Its weights chain's items for the epoch, in order.
    pub step_hashes: Vec<[u8; 32]>,
}

/// Bounds a reader puts on a bundle (from the run's shape).
#[derive(Clone, Copy, Debug)]
pub struct BundleLimits {
    /// Largest whole frame (bytes).
    pub max_frame: u64,
    /// The stage's weight count: a bundle must hold exactly this many.
    pub weights: u64,
    /// Most step hashes (inner steps in an epoch).
    pub max_steps: u64,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error("not an evidence bundle (bad magic)")]
    Magic,
    #[error("truncated")]
    Truncated,
    #[error("{0}")]
    Bound(String),
    #[error("{0} bytes after the last section")]
    Trailing(usize),
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, BundleError> {
    let end = at.checked_add(8).ok_or(BundleError::Truncated)?;
    let s: [u8; 8] = b.get(at..end).and_then(|s| s.try_into().ok()).ok_or(BundleError::Truncated)?;
    Ok(u64::from_le_bytes(s))
}

/// Takes `len` bytes at `*at`, moving `*at` past them.
fn take<'a>(b: &'a [u8], at: &mut usize, len: u64) -> Result<&'a [u8], BundleError> {
    let len = usize::try_from(len).map_err(|_| BundleError::Truncated)?;
    let end = at.checked_add(len).ok_or(BundleError::Truncated)?;
    let s = b.get(*at..end).ok_or(BundleError::Truncated)?;
    *at = end;
    Ok(s)
}

impl EvidenceBundle {
    // Our own bytes: sizes of vectors in memory, which cannot overflow.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn encode(&self) -> Vec<u8> {
        let input = self.input_frame.as_deref().unwrap_or(&[]);
        let body = input.len() + self.output_frame.len() + 4 * self.weights.len() + 32 * self.step_hashes.len();
        let mut b = Vec::with_capacity(HEADER_LEN + body);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&u32::from(self.input_frame.is_some()).to_le_bytes());
        for n in [input.len(), self.output_frame.len(), self.weights.len(), self.step_hashes.len()] {
            b.extend_from_slice(&(n as u64).to_le_bytes());
        }
        b.extend_from_slice(input);
        b.extend_from_slice(&self.output_frame);
        for w in &self.weights {
            b.extend_from_slice(&w.to_le_bytes());
        }
        for h in &self.step_hashes {
            b.extend_from_slice(h);
        }
        b
    }

    pub fn decode(b: &[u8], lim: BundleLimits) -> Result<EvidenceBundle, BundleError> {
        if b.get(..8) != Some(&MAGIC[..]) {
            return Err(BundleError::Magic);
        }
        let flags: [u8; 4] = b.get(8..12).and_then(|s| s.try_into().ok()).ok_or(BundleError::Truncated)?;
        let flags = u32::from_le_bytes(flags);
        if flags > 1 {
            return Err(BundleError::Bound(format!("unknown flags {flags:#x}")));
        }
        let (input_len, output_len, weights, steps) = (u64_at(b, 12)?, u64_at(b, 20)?, u64_at(b, 28)?, u64_at(b, 36)?);
        if flags == 0 && input_len != 0 {
            return Err(BundleError::Bound("an input length without an input frame".into()));
        }
        if input_len > lim.max_frame || output_len > lim.max_frame {
            return Err(BundleError::Bound(format!("a frame over {} bytes", lim.max_frame)));
        }
        if weights != lim.weights {
            return Err(BundleError::Bound(format!("{weights} weights, the stage has {}", lim.weights)));
        }
        if steps > lim.max_steps {
            return Err(BundleError::Bound(format!("{steps} step hashes, at most {}", lim.max_steps)));
        }
        // The declared sizes must add up to what is there before any copy.
        let total = [input_len, output_len, weights.saturating_mul(4), steps.saturating_mul(32)]
            .iter()
            .try_fold(HEADER_LEN as u64, |acc, n| acc.checked_add(*n))
            .ok_or(BundleError::Truncated)?;
        let have = b.len() as u64;
        if have < total {
            return Err(BundleError::Truncated);
        }
        if have > total {
            return Err(BundleError::Trailing(usize::try_from(have.saturating_sub(total)).unwrap_or(usize::MAX)));
        }
        let mut at = HEADER_LEN;
        let input = take(b, &mut at, input_len)?;
        let output = take(b, &mut at, output_len)?;
        let w = take(b, &mut at, weights.saturating_mul(4))?;
        let h = take(b, &mut at, steps.saturating_mul(32))?;
        Ok(EvidenceBundle {
            input_frame: (flags == 1).then(|| input.to_vec()),
            output_frame: output.to_vec(),
            weights: w.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect(),
            step_hashes: h.chunks_exact(32).filter_map(|c| c.try_into().ok()).collect(),
        })
    }

    /// The bundle as `evidence::check_forward` takes it.
    pub fn as_forward(&self) -> ForwardEvidence<'_> {
        ForwardEvidence {
            input_frame: self.input_frame.as_deref(),
            output_frame: &self.output_frame,
            weights: &self.weights,
            step_hashes: &self.step_hashes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(input: bool) -> EvidenceBundle {
        EvidenceBundle {
            input_frame: input.then(|| vec![7; 33]),
            output_frame: vec![9; 41],
            weights: (0..10).map(|i| i as f32 * 0.5 - 1.0).collect(),
            step_hashes: vec![[1; 32], [2; 32]],
        }
    }

    const LIM: BundleLimits = BundleLimits { max_frame: 64, weights: 10, max_steps: 4 };

    #[test]
    fn round_trips_with_and_without_an_input() {
        for input in [true, false] {
            let b = bundle(input);
            assert_eq!(EvidenceBundle::decode(&b.encode(), LIM).unwrap(), b);
        }
    }

    #[test]
    fn hostile_bundles_are_refused_without_panics() {
        let good = bundle(true).encode();
        assert_eq!(EvidenceBundle::decode(&good[..good.len() - 1], LIM), Err(BundleError::Truncated));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(EvidenceBundle::decode(&long, LIM), Err(BundleError::Trailing(1)));
        let mut magic = good.clone();
        magic[0] ^= 1;
        assert_eq!(EvidenceBundle::decode(&magic, LIM), Err(BundleError::Magic));
        // A declared length far past the bytes, and one that overflows.
        for (at, v) in [(12usize, 1u64 << 40), (20, u64::MAX), (28, u64::MAX / 2), (36, u64::MAX)] {
            let mut b = good.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            assert!(EvidenceBundle::decode(&b, LIM).is_err(), "length at {at}");
        }
        let wrong_stage = BundleLimits { weights: 11, ..LIM };
        assert!(matches!(EvidenceBundle::decode(&good, wrong_stage), Err(BundleError::Bound(_))));
        let mut flags = good.clone();
        flags[8] = 2;
        assert!(matches!(EvidenceBundle::decode(&flags, LIM), Err(BundleError::Bound(_))));
        // Every prefix of a good bundle is refused, and so is noise.
        for n in 0..good.len() {
            assert!(EvidenceBundle::decode(&good[..n], LIM).is_err());
        }
        let mut rng = iota_core::Rng::new(5);
        for _ in 0..200 {
            let n = rng.below(200) as usize;
            let noise: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
            let _ = EvidenceBundle::decode(&noise, LIM);
        }
    }
}
