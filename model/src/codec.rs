//! Encoders and decoders of the wire codecs (`iota_core::WireCodec`).
//!
//! Decoding treats its input as hostile: lengths must match exactly, scales
//! and floats must be finite, and integer codes must be in range; anything
//! else is a typed error, never a panic.

use iota_core::codec::{bf16_to_f32, f32_to_bf16, f32_to_bf16_up};
use iota_core::{CoreError, WireCodec};

const INT8_MAX: f32 = 127.0;
const INT4_MAX: f32 = 7.0;

/// Encodes a `[rows, cols]` tensor. Non-finite values are refused: a stage
/// that produced them has diverged, and sending them on would poison peers.
pub fn encode(codec: WireCodec, rows: usize, cols: usize, x: &[f32]) -> Result<Vec<u8>, CoreError> {
    let expected = codec.payload_bytes(rows, cols).expect("local tensor size overflows");
    let mut out = vec![0u8; expected];
    encode_into(codec, rows, cols, x, &mut out)?;
    Ok(out)
}

/// `y.round()` (halves away from zero) for |y| < 2^31, without the libm
/// call `f32::round` is on the baseline x86-64 target, so a row vectorises:
/// the truncation is a conversion, `y - t` is exact, and a fraction of at
/// least one half steps away from zero. The same value as `round` (a test
/// compares them on ties, near-ties and random values).
#[inline]
fn round_half_away(y: f32) -> f32 {
    let t = (y as i32) as f32;
    let up = ((y - t).abs() >= 0.5) as i32 as f32;
    t + up.copysign(y)
}

/// `encode` into `out` (exactly `codec.payload_bytes(rows, cols)` bytes).
/// Rows are encoded independently, so a tensor encoded in row blocks, each
/// into its own part of `out`, gives the same bytes as encoded whole.
pub fn encode_into(codec: WireCodec, rows: usize, cols: usize, x: &[f32], out: &mut [u8]) -> Result<(), CoreError> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above (std caches it).
        return unsafe { encode_into_avx2(codec, rows, cols, x, out) };
    }
    encode_into_body(codec, rows, cols, x, out)
}

/// `encode_into` compiled for AVX2 (eight f32 lanes where baseline x86-64
/// has four): the same integer and IEEE operations on each value, so the
/// same bytes; a merge's reduce encodes every update through here.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn encode_into_avx2(
    codec: WireCodec,
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), CoreError> {
    encode_into_body(codec, rows, cols, x, out)
}

