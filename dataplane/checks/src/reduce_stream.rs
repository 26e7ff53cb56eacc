//! The streamed reduce of a partition (`slices::reduce_partition` for the
//! rules that are a weighted mean): one pass reads the encoded
//! contributions for the norms `flaws` judges by; a second, chunk by chunk
//! and within a chunk by sub-blocks that stay in the first-level cache,
//! decodes each contribution's values, takes the weighted mean, applies
//! the outer step and hands the update to a sink (an f32 buffer, or the
//! merge codec's encoding with each chunk hashed while in cache). The sums
//! are the reference's, in its order, so the bits are too.

use crate::reduce_bf16::padding_finite;
use anyhow::{Result, bail};
use blake3::hazmat::ChainingValue;
use iota_core::WireCodec;
use iota_core::merge::flaws::{SqSum, chunk_sq_sum, flaws_of_norms, norm_of_partials};
use iota_core::merge::reduce::{REDUCE_CHUNK, clip_cannot_bite};
use iota_core::merge::{BLOCK, ReduceRule};
use iota_model::codec;
use iota_wire::MergeSpec;
use rayon::prelude::*;

/// Values per sub-block of the second pass: whole blocks, few enough that
/// the decoded values (4 KiB), their f64 sums (8 KiB) and the update (4
/// KiB) stay in the first-level cache while every contribution is added.
const SUB: usize = 4 * BLOCK as usize;

/// The contributions an owner flags: index (plan order), why.
pub type Flagged = Vec<(usize, iota_core::merge::Flaw)>;

/// Where the second pass puts the update: `out`, cut in one piece per
/// `REDUCE_CHUNK` of the update, `per_row` elements of it for each `BLOCK`
/// values (the last piece maybe shorter); `write` puts a run of whole
/// blocks of the update (the last maybe partial) into its part of a piece;
/// `seal` is called on each finished piece (its index and contents) and
/// may return its chaining value (`tree_hash`).
pub struct Sink<'a, T, W, S> {
    pub out: &'a mut [T],
    pub per_row: usize,
    pub write: W,
    pub seal: S,
    /// The sink's own loop for a whole sub-block where the contributions
    /// are bf16, there is no outer momentum and the norms are measured
    /// (`reduce_bf16::fused_bf16`, for the bf16 encoding): None, the
    /// general loop.
    pub fused: Option<Fused<T>>,
}

/// A sub-block's fused loop: the contributions' bytes for its values,
/// their normalised weights, their running sums of squares, the outer
/// learning rate, scratch, and the sub-block's piece of the output; false
/// where an update value is not finite.
pub type Fused<T> = fn(&[&[u8]], &[f64], &mut [SqSum], f32, &mut [f64], &mut [T]) -> bool;

/// What the second pass gave: the flags, and for each piece what `seal`
/// returned (an error where a chunk could not be decoded or written).
pub type Streamed = (Flagged, Result<Vec<Option<ChainingValue>>>);

/// Checks that `bytes` is a slice of `len` values in codec `c` (whole
/// blocks, the last zero-padded).
pub fn check_slice_len(c: WireCodec, len: u64, bytes: &[u8]) -> Result<()> {
    let want = c.payload_bytes(len.div_ceil(BLOCK) as usize, BLOCK as usize);
    if want != Some(bytes.len()) {
        bail!("slice of {len} values: {} payload bytes, expected {want:?}", bytes.len());
    }
    Ok(())
}

