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

    /// Fills `out` with N(0, std^2) samples.
    pub fn fill_normal(&mut self, out: &mut [f32], std: f32) {
        for x in out {
            *x = self.normal() * std;
        }
    }
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
