//! Contributions every honest owner rejects the same way: checks that
//! depend only on the contributions an owner holds, so two honest owners of
//! one partition, given the same contributions (which the signed headers
//! they hand on show), flag the same senders.
//!
//! The robust reduce already keeps such a contribution out of the result;
//! flagging names its sender. The orchestrator convicts a sender that two
//! owners other than itself flag: as much trust as it puts in two owners'
//! agreeing result. With two replicas every partition is owned by both, so
//! the only other owner's word is not enough and nobody is convicted (the
//! robust reduce still contains the contribution).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::reduce::REDUCE_CHUNK;

/// How far above the others' median L2 norm a contribution may lie. An
/// honest replica's pseudo-gradient grows with the inner steps it took, so
/// the band is wide: an honest replica that did a hundred times the work of
/// the others stays well inside it.
pub const OUTLIER_NORM_RATIO: f64 = 1_000.0;

/// Why an owner flags a contribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Flaw {
    /// Its payload does not decode as the merge codec's slice.
    Undecodable,
    /// It holds a NaN or an infinity.
    NonFinite,
    /// Its L2 norm is more than `OUTLIER_NORM_RATIO` times the median norm
    /// of the others (when that median is positive).
    Outlier,
}

/// The contributions (participant index, flaw) an honest owner flags.
/// `contribs[i]` is participant i's decoded slice, None if it did not
/// decode. Deterministic: the order and the arithmetic depend only on the
/// inputs.
pub fn flaws(contribs: &[Option<&[f32]>]) -> Vec<(usize, Flaw)> {
    let norms: Vec<Option<Option<f64>>> = contribs.iter().map(|c| c.map(finite_norm)).collect();
    flaws_of_norms(&norms)
}

/// `flaws`, from each contribution's L2 norm: None where it did not
/// decode, Some(None) where it holds a non-finite value (`finite_norm`'s
/// arithmetic: [`chunk_sq_sum`] over `REDUCE_CHUNK` chunks, added by
/// [`norm_of_partials`]). A reduce that measures the norms in its own
/// pass over the contributions flags exactly as `flaws` does.
pub fn flaws_of_norms(norms: &[Option<Option<f64>>]) -> Vec<(usize, Flaw)> {
    let finite = |n: &Option<Option<f64>>| n.flatten();
    let mut out = Vec::new();
    for (i, n) in norms.iter().enumerate() {
        match n {
            None => out.push((i, Flaw::Undecodable)),
            Some(None) => out.push((i, Flaw::NonFinite)),
            Some(Some(norm)) => {
                let mut others: Vec<f64> =
                    norms.iter().enumerate().filter(|(j, _)| *j != i).filter_map(|(_, n)| finite(n)).collect();
                if others.is_empty() {
                    continue;
                }
                others.sort_by(f64::total_cmp);
                let median = others[others.len() / 2];
                if median > 0.0 && *norm > OUTLIER_NORM_RATIO * median {
                    out.push((i, Flaw::Outlier));
                }
            }
        }
    }
    out
}

/// Running sums a chunk's sum of squares keeps: value j goes to lane
/// j mod `SQ_LANES`, and the lanes are added in order at the end. One
/// running sum waits on every add before the next (about 4 cycles a
/// value, which made the norm pass the slowest part of a reduce); sixteen
/// independent ones vectorise. Fixed, so the bits are the same anywhere.
pub const SQ_LANES: usize = 16;

/// The sum of squares (in f64) of one chunk of a contribution, None if it
/// holds a non-finite value. Squares of finite f32 values cannot overflow
/// f64 however many a chunk holds, so the sum is finite exactly when every
/// value is: one test at the end, none in the loop.
pub fn chunk_sq_sum(ch: &[f32]) -> Option<f64> {
    let mut s = SqSum::default();
    s.add(ch);
    s.finish()
}

/// A chunk's sum of squares fed in pieces, in order (a pass that reads a
/// chunk a sub-block at a time measures the norm as it goes): every piece
/// but the last a multiple of `SQ_LANES` long, so each value lands in the
/// lane it would in one call, and `finish` gives `chunk_sq_sum`'s bits.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqSum {
    lanes: [f64; SQ_LANES],
}

impl SqSum {
    /// Adds the chunk's next values.
    pub fn add(&mut self, x: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: this CPU has AVX2, checked just above (std caches it).
            unsafe { sq_add_avx2(&mut self.lanes, x) };
            return;
        }
        sq_add_body(&mut self.lanes, x);
    }

    /// The lanes, for a loop that adds each value's square itself (value j
    /// of the chunk to lane j mod `SQ_LANES`, in order), fused with other
    /// work on the same values.
    pub fn lanes_mut(&mut self) -> &mut [f64; SQ_LANES] {
        &mut self.lanes
    }

    /// The chunk's sum of squares, None if a value was not finite.
    pub fn finish(&self) -> Option<f64> {
        let s = self.lanes.iter().fold(0.0f64, |a, l| a + l);
        s.is_finite().then_some(s)
    }
}

/// The same code in AVX2 (four f64 lanes where baseline x86-64 has two):
/// the same operations on each value in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sq_add_avx2(lanes: &mut [f64; SQ_LANES], ch: &[f32]) {
    sq_add_body(lanes, ch)
}

#[inline(always)]
fn sq_add_body(lanes: &mut [f64; SQ_LANES], ch: &[f32]) {
    let (body, rest) = ch.as_chunks::<SQ_LANES>();
    for block in body {
        for (l, &x) in lanes.iter_mut().zip(block) {
            *l += f64::from(x) * f64::from(x);
        }
    }
    for (l, &x) in lanes.iter_mut().zip(rest) {
        *l += f64::from(x) * f64::from(x);
    }
}