#[inline(always)]
fn encode_into_body(codec: WireCodec, rows: usize, cols: usize, x: &[f32], out: &mut [u8]) -> Result<(), CoreError> {
    if !codec.is_dense() {
        return Err(CoreError::NotATensorCodec(codec.name()));
    }
    let expected = codec.payload_bytes(rows, cols).expect("local tensor size overflows");
    assert_eq!(x.len(), rows * cols, "encode: tensor length does not match its shape");
    assert_eq!(out.len(), expected, "encode: output length does not match the shape");
    // No early exit, so the check vectorises (as in `decode_into`).
    if x.iter().fold(false, |bad, v| bad | !v.is_finite()) {
        return Err(CoreError::NonFinite("tensor to encode"));
    }
    match codec {
        WireCodec::SparseTopK => {} // refused above
        WireCodec::F32 => out.chunks_exact_mut(4).zip(x).for_each(|(o, v)| o.copy_from_slice(&v.to_le_bytes())),
        WireCodec::Bf16 => {
            // Pairs by type; every value is finite here.
            let (pairs, _) = out.as_chunks_mut::<2>();
            pairs.iter_mut().zip(x).for_each(|(o, v)| *o = f32_to_bf16(*v).to_le_bytes())
        }
        WireCodec::Int8Row | WireCodec::Int4Row => {
            let qmax = if codec == WireCodec::Int8Row { INT8_MAX } else { INT4_MAX };
            let rb = codec.row_bytes(cols);
            for (row, orow) in x.chunks(cols.max(1)).zip(out.chunks_mut(rb.max(1))).take(rows) {
                let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale_bits = f32_to_bf16_up(absmax / qmax);
                let scale = bf16_to_f32(scale_bits);
                let (head, codes) = orow.split_at_mut(2);
                head.copy_from_slice(&scale_bits.to_le_bytes());
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                let q = |v: f32| round_half_away(v * inv).clamp(-qmax, qmax) as i8;
                if codec == WireCodec::Int8Row {
                    codes.iter_mut().zip(row).for_each(|(o, &v)| *o = q(v) as u8);
                } else {
                    for (o, pair) in codes.iter_mut().zip(row.chunks(2)) {
                        let lo = q(pair[0]) as u8 & 0x0F;
                        let hi = pair.get(1).map_or(0, |&v| q(v) as u8 & 0x0F);
                        *o = lo | (hi << 4);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Decodes into `out` (length rows * cols), validating everything. Its
/// input is a peer's: no unchecked arithmetic or indexing (the lints hold it
/// to that).
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub fn decode_into(codec: WireCodec, rows: usize, cols: usize, bytes: &[u8], out: &mut [f32]) -> Result<(), CoreError> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above (std caches it).
        return unsafe { decode_into_avx2(codec, rows, cols, bytes, out) };
    }
    decode_into_body(codec, rows, cols, bytes, out)
}

/// `decode_into` compiled for AVX2, as `encode_into_avx2` (the same
/// checks and values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_into_avx2(
    codec: WireCodec,
    rows: usize,
    cols: usize,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), CoreError> {
    decode_into_body(codec, rows, cols, bytes, out)
}

#[inline(always)]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
fn decode_into_body(
    codec: WireCodec,
    rows: usize,
    cols: usize,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), CoreError> {
    if !codec.is_dense() {
        return Err(CoreError::NotATensorCodec(codec.name()));
    }
    let len_err = |expected| CoreError::PayloadLength { codec: codec.name(), rows, cols, expected, got: bytes.len() };
    let expected = codec.payload_bytes(rows, cols).ok_or(len_err(usize::MAX))?;
    if bytes.len() != expected || Some(out.len()) != rows.checked_mul(cols) {
        return Err(len_err(expected));
    }
    match codec {
        WireCodec::SparseTopK => {} // refused above
        WireCodec::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().map_err(|_| len_err(expected))?);
            }
        }
        WireCodec::Bf16 => {
            // Whole pairs by type: no error path in the loop, which vectorises.
            let (pairs, _) = bytes.as_chunks::<2>();
            for (o, b) in out.iter_mut().zip(pairs) {
                *o = bf16_to_f32(u16::from_le_bytes(*b));
            }
        }
        WireCodec::Int8Row | WireCodec::Int4Row => {
            let rb = codec.row_bytes(cols);
            for (orow, brow) in out.chunks_mut(cols.max(1)).zip(bytes.chunks(rb.max(1))).take(rows) {
                let (scale, codes) = brow.split_first_chunk::<2>().ok_or(len_err(expected))?;
                let scale = bf16_to_f32(u16::from_le_bytes(*scale));
                if !(scale.is_finite() && scale >= 0.0) {
                    return Err(CoreError::NonFinite("quantisation scale"));
                }
                if codec == WireCodec::Int8Row {
                    for (o, &c) in orow.iter_mut().zip(codes) {
                        let q = c as i8;
                        if q == i8::MIN {
                            return Err(CoreError::NonFinite("int8 code -128 (outside the symmetric range)"));
                        }
                        *o = q as f32 * scale;
                    }
                } else {
                    for (j, o) in orow.iter_mut().enumerate() {
                        let byte = *codes.get(j / 2).ok_or(len_err(expected))?;
                        let nib = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                        let q = ((nib << 4) as i8) >> 4; // sign-extend 4 bits
                        if q == -8 {
                            return Err(CoreError::NonFinite("int4 code -8 (outside the symmetric range)"));
                        }
                        *o = q as f32 * scale;
                    }
                }
            }
        }
    }
    // Without an early exit, so it vectorises: a hostile payload gains
    // nothing by failing early, and an honest one is read to its end anyway.
    if out.iter().fold(false, |bad, v| bad | !v.is_finite()) {
        return Err(CoreError::NonFinite("decoded tensor"));
    }
    Ok(())
}

pub fn decode(codec: WireCodec, rows: usize, cols: usize, bytes: &[u8]) -> Result<Vec<f32>, CoreError> {
    let n = rows.checked_mul(cols).ok_or(CoreError::PayloadLength {
        codec: codec.name(),
        rows,
        cols,
        expected: usize::MAX,
        got: bytes.len(),
    })?;
    // Check the length before allocating: a hostile shape must not make us
    // reserve memory the payload does not back.
    if codec.payload_bytes(rows, cols) != Some(bytes.len()) {
        return decode_into(codec, rows, cols, bytes, &mut []).map(|_| Vec::new());
    }
    let mut out = vec![0.0; n];
    decode_into(codec, rows, cols, bytes, &mut out)?;
    Ok(out)
}

