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

pub use iota_core::codec::{SPARSE_BLOCK, sparse_kept as kept_per_block};
const BLOCK_HEADER: usize = 2 + 2 + 2;

/// Where the `n`-th code of a byte sits (four to a byte, low bits first).
fn code_shift(n: usize) -> u32 {
    [0, 2, 4, 6].get(n % 4).copied().unwrap_or(0)
}

/// Bytes a block of `k` kept values takes.
fn block_bytes(k: usize) -> usize {
    BLOCK_HEADER.saturating_add(k.saturating_mul(2)).saturating_add(k.div_ceil(4))
}

/// Encodes `x` keeping `density` of each block's values.
pub fn encode_sparse(x: &[f32], density: f32) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks(SPARSE_BLOCK) {
        encode_block(block, kept_per_block(block.len(), density), &mut out, None);
    }
    out
}

/// The indices of the `k` largest |x| (a non-finite value counts as 0),
/// ties to the lower index, in increasing order: one total order, so one
/// answer whatever the selection algorithm does. Each value's key holds
/// its magnitude's bits above (a non-negative float's bits order as its
/// value does) and its index's complement below (a lower index ranks
/// higher), so the selection compares plain integers.
fn top_k(x: &[f32], k: usize) -> Vec<u32> {
    let mut keys: Vec<u64> = x
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let m = if v.is_finite() { v.abs() } else { 0.0 };
            u64::from(m.to_bits()).rotate_left(32) | u64::from(!(i as u32))
        })
        .collect();
    if k < keys.len() {
        keys.select_nth_unstable_by(k, |a, b| b.cmp(a));
        keys.truncate(k);
    }
    let mut order: Vec<u32> = keys.iter().map(|key| !(*key as u32)).collect();
    order.sort_unstable();
    order
}

