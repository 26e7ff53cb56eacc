//! A small deterministic random generator.
//!
//! Validators re-run work and must get bit-identical results, so every random
//! choice in iota-rs (initialisation, sample addresses, pathway routing) comes
//! from this generator, whose output is fixed by this file alone and does not
//! change with a dependency's version.

/// SplitMix64: a 64-bit state advanced by a Weyl sequence and mixed by a
/// bijective finaliser. Fast, statistically solid for our needs, and trivially
/// seekable, which lets us derive independent streams from (seed, ids...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hashes a seed together with a list of ids into one well-mixed value.
/// Used to address samples and derive per-object streams: the result depends
/// on every word and on their order.
pub fn derive(seed: u64, words: &[u64]) -> u64 {
    let mut h = mix64(seed ^ GOLDEN);
    for &w in words {
        h = mix64(h.wrapping_add(GOLDEN) ^ mix64(w.wrapping_add(0x632B_E59B_D9B4_E019)));
    }
    h
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: mix64(seed) }
    }

    /// An independent stream for a (seed, ids...) address.
    pub fn derived(seed: u64, words: &[u64]) -> Self {
        Rng::new(derive(seed, words))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in [0, 1) with 24 bits of precision.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n). `n` must be non-zero. Uses Lemire's
    /// multiply-shift; the tiny bias for huge n does not matter here.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal sample (Box-Muller, computed in f64 for accuracy).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// This stream as it will be after `draws` more 64-bit draws (SplitMix64
    /// is a Weyl sequence, so seeking is one multiply). Lets a long fill be
    /// split into parts that yield exactly the sequential values.
    pub fn skipped(&self, draws: u64) -> Rng {
        Rng { state: self.state.wrapping_add(draws.wrapping_mul(GOLDEN)) }
    }

    /// Fills `out` with N(0, std^2) samples: the same bits as calling
    /// [`Rng::normal`] for each, in about a third of the time (a `1.5b`
    /// head's 628M initial weights: 14.0-14.2 s -> 5.2 s on a 2-core VM).
    ///
    /// Why it can be faster and still the same: `normal` rounds an f64 value
    /// to f32, so the f64 value need only be known well enough to say which
    /// f32 it rounds to. A block of samples is computed with polynomial `ln`
    /// and `cos` (loops the compiler vectorises, no libm call) together with
    /// a bound on their distance from libm's result; wherever that interval
    /// could round to two different f32 values (about 1 sample in 46,000)
    /// the sample is computed again through `normal`'s own libm path.
    /// Initial weights, which every miner draws at start-up, keep the values
    /// every recorded run used.
    // Inline, so a crate built with optimisation (the model, in test builds
    // too) compiles this loop itself rather than calling core's build of it.
    #[inline]
    pub fn fill_normal(&mut self, out: &mut [f32], std: f32) {
        for block in out.chunks_mut(NORMAL_BLOCK) {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: this CPU has AVX2, checked just above (std caches the check).
                unsafe { self.fill_normal_block_avx2(block, std) };
                continue;
            }
            self.fill_normal_block(block, std);
        }
    }

    /// The same code compiled for AVX2: four f64 lanes where baseline
    /// x86-64 has two. The values do not depend on it: every sample either
    /// passes the rounding test or is recomputed through libm.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn fill_normal_block_avx2(&mut self, block: &mut [f32], std: f32) {
        self.fill_normal_block(block, std)
    }

    #[inline(always)]
    fn fill_normal_block(&mut self, block: &mut [f32], std: f32) {
        let n = block.len().min(NORMAL_BLOCK);
        // The block's draws as `next_f64` makes them (u1 = the even ones),
        // addressed by position so the loop vectorises.
        let base = self.state;
        let mut u1 = [0.0f64; NORMAL_BLOCK];
        let mut u2 = [0.0f64; NORMAL_BLOCK];
        for i in 0..NORMAL_BLOCK {
            let at = 2 * i as u64;
            u1[i] = unit_f64(mix64(base.wrapping_add((at + 1).wrapping_mul(GOLDEN)))).max(f64::MIN_POSITIVE);
            u2[i] = unit_f64(mix64(base.wrapping_add((at + 2).wrapping_mul(GOLDEN))));
        }
        self.state = base.wrapping_add((2 * n as u64).wrapping_mul(GOLDEN));
        let mut lo = [0.0f32; NORMAL_BLOCK];
        let mut hi = [0.0f32; NORMAL_BLOCK];
        for i in 0..NORMAL_BLOCK {
            let (v, bound) = fast_box_muller(u1[i], u2[i]);
            (lo[i], hi[i]) = ((v - bound) as f32, (v + bound) as f32);
        }
        for i in 0..n {
            block[i] = lo[i] * std;
        }
        for i in 0..n {
            // Compared as bits: -0.0 and 0.0 are different samples.
            if lo[i].to_bits() != hi[i].to_bits() {
                block[i] = box_muller(u1[i], u2[i]) * std;
            }
        }
    }
}

