//! The streamed reduce's inner loop for the swarm's default merge (bf16
//! slices, no outer momentum, the norms measured as the contributions are
//! read), fused: each contribution's values are decoded, squared into its
//! norm's lanes and added into the weighted mean in one loop, and the last
//! contribution's loop also takes the outer step and encodes the update.
//! The same operations on each value in the same order as the general
//! path (`reduce_stream::reduce_chunk`: `decode_range`, `SqSum::add`,
//! `add_weighted`, `outer_step`, `codec::encode_into`), so the same bits;
//! what it saves is the passes over scratch buffers between them. Two
//! contributions (R = 2, the default) are read side by side in one loop
//! (`pair_pass`), the mean never leaving the registers.

use iota_core::codec::{bf16_to_f32, f32_to_bf16};
use iota_core::merge::flaws::{SQ_LANES, SqSum};

/// One sub-block of `acc.len()` values: `xs[i]`, contribution i's bf16
/// bytes for them (two a value); `ws[i]` its normalised weight; `sq[i]`
/// its running sum of squares; `acc` scratch; `o` the sub-block's piece of
/// the encoded update (two bytes a value, then zeros to its end: a last,
/// partial block's padding). False where the shapes do not fit or an
/// update value is not finite (the encoding refuses those).
pub fn fused_bf16(xs: &[&[u8]], ws: &[f64], sq: &mut [SqSum], lr: f32, acc: &mut [f64], o: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: this CPU has AVX-512 F and BW, checked just above.
        return unsafe { fused_avx512(xs, ws, sq, lr, acc, o) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above (std caches it).
        return unsafe { fused_avx2(xs, ws, sq, lr, acc, o) };
    }
    fused_body(xs, ws, sq, lr, acc, o)
}

