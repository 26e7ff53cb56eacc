//! A partition's slice on the wire and its reduce: the encoding every
//! sender and owner uses, a `WeightSlice` frame read into a `SliceMsg`, and
//! the reduce an honest owner (and a validator auditing it) runs.

use anyhow::{Result, bail};
use bytes::Bytes;
use iota_core::PeerId;
use iota_core::WireCodec;
use iota_core::merge::flaws::{chunk_sq_sum, flaws_of_norms, norm_of_partials};
use iota_core::merge::reduce::{REDUCE_CHUNK, clip_cannot_bite};
use iota_core::merge::{BLOCK, ReduceRule, ReduceStats, flaws, reduce_slice};
use iota_core::wire::{Direction, header_bytes};
use iota_model::codec;
use iota_wire::MergeSpec;
use rayon::prelude::*;

/// `WeightSlice` frame kinds (the header's `samples`).
pub const KIND_CONTRIBUTION: u32 = 0;
pub const KIND_UPDATE: u32 = 1;

pub fn blocks(len: u64) -> usize {
    len.div_ceil(BLOCK) as usize
}

/// Rows (blocks of `BLOCK` values) per parallel task when a slice is
/// encoded or decoded. Each row is encoded on its own, so the bytes do not
/// depend on how the rows are spread over threads.
const PAR_ROWS: usize = 256;

/// Encodes a slice zero-padded to whole blocks, as [blocks, BLOCK]: whole
/// blocks straight from `x` (spread over the rayon pool), the last, partial
/// one through a padded copy of one block.
pub fn encode_slice(c: WireCodec, x: &[f32]) -> Result<Vec<u8>> {
    let b = BLOCK as usize;
    let rows = blocks(x.len() as u64);
    let rb = c.row_bytes(b);
    let mut out = vec![0u8; rows * rb];
    let full = x.len() / b;
    let (body, tail) = out.split_at_mut(full * rb);
    body.par_chunks_mut(PAR_ROWS * rb)
        .zip(x[..full * b].par_chunks(PAR_ROWS * b))
        .try_for_each(|(o, xs)| codec::encode_into(c, xs.len() / b, b, xs, o))?;
    if !tail.is_empty() {
        let mut padded = vec![0.0f32; b];
        padded[..x.len() - full * b].copy_from_slice(&x[full * b..]);
        codec::encode_into(c, 1, b, &padded, tail)?;
    }
    Ok(out)
}

/// Decodes a slice of `len` values written by `encode_slice`.
pub fn decode_slice(c: WireCodec, len: u64, bytes: &[u8]) -> Result<Vec<f32>> {
    // The length is checked before the output is allocated.
    check_slice_len(c, len, bytes)?;
    let mut v = vec![0.0f32; usize::try_from(len)?];
    decode_slice_into(c, bytes, &mut v)?;
    Ok(v)
}

fn check_slice_len(c: WireCodec, len: u64, bytes: &[u8]) -> Result<()> {
    let want = c.payload_bytes(blocks(len), BLOCK as usize);
    if want != Some(bytes.len()) {
        bail!("slice of {len} values: {} payload bytes, expected {want:?}", bytes.len());
    }
    Ok(())
}

/// Decodes a slice written by `encode_slice` into `out` (its `len` values,
/// the padding checked and dropped), whole blocks spread over the rayon
/// pool. Every value is checked as `codec::decode` checks it; on an error
/// `out` holds a partial result.
// A peer's frame: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub fn decode_slice_into(c: WireCodec, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let b = BLOCK as usize;
    check_slice_len(c, out.len() as u64, bytes)?;
    let rb = c.row_bytes(b);
    let full = out.len().checked_div(b).unwrap_or(0);
    let (body_out, tail_out) = out.split_at_mut(full.saturating_mul(b));
    let (body_in, tail_in) = bytes.split_at(full.saturating_mul(rb));
    body_out
        .par_chunks_mut(PAR_ROWS.saturating_mul(b))
        .zip(body_in.par_chunks(PAR_ROWS.saturating_mul(rb)))
        .try_for_each(|(o, bs)| codec::decode_into(c, o.len().checked_div(b).unwrap_or(0), b, bs, o))?;
    if !tail_out.is_empty() {
        let mut padded = vec![0.0f32; b];
        codec::decode_into(c, 1, b, tail_in, &mut padded)?;
        let n = tail_out.len();
        tail_out.copy_from_slice(padded.get(..n).unwrap_or_default());
    }
    Ok(())
}

