//! A sparse merge codec for pseudo-gradients (issue 57, "compressed
//! contributions"): per block of `BLOCK` values, the `k` largest in
//! magnitude, each as a 16-bit index and two bits (its sign, and which of
//! two magnitudes it takes), with the block's two magnitudes as bf16. The
//! sender keeps what the codec dropped and adds it to its next
//! contribution (error feedback, [`ErrorFeedback`]), so nothing it trained
//! is lost, only delayed.
//!
//! At density 1/64 a value costs (16 + 2) / 64 bits on average against
//! bf16's 16: 57x fewer bytes. Encoding is deterministic (ties in
//! magnitude go to the lower index) and decoding is exact arithmetic on
//! the wire's values, so every owner, referee and auditor decodes the same
//! bits.
//!
//! Wire form of one block: `k` (u16), the low and high magnitudes (bf16
//! each), `k` indices (u16, strictly increasing, each below the block's
//! length), then `k` 2-bit codes packed four to a byte, low bits first
//! (bit 0: negative; bit 1: the high magnitude). Blocks follow each other;
//! the last may be shorter than `BLOCK`. Everything read is hostile:
//! counts, order, ranges and the exact length are checked, and nothing
//! panics.

// Store and network bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use anyhow::{Context, Result, bail, ensure};
use iota_core::codec::{bf16_to_f32, f32_to_bf16};

/// Values per block (a block's indices fit 16 bits).
pub const SPARSE_BLOCK: usize = 1 << 14;
const BLOCK_HEADER: usize = 2 + 2 + 2;

/// Where the `n`-th code of a byte sits (four to a byte, low bits first).
fn code_shift(n: usize) -> u32 {
    [0, 2, 4, 6].get(n % 4).copied().unwrap_or(0)
}

/// Values kept per block of `len` at `density` (at least one of a
/// non-empty block).
pub fn kept_per_block(len: usize, density: f32) -> usize {
    if len == 0 {
        return 0;
    }
    // Less a hair: 0.05 as f32 is a little over 1/20, and 100 values at it
    // keep 5, not 6.
    let k = (f64::from(density.clamp(0.0, 1.0)) * len as f64 - 1e-6).ceil() as usize;
    k.clamp(1, len)
}

/// Bytes a block of `k` kept values takes.
fn block_bytes(k: usize) -> usize {
    BLOCK_HEADER.saturating_add(k.saturating_mul(2)).saturating_add(k.div_ceil(4))
}

/// Encodes `x` keeping `density` of each block's values.
pub fn encode_sparse(x: &[f32], density: f32) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks(SPARSE_BLOCK) {
        encode_block(block, kept_per_block(block.len(), density), &mut out);
    }
    out
}

fn encode_block(x: &[f32], k: usize, out: &mut Vec<u8>) {
    // The k largest |x|, ties to the lower index: one total order, so one
    // answer whatever the selection algorithm does.
    let mut order: Vec<u32> = (0..x.len() as u32).collect();
    let mag = |i: u32| x.get(i as usize).map_or(0.0, |v| if v.is_finite() { v.abs() } else { 0.0 });
    let by_size = |a: &u32, b: &u32| mag(*b).total_cmp(&mag(*a)).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, by_size);
        order.truncate(k);
    }
    order.sort_unstable();
    // Two magnitudes: the mean of the kept values' magnitudes below their
    // median and of those at or above it.
    let mut mags: Vec<f32> = order.iter().map(|&i| mag(i)).collect();
    mags.sort_unstable_by(f32::total_cmp);
    let half = mags.len() / 2;
    let mean =
        |v: &[f32]| if v.is_empty() { 0.0 } else { v.iter().map(|m| f64::from(*m)).sum::<f64>() / v.len() as f64 };
    let (lo_part, hi_part) = mags.split_at(half);
    let (lo, hi) = (f32_to_bf16(mean(lo_part) as f32), f32_to_bf16(mean(hi_part) as f32));
    let (lo_v, hi_v) = (bf16_to_f32(lo), bf16_to_f32(hi));
    out.extend_from_slice(&(order.len() as u16).to_le_bytes());
    out.extend_from_slice(&lo.to_le_bytes());
    out.extend_from_slice(&hi.to_le_bytes());
    for &i in &order {
        out.extend_from_slice(&(i as u16).to_le_bytes());
    }
    let mut codes = vec![0u8; order.len().div_ceil(4)];
    for (n, &i) in order.iter().enumerate() {
        let v = x.get(i as usize).copied().unwrap_or(0.0);
        let m = mag(i);
        // The nearer magnitude (the high one on a tie).
        let high = (m - lo_v).abs() >= (hi_v - m).abs();
        let code = u8::from(v.is_sign_negative()) | (u8::from(high) << 1);
        if let Some(c) = codes.get_mut(n / 4) {
            *c |= code.checked_shl(code_shift(n)).unwrap_or(0);
        }
    }
    out.extend_from_slice(&codes);
}