/// The L2 norm from the chunks' `chunk_sq_sum`s, added in chunk order.
pub fn norm_of_partials(partials: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    partials.into_iter().sum::<Option<f64>>().map(f64::sqrt)
}

/// The L2 norm of `c`, None if it holds a non-finite value. One pass,
/// spread over the rayon pool in fixed chunks whose partial sums are added
/// in chunk order, so the bits do not depend on the thread count (an owner
/// checks stage-sized slices here before every reduce).
fn finite_norm(c: &[f32]) -> Option<f64> {
    let partials: Vec<Option<f64>> = c.par_chunks(REDUCE_CHUNK).map(chunk_sq_sum).collect();
    norm_of_partials(partials)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk fed to `SqSum` in pieces (multiples of `SQ_LANES`, the last
    /// any length) gives `chunk_sq_sum`'s bits for the whole chunk, and a
    /// non-finite value in any piece makes it None.
    #[test]
    fn a_sum_of_squares_fed_in_pieces_is_the_chunks() {
        let mut rng = crate::Rng::new(3);
        for len in [1usize, 15, 16, 17, 1024, 4096 + 7, REDUCE_CHUNK] {
            let x: Vec<f32> = (0..len).map(|_| rng.normal() * 10f32.powi((rng.below(9) as i32) - 4)).collect();
            for piece in [16usize, 48, 1024] {
                let mut s = SqSum::default();
                x.chunks(piece).for_each(|p| s.add(p));
                assert_eq!(s.finish().map(f64::to_bits), chunk_sq_sum(&x).map(f64::to_bits), "len {len} piece {piece}");
            }
            let mut bad = x.clone();
            bad[len - 1] = f32::INFINITY;
            let mut s = SqSum::default();
            bad.chunks(16).for_each(|p| s.add(p));
            assert_eq!(s.finish(), None);
        }
    }

    /// The lanes' sum is the sum of squares (to rounding), and any
    /// non-finite value, wherever it sits, makes the chunk's sum None.
    #[test]
    fn a_chunks_sum_of_squares_is_lane_by_lane_and_refuses_non_finite_values() {
        let mut rng = crate::rng::Rng::new(4);
        for n in [0, 1, SQ_LANES - 1, SQ_LANES, 5 * SQ_LANES + 3] {
            let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let plain: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let got = chunk_sq_sum(&x).unwrap();
            assert!((got - plain).abs() <= 1e-12 * plain.max(1.0), "{n}: {got} vs {plain}");
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for at in [0, n / 2, n.saturating_sub(1)] {
                    if n == 0 {
                        continue;
                    }
                    let mut y = x.clone();
                    y[at] = bad;
                    assert_eq!(chunk_sq_sum(&y), None, "{bad} at {at} of {n}");
                }
            }
        }
        // The largest finite values do not overflow the sum.
        assert!(chunk_sq_sum(&vec![f32::MAX; crate::merge::reduce::REDUCE_CHUNK]).is_some());
    }

    #[test]
    fn broken_and_outlying_contributions_are_flagged_and_honest_spreads_are_not() {
        let honest = [vec![0.01f32; 64], vec![-0.02; 64], vec![0.015; 64]];
        fn refs(v: &[Vec<f32>]) -> Vec<Option<&[f32]>> {
            v.iter().map(|c| Some(c.as_slice())).collect()
        }
        assert_eq!(flaws(&refs(&honest)), vec![]);
        // A replica with a hundred times the others' steps is still honest.
        let busy = [vec![0.01f32; 64], vec![-0.02; 64], vec![1.5; 64]];
        assert_eq!(flaws(&refs(&busy)), vec![]);
        // One that did nothing sends zeros: not flagged, nor are the others.
        let idle = [vec![0.0f32; 64], vec![-0.02; 64], vec![0.015; 64]];
        assert_eq!(flaws(&refs(&idle)), vec![]);
        let mut nan = honest.clone();
        nan[1][7] = f32::NAN;
        assert_eq!(flaws(&refs(&nan)), vec![(1, Flaw::NonFinite)]);
        let mut huge = honest.clone();
        huge[2].iter_mut().for_each(|x| *x = *x * 1e6 + 1.0);
        assert_eq!(flaws(&refs(&huge)), vec![(2, Flaw::Outlier)]);
        let mut missing = refs(&honest);
        missing[0] = None;
        assert_eq!(flaws(&missing), vec![(0, Flaw::Undecodable)]);
        // Two participants: each is measured against the other.
        assert_eq!(flaws(&refs(&huge[1..])), vec![(1, Flaw::Outlier)]);
        assert_eq!(flaws(&refs(&[vec![0.0; 4], vec![3.0; 4]])), vec![], "nothing to measure against");
    }

    /// The norm runs over chunks in parallel: a bad value in any chunk is
    /// seen, and the bits do not depend on the thread count.
    #[test]
    fn the_chunked_norm_sees_every_chunk_and_ignores_the_thread_count() {
        let n = 3 * REDUCE_CHUNK + 5;
        let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| finite_norm(&v)).unwrap()
        };
        let one = on(1);
        assert_eq!(one.to_bits(), on(3).to_bits());
        let plain = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
        assert!((one - plain).abs() < 1e-9 * plain);
        for at in [0, REDUCE_CHUNK + 1, n - 1] {
            let mut bad = v.clone();
            bad[at] = f32::INFINITY;
            assert_eq!(finite_norm(&bad), None, "a bad value at {at}");
        }
    }
}
