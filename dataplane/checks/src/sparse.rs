//! A sparse merge codec for pseudo-gradients (issue 57, "compressed
//! contributions"): per block of `SPARSE_BLOCK` values, the `k` largest
//! in magnitude, their indices Elias-Fano coded ([`indices`]) and each
//! with two bits (its sign, and which of two magnitudes it takes), with the
//! block's two magnitudes as bf16. The
//! sender keeps what the codec dropped and adds it to its next
//! contribution (error feedback, [`ErrorFeedback`]), so nothing it trained
//! is lost, only delayed.
//!
//! At density 1/16 a kept value costs about 6 + 2 bits, a value on
//! average half a bit against bf16's 16: 31.8x fewer bytes (1/18: 35x).
//! Encoding is deterministic (ties in
//! magnitude go to the lower index) and decoding is exact arithmetic on
//! the wire's values, so every owner, referee and auditor decodes the same
//! bits.
//!
//! Wire form of one block: `k` (u16), the low and high magnitudes (bf16
//! each), the `k` indices' two sections (strictly increasing, each below
//! the block's length; `iota_core::codec::sparse_index_bytes`), then `k`
//! 2-bit codes packed four to a byte, low bits first (bit 0: negative;
//! bit 1: the high magnitude). Blocks follow each other;
//! the last may be shorter than `SPARSE_BLOCK`. Everything read is hostile:
//! counts, order, ranges and the exact length are checked, and nothing
//! panics.

// Store and network bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use anyhow::{Context, Result, bail, ensure};
use iota_core::codec::{bf16_to_f32, f32_to_bf16, sparse_index_bytes, sparse_row_bytes};

pub mod indices;

pub use iota_core::codec::{SPARSE_BLOCK, sparse_kept as kept_per_block};
const BLOCK_HEADER: usize = 2 + 2 + 2;

/// Where the `n`-th code of a byte sits (four to a byte, low bits first).
fn code_shift(n: usize) -> u32 {
    [0, 2, 4, 6].get(n % 4).copied().unwrap_or(0)
}

/// Where a row of `k` kept values has its codes (past the header and the
/// index sections).
fn codes_at(k: usize) -> usize {
    let (low, high) = sparse_index_bytes(k);
    BLOCK_HEADER.saturating_add(low).saturating_add(high)
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
    indices::write(&order, out);
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
    let need = sparse_row_bytes(k);
    ensure!(b.len() >= need, "truncated");
    let (lo, hi) = (bf16_to_f32(u16_at(2)?), bf16_to_f32(u16_at(4)?));
    ensure!(lo.is_finite() && hi.is_finite() && lo >= 0.0 && hi >= 0.0, "magnitudes {lo}, {hi}");
    let codes_at = codes_at(k);
    let reader = b.get(BLOCK_HEADER..codes_at).and_then(|s| indices::Reader::new(s, k)).context("truncated")?;
    ensure!(!reader.low_padding_set(k), "bits set past the last index's low part");
    let mut last: Option<usize> = None;
    let mut count = 0usize;
    for (n, i) in reader {
        let i = i.context("an index past the block")?;
        ensure!(n < k, "more than {k} indices");
        ensure!(last.is_none_or(|l| i > l), "indices not increasing at {n}");
        let byte = b.get(codes_at.checked_add(n / 4).context("length")?).context("truncated")?;
        let code = byte.checked_shr(code_shift(n)).unwrap_or(0);
        let m = if code & 2 != 0 { hi } else { lo };
        *out.get_mut(i).context("an index past the block")? = if code & 1 != 0 { -m } else { m };
        last = Some(i);
        count = n.saturating_add(1);
    }
    ensure!(count == k, "{count} indices of {k}");
    if !k.is_multiple_of(4) {
        let tail = b.get(codes_at.checked_add(k / 4).context("length")?).context("truncated")?;
        ensure!(tail.checked_shr(code_shift(k)).unwrap_or(0) == 0, "bits set past the last code");
    }
    Ok(need)
}