/// Decodes `len` values written by [`encode_sparse`] (the values not kept
/// are zero). `max_kept`: the most values a block may name (from the
/// run's density), so a payload cannot claim a denser code than agreed.
pub fn decode_sparse(bytes: &[u8], len: usize, max_kept: usize) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; len];
    decode_sparse_into(bytes, &mut out, max_kept)?;
    Ok(out)
}

/// [`decode_sparse`] into `out` (overwritten whole).
pub fn decode_sparse_into(bytes: &[u8], out: &mut [f32], max_kept: usize) -> Result<()> {
    out.fill(0.0);
    let mut at = 0usize;
    for (b, block) in out.chunks_mut(SPARSE_BLOCK).enumerate() {
        let rest = bytes.get(at..).context("truncated")?;
        let used = decode_block(rest, block, max_kept).with_context(|| format!("sparse block {b}"))?;
        at = at.checked_add(used).context("length")?;
    }
    if at != bytes.len() {
        bail!("{} bytes after the last sparse block", bytes.len().saturating_sub(at));
    }
    Ok(())
}

fn decode_block(b: &[u8], out: &mut [f32], max_kept: usize) -> Result<usize> {
    let u16_at = |i: usize| -> Result<u16> {
        let s = b.get(i..i.checked_add(2).context("length")?).context("truncated")?;
        Ok(u16::from_le_bytes([*s.first().context("byte")?, *s.get(1).context("byte")?]))
    };
    let k = usize::from(u16_at(0)?);
    ensure!(k <= out.len().min(max_kept), "{k} values kept of {} (at most {max_kept})", out.len());
    let need = block_bytes(k);
    ensure!(b.len() >= need, "truncated");
    let (lo, hi) = (bf16_to_f32(u16_at(2)?), bf16_to_f32(u16_at(4)?));
    ensure!(lo.is_finite() && hi.is_finite() && lo >= 0.0 && hi >= 0.0, "magnitudes {lo}, {hi}");
    let codes_at = BLOCK_HEADER.checked_add(k.checked_mul(2).context("length")?).context("length")?;
    let mut last: Option<usize> = None;
    for n in 0..k {
        let i = usize::from(u16_at(BLOCK_HEADER.checked_add(n.checked_mul(2).context("length")?).context("length")?)?);
        ensure!(last.is_none_or(|l| i > l), "indices not increasing at {n}");
        let byte = b.get(codes_at.checked_add(n / 4).context("length")?).context("truncated")?;
        let code = byte.checked_shr(code_shift(n)).unwrap_or(0);
        let m = if code & 2 != 0 { hi } else { lo };
        *out.get_mut(i).context("an index past the block")? = if code & 1 != 0 { -m } else { m };
        last = Some(i);
    }
    if !k.is_multiple_of(4) {
        let tail = b.get(codes_at.checked_add(k / 4).context("length")?).context("truncated")?;
        ensure!(tail.checked_shr(code_shift(k)).unwrap_or(0) == 0, "bits set past the last code");
    }
    Ok(need)
}

/// What a sender's sparse contributions left behind, added to the next
/// ones (error feedback): per value of the stage, the part of its
/// pseudo-gradients the codec has not sent yet.
#[derive(Clone, Debug, Default)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
}

impl ErrorFeedback {
    pub fn new(n: usize) -> Self {
        ErrorFeedback { residual: vec![0.0; n] }
    }

