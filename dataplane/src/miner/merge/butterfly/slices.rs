//! A partition's slice on the wire and its reduce: the encoding every
//! sender and owner uses, a `WeightSlice` frame read into a `SliceMsg`, and
//! the reduce an honest owner (and a validator auditing it) runs.

use anyhow::Result;
use bytes::Bytes;
use iota_core::PeerId;
use iota_core::WireCodec;
use iota_core::merge::{BLOCK, flaws, reduce_slice};
use iota_core::wire::{Direction, header_bytes};
use iota_model::codec;
use iota_protocol::MergeSpec;

/// `WeightSlice` frame kinds (the header's `samples`).
pub(super) const KIND_CONTRIBUTION: u32 = 0;
pub(super) const KIND_UPDATE: u32 = 1;

pub(super) fn blocks(len: u64) -> usize {
    len.div_ceil(BLOCK) as usize
}

/// Encodes a slice zero-padded to whole blocks, as [blocks, BLOCK].
pub fn encode_slice(c: WireCodec, x: &[f32]) -> Result<Vec<u8>> {
    let rows = blocks(x.len() as u64);
    let mut padded = x.to_vec();
    padded.resize(rows * BLOCK as usize, 0.0);
    Ok(codec::encode(c, rows, BLOCK as usize, &padded)?)
}

/// Decodes a slice of `len` values written by `encode_slice`.
// A peer's frame: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub fn decode_slice(c: WireCodec, len: u64, bytes: &[u8]) -> Result<Vec<f32>> {
    let mut v = codec::decode(c, blocks(len), BLOCK as usize, bytes)?;
    v.truncate(len as usize);
    Ok(v)
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
    let hash = *blake3::hash(&payload).as_bytes();
    Ok((payload, hash))
}

/// A `WeightSlice` frame, checked and copied out of the receive pool.
#[derive(Clone, Debug)]
pub(super) struct SliceMsg {
    pub(super) from: PeerId,
    pub(super) epoch: u64,
    pub(super) k: usize,
    pub(super) kind: u32,
    pub(super) generation: u32,
    pub(super) offset: u64,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) codec: u8,
    pub(super) hash: [u8; 32],
    /// The archived signed header, handed on as evidence (`SliceDone`).
    pub(super) header: Vec<u8>,
    pub(super) payload: Bytes,
}

// A peer's frame: no unchecked arithmetic or indexing.
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub(super) fn slice_msg(h: &iota_core::wire::FrameHeader, from: PeerId, payload: &[u8]) -> Option<SliceMsg> {
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