/// Eight f64 lanes where AVX2 has four: the same operations on each value
/// (no fused multiply-add), so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fused_avx512(xs: &[&[u8]], ws: &[f64], sq: &mut [SqSum], lr: f32, acc: &mut [f64], o: &mut [u8]) -> bool {
    fused_body(xs, ws, sq, lr, acc, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fused_avx2(xs: &[&[u8]], ws: &[f64], sq: &mut [SqSum], lr: f32, acc: &mut [f64], o: &mut [u8]) -> bool {
    fused_body(xs, ws, sq, lr, acc, o)
}

#[inline(always)]
fn fused_body(xs: &[&[u8]], ws: &[f64], sq: &mut [SqSum], lr: f32, acc: &mut [f64], o: &mut [u8]) -> bool {
    let n = acc.len();
    let r = xs.len();
    let Some(bytes) = n.checked_mul(2) else { return false };
    if r == 0 || ws.len() != r || sq.len() != r || o.len() < bytes || xs.iter().any(|x| x.len() != bytes) {
        return false;
    }
    let (head, pad) = o.split_at_mut(bytes);
    pad.fill(0);
    let (out, _) = head.as_chunks_mut::<2>();
    if let ([x0, x1], [w0, w1], [s0, s1]) = (xs, ws, &mut *sq) {
        let (v0, v1) = (x0.as_chunks::<2>().0, x1.as_chunks::<2>().0);
        return pair_pass([v0, v1], [*w0, *w1], [s0.lanes_mut(), s1.lanes_mut()], lr, out);
    }
    let mut finite = true;
    for (i, ((x, &w), s)) in xs.iter().zip(ws).zip(sq.iter_mut()).enumerate() {
        let (vals, _) = x.as_chunks::<2>();
        let lanes = s.lanes_mut();
        let (first, last) = (i == 0, i + 1 == r);
        if last {
            let others = if first { None } else { Some(&*acc) };
            finite = last_pass(vals, w, lanes, others, lr, out);
        } else {
            add_pass(vals, w, lanes, acc, first);
        }
    }
    finite
}

/// Two contributions (R = 2, the swarm's default) read side by side: the
/// operations of `add_pass` on the first and `last_pass` on the second,
/// value by value, so the same bits; the weighted mean stays in registers
/// instead of going through `acc` and back, and both contributions' lanes
/// are local for the whole sub-block.
#[inline(always)]
fn pair_pass(
    vals: [&[[u8; 2]]; 2],
    w: [f64; 2],
    lanes: [&mut [f64; SQ_LANES]; 2],
    lr: f32,
    out: &mut [[u8; 2]],
) -> bool {
    let [l0, l1] = lanes;
    let (mut s0, mut s1) = (*l0, *l1);
    // Each lane's largest update magnitude (as bits: for non-negative
    // floats their order), finite while below infinity's: a lane-wise max
    // vectorises, where one flag or-ed in every value made a chain through
    // the mask registers.
    let mut top = [0u32; SQ_LANES];
    let step = |s0: &mut f64, s1: &mut f64, t: &mut u32, p0: &[u8; 2], p1: &[u8; 2], o: &mut [u8; 2]| {
        let v0 = f64::from(bf16_to_f32(u16::from_le_bytes(*p0)));
        *s0 += v0 * v0;
        let a = -0.0 + w[0] * v0;
        let v1 = f64::from(bf16_to_f32(u16::from_le_bytes(*p1)));
        *s1 += v1 * v1;
        let u = lr * ((a + w[1] * v1) as f32);
        *t = (*t).max(u.to_bits() & 0x7FFF_FFFF);
        *o = not_nan_to_bf16(u).to_le_bytes();
    };
    let (g0, r0) = vals[0].as_chunks::<SQ_LANES>();
    let (g1, r1) = vals[1].as_chunks::<SQ_LANES>();
    let (og, or) = out.as_chunks_mut::<SQ_LANES>();
    for ((a, b), o) in g0.iter().zip(g1).zip(og) {
        let lanes = s0.iter_mut().zip(s1.iter_mut()).zip(top.iter_mut());
        for (((((s0, s1), t), p0), p1), o) in lanes.zip(a).zip(b).zip(o) {
            step(s0, s1, t, p0, p1, o);
        }
    }
    let lanes = s0.iter_mut().zip(s1.iter_mut()).zip(top.iter_mut());
    for (((((s0, s1), t), p0), p1), o) in lanes.zip(r0).zip(r1).zip(or) {
        step(s0, s1, t, p0, p1, o);
    }
    (*l0, *l1) = (s0, s1);
    top.iter().all(|&t| t < f32::INFINITY.to_bits())
}

/// `f32_to_bf16` for every value but NaN (whose bytes differ): a NaN
/// update is never published (the sub-block reports it not finite), and
/// skipping NaN's own encoding takes a compare and a blend out of the
/// loop.
#[inline(always)]
fn not_nan_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// A contribution before the last: its squares into `lanes`, its share
/// into `acc` (set, from -0.0 as the general path starts, where `first`).
#[inline(always)]
fn add_pass(vals: &[[u8; 2]], w: f64, lanes: &mut [f64; SQ_LANES], acc: &mut [f64], first: bool) {
    let (groups, rest) = vals.as_chunks::<SQ_LANES>();
    let (acc_groups, acc_rest) = acc.as_chunks_mut::<SQ_LANES>();
    let step = |l: &mut f64, p: &[u8; 2], a: &mut f64| {
        let v = f64::from(bf16_to_f32(u16::from_le_bytes(*p)));
        *l += v * v;
        *a = if first { -0.0 + w * v } else { *a + w * v };
    };
    for (g, a) in groups.iter().zip(acc_groups) {
        lanes.iter_mut().zip(g).zip(a.iter_mut()).for_each(|((l, p), a)| step(l, p, a));
    }
    lanes.iter_mut().zip(rest).zip(acc_rest.iter_mut()).for_each(|((l, p), a)| step(l, p, a));
}

/// The last contribution: its squares into `lanes`, its share added to
/// the others' (`acc`; None: it is the only one, from -0.0), the outer
/// step without momentum (u = lr g, g the mean as f32) and the bf16
/// encoding. Whether every update value was finite.
#[inline(always)]
fn last_pass(
    vals: &[[u8; 2]],
    w: f64,
    lanes: &mut [f64; SQ_LANES],
    acc: Option<&[f64]>,
    lr: f32,
    out: &mut [[u8; 2]],
) -> bool {
    let mut bad = false;
    let mut step = |l: &mut f64, p: &[u8; 2], a: f64, o: &mut [u8; 2]| {
        let v = f64::from(bf16_to_f32(u16::from_le_bytes(*p)));
        *l += v * v;
        let u = lr * ((a + w * v) as f32);
        bad |= !u.is_finite();
        *o = f32_to_bf16(u).to_le_bytes();
    };
    let (groups, rest) = vals.as_chunks::<SQ_LANES>();
    let (out_groups, out_rest) = out.as_chunks_mut::<SQ_LANES>();
    match acc {
        Some(acc) => {
            let (acc_groups, acc_rest) = acc.as_chunks::<SQ_LANES>();
            for ((g, a), o) in groups.iter().zip(acc_groups).zip(out_groups) {
                for (((l, p), a), o) in lanes.iter_mut().zip(g).zip(a).zip(o) {
                    step(l, p, *a, o);
                }
            }
            for (((l, p), a), o) in lanes.iter_mut().zip(rest).zip(acc_rest).zip(out_rest) {
                step(l, p, *a, o);
            }
        }
        None => {
            for (g, o) in groups.iter().zip(out_groups) {
                for ((l, p), o) in lanes.iter_mut().zip(g).zip(o) {
                    step(l, p, -0.0, o);
                }
            }
            for ((l, p), o) in lanes.iter_mut().zip(rest).zip(out_rest) {
                step(l, p, -0.0, o);
            }
        }
    }
    !bad
}

/// Whether the padding of a bf16 slice of `n` values (the last block's
/// values past `n`) decodes to finite values, as the general path's decode
/// of that block requires; the fused loop reads only the values.
pub fn padding_finite(bytes: &[u8], n: usize) -> bool {
    let (pairs, _) = bytes.get(n.saturating_mul(2)..).unwrap_or_default().as_chunks::<2>();
    pairs.iter().all(|p| bf16_to_f32(u16::from_le_bytes(*p)).is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `not_nan_to_bf16` is `f32_to_bf16` on every value but NaN: every
    /// sign and exponent, with mantissas at and around each rounding
    /// boundary (ties to even both ways, carries into the exponent).
    #[test]
    fn the_pair_loops_encoding_is_the_codecs_but_for_nan() {
        let mut n = 0;
        for hi in 0..=0x1FFu32 {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1_7FFF, 0x1_8000, 0x7F_FFFF] {
                let x = f32::from_bits((hi << 23) | lo);
                if !x.is_nan() {
                    assert_eq!(not_nan_to_bf16(x), f32_to_bf16(x), "{x:e} ({:#x})", x.to_bits());
                    n += 1;
                }
            }
        }
        assert!(n > 4000, "{n} values checked");
    }
}
