//! The evidence object a miner uploads for one sampled micro-batch attempt
//! (PROTOCOL.md, "Validation"): the frames it received and sent for it, the
//! weights it computed with, and the items of its weights chain, so a
//! validator can check each link of `evidence::check_forward` (and, for a
//! middle stage, `evidence::check_backward`) without trusting anything the
//! miner says.
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! magic  b"IOTAEVD1"
//! u32    flags            bit 0: an input frame follows
//!                         bit 1: a backward follows (two gradient frames)
//!                         bit 2: the backward's own weights follow (bit 1 set)
//!                         bit 3: an inner step follows (below)
//! u64    input_len        (0 when absent)
//! u64    output_len
//! u64    weights          count of f32 values
//! u64    steps            count of 32-byte step hashes
//! u64    grad_in_len      (bit 1 only) the gradient frame received
//! u64    grad_out_len     (bit 1 only) the gradient frame sent upstream
//! bytes  input frame, output frame, weights (f32), step hashes,
//!        then (bit 1) the received and the sent gradient frame,
//!        then (bit 2) the backward's weights (`weights` f32 values)
//! ```
//!
//! A head's bundle carries bit 1 too: the gradient frame it received for
//! its output (what shows its neighbour received that output), with an
//! empty sent gradient (a head sends none) and never bit 2.
//!
//! With bit 3 set, the inner step the attempt's backward went into follows
//! last: a u64 length, then that many bytes of an
//! `inner_step::StepEvidence` (decoded and bounded by its own reader).
//!
//! Nothing else may follow. A bundle with flags 0 or 1 is the format as it
//! was before backward evidence (a reader of that format refuses the new
//! bits as unknown flags). The object is read from the store after its
//! size and hash were checked against the miner's signed announcement, but
//! the miner chose the bytes: every length is bounded by [`BundleLimits`]
//! before anything is allocated, and nothing panics.

// Store bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use crate::evidence::{BackwardEvidence, ForwardEvidence};

const MAGIC: &[u8; 8] = b"IOTAEVD1";
const HEADER_LEN: usize = 8 + 4 + 8 * 4;
/// The two gradient lengths a backward adds to the header.
const BACKWARD_HEADER_LEN: usize = 8 * 2;
const HAS_INPUT: u32 = 1;
const HAS_BACKWARD: u32 = 1 << 1;
const HAS_BACKWARD_WEIGHTS: u32 = 1 << 2;
const HAS_STEP: u32 = 1 << 3;
const KNOWN_FLAGS: u32 = HAS_INPUT | HAS_BACKWARD | HAS_BACKWARD_WEIGHTS | HAS_STEP;

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
    /// A middle stage's backward for the attempt (None elsewhere).
    pub backward: Option<BackwardFrames>,
    /// The encoded `inner_step::StepEvidence` of the step the attempt's
    /// backward went into (None: the miner keeps no steps chain).
    pub step: Option<Vec<u8>>,
}

/// What a middle stage adds for its backward, and a head for the answer
/// to its output (`evidence::check_head_answer`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackwardFrames {
    /// The whole gradient frame it received from downstream.
    pub received: Vec<u8>,
    /// The whole gradient frame it sent upstream (empty at the head, which
    /// sends none).
    pub sent: Vec<u8>,
    /// The weights its backward ran on, when they are not `weights` (an
    /// inner step came between the attempt's forward and its backward).
    pub weights: Option<Vec<f32>>,
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

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect()
}