    /// Encodes `delta` (the values at `offset..`) plus what earlier
    /// contributions left there, and keeps what this one leaves.
    pub fn encode(&mut self, offset: usize, delta: &[f32], density: f32) -> Result<Vec<u8>> {
        let end = offset.checked_add(delta.len()).context("range")?;
        let residual = self.residual.get(offset..end).context("a range past the stage")?;
        let wanted: Vec<f32> = delta.iter().zip(residual).map(|(d, r)| d + r).collect();
        self.encode_kept(offset, &wanted, density)
    }

    /// Encodes `delta` (the values at `offset..`), which already holds
    /// what earlier contributions left (a sender that keeps its residual in
    /// its own weights: it moves onto the merged weights less what it has
    /// not sent, so its next pseudo-gradient carries it); keeps what this
    /// one leaves.
    pub fn encode_kept(&mut self, offset: usize, delta: &[f32], density: f32) -> Result<Vec<u8>> {
        let end = offset.checked_add(delta.len()).context("range")?;
        let residual = self.residual.get_mut(offset..end).context("a range past the stage")?;
        let bytes = encode_sparse(delta, density);
        let sent = decode_sparse(&bytes, delta.len(), SPARSE_BLOCK)?;
        for ((r, d), s) in residual.iter_mut().zip(delta).zip(&sent) {
            *r = d - s;
        }
        Ok(bytes)
    }

