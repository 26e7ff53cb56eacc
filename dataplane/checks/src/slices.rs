//! A partition's slice on the wire and its reduce: the encoding every
//! sender and owner uses, a `WeightSlice` frame read into a `SliceMsg`, and
//! the reduce an honest owner (and a validator auditing it) runs.

use crate::reduce_bf16;
use crate::reduce_stream::{Fused, Sink, check_slice_len, streamed};
use crate::{payload_pool, tree_hash};
use anyhow::Result;
use bytes::Bytes;
use iota_core::PeerId;
use iota_core::WireCodec;
use iota_core::merge::reduce::REDUCE_CHUNK;
use iota_core::merge::{BLOCK, ReduceStats, flaws, reduce_slice};
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

/// Encodes a contribution as the run sends it (`MergeSpec::contribution_codec`)
/// with nothing held back: a dense codec's slice, or the sparse codec's
/// rows without error feedback (which the butterfly adds,
/// `sparse::ErrorFeedback::encode_frame`).
pub fn encode_contribution(spec: &MergeSpec, x: &[f32]) -> Result<Vec<u8>> {
    if spec.contribution_codec().is_dense() {
        return encode_slice(spec.codec, x);
    }
    let (_, k) = spec.contribution_shape(x.len() as u64);
    Ok(crate::sparse::encode_frame(x, k))
}

/// Decodes a contribution of `len` values in the run's contribution codec;
/// hostile bytes are an error.
pub fn decode_contribution(spec: &MergeSpec, len: u64, bytes: &[u8]) -> Result<Vec<f32>> {
    if spec.contribution_codec().is_dense() {
        return decode_slice(spec.codec, len, bytes);
    }
    let want = spec.contribution_bytes(len);
    if want != Some(bytes.len() as u64) {
        anyhow::bail!("sparse contribution of {len} values: {} payload bytes, expected {want:?}", bytes.len());
    }
    let (_, k) = spec.contribution_shape(len);
    let mut v = vec![0.0f32; usize::try_from(len)?];
    crate::sparse::decode_frame_into(bytes, &mut v, k)?;
    Ok(v)
}