/// One partition's reduce as an honest owner does it, from the
/// participants' encoded contributions in plan order (None: missing):
/// decode, leave out what `flaws` flags, `reduce_slice` with the outer
/// momentum slice (updated in place). A validator auditing the partition
/// runs the same function (`iota_control::validator`).
pub struct Reduced {
    pub update: Vec<f32>,
    /// The contributions flagged and left out: index (plan order), why.
    pub flagged: Vec<(usize, iota_core::merge::Flaw)>,
    pub stats: iota_core::merge::ReduceStats,
}

pub fn reduce_partition(
    spec: &MergeSpec,
    epoch: u64,
    len: u64,
    payloads: &[Option<&[u8]>],
    weights: &[f64],
    momentum: &mut [f32],
) -> Reduced {
    if let Some(r) = streamed_reduce(spec, epoch, len, payloads, weights, momentum) {
        return r;
    }
    reduce_partition_decoded(spec, epoch, len, payloads, weights, momentum)
}

/// `reduce_partition` as its reference does it: every contribution decoded
/// whole, then `flaws`, then `reduce_slice`. The rules that are not a
/// weighted mean (trimmed mean; centered clipping of three or more) run
/// this way.
pub fn reduce_partition_decoded(
    spec: &MergeSpec,
    epoch: u64,
    len: u64,
    payloads: &[Option<&[u8]>],
    weights: &[f64],
    momentum: &mut [f32],
) -> Reduced {
    let decoded: Vec<Option<Vec<f32>>> =
        payloads.iter().map(|p| p.and_then(|b| decode_slice(spec.codec, len, b).ok())).collect();
    let mut refs: Vec<Option<&[f32]>> = decoded.iter().map(|d| d.as_deref()).collect();
    let mut flagged = Vec::new();
    for (i, why) in flaws(&refs) {
        refs[i] = None;
        flagged.push((i, why));
    }
    let (update, stats) = reduce_slice(spec.rule, spec.outer_at(epoch), &refs, weights, momentum);
    Reduced { update, flagged, stats }
}

/// `reduce_partition` for the rules that come down to a weighted mean
/// (`Mean`, and centered clipping where it `clip_cannot_bite`: two
/// contributions), streamed chunk by chunk as a reduce at memory speed
/// must be: one pass reads the encoded contributions for the norms `flaws`
/// judges by; a second decodes each chunk again into a buffer that stays
/// in cache, takes the weighted mean and applies the outer step at once.
/// Nothing stage-sized is decoded or written but the update and the
/// momentum (the reference decodes every contribution whole and passes
/// over it four times). The sums are the reference's, in its order (norm
/// partials per `REDUCE_CHUNK` in chunk order, the mean per coordinate in
/// participant order from -0.0, the outer step in f32), so the bits are
/// too. None where this does not apply (another rule, nothing left to
/// reduce, weights that do not pair with the contributions): the reference
/// runs.
fn streamed_reduce(
    spec: &MergeSpec,
    epoch: u64,
    len: u64,
    payloads: &[Option<&[u8]>],
    weights: &[f64],
    momentum: &mut [f32],
) -> Option<Reduced> {
    let mut update = vec![0.0f32; momentum.len()];
    let write = |u: &[f32], out: &mut [f32]| -> Result<()> {
        out.copy_from_slice(u);
        Ok(())
    };
    let (flagged, written) =
        streamed(spec, epoch, len, payloads, weights, momentum, (&mut update, REDUCE_CHUNK, write))?;
    written.ok()?;
    Some(Reduced { update, flagged, stats: ReduceStats::default() })
}

/// An owner's reduce of one partition to what it publishes: the update
/// encoded with the merge codec (what `update_hash` encodes), its hash,
/// and the contributions flagged. For the weighted-mean rules each chunk's
/// update is encoded as the reduce computes it (`streamed`: the f32
/// update is never written out); the other rules run the reference and
/// encode its update. The same bytes either way, and as
/// `update_hash(reduce_partition(..).update)`.
pub struct Published {
    pub payload: Bytes,
    pub hash: [u8; 32],
    pub flagged: Vec<(usize, iota_core::merge::Flaw)>,
    pub stats: iota_core::merge::ReduceStats,
}