    /// What has not been sent yet, per value.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// The magnitude still held back (for reports).
    pub fn norm(&self) -> f64 {
        self.residual.iter().map(|r| f64::from(*r) * f64::from(*r)).sum::<f64>().sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
            })
            .collect()
    }

    #[test]
    fn keeps_the_largest_values_with_their_signs_at_a_57th_of_bf16() {
        let n = 3 * SPARSE_BLOCK + 1000;
        let x = noise(n, 1);
        let density = 1.0 / 64.0;
        let bytes = encode_sparse(&x, density);
        let bf16_bytes = 2 * n;
        let ratio = bf16_bytes as f64 / bytes.len() as f64;
        assert!(ratio > 55.0, "{ratio:.1}x fewer bytes than bf16");
        let y = decode_sparse(&bytes, n, SPARSE_BLOCK).unwrap();
        for (b, (xb, yb)) in x.chunks(SPARSE_BLOCK).zip(y.chunks(SPARSE_BLOCK)).enumerate() {
            let k = kept_per_block(xb.len(), density);
            assert_eq!(yb.iter().filter(|v| **v != 0.0).count(), k, "block {b}");
            // Every kept value is at least as large as every dropped one,
            // and keeps its sign.
            let smallest_kept =
                xb.iter().zip(yb).filter(|(_, y)| **y != 0.0).map(|(x, _)| x.abs()).fold(f32::MAX, f32::min);
            let largest_dropped =
                xb.iter().zip(yb).filter(|(_, y)| **y == 0.0).map(|(x, _)| x.abs()).fold(0.0, f32::max);
            assert!(smallest_kept >= largest_dropped, "block {b}: {smallest_kept} < {largest_dropped}");
            assert!(xb.iter().zip(yb).all(|(x, y)| *y == 0.0 || x.signum() == y.signum()), "block {b}: signs");
        }
        assert_eq!(encode_sparse(&x, density), bytes, "deterministic");
    }

    #[test]
    fn ties_go_to_the_lower_index_and_odd_inputs_encode() {
        let x = vec![1.0f32; 100];
        let y = decode_sparse(&encode_sparse(&x, 0.05), 100, SPARSE_BLOCK).unwrap();
        assert!(y[..5].iter().all(|v| *v == 1.0) && y[5..].iter().all(|v| *v == 0.0), "{y:?}");
        let odd = [0.0, f32::NAN, -0.0, f32::INFINITY, 3.0, -2.0];
        let y = decode_sparse(&encode_sparse(&odd, 0.34), 6, SPARSE_BLOCK).unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "non-finite values are never kept as such: {y:?}");
        assert_eq!(decode_sparse(&encode_sparse(&[], 0.1), 0, 1).unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn error_feedback_sends_everything_eventually() {
        // The same pseudo-gradient every merge: what the codec drops is
        // carried, so what is missing from the sum sent is the residual,
        // which stays bounded while the sum wanted grows.
        let n = 5000;
        let delta = noise(n, 7);
        let mut ef = ErrorFeedback::new(n);
        let mut sent_sum = vec![0.0f64; n];
        let mut off_at = Vec::new();
        for round in 1..=400u32 {
            let bytes = ef.encode(0, &delta, 1.0 / 32.0).unwrap();
            let sent = decode_sparse(&bytes, n, SPARSE_BLOCK).unwrap();
            sent_sum.iter_mut().zip(&sent).for_each(|(s, v)| *s += f64::from(*v));
            if round % 100 == 0 {
                let r = f64::from(round);
                let sq = |e: f64| e * e;
                let want = delta.iter().map(|d| sq(f64::from(*d) * r)).sum::<f64>().sqrt();
                let off = sent_sum.iter().zip(&delta).map(|(s, d)| sq(s - f64::from(*d) * r)).sum::<f64>().sqrt();
                assert!((ef.norm() - off).abs() / want < 1e-3, "round {round}: the residual is what is missing");
                off_at.push(off / want);
            }
        }
        assert!(off_at[3] < off_at[0] / 3.0 && off_at[3] < 0.05, "missing share by round: {off_at:?}");
        assert!(ef.encode(n - 1, &delta[..2], 0.5).is_err(), "a range past the stage");
        // Kept in the sender's weights instead: the residual is this
        // contribution's remainder alone, not added to.
        let mut kept = ErrorFeedback::new(n);
        for _ in 0..3 {
            let sent = decode_sparse(&kept.encode_kept(0, &delta, 1.0 / 32.0).unwrap(), n, SPARSE_BLOCK).unwrap();
            let remainder: Vec<f32> = delta.iter().zip(&sent).map(|(d, s)| d - s).collect();
            assert_eq!(kept.residual(), remainder.as_slice());
        }
    }

    #[test]
    fn hostile_payloads_are_refused_without_panics() {
        let x = noise(2 * SPARSE_BLOCK + 77, 3);
        let bytes = encode_sparse(&x, 0.01);
        let n = x.len();
        let max = kept_per_block(SPARSE_BLOCK, 0.01);
        assert!(decode_sparse(&bytes, n, max).is_ok());
        for cut in [0, 1, 5, 6, 100, bytes.len() - 1] {
            assert!(decode_sparse(&bytes[..cut], n, max).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_sparse(&long, n, max).is_err(), "trailing bytes");
        assert!(decode_sparse(&bytes, n, max - 1).is_err(), "denser than agreed");
        let edit = |at: usize, v: &[u8]| {
            let mut b = bytes.clone();
            b[at..at + v.len()].copy_from_slice(v);
            decode_sparse(&b, n, max)
        };
        assert!(edit(0, &u16::MAX.to_le_bytes()).is_err(), "a count past the block");
        assert!(edit(2, &0x7f80u16.to_le_bytes()).is_err(), "an infinite magnitude");
        assert!(edit(4, &0xbf80u16.to_le_bytes()).is_err(), "a negative magnitude");
        assert!(edit(6, &edit_first_index(&bytes)).is_err(), "indices out of order");
        let k = kept_per_block(SPARSE_BLOCK, 0.01);
        let last_code = 6 + 2 * k + k.div_ceil(4) - 1;
        if !k.is_multiple_of(4) {
            let mut b = bytes.clone();
            b[last_code] |= 0xc0;
            assert!(decode_sparse(&b, n, max).is_err(), "bits past the last code");
        }
        // Random bytes: refused or decoded, never a panic.
        for seed in 0..200u64 {
            let junk: Vec<u8> = noise(64, seed).iter().map(|v| v.to_bits() as u8).collect();
            let _ = decode_sparse(&junk, 100, 10);
        }
    }

    /// The first index set past the second (so they are out of order).
    fn edit_first_index(bytes: &[u8]) -> Vec<u8> {
        let second = u16::from_le_bytes([bytes[8], bytes[9]]);
        second.saturating_add(1).to_le_bytes().to_vec()
    }
}