/// Decodes a slice of `len` values written by `encode_slice`.
pub fn decode_slice(c: WireCodec, len: u64, bytes: &[u8]) -> Result<Vec<f32>> {
    // The length is checked before the output is allocated.
    check_slice_len(c, len, bytes)?;
    let mut v = vec![0.0f32; usize::try_from(len)?];
    decode_slice_into(c, bytes, &mut v)?;
    Ok(v)
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
        payloads.iter().map(|p| p.and_then(|b| decode_contribution(spec, len, b).ok())).collect();
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
/// contributions), streamed (`reduce_stream`): nothing stage-sized is
/// decoded or written but the update and the momentum (the reference
/// decodes every contribution whole and passes over it four times). The
/// same bits as the reference. None where it does not apply: the
/// reference runs.
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
    let sink = Sink { out: &mut update, per_row: BLOCK as usize, write, seal: |_, _: &[f32]| None, fused: None };
    let (flagged, written) = streamed(spec, epoch, len, payloads, weights, momentum, sink)?;
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
    // Written whole below (every chunk's piece, padding included).
    let mut out = payload_pool::take(bytes);
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
    // Each encoded chunk hashed as soon as it is written, while in cache,
    // where a chunk's bytes are a whole subtree of BLAKE3's tree (bf16 and
    // f32: 32 and 64 KiB) and the payload is more than one chunk.
    let per_chunk = REDUCE_CHUNK / b * rb;
    let in_pieces = tree_hash::is_subtree_len(per_chunk) && bytes > per_chunk;
    let seal = |i: usize, o: &[u8]| in_pieces.then(|| tree_hash::piece_cv(i, per_chunk, o));
    let fused: Option<Fused<u8>> = (c == WireCodec::Bf16).then_some(reduce_bf16::fused_bf16);
    let sink = Sink { out: &mut out, per_row: rb, write, seal, fused };
    if let Some((flagged, pieces)) = streamed(spec, epoch, len, payloads, weights, momentum, sink) {
        let pieces: Option<Vec<_>> = pieces?.into_iter().collect();
        let payload = payload_pool::publish(out);
        let hash = match pieces.and_then(|p| tree_hash::root_of_pieces(&p, per_chunk, bytes as u64)) {
            Some(h) => h,
            None => hash_bytes(&payload),
        };
        return Ok(Published { payload, hash, flagged, stats: ReduceStats::default() });
    }
    let r = reduce_partition_decoded(spec, epoch, len, payloads, weights, momentum);
    let (payload, hash) = update_hash(c, &r.update)?;
    Ok(Published { payload, hash, flagged: r.flagged, stats: r.stats })
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
    /// flags, stats, the published payload and its hash, hashed in pieces
    /// where the payload is more than one chunk) for every codec, rule,
    /// replica count, length (whole chunks, a partial chunk, a partial
    /// block), outer step with and without momentum, and hostile
    /// contribution (missing, truncated, NaN, NaN in the padding, a huge
    /// outlier), and leaves
    /// to the reference what it does not stream.
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
        let (mut streamed, mut streamed_sparse) = (0, 0);
        // Dense contributions in each codec, and sparse ones (bf16 updates).
        for (c, density) in
            [(WireCodec::Bf16, 0.0), (WireCodec::Int8Row, 0.0), (WireCodec::F32, 0.0), (WireCodec::Bf16, 1.0 / 32.0)]
        {
            for len in [7, b, REDUCE_CHUNK, 2 * REDUCE_CHUNK + 3 * b + 5] {
                for r in 1..=4usize {
                    for attack in ["none", "missing", "short", "nan", "huge", "nan-pad", "overflow"] {
                        // With momentum (two passes), and without (one
                        // pass measuring the norms, again without what it
                        // flags).
                        for (rule, mu) in rules.into_iter().flat_map(|r| [(r, 0.9), (r, 0.0)]) {
                            let base: Vec<f32> = (0..len).map(|_| rng.normal() * 0.01).collect();
                            let mut xs: Vec<Vec<f32>> =
                                (0..r).map(|_| base.iter().map(|&v| v + rng.normal() * 0.003).collect()).collect();
                            match attack {
                                "nan" => xs[0][len / 2] = f32::NAN,
                                "huge" => xs[0].iter_mut().for_each(|v| *v *= 1e5),
                                // Finite contributions whose update is not
                                // (the outer step's lr above 1 takes the
                                // mean past f32's range): refused.
                                "overflow" => xs.iter_mut().for_each(|x| x[len / 2] = 3.0e38),
                                _ => {}
                            }
                            let spec = MergeSpec {
                                codec: c,
                                rule,
                                outer: OuterOpt { lr: if attack == "overflow" { 1.5 } else { 0.7 }, momentum: mu },
                                sparse_density: density,
                                ..MergeSpec::default()
                            };
                            // A codec that cannot carry a NaN refuses to encode it.
                            let Ok(mut enc) =
                                xs.iter().map(|x| encode_contribution(&spec, x)).collect::<Result<Vec<_>>>()
                            else {
                                continue;
                            };
                            if attack == "short" {
                                enc[0].pop();
                            }
                            // The sparse codec drops a NaN value; a hostile
                            // sender writes one as a block's magnitude.
                            if attack == "nan" && density > 0.0 {
                                enc[0][2..4].copy_from_slice(&0x7FC0u16.to_le_bytes());
                            }
                            // A NaN in the last block's padding (read by
                            // the decode, not by the fused bf16 loop).
                            if attack == "nan-pad" {
                                if c != WireCodec::Bf16 || len % b == 0 || density > 0.0 {
                                    continue;
                                }
                                enc[0][2 * len..2 * len + 2].copy_from_slice(&0x7FC0u16.to_le_bytes());
                            }
                            let payloads: Vec<Option<&[u8]>> = enc
                                .iter()
                                .enumerate()
                                .map(|(i, e)| (attack != "missing" || i != 0).then_some(e.as_slice()))
                                .collect();
                            let weights: Vec<f64> = (0..r).map(|i| 3.0 + i as f64).collect();
                            let m0: Vec<f32> = (0..len).map(|_| rng.normal() * 1e-3).collect();
                            let (mut m_ref, mut m_got) = (m0.clone(), m0.clone());
                            let want = reduce_partition_decoded(&spec, 5, len as u64, &payloads, &weights, &mut m_ref);
                            let got = reduce_partition(&spec, 5, len as u64, &payloads, &weights, &mut m_got);
                            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            let what = format!("{c:?} (sparse {density}) len {len} R {r} {attack} {rule:?}");
                            assert_eq!(bits(&got.update), bits(&want.update), "{what}");
                            assert_eq!(bits(&m_got), bits(&m_ref), "{what}: momentum");
                            assert_eq!(got.flagged, want.flagged, "{what}");
                            assert_eq!(got.stats, want.stats, "{what}");
                            let mut m = m0.clone();
                            let did = streamed_reduce(&spec, 5, len as u64, &payloads, &weights, &mut m).is_some();
                            streamed += usize::from(did);
                            streamed_sparse += usize::from(did && density > 0.0);
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
        assert!(streamed > 500, "{streamed} streamed");
        assert!(streamed_sparse > 100, "{streamed_sparse} sparse streamed");
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