/// Bytes of one block of `k` kept values in a frame (a row of
/// `WireCodec::SparseTopK`, whose row width is `k`).
pub fn frame_row_bytes(k: usize) -> usize {
    sparse_row_bytes(k)
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
    let rb = sparse_row_bytes(k);
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

/// One sender's sparse contribution over a range, and its backlog after
/// it: each block's backlog (`residual`) is faded by `decay` and added to
/// `delta` (what it wants sent), written as a row keeping `k`
/// ([`encode_frame`]'s rows), and left holding what the row does not send.
/// The sender ([`ErrorFeedback::encode_frame`]) and an auditor checking
/// its backlog (`sparse_contribution`) both run this, so they agree bit
/// for bit. Blocks start at `residual`'s start: ranges that begin on
/// `SPARSE_BLOCK` multiples of a stage see the same blocks.
pub fn step_frame(residual: &mut [f32], delta: &[f32], k: usize, decay: f32) -> Vec<u8> {
    use rayon::prelude::*;
    let rb = sparse_row_bytes(k);
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
    out
}

/// Decodes a frame written by [`encode_frame`] into `out` (its `len`
/// values; what a block names in the last block's padding is dropped).
/// Every row must keep exactly `k` values: a hostile payload is refused,
/// never a panic.
pub fn decode_frame_into(bytes: &[u8], out: &mut [f32], k: usize) -> Result<()> {
    use rayon::prelude::*;
    let rb = sparse_row_bytes(k);
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
    let rb = sparse_row_bytes(k);
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
/// range, found by seeking its index bitvector, zeros elsewhere. A slice that
/// was not checked gives an error or wrong values, never a panic.
pub fn decode_range(bytes: &[u8], at: usize, out: &mut [f32]) -> Result<()> {
    let u16_at = |b: &[u8], i: usize| -> Option<usize> {
        let s = b.get(i..i.checked_add(2)?)?;
        Some(usize::from(u16::from_le_bytes([*s.first()?, *s.get(1)?])))
    };
    let k = u16_at(bytes, 0).context("an empty sparse slice")?;
    let rb = sparse_row_bytes(k);
    let (block, off) = (at / SPARSE_BLOCK, at % SPARSE_BLOCK);
    let end = off.checked_add(out.len()).context("range")?;
    ensure!(end <= SPARSE_BLOCK, "a range across sparse blocks");
    let start = block.checked_mul(rb).context("offset")?;
    let row = bytes.get(start..start.checked_add(rb).context("offset")?).context("slice shorter than its values")?;
    let (lo, hi) =
        (bf16_to_f32(u16_at(row, 2).context("row")? as u16), bf16_to_f32(u16_at(row, 4).context("row")? as u16));
    let codes_at = codes_at(k);
    let reader = row.get(BLOCK_HEADER..codes_at).and_then(|s| indices::Reader::new(s, k)).context("row")?;
    out.fill(0.0);
    // Past the indices whose high part lies below the range's; the rest
    // rise, so the first at or past `end` ends the read.
    for (n, i) in reader.seek(off) {
        let i = i.context("index")?;
        if i >= end || n >= k {
            break;
        }
        let Some(slot) = i.checked_sub(off) else { continue };
        let byte = row.get(codes_at.checked_add(n / 4).context("length")?).context("row")?;
        let code = byte.checked_shr(code_shift(n)).unwrap_or(0);
        let m = if code & 2 != 0 { hi } else { lo };
        *out.get_mut(slot).context("index")? = if code & 1 != 0 { -m } else { m };
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

    /// A backlog holding `residual` (what an earlier one held).
    pub fn from_residual(residual: Vec<f32>) -> Self {
        ErrorFeedback { residual }
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
        let end = offset.checked_add(delta.len()).context("range")?;
        let residual = self.residual.get_mut(offset..end).context("a range past the stage")?;
        Ok(step_frame(residual, delta, k, decay))
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
mod tests;