/// `next_f64`'s value for the 64-bit draw `x`: (x >> 11) 2^-53, converted
/// without an integer-to-float instruction (baseline x86-64 and AVX2 have
/// none for 64-bit lanes): the low 52 bits through the 2^52 exponent trick,
/// the 53rd added as 0 or 2^52. Both parts and their sum are exact.
#[inline(always)]
fn unit_f64(x: u64) -> f64 {
    const TWO_52: u64 = 0x4330_0000_0000_0000;
    let m = x >> 11;
    let low = f64::from_bits(TWO_52 | (m & ((1 << 52) - 1))) - 4_503_599_627_370_496.0;
    let top = f64::from_bits((m >> 52).wrapping_mul(TWO_52));
    (low + top) * (1.0 / (1u64 << 53) as f64)
}

/// Samples `fill_normal` computes together.
const NORMAL_BLOCK: usize = 64;

/// `normal`'s transform of two uniforms, through libm: the reference.
#[inline]
fn box_muller(u1: f64, u2: f64) -> f32 {
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// `box_muller`'s value before its rounding to f32, computed without libm,
/// and a bound on its distance from libm's f64 value.
///
/// The bound: the polynomials below are accurate to a few f64 ulps
/// (relative 1e-15), and libm's `ln`, `sqrt`, `cos` and the product add at
/// most about 5 ulps more; the bound allows 2^-40 of the value (some 900
/// times the largest difference from libm measured over 200M samples) plus
/// an absolute term for `cos` near its zeros, where the argument
/// reduction's absolute error (~1e-20) is what counts.
#[inline(always)]
fn fast_box_muller(u1: f64, u2: f64) -> (f64, f64) {
    let r = (-2.0 * ln_unit(u1)).sqrt();
    let v = r * cos_turn(std::f64::consts::TAU * u2);
    (v, v.abs() * (1.0 / (1u64 << 40) as f64) + r * 1e-18)
}

/// ln(u) for a positive normal f64 (the uniform draws: 2^-1022 up to 1).
/// u = 2^e m with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s) for
/// s = (m-1)/(m+1), |s| < 0.172, by its series to s^17 (truncation below
/// 1e-15 relative). Near u = 1, m - 1 is exact, so small results keep their
/// relative accuracy.
#[inline(always)]
fn ln_unit(u: f64) -> f64 {
    const LN2: f64 = std::f64::consts::LN_2;
    const EXPONENT: u64 = 0x7ff0_0000_0000_0000;
    const ONE: u64 = 0x3ff0_0000_0000_0000;
    // Written in u64 and f64 operations only (no i64 <-> f64 conversion,
    // which baseline x86-64 lacks in vector form), so the block loop
    // vectorises.
    let bits = u.to_bits();
    // Moving the split point from 1 to sqrt(1/2): adding the mantissa
    // distance from sqrt(1/2) to 1 carries into the exponent exactly when
    // the mantissa is at least sqrt(2)'s.
    const OFFSET: u64 = ONE - 0x3fe6_a09e_667f_3bcd;
    let exponent_field = bits.wrapping_add(OFFSET) & EXPONENT;
    let m = f64::from_bits(bits.wrapping_sub(exponent_field).wrapping_add(ONE));
    // The unbiased exponent as f64: (2^52 + field) - (2^52 + 1023), exact.
    const MAGIC: u64 = 0x4330_0000_0000_0000;
    let e = f64::from_bits(MAGIC | (exponent_field >> 52)) - (4_503_599_627_370_496.0 + 1023.0);
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let series = 1.0
        + z * (1.0 / 3.0
            + z * (1.0 / 5.0
                + z * (1.0 / 7.0
                    + z * (1.0 / 9.0 + z * (1.0 / 11.0 + z * (1.0 / 13.0 + z * (1.0 / 15.0 + z * (1.0 / 17.0))))))));
    e * LN2 + 2.0 * s * series
}

/// cos(x) for x in [0, 2 pi]: reduced by the nearest multiple of pi/2 (pi/2
/// split in three parts, so the reduced argument is exact to ~1e-20), then
/// the Taylor series of cos or sin to the 16th power on |y| <= pi/4
/// (truncation below 1e-16 relative).
#[inline(always)]
fn cos_turn(x: f64) -> f64 {
    // pi/2 = P1 + P2 + P3 (fdlibm's split, to ~1e-31): P1 and P2 have 33
    // significant bits, so k * P1 and k * P2 are exact for the k (0 to 4)
    // this range needs.
    const P1: f64 = f64::from_bits(0x3ff9_21fb_5440_0000); // 1.57079632673412561417
    const P2: f64 = f64::from_bits(0x3dd0_b461_1a60_0000); // 6.07710050630396597660e-11
    const P3: f64 = f64::from_bits(0x3ba3_198a_2e03_7073); // 2.02226624879595063154e-21
    // Rounding to the nearest integer by adding 2^52: k's low bits are then
    // the low bits of the sum's mantissa (u64 and f64 operations only, as above).
    const ROUNDER: f64 = 4_503_599_627_370_496.0;
    let shifted = x * std::f64::consts::FRAC_2_PI + ROUNDER;
    let k = shifted - ROUNDER;
    let quadrant = shifted.to_bits() & 3;
    let y = ((x - k * P1) - k * P2) - k * P3;
    let z = y * y;
    let cos = 1.0
        - z * (1.0 / 2.0
            - z * (1.0 / 24.0
                - z * (1.0 / 720.0
                    - z * (1.0 / 40_320.0
                        - z * (1.0 / 3_628_800.0
                            - z * (1.0 / 479_001_600.0
                                - z * (1.0 / 87_178_291_200.0 - z * (1.0 / 20_922_789_888_000.0))))))));
    let sin = y
        * (1.0
            - z * (1.0 / 6.0
                - z * (1.0 / 120.0
                    - z * (1.0 / 5_040.0
                        - z * (1.0 / 362_880.0
                            - z * (1.0 / 39_916_800.0
                                - z * (1.0 / 6_227_020_800.0 - z * (1.0 / 1_307_674_368_000.0))))))));
    // Quadrant mod 4: cos, -sin, -cos, sin; chosen by masks, not branches.
    let odd = 0u64.wrapping_sub(quadrant & 1);
    let picked = (sin.to_bits() & odd) | (cos.to_bits() & !odd);
    let negate = ((quadrant ^ (quadrant >> 1)) & 1) << 63;
    f64::from_bits(picked ^ negate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let a: Vec<u64> = (0..8).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..8).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
        let c: Vec<u64> = (0..8).scan(Rng::new(8), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(derive(1, &[2, 3]), derive(1, &[3, 2]));
    }

    #[test]
    fn a_skipped_stream_continues_where_the_draws_would_have_left_it() {
        let mut r = Rng::new(5);
        let ahead = r.skipped(1000);
        for _ in 0..1000 {
            r.next_u64();
        }
        assert_eq!(r, ahead);
        // Normals take two draws each: a fill split at element k resumes at 2k.
        let mut whole = vec![0.0f32; 10];
        Rng::new(9).fill_normal(&mut whole, 1.0);
        let mut tail = vec![0.0f32; 4];
        Rng::new(9).skipped(2 * 6).fill_normal(&mut tail, 1.0);
        assert_eq!(&whole[6..], &tail[..]);
    }

    /// `normal`'s values for `n` draws from `seed`, one call at a time.
    fn normals_one_by_one(seed: u64, n: usize, std: f32) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n).map(|_| r.normal() * std).collect()
    }

    #[test]
    fn fill_normal_gives_normals_bits_in_blocks_and_remainders() {
        let want = normals_one_by_one(21, 200_003, 0.02);
        let mut got = vec![0.0f32; want.len()];
        let mut r = Rng::new(21);
        r.fill_normal(&mut got, 0.02);
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        // The stream goes on where one-by-one draws would leave it.
        let mut one_by_one = Rng::new(21);
        for _ in 0..want.len() {
            one_by_one.normal();
        }
        assert_eq!(r, one_by_one);
        // The portable block (no AVX2), on lengths below, at and across a block.
        for len in [1, 5, NORMAL_BLOCK - 1, NORMAL_BLOCK, NORMAL_BLOCK + 3] {
            let mut block = vec![0.0f32; len];
            let mut r = Rng::new(5);
            for part in block.chunks_mut(NORMAL_BLOCK) {
                r.fill_normal_block(part, 1.5);
            }
            assert_eq!(block, normals_one_by_one(5, len, 1.5), "length {len}");
        }
    }

    #[test]
    fn unit_f64_is_next_f64s_conversion() {
        let mut r = Rng::new(3);
        let edges = [0, 1, (1 << 11) - 1, 1 << 11, 1 << 63, (1 << 63) - 1, u64::MAX, u64::MAX - (1 << 11)];
        for x in edges.into_iter().chain((0..10_000).map(|_| r.next_u64())) {
            let want = (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            assert_eq!(unit_f64(x).to_bits(), want.to_bits(), "{x:#x}");
        }
    }

    #[test]
    fn fast_box_muller_stays_far_inside_its_bound() {
        // libm's value before rounding, as `normal` computes it.
        let libm = |u1: f64, u2: f64| (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let ulp = f64::EPSILON;
        let mut u1s = vec![f64::MIN_POSITIVE, ulp / 2.0, ulp, 0.5 - ulp / 4.0, 0.5, 1.0 - ulp / 2.0];
        // Around sqrt(1/2) scaled by powers of two, where ln_unit changes exponent.
        for k in 1..60 {
            let split = std::f64::consts::FRAC_1_SQRT_2 / (1u64 << k) as f64 * 2.0;
            u1s.extend([split * (1.0 - ulp), split, split * (1.0 + ulp)]);
        }
        // Around the quadrant edges (pi/4 odd multiples) and zeros of cos.
        let mut u2s = vec![0.0, 1.0 - ulp / 2.0];
        for eighth in 1..8 {
            let at = eighth as f64 / 8.0;
            u2s.extend([at * (1.0 - ulp), at, at * (1.0 + ulp)]);
        }
        let mut r = Rng::new(8);
        let random: Vec<(f64, f64)> =
            (0..100_000).map(|_| (r.next_f64().max(f64::MIN_POSITIVE), r.next_f64())).collect();
        let edges = u1s.iter().flat_map(|&a| u2s.iter().map(move |&b| (a, b)));
        let mut worst = 0.0f64;
        for (u1, u2) in edges.chain(random) {
            let (v, bound) = fast_box_muller(u1, u2);
            let exact = libm(u1, u2);
            let ratio = (v - exact).abs() / bound;
            worst = worst.max(ratio);
            assert!(ratio < 0.01, "u1 {u1:e} u2 {u2:e}: {v:e} vs libm {exact:e}, bound {bound:e}");
        }
        assert!(worst > 0.0, "the comparison saw no difference at all: is it comparing libm with itself?");
    }

    #[test]
    fn the_libm_fallback_runs_and_is_rare() {
        let mut r = Rng::new(77);
        let n = 1_000_000;
        let fallbacks = (0..n)
            .filter(|_| {
                let (v, b) = fast_box_muller(r.next_f64().max(f64::MIN_POSITIVE), r.next_f64());
                (v - b) as f32 != (v + b) as f32
            })
            .count();
        // About 2e-5 of samples (some 20 here): none would leave the libm
        // path unexercised by this seed, a thousand a bound loose enough to
        // cost speed.
        assert!((1..1000).contains(&fallbacks), "{fallbacks} fallbacks in {n}");
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(42);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal() as f64).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::new(3);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let v = r.below(10) as usize;
            seen[v] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
    }
}