impl EvidenceBundle {
    // Our own bytes: sizes of vectors in memory, which cannot overflow.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn encode(&self) -> Vec<u8> {
        let input = self.input_frame.as_deref().unwrap_or(&[]);
        let bw = self.backward.as_ref();
        let bw_weights = bw.and_then(|b| b.weights.as_deref());
        let backward_len = bw.map_or(0, |b| BACKWARD_HEADER_LEN + b.received.len() + b.sent.len())
            + 4 * bw_weights.map_or(0, <[f32]>::len);
        let body = input.len() + self.output_frame.len() + 4 * self.weights.len() + 32 * self.step_hashes.len();
        let mut b = Vec::with_capacity(HEADER_LEN + body + backward_len);
        b.extend_from_slice(MAGIC);
        let flags = if self.input_frame.is_some() { HAS_INPUT } else { 0 }
            | if bw.is_some() { HAS_BACKWARD } else { 0 }
            | if bw_weights.is_some() { HAS_BACKWARD_WEIGHTS } else { 0 }
            | if self.step.is_some() { HAS_STEP } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        for n in [input.len(), self.output_frame.len(), self.weights.len(), self.step_hashes.len()] {
            b.extend_from_slice(&(n as u64).to_le_bytes());
        }
        if let Some(bw) = bw {
            for n in [bw.received.len(), bw.sent.len()] {
                b.extend_from_slice(&(n as u64).to_le_bytes());
            }
        }
        b.extend_from_slice(input);
        b.extend_from_slice(&self.output_frame);
        for w in &self.weights {
            b.extend_from_slice(&w.to_le_bytes());
        }
        for h in &self.step_hashes {
            b.extend_from_slice(h);
        }
        if let Some(bw) = bw {
            b.extend_from_slice(&bw.received);
            b.extend_from_slice(&bw.sent);
        }
        for w in bw_weights.unwrap_or(&[]) {
            b.extend_from_slice(&w.to_le_bytes());
        }
        if let Some(step) = &self.step {
            b.extend_from_slice(&(step.len() as u64).to_le_bytes());
            b.extend_from_slice(step);
        }
        b
    }

    pub fn decode(b: &[u8], lim: BundleLimits) -> Result<EvidenceBundle, BundleError> {
        if b.get(..8) != Some(&MAGIC[..]) {
            return Err(BundleError::Magic);
        }
        let flags: [u8; 4] = b.get(8..12).and_then(|s| s.try_into().ok()).ok_or(BundleError::Truncated)?;
        let flags = u32::from_le_bytes(flags);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(BundleError::Bound(format!("unknown flags {flags:#x}")));
        }
        let (has_input, has_backward, has_bw_weights) =
            (flags & HAS_INPUT != 0, flags & HAS_BACKWARD != 0, flags & HAS_BACKWARD_WEIGHTS != 0);
        if has_bw_weights && !has_backward {
            return Err(BundleError::Bound("backward weights without a backward".into()));
        }
        let (input_len, output_len, weights, steps) = (u64_at(b, 12)?, u64_at(b, 20)?, u64_at(b, 28)?, u64_at(b, 36)?);
        let (grad_in_len, grad_out_len) =
            if has_backward { (u64_at(b, HEADER_LEN)?, u64_at(b, HEADER_LEN.saturating_add(8))?) } else { (0, 0) };
        if !has_input && input_len != 0 {
            return Err(BundleError::Bound("an input length without an input frame".into()));
        }
        if [input_len, output_len, grad_in_len, grad_out_len].iter().any(|n| *n > lim.max_frame) {
            return Err(BundleError::Bound(format!("a frame over {} bytes", lim.max_frame)));
        }
        if weights != lim.weights {
            return Err(BundleError::Bound(format!("{weights} weights, the stage has {}", lim.weights)));
        }
        if steps > lim.max_steps {
            return Err(BundleError::Bound(format!("{steps} step hashes, at most {}", lim.max_steps)));
        }
        let header = if has_backward { HEADER_LEN.saturating_add(BACKWARD_HEADER_LEN) } else { HEADER_LEN };
        let bw_weights_len = if has_bw_weights { weights.saturating_mul(4) } else { 0 };
        // The declared sizes must add up to what is there before any copy.
        let total = [
            input_len,
            output_len,
            weights.saturating_mul(4),
            steps.saturating_mul(32),
            grad_in_len,
            grad_out_len,
            bw_weights_len,
        ]
        .iter()
        .try_fold(header as u64, |acc, n| acc.checked_add(*n))
        .ok_or(BundleError::Truncated)?;
        let step_len = if flags & HAS_STEP != 0 {
            Some(u64_at(b, usize::try_from(total).map_err(|_| BundleError::Truncated)?)?)
        } else {
            None
        };
        let total = match step_len {
            Some(n) => total.checked_add(8).and_then(|t| t.checked_add(n)).ok_or(BundleError::Truncated)?,
            None => total,
        };
        let have = b.len() as u64;
        if have < total {
            return Err(BundleError::Truncated);
        }
        if have > total {
            return Err(BundleError::Trailing(usize::try_from(have.saturating_sub(total)).unwrap_or(usize::MAX)));
        }
        let mut at = header;
        let input = take(b, &mut at, input_len)?;
        let output = take(b, &mut at, output_len)?;
        let w = take(b, &mut at, weights.saturating_mul(4))?;
        let h = take(b, &mut at, steps.saturating_mul(32))?;
        let grad_in = take(b, &mut at, grad_in_len)?;
        let grad_out = take(b, &mut at, grad_out_len)?;
        let bw_w = take(b, &mut at, bw_weights_len)?;
        let step = match step_len {
            Some(n) => {
                take(b, &mut at, 8)?;
                Some(take(b, &mut at, n)?.to_vec())
            }
            None => None,
        };
        Ok(EvidenceBundle {
            input_frame: has_input.then(|| input.to_vec()),
            output_frame: output.to_vec(),
            weights: f32s(w),
            step_hashes: h.chunks_exact(32).filter_map(|c| c.try_into().ok()).collect(),
            backward: has_backward.then(|| BackwardFrames {
                received: grad_in.to_vec(),
                sent: grad_out.to_vec(),
                weights: has_bw_weights.then(|| f32s(bw_w)),
            }),
            step,
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

    /// The bundle as `evidence::check_backward` takes it (None: it holds
    /// no backward).
    pub fn as_backward(&self) -> Option<BackwardEvidence<'_>> {
        let b = self.backward.as_ref()?;
        Some(BackwardEvidence {
            forward: self.as_forward(),
            received_grad: &b.received,
            sent_grad: &b.sent,
            weights: b.weights.as_deref().unwrap_or(&self.weights),
        })
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
            backward: None,
            step: None,
        }
    }

    /// A middle stage's bundle, with the backward's own weights or not.
    fn middle(own_weights: bool) -> EvidenceBundle {
        EvidenceBundle {
            backward: Some(BackwardFrames {
                received: vec![5; 29],
                sent: vec![6; 37],
                weights: own_weights.then(|| (0..10).map(|i| i as f32 * 0.25).collect()),
            }),
            ..bundle(true)
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
    fn round_trips_with_a_step_and_refuses_a_step_section_cut_or_overlong() {
        let b = EvidenceBundle { step: Some(vec![3; 17]), ..middle(true) };
        let bytes = b.encode();
        assert_eq!(EvidenceBundle::decode(&bytes, LIM).unwrap(), b);
        let empty = EvidenceBundle { step: Some(Vec::new()), ..bundle(false) };
        assert_eq!(EvidenceBundle::decode(&empty.encode(), LIM).unwrap(), empty);
        assert_eq!(EvidenceBundle::decode(&bytes[..bytes.len() - 1], LIM), Err(BundleError::Truncated));
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(EvidenceBundle::decode(&long, LIM), Err(BundleError::Trailing(1)));
        // A length past the end, or one that overflows, is refused whole.
        let at = bytes.len() - 17 - 8;
        for n in [18u64, u64::MAX] {
            let mut lie = bytes.clone();
            lie[at..at + 8].copy_from_slice(&n.to_le_bytes());
            assert_eq!(EvidenceBundle::decode(&lie, LIM), Err(BundleError::Truncated), "{n}");
        }
    }

    #[test]
    fn round_trips_with_a_backward_and_leaves_the_old_format_unchanged() {
        for own in [false, true] {
            let b = middle(own);
            let bytes = b.encode();
            assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), if own { 7 } else { 3 });
            let d = EvidenceBundle::decode(&bytes, LIM).unwrap();
            assert_eq!(d, b);
            let ev = d.as_backward().unwrap();
            assert_eq!((ev.received_grad, ev.sent_grad), (&[5u8; 29][..], &[6u8; 37][..]));
            let want = if own { b.backward.as_ref().unwrap().weights.clone().unwrap() } else { b.weights.clone() };
            assert_eq!(ev.weights, &want[..], "the backward's weights: its own, else the forward's");
        }
        // A bundle without a backward is byte for byte the earlier format:
        // flags 0 or 1, four lengths, the four sections.
        let old = bundle(true).encode();
        assert_eq!(&old[8..12], &[1, 0, 0, 0]);
        assert_eq!(old.len(), HEADER_LEN + 33 + 41 + 40 + 64);
        assert!(bundle(true).as_backward().is_none());
        // Empty gradient frames are still a backward (the check refuses them).
        let mut empty = middle(false);
        empty.backward = Some(BackwardFrames::default());
        assert_eq!(EvidenceBundle::decode(&empty.encode(), LIM).unwrap(), empty);
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
        flags[8] = 8;
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

    #[test]
    fn hostile_backward_sections_are_refused_without_panics() {
        for own in [false, true] {
            let good = middle(own).encode();
            // Every prefix, and one byte too many.
            for n in 0..good.len() {
                assert!(EvidenceBundle::decode(&good[..n], LIM).is_err(), "prefix of {n}");
            }
            let mut long = good.clone();
            long.push(0);
            assert_eq!(EvidenceBundle::decode(&long, LIM), Err(BundleError::Trailing(1)));
            // A gradient length over the frame bound, far past the bytes,
            // or overflowing, before anything is allocated.
            for (at, v) in [(44usize, 65u64), (52, 65), (44, 1 << 40), (52, u64::MAX), (44, u64::MAX / 2)] {
                let mut b = good.clone();
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
                assert!(EvidenceBundle::decode(&b, LIM).is_err(), "length {v} at {at}");
            }
            let mut b = good.clone();
            b[44..52].copy_from_slice(&65u64.to_le_bytes());
            assert!(matches!(EvidenceBundle::decode(&b, LIM), Err(BundleError::Bound(_))), "over the frame bound");
            // The gradient lengths moved between the two frames: still the
            // same total, so it decodes, but to other frames.
            let mut moved = good.clone();
            moved[44..52].copy_from_slice(&30u64.to_le_bytes());
            moved[52..60].copy_from_slice(&36u64.to_le_bytes());
            let d = EvidenceBundle::decode(&moved, LIM).unwrap();
            assert_ne!(d, middle(own));
        }
        // Wrong flags: a backward's bytes under flags that say none (the
        // gradient lengths then read as sections: trailing or short), the
        // backward's weights without a backward, and unknown bits.
        let good = middle(true).encode();
        for f in [0u32, 1, 5, 4, 9, 0x8000_0003] {
            let mut b = good.clone();
            b[8..12].copy_from_slice(&f.to_le_bytes());
            assert!(EvidenceBundle::decode(&b, LIM).is_err(), "flags {f:#x}");
        }
        let mut b = good.clone();
        b[8..12].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(
            EvidenceBundle::decode(&b, LIM),
            Err(BundleError::Bound("backward weights without a backward".into()))
        );
        // Flags that claim the backward's weights on a bundle without them:
        // too short by those weights.
        let mut b = middle(false).encode();
        b[8..12].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(EvidenceBundle::decode(&b, LIM), Err(BundleError::Truncated));
        // ... and flags that drop them: too long by them.
        let mut b = middle(true).encode();
        b[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(EvidenceBundle::decode(&b, LIM), Err(BundleError::Trailing(40)));
        // Noise behind a backward header.
        let mut rng = iota_core::Rng::new(6);
        for _ in 0..200 {
            let mut b = good[..60].to_vec();
            let n = rng.below(300) as usize;
            b.extend((0..n).map(|_| rng.below(256) as u8));
            let _ = EvidenceBundle::decode(&b, LIM);
        }
    }
}