pub fn reduce_partition_published(
    spec: &MergeSpec,
    epoch: u64,
    len: u64,
    payloads: &[Option<&[u8]>],
    weights: &[f64],
    momentum: &mut [f32],
) -> Result<Published> {
    let c = spec.codec;
    let b = BLOCK as usize;
    let rb = c.row_bytes(b);
    let bytes = c.payload_bytes(blocks(len), b).ok_or_else(|| anyhow::anyhow!("a partition too large to encode"))?;
    let mut out = vec![0u8; bytes];
    // Each chunk's rows encoded on their own (as `encode_slice` does), a
    // last, partial block through a zero-padded copy.
    let write = |u: &[f32], o: &mut [u8]| -> Result<()> {
        let full = u.len() / b;
        let (body, tail) = o.split_at_mut(full * rb);
        codec::encode_into(c, full, b, &u[..full * b], body)?;
        if !tail.is_empty() {
            let mut padded = vec![0.0f32; b];
            padded[..u.len() - full * b].copy_from_slice(&u[full * b..]);
            codec::encode_into(c, 1, b, &padded, tail)?;
        }
        Ok(())
    };
    if let Some((flagged, written)) =
        streamed(spec, epoch, len, payloads, weights, momentum, (&mut out, REDUCE_CHUNK / b * rb, write))
    {
        written?;
        let payload = Bytes::from(out);
        let hash = hash_bytes(&payload);
        return Ok(Published { payload, hash, flagged, stats: ReduceStats::default() });
    }
    let r = reduce_partition_decoded(spec, epoch, len, payloads, weights, momentum);
    let (payload, hash) = update_hash(c, &r.update)?;
    Ok(Published { payload, hash, flagged: r.flagged, stats: r.stats })
}

/// The contributions an owner flags: index (plan order), why.
type Flagged = Vec<(usize, iota_core::merge::Flaw)>;

/// The output of `streamed`'s second pass: `out`, cut in `per_chunk`
/// pieces, one for each `REDUCE_CHUNK` of the update, and how a chunk of
/// the update is written into its piece.
type Sink<'a, T, W> = (&'a mut [T], usize, W);

/// The two passes of the streamed reduce (see `streamed_reduce`): None
/// where it does not apply; else the flags and whether every chunk was
/// decoded and written (an error where not: a payload pass 1 read, or an
/// update the codec refuses).
// A peer's payloads: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
fn streamed<T: Send, W: Fn(&[f32], &mut [T]) -> Result<()> + Sync>(
    spec: &MergeSpec,
    epoch: u64,
    len: u64,
    payloads: &[Option<&[u8]>],
    weights: &[f64],
    momentum: &mut [f32],
    (out, per_chunk, write): Sink<'_, T, W>,
) -> Option<(Flagged, Result<()>)> {
    let c = spec.codec;
    let n = usize::try_from(len).ok()?;
    let chunks = n.div_ceil(REDUCE_CHUNK);
    let fits = out.len().div_ceil(per_chunk.max(1)) == chunks;
    if momentum.len() != n || n == 0 || weights.len() != payloads.len() || per_chunk == 0 || !fits {
        return None;
    }
    let sized: Vec<Option<&[u8]>> = payloads.iter().map(|p| p.filter(|b| check_slice_len(c, len, b).is_ok())).collect();
    // Pass 1: per chunk, each contribution's sum of squares (None: a
    // non-finite value; Err: a value that does not decode).
    let partials: Vec<Vec<Result<Option<f64>, ()>>> = (0..chunks)
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
    let norms: Vec<Option<Option<f64>>> = (0..payloads.len())
        .map(|i| {
            let of_i: Result<Vec<Option<f64>>, ()> =
                partials.iter().map(|p| p.get(i).copied().unwrap_or(Err(()))).collect();
            of_i.ok().map(norm_of_partials)
        })
        .collect();
    let flagged = flaws_of_norms(&norms);
    let used: Vec<(&[u8], f64)> = sized
        .iter()
        .zip(weights)
        .enumerate()
        .filter(|(i, _)| !flagged.iter().any(|(j, _)| j == i))
        .filter_map(|(_, (p, w))| Some(((*p)?, *w)))
        .collect();
    let mean = match spec.rule {
        ReduceRule::Mean => true,
        ReduceRule::CenteredClip { tau_factor, .. } => clip_cannot_bite(used.len(), tau_factor),
        ReduceRule::TrimmedMean { .. } => false,
    };
    if !mean || used.is_empty() {
        return None;
    }
    // The weights as `reduce_slice` normalises them.
    let total: f64 = used.iter().map(|u| u.1).sum();
    let count = used.len() as f64;
    let norm: Vec<f64> = used.iter().map(|u| if total > 0.0 { u.1 / total } else { 1.0 / count }).collect();
    let outer = spec.outer_at(epoch);
    let (lr, mu) = (outer.lr, outer.momentum);
    // Pass 2: the weighted mean and the outer step, chunk by chunk, each
    // chunk's update written into its piece of `out` while in cache.
    let written = out
        .par_chunks_mut(per_chunk)
        .zip(momentum.par_chunks_mut(REDUCE_CHUNK))
        .enumerate()
        .map_init(
            || (vec![0.0f32; REDUCE_CHUNK], vec![0.0f64; REDUCE_CHUNK], vec![0.0f32; REDUCE_CHUNK]),
            |(buf, acc, upd), (ci, (o, m))| -> Result<()> {
                let at = ci.saturating_mul(REDUCE_CHUNK);
                let k = m.len();
                let x = buf.get_mut(..k).unwrap_or_default();
                let acc = acc.get_mut(..k).unwrap_or_default();
                let u = upd.get_mut(..k).unwrap_or_default();
                acc.fill(-0.0);
                for ((bytes, _), w) in used.iter().zip(&norm) {
                    decode_range(c, bytes, at, x)?;
                    add_weighted(acc, x, *w);
                }
                outer_step(acc, m, u, lr, mu);
                write(u, o)
            },
        )
        .collect::<Result<()>>();
    Some((flagged, written))
}

