//! Wire codecs for tensors that cross a stage boundary: their ids, their
//! exact byte sizes and the bf16 conversions they share. The encoders and
//! decoders themselves live in `iota-model::codec`.

use serde::{Deserialize, Serialize};

use crate::error::CoreError;

/// How a `[rows, cols]` f32 tensor is written on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WireCodec {
    /// Raw little-endian f32: exact; used when the bottleneck is off.
    F32,
    /// bfloat16, round to nearest even.
    Bf16,
    /// Per row: a bf16 scale, then `cols` signed bytes (x ~= q * scale).
    Int8Row,
    /// Per row: a bf16 scale, then `cols` signed 4-bit values in [-7, 7],
    /// two per byte, low nibble first.
    Int4Row,
    /// Merge contributions only, never a stage boundary's tensors (issue
    /// 57): a row is one block of `SPARSE_BLOCK` values written as its
    /// `cols` largest in magnitude: a 6-byte header, the kept indices
    /// Elias-Fano coded (`sparse_index_bytes`), a 2-bit code for each.
    SparseTopK,
}

impl WireCodec {
    pub const ALL: [WireCodec; 4] = [WireCodec::F32, WireCodec::Bf16, WireCodec::Int8Row, WireCodec::Int4Row];

    pub fn id(self) -> u8 {
        match self {
            WireCodec::F32 => 0,
            WireCodec::Bf16 => 1,
            WireCodec::Int8Row => 2,
            WireCodec::Int4Row => 3,
            WireCodec::SparseTopK => 4,
        }
    }

    /// Every codec a frame may carry: the tensor codecs (`ALL`) and the
    /// merge's sparse one.
    pub fn from_id(id: u8) -> Result<Self, CoreError> {
        WireCodec::ALL
            .into_iter()
            .chain([WireCodec::SparseTopK])
            .find(|c| c.id() == id)
            .ok_or(CoreError::UnknownCodec(id))
    }

    /// A codec that writes every value of a tensor (all but `SparseTopK`).
    pub fn is_dense(self) -> bool {
        self != WireCodec::SparseTopK
    }

    pub fn name(self) -> &'static str {
        match self {
            WireCodec::F32 => "f32",
            WireCodec::Bf16 => "bf16",
            WireCodec::Int8Row => "int8",
            WireCodec::Int4Row => "int4",
            WireCodec::SparseTopK => "sparse",
        }
    }

    /// A tensor codec by name (`SparseTopK` is not one).
    pub fn parse(s: &str) -> Option<Self> {
        WireCodec::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Bytes one row of `cols` values takes on the wire.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            WireCodec::F32 => 4 * cols,
            WireCodec::Bf16 => 2 * cols,
            WireCodec::Int8Row => 2 + cols,
            WireCodec::Int4Row => 2 + cols.div_ceil(2),
            WireCodec::SparseTopK => sparse_row_bytes(cols),
        }
    }

    /// Bytes of a whole `[rows, cols]` tensor (checked: a hostile shape must
    /// not overflow).
    pub fn payload_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        rows.checked_mul(self.row_bytes(cols))
    }
}

/// Values per row of `WireCodec::SparseTopK` (a row's indices fit 16 bits).
pub const SPARSE_BLOCK: usize = 1 << 14;

/// Values a sparse block of `len` keeps at `density` (at least one of a
/// non-empty block).
pub fn sparse_kept(len: usize, density: f32) -> usize {
    if len == 0 {
        return 0;
    }
    // Less a hair: 0.05 as f32 is a little over 1/20, and 100 values at it
    // keep 5, not 6.
    let k = (f64::from(density.clamp(0.0, 1.0)) * len as f64 - 1e-6).ceil() as usize;
    k.clamp(1, len)
}

/// Low bits of each kept index in a sparse row keeping `k` of a block's
/// values: Elias-Fano's split, log2 of the mean gap between kept indices,
/// rounded down (0 where `k` passes the block: a hostile count sizes a
/// row without a panic).
pub fn sparse_low_bits(k: usize) -> u32 {
    (SPARSE_BLOCK / k.max(1)).max(1).ilog2()
}

/// Bytes of a sparse row's two index sections for `k` kept values, each
/// byte-aligned: the low bits (`sparse_low_bits` each, packed), then the
/// high bitvector (`k + SPARSE_BLOCK >> low bits` bits: kept value n sets
/// bit `(index >> low bits) + n`). About 2 + log2(block / k) bits an index
/// whatever the indices are: 6 at 1/16, against a u16's 16.
pub fn sparse_index_bytes(k: usize) -> (usize, usize) {
    let l = sparse_low_bits(k);
    (k.saturating_mul(l as usize).div_ceil(8), k.saturating_add(SPARSE_BLOCK >> l).div_ceil(8))
}