/// Writes one block's row; where `sent` is given, also each kept index
/// with the value the row decodes to there (so a sender can take what it
/// sent off its backlog without decoding the row).
fn encode_block(x: &[f32], k: usize, out: &mut Vec<u8>, mut sent: Option<&mut Vec<(u32, f32)>>) {
    let mag = |i: u32| x.get(i as usize).map_or(0.0, |v| if v.is_finite() { v.abs() } else { 0.0 });
    let order = top_k(x, k);
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
        if let Some(sent) = sent.as_deref_mut() {
            // What `decode_block` gives for this code.
            let q = if high { hi_v } else { lo_v };
            sent.push((i, if v.is_sign_negative() { -q } else { q }));
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

/// Bytes of one block of `k` kept values in a frame (a row of
/// `WireCodec::SparseTopK`, whose row width is `k`).
pub fn frame_row_bytes(k: usize) -> usize {
    block_bytes(k)
}

/// The frame shape of a sparse slice of `len` values: `[blocks, k]`,
/// every block `SPARSE_BLOCK` values (the last zero-padded) with exactly
/// `k` kept. A fixed size for a length and a density, so a frame's
/// header says how long its payload is, as it does for the dense codecs.
pub fn frame_shape(len: u64, density: f32) -> (usize, usize) {
    (usize::try_from(len.div_ceil(SPARSE_BLOCK as u64)).unwrap_or(usize::MAX), kept_per_block(SPARSE_BLOCK, density))
}

/// Encodes `x` as the rows of a `frame_shape` frame: each block padded
/// with zeros to `SPARSE_BLOCK` and exactly `k` values kept (blocks encoded
/// in parallel; each on its own, so the same bytes on any thread count).
pub fn encode_frame(x: &[f32], k: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let rb = block_bytes(k);
    let blocks = x.len().div_ceil(SPARSE_BLOCK);
    let mut out = vec![0u8; blocks.saturating_mul(rb)];
    out.par_chunks_mut(rb.max(1)).zip(x.par_chunks(SPARSE_BLOCK)).for_each(|(o, xs)| {
        let mut row = Vec::with_capacity(rb);
        if xs.len() == SPARSE_BLOCK {
            encode_block(xs, k.min(SPARSE_BLOCK), &mut row, None);
        } else {
            let mut padded = vec![0.0f32; SPARSE_BLOCK];
            if let Some(head) = padded.get_mut(..xs.len()) {
                head.copy_from_slice(xs);
            }
            encode_block(&padded, k.min(SPARSE_BLOCK), &mut row, None);
        }
        o.copy_from_slice(&row);
    });
    out
}

/// Decodes a frame written by [`encode_frame`] into `out` (its `len`
/// values; what a block names in the last block's padding is dropped).
/// Every row must keep exactly `k` values: a hostile payload is refused,
/// never a panic.
pub fn decode_frame_into(bytes: &[u8], out: &mut [f32], k: usize) -> Result<()> {
    use rayon::prelude::*;
    let rb = block_bytes(k);
    let blocks = out.len().div_ceil(SPARSE_BLOCK);
    ensure!(
        Some(bytes.len()) == blocks.checked_mul(rb),
        "a sparse slice of {} bytes, {blocks} blocks keeping {k} need {}",
        bytes.len(),
        blocks.saturating_mul(rb)
    );
    out.par_chunks_mut(SPARSE_BLOCK).zip(bytes.par_chunks(rb.max(1))).enumerate().try_for_each(|(b, (o, row))| {
        let k_row = row.first_chunk::<2>().map(|c| usize::from(u16::from_le_bytes(*c)));
        ensure!(k_row == Some(k), "sparse block {b} keeps {k_row:?} values, the run's density {k}");
        if o.len() == SPARSE_BLOCK {
            o.fill(0.0);
            decode_block(row, o, k).with_context(|| format!("sparse block {b}"))?;
        } else {
            let mut padded = vec![0.0f32; SPARSE_BLOCK];
            decode_block(row, &mut padded, k).with_context(|| format!("sparse block {b}"))?;
            let n = o.len();
            o.copy_from_slice(padded.get(..n).context("length")?);
        }
        Ok(())
    })
}

/// Checks a sparse slice of `len` values before a reduce reads ranges of
/// it ([`decode_range`]): its size for `k` kept per block, and every row as
/// [`decode_frame_into`] checks it (rows in parallel, nothing written but
/// a scratch row's kept values).
pub fn check_frame(bytes: &[u8], len: u64, k: usize) -> Result<()> {
    use rayon::prelude::*;
    let rb = block_bytes(k);
    let rows = usize::try_from(len.div_ceil(SPARSE_BLOCK as u64))?;
    ensure!(Some(bytes.len()) == rows.checked_mul(rb), "a sparse slice of {} bytes, {rows} rows of {rb}", bytes.len());
    bytes.par_chunks(rb.max(1)).enumerate().try_for_each_init(
        || vec![0.0f32; SPARSE_BLOCK],
        |scratch, (b, row)| {
            let k_row = row.first_chunk::<2>().map(|c| usize::from(u16::from_le_bytes(*c)));
            ensure!(k_row == Some(k), "sparse block {b} keeps {k_row:?} values, the run's density {k}");
            decode_block(row, scratch, k).map(|_| ()).with_context(|| format!("sparse block {b}"))
        },
    )
}

/// Values `at..at + out.len()` of a sparse slice that [`check_frame`]
/// passed (the range inside one block): the block's kept values in the
/// range, found by bisecting its indices, zeros elsewhere. A slice that
/// was not checked gives an error or wrong values, never a panic.
pub fn decode_range(bytes: &[u8], at: usize, out: &mut [f32]) -> Result<()> {
    let u16_at = |b: &[u8], i: usize| -> Option<usize> {
        let s = b.get(i..i.checked_add(2)?)?;
        Some(usize::from(u16::from_le_bytes([*s.first()?, *s.get(1)?])))
    };
    let k = u16_at(bytes, 0).context("an empty sparse slice")?;
    let rb = block_bytes(k);
    let (block, off) = (at / SPARSE_BLOCK, at % SPARSE_BLOCK);
    let end = off.checked_add(out.len()).context("range")?;
    ensure!(end <= SPARSE_BLOCK, "a range across sparse blocks");
    let start = block.checked_mul(rb).context("offset")?;
    let row = bytes.get(start..start.checked_add(rb).context("offset")?).context("slice shorter than its values")?;
    let (lo, hi) =
        (bf16_to_f32(u16_at(row, 2).context("row")? as u16), bf16_to_f32(u16_at(row, 4).context("row")? as u16));
    let codes_at = BLOCK_HEADER.checked_add(k.checked_mul(2).context("length")?).context("length")?;
    let (indices, _) = row.get(BLOCK_HEADER..codes_at).context("row")?.as_chunks::<2>();
    out.fill(0.0);
    // The first kept index at or past `off` (the indices rise).
    let first = indices.partition_point(|i| usize::from(u16::from_le_bytes(*i)) < off);
    for (n, i) in indices.iter().enumerate().skip(first) {
        let i = usize::from(u16::from_le_bytes(*i));
        if i >= end {
            break;
        }
        let byte = row.get(codes_at.checked_add(n / 4).context("length")?).context("row")?;
        let code = byte.checked_shr(code_shift(n)).unwrap_or(0);
        let m = if code & 2 != 0 { hi } else { lo };
        *out.get_mut(i.checked_sub(off).context("index")?).context("index")? = if code & 1 != 0 { -m } else { m };
    }
    Ok(())
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

    /// `delta` plus what earlier contributions left at `offset..`, sent
    /// whole (a last merge that flushes the backlog): nothing is left.
    pub fn flush(&mut self, offset: usize, delta: &[f32]) -> Result<Vec<f32>> {
        let end = offset.checked_add(delta.len()).context("range")?;
        let residual = self.residual.get_mut(offset..end).context("a range past the stage")?;
        let all = delta.iter().zip(residual.iter()).map(|(d, r)| d + r).collect();
        residual.fill(0.0);
        Ok(all)
    }

    /// [`ErrorFeedback::encode`] as a frame's rows ([`encode_frame`],
    /// exactly `k` kept per block), the backlog over the range first
    /// multiplied by `decay`: each block in one pass on its own thread (its
    /// backlog becomes what it wants sent, then loses what its row sends),
    /// with the bits of fading, adding, encoding and decoding in turn.
    pub fn encode_frame(&mut self, offset: usize, delta: &[f32], k: usize, decay: f32) -> Result<Vec<u8>> {
        use rayon::prelude::*;
        let end = offset.checked_add(delta.len()).context("range")?;
        let residual = self.residual.get_mut(offset..end).context("a range past the stage")?;
        let rb = block_bytes(k);
        let k = k.min(SPARSE_BLOCK);
        let mut out = vec![0u8; delta.len().div_ceil(SPARSE_BLOCK).saturating_mul(rb)];
        out.par_chunks_mut(rb.max(1))
            .zip(residual.par_chunks_mut(SPARSE_BLOCK))
            .zip(delta.par_chunks(SPARSE_BLOCK))
            .for_each(|((o, r), d)| {
                r.iter_mut().zip(d).for_each(|(r, d)| *r = d + *r * decay);
                let mut row = Vec::with_capacity(rb);
                let mut sent = Vec::with_capacity(k);
                if r.len() == SPARSE_BLOCK {
                    encode_block(r, k, &mut row, Some(&mut sent));
                } else {
                    let mut padded = vec![0.0f32; SPARSE_BLOCK];
                    if let Some(head) = padded.get_mut(..r.len()) {
                        head.copy_from_slice(r);
                    }
                    encode_block(&padded, k, &mut row, Some(&mut sent));
                }
                o.copy_from_slice(&row);
                // Kept in the last block's padding: sent nowhere real.
                for (i, v) in sent {
                    if let Some(x) = r.get_mut(i as usize) {
                        *x -= v;
                    }
                }
            });
        Ok(out)
    }

    /// Scales what is held back over `range` by `factor` (a backlog that
    /// fades: SparseLoCo's decayed error feedback).
    pub fn decay(&mut self, range: std::ops::Range<usize>, factor: f32) {
        if factor != 1.0
            && let Some(r) = self.residual.get_mut(range)
        {
            r.iter_mut().for_each(|v| *v *= factor);
        }
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

    /// The frame form: a fixed size for a length and a density (what the
    /// frame header's shape promises), the last block's padding dropped,
    /// the same values as the unpadded codec where blocks are whole, and a
    /// row keeping more or fewer than the run's count refused.
    #[test]
    fn frames_have_the_size_their_shape_says_and_refuse_another_density() {
        use iota_core::WireCodec;
        let n = 2 * SPARSE_BLOCK + 300;
        let x = noise(n, 9);
        let density = 1.0 / 32.0;
        let (rows, k) = frame_shape(n as u64, density);
        assert_eq!((rows, k), (3, SPARSE_BLOCK / 32));
        let bytes = encode_frame(&x, k);
        assert_eq!(Some(bytes.len()), WireCodec::SparseTopK.payload_bytes(rows, k));
        assert_eq!(frame_row_bytes(k), WireCodec::SparseTopK.row_bytes(k));
        // A whole block at 1/32: 28x fewer bytes than bf16 (a partial last
        // block is padded, so short slices gain less).
        let ratio = (2 * SPARSE_BLOCK) as f64 / frame_row_bytes(k) as f64;
        assert!(ratio > 28.0, "{ratio:.1}x");
        let mut y = vec![1.0f32; n];
        decode_frame_into(&bytes, &mut y, k).unwrap();
        // Whole blocks: what the unpadded codec keeps.
        let whole = 2 * SPARSE_BLOCK;
        let plain = decode_sparse(&encode_sparse(&x[..whole], density), whole, SPARSE_BLOCK).unwrap();
        assert_eq!(&y[..whole], plain.as_slice());
        // The last block keeps k of its 300 values and the padding's zeros.
        let kept_last = y[whole..].iter().filter(|v| **v != 0.0).count();
        assert_eq!(kept_last, k.min(300));
        assert_eq!(encode_frame(&x, k), bytes, "deterministic");
        // Another density's rows, a cut payload, a row claiming another count.
        assert!(decode_frame_into(&bytes, &mut y, k - 1).is_err());
        assert!(decode_frame_into(&bytes[..bytes.len() - 1], &mut y, k).is_err());
        let mut other = bytes.clone();
        other[0..2].copy_from_slice(&((k - 1) as u16).to_le_bytes());
        assert!(decode_frame_into(&other, &mut y, k).is_err());
        // Error feedback through frames: what is held back is what was not sent.
        let mut ef = ErrorFeedback::new(n + 10);
        let sent_bytes = ef.encode_frame(10, &x, k, 1.0).unwrap();
        let mut sent = vec![0.0f32; n];
        decode_frame_into(&sent_bytes, &mut sent, k).unwrap();
        let left: Vec<f32> = x.iter().zip(&sent).map(|(a, b)| a - b).collect();
        assert_eq!(&ef.residual()[10..], left.as_slice());
        assert!(ef.residual()[..10].iter().all(|r| *r == 0.0));
        // A fading backlog: scaled over the range, nowhere else.
        ef.decay(10..20, 0.5);
        assert_eq!(ef.residual()[10..20], left[..10].iter().map(|v| v * 0.5).collect::<Vec<_>>()[..]);
        assert_eq!(&ef.residual()[20..], &left[10..]);
        // Random bytes as a frame: refused or decoded, never a panic.
        for seed in 0..100u64 {
            let junk: Vec<u8> = noise(frame_row_bytes(4), seed).iter().map(|v| v.to_bits() as u8).collect();
            let _ = decode_frame_into(&junk, &mut y[..SPARSE_BLOCK], 4);
        }
    }

    /// The integer-key selection is the comparator's: the k largest
    /// magnitudes, ties to the lower index, non-finite values as zero.
    #[test]
    fn the_key_selection_is_the_comparators() {
        let reference = |x: &[f32], k: usize| {
            let mag = |i: u32| x.get(i as usize).map_or(0.0, |v| if v.is_finite() { v.abs() } else { 0.0 });
            let mut order: Vec<u32> = (0..x.len() as u32).collect();
            if k < order.len() {
                order.select_nth_unstable_by(k, |a, b| mag(*b).total_cmp(&mag(*a)).then(a.cmp(b)));
                order.truncate(k);
            }
            order.sort_unstable();
            order
        };
        for seed in 0..20u64 {
            let mut x = noise(SPARSE_BLOCK, seed);
            // Ties, signed zeros and non-finite values among them.
            for j in (0..x.len()).step_by(7) {
                x[j] = x[j / 2];
            }
            for (j, v) in [(3, -0.0), (9, f32::NAN), (11, f32::INFINITY), (13, f32::NEG_INFINITY), (17, 0.0)] {
                x[j] = v;
            }
            for k in [1, 37, 512, SPARSE_BLOCK - 1, SPARSE_BLOCK] {
                assert_eq!(top_k(&x, k), reference(&x, k), "seed {seed} k {k}");
            }
        }
        let flat = vec![0.5f32; 100];
        assert_eq!(top_k(&flat, 3), vec![0, 1, 2]);
    }

    /// The one-pass backlog update is fading, adding, `encode_frame`,
    /// decoding and subtracting done in turn, bit for bit, over several
    /// merges with a padded last block.
    #[test]
    fn the_fused_feedback_is_the_stepwise_one() {
        let n = 3 * SPARSE_BLOCK + 999;
        let k = kept_per_block(SPARSE_BLOCK, 1.0 / 32.0);
        let mut fused = ErrorFeedback::new(n + 5);
        let mut stepwise = vec![0.0f32; n];
        for round in 0..4u64 {
            let delta = noise(n, 40 + round);
            let got = fused.encode_frame(5, &delta, k, 0.95).unwrap();
            stepwise.iter_mut().for_each(|r| *r *= 0.95);
            let wanted: Vec<f32> = delta.iter().zip(&stepwise).map(|(d, r)| d + r).collect();
            let want = encode_frame(&wanted, k);
            let mut sent = vec![0.0f32; n];
            decode_frame_into(&want, &mut sent, k).unwrap();
            stepwise = wanted.iter().zip(&sent).map(|(w, s)| w - s).collect();
            assert_eq!(got, want, "round {round}: the bytes");
            let same_bits = fused.residual()[5..].iter().zip(&stepwise).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same_bits, "round {round}: the backlog");
        }
    }

    /// A range of a checked slice reads as that range of the whole
    /// decode; a slice of another density, or junk, fails the check, and
    /// junk read unchecked gives no panic.
    #[test]
    fn ranges_read_as_the_whole_decode_and_checks_refuse_junk() {
        let n = 2 * SPARSE_BLOCK + 1500;
        let k = kept_per_block(SPARSE_BLOCK, 1.0 / 32.0);
        let bytes = encode_frame(&noise(n, 77), k);
        check_frame(&bytes, n as u64, k).unwrap();
        assert!(check_frame(&bytes, n as u64, k + 1).is_err());
        assert!(check_frame(&bytes, n as u64 + SPARSE_BLOCK as u64, k).is_err());
        let mut whole = vec![0.0f32; n];
        decode_frame_into(&bytes, &mut whole, k).unwrap();
        for (at, len) in
            [(0, 1024), (1024, 1024), (SPARSE_BLOCK - 7, 7), (SPARSE_BLOCK, SPARSE_BLOCK), (2 * SPARSE_BLOCK, 1500)]
        {
            let mut part = vec![9.0f32; len];
            decode_range(&bytes, at, &mut part).unwrap();
            assert_eq!(part.as_slice(), &whole[at..at + len], "{at}+{len}");
        }
        let mut across = vec![0.0f32; 10];
        assert!(decode_range(&bytes, SPARSE_BLOCK - 5, &mut across).is_err());
        let mut bad = bytes.clone();
        bad[8..10].copy_from_slice(&0u16.to_le_bytes());
        assert!(check_frame(&bad, n as u64, k).is_err(), "indices out of order");
        for seed in 0..50u64 {
            let junk: Vec<u8> = noise(3 * frame_row_bytes(k), seed).iter().map(|v| v.to_bits() as u8).collect();
            let _ = decode_range(&junk, (seed as usize * 997) % n, &mut across);
        }
    }

    /// The first index set past the second (so they are out of order).
    fn edit_first_index(bytes: &[u8]) -> Vec<u8> {
        let second = u16::from_le_bytes([bytes[8], bytes[9]]);
        second.saturating_add(1).to_le_bytes().to_vec()
    }
}