/// Replaces `x` by what the receiver would see after the wire (used by the
/// in-process pipeline, so it trains with exactly the quantisation error a
/// distributed run has).
pub fn round_trip(codec: WireCodec, rows: usize, cols: usize, x: &mut [f32]) -> Result<usize, CoreError> {
    if codec == WireCodec::F32 {
        if x.iter().any(|v| !v.is_finite()) {
            return Err(CoreError::NonFinite("tensor to encode"));
        }
        return Ok(4 * x.len());
    }
    let bytes = encode(codec, rows, cols, x)?;
    decode_into(codec, rows, cols, &bytes, x)?;
    Ok(bytes.len())
}

/// The largest error `encode`+`decode` may introduce on an element of a row
/// whose largest magnitude is `absmax` (half a quantisation step; for bf16,
/// half an ulp at 8 bits of mantissa).
pub fn error_bound(codec: WireCodec, absmax: f32) -> f32 {
    match codec {
        WireCodec::F32 => 0.0,
        WireCodec::Bf16 => absmax * (1.0 / 256.0),
        // The scale is absmax/qmax rounded up to bf16 (at most 2^-7 relative).
        WireCodec::Int8Row => 0.5 * absmax / INT8_MAX * (1.0 + 1.0 / 128.0),
        WireCodec::Int4Row => 0.5 * absmax / INT4_MAX * (1.0 + 1.0 / 128.0),
        // A value it drops is lost whole (until error feedback sends it).
        WireCodec::SparseTopK => absmax,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The AVX2 build of the codec (what `encode_into` and `decode_into`
    /// run on a CPU that has it) gives the baseline build's bytes and
    /// values, and the same refusals, for every codec.
    #[test]
    fn the_avx2_codec_is_the_baseline_codec() {
        let mut rng = iota_core::Rng::new(21);
        for codec in [WireCodec::F32, WireCodec::Bf16, WireCodec::Int8Row, WireCodec::Int4Row] {
            for (rows, cols) in [(1, 1), (3, 7), (17, 256), (64, 96)] {
                let x: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * 3.0).collect();
                let n = codec.payload_bytes(rows, cols).unwrap();
                let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
                encode_into(codec, rows, cols, &x, &mut a).unwrap();
                encode_into_body(codec, rows, cols, &x, &mut b).unwrap();
                assert_eq!(a, b, "{codec:?} {rows}x{cols}: encoded");
                let (mut u, mut v) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
                decode_into(codec, rows, cols, &a, &mut u).unwrap();
                decode_into_body(codec, rows, cols, &a, &mut v).unwrap();
                let bits = |w: &[f32]| w.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&u), bits(&v), "{codec:?} {rows}x{cols}: decoded");
                // Noise bytes: refused or decoded alike.
                let noise: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
                let r1 = decode_into(codec, rows, cols, &noise, &mut u).map(|_| bits(&u));
                let r2 = decode_into_body(codec, rows, cols, &noise, &mut v).map(|_| bits(&v));
                assert_eq!(r1.is_ok(), r2.is_ok(), "{codec:?}: noise");
                if let (Ok(p), Ok(q)) = (r1, r2) {
                    assert_eq!(p, q);
                }
            }
        }
    }

    fn rows_strategy() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
        (1usize..6, 1usize..40)
            .prop_flat_map(|(r, c)| (Just(r), Just(c), proptest::collection::vec(-1.0e4f32..1.0e4, r * c)))
    }

    proptest! {
        #[test]
        fn quantise_error_is_bounded((rows, cols, x) in rows_strategy(), codec_id in 0u8..4) {
            let codec = WireCodec::from_id(codec_id).unwrap();
            let bytes = encode(codec, rows, cols, &x).unwrap();
            prop_assert_eq!(bytes.len(), codec.payload_bytes(rows, cols).unwrap());
            let y = decode(codec, rows, cols, &bytes).unwrap();
            for (xr, yr) in x.chunks(cols).zip(y.chunks(cols)) {
                let absmax = xr.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let bound = error_bound(codec, absmax) * (1.0 + 1e-6) + f32::MIN_POSITIVE;
                for (a, b) in xr.iter().zip(yr) {
                    prop_assert!((a - b).abs() <= bound, "{:?}: {} -> {} (bound {})", codec, a, b, bound);
                }
            }
        }

        #[test]
        fn decode_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                          rows in 0usize..8, cols in 0usize..40, codec_id in 0u8..5) {
            let codec = WireCodec::from_id(codec_id).unwrap();
            if let Ok(v) = decode(codec, rows, cols, &bytes) {
                prop_assert_eq!(v.len(), rows * cols);
                prop_assert!(v.iter().all(|x| x.is_finite()));
            }
        }
    }

    /// A frame may name the sparse codec (merge contributions), but no
    /// tensor is encoded or decoded with it: refused, not a panic.
    #[test]
    fn the_sparse_codec_is_no_tensor_codec() {
        let c = WireCodec::SparseTopK;
        assert!(matches!(encode(c, 1, 4, &[1.0, 2.0, 3.0, 4.0]), Err(CoreError::NotATensorCodec("sparse"))));
        let bytes = vec![0u8; c.payload_bytes(1, 4).unwrap()];
        assert!(matches!(decode(c, 1, 4, &bytes), Err(CoreError::NotATensorCodec("sparse"))));
    }

    #[test]
    fn rejects_wrong_length_bad_scale_and_nonfinite() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let b = encode(WireCodec::Int8Row, 2, 2, &x).unwrap();
        assert!(matches!(decode(WireCodec::Int8Row, 2, 2, &b[..5]), Err(CoreError::PayloadLength { .. })));
        let mut bad = b.clone();
        bad[0..2].copy_from_slice(&0x7FC0u16.to_le_bytes()); // NaN scale
        assert!(decode(WireCodec::Int8Row, 2, 2, &bad).is_err());
        assert!(encode(WireCodec::Bf16, 1, 2, &[f32::NAN, 1.0]).is_err());
        assert!(decode(WireCodec::F32, 1, 1, &f32::INFINITY.to_le_bytes()).is_err());
        // A huge claimed shape with a tiny payload is refused without allocating.
        assert!(decode(WireCodec::F32, usize::MAX / 2, 3, &[0; 12]).is_err());
    }

    /// The bf16 codec handles pairs by type and checks finiteness without
    /// an early exit: a NaN or infinity anywhere is still refused, both
    /// ways, and every value bf16 holds comes back exactly.
    #[test]
    fn bf16_coding_refuses_a_nonfinite_value_anywhere() {
        // Eight significant bits at most: exact in bf16.
        let x: Vec<f32> = (0..1000).map(|i| ((i % 256) as f32 - 128.0) * (0.5f32).powi(i % 7)).collect();
        let b = encode(WireCodec::Bf16, 10, 100, &x).unwrap();
        assert_eq!(decode(WireCodec::Bf16, 10, 100, &b).unwrap(), x);
        for at in [0usize, 517, 999] {
            let mut bad = x.clone();
            bad[at] = f32::INFINITY;
            assert!(encode(WireCodec::Bf16, 10, 100, &bad).is_err(), "encoding an infinity at {at}");
        }
        for at in [0usize, 517, 999] {
            for bits in [0x7FC0u16, 0x7F80, 0xFF80] {
                let mut bad = b.clone();
                bad[2 * at..2 * at + 2].copy_from_slice(&bits.to_le_bytes());
                assert!(
                    matches!(decode(WireCodec::Bf16, 10, 100, &bad), Err(CoreError::NonFinite(_))),
                    "{bits:#x} at {at}"
                );
            }
        }
    }

    #[test]
    fn round_half_away_is_round() {
        let mut cases = vec![0.0f32, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 127.49998, 200.0, -300.7];
        for k in -130i32..=130 {
            let k = k as f32;
            cases.extend([
                k,
                k + 0.5,
                k - 0.5,
                f32::from_bits((k + 0.5).to_bits() - 1),
                f32::from_bits((k + 0.5).to_bits() + 1),
            ]);
        }
        cases.extend([0.49999997f32, -0.49999997, 1e-30, -1e-30, 8_388_607.5, -8_388_609.0, 2.1e9, -2.1e9]);
        let mut rng = iota_core::Rng::new(8);
        cases.extend((0..100_000).map(|_| (rng.next_f32() - 0.5) * 300.0));
        for y in cases {
            assert_eq!(round_half_away(y), y.round(), "{y:e}");
        }
    }

    #[test]
    fn zero_rows_round_trip_exactly() {
        let mut z = vec![0.0f32; 10];
        round_trip(WireCodec::Int4Row, 2, 5, &mut z).unwrap();
        assert!(z.iter().all(|&v| v == 0.0));
    }
}