/// The reduce (see the module): None where it does not apply (another
/// rule, nothing left to reduce, weights that do not pair with the
/// contributions, a sink of the wrong size): the reference runs.
///
/// With no outer momentum (the default) the momentum is not touched, so
/// the second pass may run first, on every contribution, measuring the
/// norms as it reads them: when `flaws` then flags none of them (an honest
/// merge) that was the reduce, and each contribution was read once; when
/// it flags one, the second pass runs again without it (a hostile merge
/// costs one more pass, never a different result).
// A peer's payloads: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub fn streamed<T, W, S>(
    spec: &MergeSpec,
    epoch: u64,
    len: u64,
    payloads: &[Option<&[u8]>],
    weights: &[f64],
    momentum: &mut [f32],
    sink: Sink<'_, T, W, S>,
) -> Option<Streamed>
where
    T: Send,
    W: Fn(&[f32], &mut [T]) -> Result<()> + Sync,
    S: Fn(usize, &[T]) -> Option<ChainingValue> + Sync,
{
    // The contributions' codec (what is decoded); the sink encodes the
    // update in the merge codec itself.
    let c = spec.contribution_codec();
    let n = usize::try_from(len).ok()?;
    let chunks = n.div_ceil(REDUCE_CHUNK);
    let per_chunk = REDUCE_CHUNK.checked_div(BLOCK as usize)?.checked_mul(sink.per_row)?;
    let fits = sink.out.len().div_ceil(per_chunk.max(1)) == chunks;
    if momentum.len() != n || n == 0 || weights.len() != payloads.len() || per_chunk == 0 || !fits {
        return None;
    }
    let sized: Vec<Option<&[u8]>> = payloads
        .iter()
        .map(|p| {
            p.filter(|b| match c {
                // Every row checked once here: the passes then read ranges.
                WireCodec::SparseTopK => crate::sparse::check_frame(b, len, spec.contribution_shape(len).1).is_ok(),
                _ => check_slice_len(c, len, b).is_ok(),
            })
        })
        .collect();
    let mean = |count: usize| match spec.rule {
        ReduceRule::Mean => true,
        ReduceRule::CenteredClip { tau_factor, .. } => clip_cannot_bite(count, tau_factor),
        ReduceRule::TrimmedMean { .. } => false,
    };
    let outer = spec.outer_at(epoch);
    let step = (outer.lr, outer.momentum);
    let mut sink = sink;
    // The fused loop reads only the values, not a last block's padding:
    // where a padding value would not decode, the general loop runs.
    if c != WireCodec::Bf16 || !sized.iter().flatten().all(|b| padding_finite(b, n)) {
        sink.fused = None;
    }
    let present = sized.iter().filter(|p| p.is_some()).count();
    let flagged = if outer.momentum == 0.0 && present > 0 && mean(present) {
        let used = used_of(&sized, weights, &[]);
        let pieces = second_pass(c, &used, step, momentum, &mut sink, true);
        let flagged = flaws_of_norms(&norms_of(&sized, &used, pieces.as_ref().ok()));
        if !flagged.iter().any(|(i, _)| sized.get(*i).is_some_and(Option::is_some)) {
            return Some((flagged, pieces.map(|p| p.into_iter().map(|(cv, _)| cv).collect())));
        }
        flagged
    } else {
        flags(c, n, &sized)
    };
    let used = used_of(&sized, weights, &flagged);
    if !mean(used.len()) || used.is_empty() {
        return None;
    }
    let pieces = second_pass(c, &used, step, momentum, &mut sink, false);
    Some((flagged, pieces.map(|p| p.into_iter().map(|(cv, _)| cv).collect())))
}

/// A contribution the second pass reads: its index (plan order), payload
/// and normalised weight.
type Used<'a> = (usize, &'a [u8], f64);

/// The contributions present and not flagged, with their weights as
/// `reduce_slice` normalises them.
fn used_of<'a>(
    sized: &[Option<&'a [u8]>],
    weights: &[f64],
    flagged: &[(usize, iota_core::merge::Flaw)],
) -> Vec<Used<'a>> {
    let kept: Vec<(usize, &[u8], f64)> = sized
        .iter()
        .zip(weights)
        .enumerate()
        .filter(|(i, _)| !flagged.iter().any(|(j, _)| j == i))
        .filter_map(|(i, (p, w))| Some((i, (*p)?, *w)))
        .collect();
    let total: f64 = kept.iter().map(|u| u.2).sum();
    let count = kept.len() as f64;
    kept.into_iter().map(|(i, p, w)| (i, p, if total > 0.0 { w / total } else { 1.0 / count })).collect()
}

/// One chunk's norm partial for each contribution the pass read (Err: it
/// did not decode), in `used`'s order.
type Partials = Vec<Result<Option<f64>, ()>>;

