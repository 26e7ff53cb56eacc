//! A partition's slice on the wire and its reduce: the encoding every
//! sender and owner uses, a `WeightSlice` frame read into a `SliceMsg`, and
//! the reduce an honest owner (and a validator auditing it) runs.

use anyhow::{Result, bail};
use bytes::Bytes;
use iota_core::PeerId;
use iota_core::WireCodec;
use iota_core::merge::{BLOCK, flaws, reduce_slice};
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