/// Bytes of a sparse row keeping `k` values: the kept count and the two
/// bf16 magnitudes (6 bytes), the index sections, a 2-bit code for each.
pub fn sparse_row_bytes(k: usize) -> usize {
    let (low, high) = sparse_index_bytes(k);
    6usize.saturating_add(low).saturating_add(high).saturating_add(k.div_ceil(4))
}

/// Boundary traffic of one token, forward (activation) and backward
/// (its gradient), against the bf16 d-wide hidden state a pipeline without
/// a bottleneck would send.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoundaryCost {
    pub bytes_per_token: usize,
    pub bf16_hidden_bytes: usize,
    pub ratio: f64,
}

pub fn boundary_cost(d_model: usize, width: usize, codec: WireCodec) -> BoundaryCost {
    let bytes = codec.row_bytes(width);
    BoundaryCost { bytes_per_token: bytes, bf16_hidden_bytes: 2 * d_model, ratio: (2 * d_model) as f64 / bytes as f64 }
}

/// f32 -> bf16, round to nearest even; NaN stays NaN.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1));
    (r >> 16) as u16
}

/// f32 -> bf16, rounded away from zero to the next representable value, so
/// the result's magnitude is never below the input's. Used for quantisation
/// scales: a scale that rounded down could push |x/scale| past the integer
/// range.
#[inline]
pub fn f32_to_bf16_up(x: f32) -> u16 {
    let b = x.to_bits();
    if !x.is_finite() {
        return f32_to_bf16(x);
    }
    let hi = (b >> 16) as u16;
    if b & 0xFFFF == 0 { hi } else { hi + 1 }
}

#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trip_and_rounding() {
        for x in [0.0f32, 1.0, -2.5, 0.0078125, 2.0f32.powi(100), -7.75] {
            assert_eq!(bf16_to_f32(f32_to_bf16(x)), x);
        }
        let x = 1.0 + 1.0 / 512.0; // halfway between two bf16 values: ties to even (1.0)
        assert_eq!(bf16_to_f32(f32_to_bf16(x)), 1.0);
        let y = 1.0 + 3.0 / 1024.0;
        assert!(bf16_to_f32(f32_to_bf16_up(y)) >= y);
        assert!(bf16_to_f32(f32_to_bf16_up(-y)) <= -y);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn iota_run_boundary_ratios() {
        // d=2048, bottleneck 32: bf16 hidden is 4096 bytes per token.
        let int8 = boundary_cost(2048, 32, WireCodec::Int8Row);
        assert_eq!(int8.bytes_per_token, 34);
        let int4 = boundary_cost(2048, 32, WireCodec::Int4Row);
        assert_eq!(int4.bytes_per_token, 18);
        assert!(int4.ratio >= 128.0);
        for c in WireCodec::ALL {
            assert_eq!(WireCodec::from_id(c.id()).unwrap(), c);
            assert_eq!(WireCodec::parse(c.name()), Some(c));
        }
        assert!(WireCodec::from_id(200).is_err());
        // The sparse codec rides in frames (merge contributions) but is no
        // tensor codec a run's boundary may name.
        assert_eq!(WireCodec::from_id(4).unwrap(), WireCodec::SparseTopK);
        assert_eq!(WireCodec::parse("sparse"), None);
        assert!(!WireCodec::SparseTopK.is_dense() && WireCodec::ALL.iter().all(|c| c.is_dense()));
        // 512 of 16,384 kept: 5 low bits each (320 bytes), a high
        // bitvector of 512 + 512 bits (128 bytes), 128 bytes of codes.
        assert_eq!(WireCodec::SparseTopK.payload_bytes(3, 512), Some(3 * (6 + 320 + 128 + 128)));
        assert_eq!(sparse_row_bytes(1024), 6 + 512 + 256 + 256);
        assert_eq!(sparse_low_bits(SPARSE_BLOCK), 0);
        assert_eq!(sparse_row_bytes(SPARSE_BLOCK), 6 + 4096 + 4096);
        assert_eq!(sparse_low_bits(1), 14);
        assert_eq!(sparse_low_bits(usize::MAX), 0);
        assert!(sparse_row_bytes(usize::MAX) >= usize::MAX / 8, "a hostile count saturates");
        assert_eq!(WireCodec::Int8Row.payload_bytes(usize::MAX, 8), None);
    }
}