/// `acc[j] += w x[j]` in f64: one contribution's share of a chunk's
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

/// The outer step on one chunk from its weighted mean `acc` (in f64):
/// m <- mu m + g, u = lr (g + mu m), with g the mean as f32 (in AVX2
/// where the CPU has it, as `add_weighted`).
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
fn decode_range(c: WireCodec, bytes: &[u8], at: usize, out: &mut [f32]) -> Result<()> {
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

/// The hash owners publish for an update (`SliceDone.hash`): blake3 of
/// its encoding.
pub fn update_hash(c: WireCodec, u: &[f32]) -> Result<(Bytes, [u8; 32])> {
    let payload = Bytes::from(encode_slice(c, u)?);
    let hash = hash_bytes(&payload);
    Ok((payload, hash))
}

/// blake3 of `bytes`, large inputs hashed on the rayon pool (the same hash:
/// blake3's tree does not depend on how it is computed).
pub fn hash_bytes(bytes: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    if bytes.len() >= 1 << 20 {
        h.update_rayon(bytes);
    } else {
        h.update(bytes);
    }
    *h.finalize().as_bytes()
}

/// A `WeightSlice` frame, checked and copied out of the receive pool.
#[derive(Clone, Debug)]
pub struct SliceMsg {
    pub from: PeerId,
    pub epoch: u64,
    pub k: usize,
    pub kind: u32,
    pub generation: u32,
    pub offset: u64,
    pub rows: usize,
    pub cols: usize,
    pub codec: u8,
    pub hash: [u8; 32],
    /// The archived signed header, handed on as evidence (`SliceDone`).
    pub header: Vec<u8>,
    pub payload: Bytes,
}

// A peer's frame: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub fn slice_msg(h: &iota_core::wire::FrameHeader, from: PeerId, payload: &[u8]) -> Option<SliceMsg> {
    let (rows, cols) = h.rows_cols()?;
    if h.direction != Direction::WeightSlice || h.ndim != 2 {
        return None;
    }
    Some(SliceMsg {
        from,
        epoch: h.epoch as u64,
        k: h.shard as usize,
        kind: h.samples,
        generation: h.attempt,
        offset: h.first_sample,
        rows,
        cols,
        codec: h.codec,
        hash: h.payload_hash,
        header: header_bytes(h),
        payload: Bytes::copy_from_slice(payload),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streamed reduce gives the reference's bits (update, momentum,
    /// flags, stats) for every codec, rule, replica count, length (whole
    /// chunks, a partial chunk, a partial block) and hostile contribution
    /// (missing, truncated, NaN, a huge outlier), and leaves to the
    /// reference what it does not stream.
    #[test]
    fn the_streamed_reduce_is_the_reference_bit_for_bit() {
        use iota_core::merge::{OuterOpt, ReduceRule};
        let b = BLOCK as usize;
        let mut rng = iota_core::Rng::new(11);
        let rules = [
            ReduceRule::Mean,
            ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 },
            ReduceRule::TrimmedMean { trim: 1 },
        ];
        let mut streamed = 0;
        for c in [WireCodec::Bf16, WireCodec::Int8Row, WireCodec::F32] {
            for len in [7, b, REDUCE_CHUNK, 2 * REDUCE_CHUNK + 3 * b + 5] {
                for r in 1..=4usize {
                    for attack in ["none", "missing", "short", "nan", "huge"] {
                        for rule in rules {
                            let base: Vec<f32> = (0..len).map(|_| rng.normal() * 0.01).collect();
                            let mut xs: Vec<Vec<f32>> =
                                (0..r).map(|_| base.iter().map(|&v| v + rng.normal() * 0.003).collect()).collect();
                            match attack {
                                "nan" => xs[0][len / 2] = f32::NAN,
                                "huge" => xs[0].iter_mut().for_each(|v| *v *= 1e5),
                                _ => {}
                            }
                            // A codec that cannot carry a NaN refuses to encode it.
                            let Ok(mut enc) = xs.iter().map(|x| encode_slice(c, x)).collect::<Result<Vec<_>>>() else {
                                continue;
                            };
                            if attack == "short" {
                                enc[0].pop();
                            }
                            let payloads: Vec<Option<&[u8]>> = enc
                                .iter()
                                .enumerate()
                                .map(|(i, e)| (attack != "missing" || i != 0).then_some(e.as_slice()))
                                .collect();
                            let weights: Vec<f64> = (0..r).map(|i| 3.0 + i as f64).collect();
                            let spec = MergeSpec {
                                codec: c,
                                rule,
                                outer: OuterOpt { lr: 0.7, momentum: 0.9 },
                                ..MergeSpec::default()
                            };
                            let m0: Vec<f32> = (0..len).map(|_| rng.normal() * 1e-3).collect();
                            let (mut m_ref, mut m_got) = (m0.clone(), m0.clone());
                            let want = reduce_partition_decoded(&spec, 5, len as u64, &payloads, &weights, &mut m_ref);
                            let got = reduce_partition(&spec, 5, len as u64, &payloads, &weights, &mut m_got);
                            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            let what = format!("{c:?} len {len} R {r} {attack} {rule:?}");
                            assert_eq!(bits(&got.update), bits(&want.update), "{what}");
                            assert_eq!(bits(&m_got), bits(&m_ref), "{what}: momentum");
                            assert_eq!(got.flagged, want.flagged, "{what}");
                            assert_eq!(got.stats, want.stats, "{what}");
                            let mut m = m0.clone();
                            streamed += usize::from(
                                streamed_reduce(&spec, 5, len as u64, &payloads, &weights, &mut m).is_some(),
                            );
                            // Reduced straight to the published bytes: the
                            // reference's update, encoded.
                            let mut m_pub = m0.clone();
                            let published =
                                reduce_partition_published(&spec, 5, len as u64, &payloads, &weights, &mut m_pub);
                            match (update_hash(c, &want.update), published) {
                                (Ok((payload, hash)), Ok(p)) => {
                                    assert_eq!((&p.payload[..], p.hash), (&payload[..], hash), "{what}: published");
                                    assert_eq!((p.flagged, p.stats), (want.flagged.clone(), want.stats.clone()));
                                    assert_eq!(bits(&m_pub), bits(&m_ref), "{what}: momentum (published)");
                                }
                                (Err(_), Err(_)) => {}
                                (a, b) => panic!("{what}: {:?} vs {:?}", a.map(|x| x.1), b.map(|x| x.hash)),
                            }
                        }
                    }
                }
            }
        }
        // Mean always, centered clipping of one or two: most cases stream.
        assert!(streamed > 200, "{streamed} streamed");
    }

    /// The slice codec (whole blocks in parallel, the tail padded on its
    /// own) gives the bytes and values of the whole padded slice coded at once.
    #[test]
    fn slices_code_as_their_padded_whole() {
        let mut rng = iota_core::Rng::new(5);
        let b = BLOCK as usize;
        for c in [WireCodec::F32, WireCodec::Bf16, WireCodec::Int8Row, WireCodec::Int4Row] {
            for len in [1, b - 1, b, b + 1, PAR_ROWS * b * 3 + 7, PAR_ROWS * b * 2] {
                let x: Vec<f32> = (0..len).map(|_| rng.normal() * 0.01).collect();
                let mut padded = x.clone();
                padded.resize(blocks(len as u64) * b, 0.0);
                let want = codec::encode(c, blocks(len as u64), b, &padded).unwrap();
                let got = encode_slice(c, &x).unwrap();
                assert_eq!(got, want, "{c:?} {len}");
                let mut back = codec::decode(c, blocks(len as u64), b, &want).unwrap();
                back.truncate(len);
                assert_eq!(decode_slice(c, len as u64, &got).unwrap(), back, "{c:?} {len}");
                assert!(decode_slice(c, len as u64, &got[1..]).is_err());
            }
        }
    }
}