/// The norms `flaws_of_norms` judges by, from the partials the second
/// pass measured (None: the pass failed; a contribution absent or of the
/// wrong size is undecodable, as `flags` has it).
// A peer's payloads: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
fn norms_of(
    sized: &[Option<&[u8]>],
    used: &[Used<'_>],
    pieces: Option<&Vec<(Option<ChainingValue>, Partials)>>,
) -> Vec<Option<Option<f64>>> {
    (0..sized.len())
        .map(|i| {
            let k = used.iter().position(|u| u.0 == i)?;
            let of_i: Result<Vec<Option<f64>>, ()> =
                pieces?.iter().map(|(_, p)| p.get(k).copied().unwrap_or(Err(()))).collect();
            of_i.ok().map(norm_of_partials)
        })
        .collect()
}

/// The second pass over every chunk (see `reduce_chunk`); with `measure`,
/// each contribution's norm partials too.
fn second_pass<T, W, S>(
    c: WireCodec,
    used: &[Used<'_>],
    step: (f32, f32),
    momentum: &mut [f32],
    sink: &mut Sink<'_, T, W, S>,
    measure: bool,
) -> Result<Vec<(Option<ChainingValue>, Partials)>>
where
    T: Send,
    W: Fn(&[f32], &mut [T]) -> Result<()> + Sync,
    S: Fn(usize, &[T]) -> Option<ChainingValue> + Sync,
{
    let per_chunk = REDUCE_CHUNK / BLOCK as usize * sink.per_row;
    let (per_row, write, seal) = (sink.per_row, &sink.write, &sink.seal);
    // The fused loop only where the norms are measured (so no momentum).
    let fused = sink.fused.filter(|_| measure && step.1 == 0.0);
    sink.out
        .par_chunks_mut(per_chunk)
        .zip(momentum.par_chunks_mut(REDUCE_CHUNK))
        .enumerate()
        .map_init(
            || (vec![0.0f32; SUB], vec![0.0f64; SUB], vec![0.0f32; SUB]),
            |bufs, (ci, (o, m))| {
                let at = ci.saturating_mul(REDUCE_CHUNK);
                let partials = match fused {
                    Some(f) => fused_chunk(used, step.0, (at, m.len()), &mut bufs.1, (o, per_row), f)?,
                    None => reduce_chunk(c, used, step, (at, m), bufs, (o, per_row, write), measure)?,
                };
                Ok((seal(ci, o), partials))
            },
        )
        .collect()
}

/// Pass 1: each contribution's norm from per-chunk sums of squares (in
/// chunk order), and the contributions `flaws` flags by them (a missing,
/// mis-sized or undecodable one, or one holding a non-finite value, is
/// flagged undecodable).
// A peer's payloads: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
fn flags(c: WireCodec, n: usize, sized: &[Option<&[u8]>]) -> Flagged {
    let chunks = n.div_ceil(REDUCE_CHUNK);
    let partials: Vec<Partials> = (0..chunks)
        .into_par_iter()
        .map_init(
            || vec![0.0f32; REDUCE_CHUNK],
            |buf, ci| {
                let at = ci.saturating_mul(REDUCE_CHUNK);
                let m = REDUCE_CHUNK.min(n.saturating_sub(at));
                let x = buf.get_mut(..m).unwrap_or_default();
                sized
                    .iter()
                    .map(|p| {
                        let bytes = p.ok_or(())?;
                        decode_range(c, bytes, at, x).map_err(|_| ())?;
                        Ok(chunk_sq_sum(x))
                    })
                    .collect()
            },
        )
        .collect();
    let norms: Vec<Option<Option<f64>>> = (0..sized.len())
        .map(|i| {
            let of_i: Result<Vec<Option<f64>>, ()> =
                partials.iter().map(|p| p.get(i).copied().unwrap_or(Err(()))).collect();
            of_i.ok().map(norm_of_partials)
        })
        .collect();
    flaws_of_norms(&norms)
}

/// The scratch buffers of one thread: decoded values, their f64 sums, the
/// update (each `SUB` long).
type Bufs = (Vec<f32>, Vec<f64>, Vec<f32>);

/// Pass 2 on the chunk at `at` (its momentum `m`), sub-block by sub-block:
/// the weighted mean of the used contributions (normalised weights) from
/// -0.0 in their order, the outer step, the update written into the
/// sub-block's part of the piece `o`. With `measure`, each contribution's
/// sum of squares over the chunk as well (`chunk_sq_sum`'s bits), and a
/// contribution that does not decode is marked, not an error (the caller
/// flags it and runs the pass again without it).
// A peer's payloads: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
fn reduce_chunk<T, W: Fn(&[f32], &mut [T]) -> Result<()>>(
    c: WireCodec,
    used: &[Used<'_>],
    (lr, mu): (f32, f32),
    (at, m): (usize, &mut [f32]),
    (xb, accb, ub): &mut Bufs,
    (o, per_row, write): (&mut [T], usize, &W),
    measure: bool,
) -> Result<Partials> {
    let b = BLOCK as usize;
    let k = m.len();
    let mut sums: Vec<Result<SqSum, ()>> = vec![Ok(SqSum::default()); if measure { used.len() } else { 0 }];
    let mut done = 0usize;
    for m in m.chunks_mut(SUB) {
        let kk = m.len();
        let x = xb.get_mut(..kk).unwrap_or_default();
        let acc = accb.get_mut(..kk).unwrap_or_default();
        let u = ub.get_mut(..kk).unwrap_or_default();
        acc.fill(-0.0);
        for (j, (_, bytes, w)) in used.iter().enumerate() {
            let decoded = decode_range(c, bytes, at.saturating_add(done), x);
            match sums.get_mut(j) {
                Some(Ok(s)) if decoded.is_ok() => s.add(x),
                Some(s) => *s = Err(()),
                None => decoded?,
            }
            add_weighted(acc, x, *w);
        }
        outer_step(acc, m, u, lr, mu);
        let end = done.saturating_add(kk);
        let from = done.checked_div(b).unwrap_or(0).saturating_mul(per_row);
        let to = if end >= k { o.len() } else { end.checked_div(b).unwrap_or(0).saturating_mul(per_row) };
        let Some(piece) = o.get_mut(from..to) else { bail!("an update piece shorter than its values") };
        if let Err(e) = write(u, piece)
            && sums.iter().all(Result::is_ok)
        {
            return Err(e);
        }
        done = end;
    }
    Ok(sums.iter().map(|s| s.map(|s| s.finish())).collect())
}

/// `reduce_chunk` measuring the norms, with a sink's fused loop for each
/// sub-block (bf16 contributions, values `at .. at + k`, no momentum).
/// A contribution holding a non-finite value is marked (Err), as the
/// general loop's decode marks it.
// A peer's payloads: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
fn fused_chunk<T>(
    used: &[Used<'_>],
    lr: f32,
    (at, k): (usize, usize),
    accb: &mut [f64],
    (o, per_row): (&mut [T], usize),
    fused: Fused<T>,
) -> Result<Partials> {
    let b = BLOCK as usize;
    let ws: Vec<f64> = used.iter().map(|u| u.2).collect();
    let mut sq = vec![SqSum::default(); used.len()];
    let mut xs: Vec<&[u8]> = Vec::with_capacity(used.len());
    let mut finite = true;
    let mut done = 0usize;
    while done < k {
        let kk = SUB.min(k.saturating_sub(done));
        let start = at.saturating_add(done).saturating_mul(2);
        let end_byte = start.saturating_add(kk.saturating_mul(2));
        xs.clear();
        for (_, bytes, _) in used {
            let Some(x) = bytes.get(start..end_byte) else { bail!("slice shorter than its values") };
            xs.push(x);
        }
        let end = done.saturating_add(kk);
        let from = done.checked_div(b).unwrap_or(0).saturating_mul(per_row);
        let to = if end >= k { o.len() } else { end.checked_div(b).unwrap_or(0).saturating_mul(per_row) };
        let Some(piece) = o.get_mut(from..to) else { bail!("an update piece shorter than its values") };
        let acc = accb.get_mut(..kk).unwrap_or_default();
        finite &= fused(&xs, &ws, &mut sq, lr, acc, piece);
        done = end;
    }
    let partials: Partials = sq.iter().map(|s| s.finish().map(Some).ok_or(())).collect();
    if !finite && partials.iter().all(Result::is_ok) {
        bail!("the reduced update holds a non-finite value");
    }
    Ok(partials)
}

/// `acc[j] += w x[j]` in f64: one contribution's share of a sub-block's
/// weighted mean. The loops of the streamed reduce run in AVX2 where the
/// CPU has it (four f64 lanes where baseline x86-64 has two): the same
/// operations on each value, no fused multiply-add (Rust never contracts
/// one), so the same bits on any x86-64.
fn add_weighted(acc: &mut [f64], x: &[f32], w: f64) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above (std caches it).
        unsafe { add_weighted_avx2(acc, x, w) };
        return;
    }
    add_weighted_body(acc, x, w);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_weighted_avx2(acc: &mut [f64], x: &[f32], w: f64) {
    add_weighted_body(acc, x, w)
}

#[inline(always)]
fn add_weighted_body(acc: &mut [f64], x: &[f32], w: f64) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += w * f64::from(v);
    }
}

/// The outer step on one sub-block from its weighted mean `acc` (in f64),
/// as `iota_core::merge::reduce::outer_step` defines it (in AVX2 where
/// the CPU has it, as `add_weighted`): with no momentum the momentum is
/// neither read nor written.
fn outer_step(acc: &[f64], m: &mut [f32], u: &mut [f32], lr: f32, mu: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above (std caches it).
        unsafe { outer_step_avx2(acc, m, u, lr, mu) };
        return;
    }
    outer_step_body(acc, m, u, lr, mu);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn outer_step_avx2(acc: &[f64], m: &mut [f32], u: &mut [f32], lr: f32, mu: f32) {
    outer_step_body(acc, m, u, lr, mu)
}

#[inline(always)]
fn outer_step_body(acc: &[f64], m: &mut [f32], u: &mut [f32], lr: f32, mu: f32) {
    if mu == 0.0 {
        for (u, a) in u.iter_mut().zip(acc) {
            *u = lr * (*a as f32);
        }
        return;
    }
    for ((u, m), a) in u.iter_mut().zip(m.iter_mut()).zip(acc) {
        let g = *a as f32;
        *m = mu * *m + g;
        *u = lr * (g + mu * *m);
    }
}

/// Decodes values `at .. at + out.len()` of a slice written by
/// `encode_slice` (`at` a multiple of `BLOCK`; a last, partial block
/// through a padded copy, as `decode_slice_into` does).
// A peer's payload: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub fn decode_range(c: WireCodec, bytes: &[u8], at: usize, out: &mut [f32]) -> Result<()> {
    if c == WireCodec::SparseTopK {
        return crate::sparse::decode_range(bytes, at, out);
    }
    let b = BLOCK as usize;
    let rb = c.row_bytes(b);
    let first = at.checked_div(b).unwrap_or(0);
    let full = out.len().checked_div(b).unwrap_or(0);
    let row = |r: usize, rows: usize| -> Result<&[u8]> {
        let start = r.checked_mul(rb).ok_or_else(|| anyhow::anyhow!("slice offset overflows"))?;
        let end = rows.checked_mul(rb).and_then(|l| start.checked_add(l));
        end.and_then(|e| bytes.get(start..e)).ok_or_else(|| anyhow::anyhow!("slice shorter than its values"))
    };
    let (body, tail) = out.split_at_mut(full.saturating_mul(b));
    codec::decode_into(c, full, b, row(first, full)?, body)?;
    if !tail.is_empty() {
        let mut padded = vec![0.0f32; b];
        codec::decode_into(c, 1, b, row(first.saturating_add(full), 1)?, &mut padded)?;
        let k = tail.len();
        tail.copy_from_slice(padded.get(..k).unwrap_or_default());
    }
    Ok(())
}
