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
    let norms: Vec<Option<f64>> = contribs.iter().map(|c| finite_norm((*c)?)).collect();
    let mut out = Vec::new();
    for (i, c) in contribs.iter().enumerate() {
        match (c, norms[i]) {
            (None, _) => out.push((i, Flaw::Undecodable)),
            (Some(_), None) => out.push((i, Flaw::NonFinite)),
            (Some(_), Some(norm)) => {
                let mut others: Vec<f64> =
                    norms.iter().enumerate().filter(|(j, _)| *j != i).filter_map(|(_, n)| *n).collect();
                if others.is_empty() {
                    continue;
                }
                others.sort_by(f64::total_cmp);
                let median = others[others.len() / 2];
                if median > 0.0 && norm > OUTLIER_NORM_RATIO * median {
                    out.push((i, Flaw::Outlier));
                }
            }
        }
    }
    out
}

/// The L2 norm of `c`, None if it holds a non-finite value. One pass,
/// spread over the rayon pool in fixed chunks whose partial sums are added
/// in chunk order, so the bits do not depend on the thread count (an owner
/// checks stage-sized slices here before every reduce).
fn finite_norm(c: &[f32]) -> Option<f64> {
    let partials: Vec<Option<f64>> = c
        .par_chunks(REDUCE_CHUNK)
        .map(|ch| {
            let mut s = 0.0f64;
            for &x in ch {
                if !x.is_finite() {
                    return None;
                }
                s += f64::from(x) * f64::from(x);
            }
            Some(s)
        })
        .collect();
    partials.into_iter().sum::<Option<f64>>().map(f64::sqrt)
}

#[cfg(test)]
mod tests {
    use super::*;

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
