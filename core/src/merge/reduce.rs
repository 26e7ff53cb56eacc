//! The reduce of one partition: a (robust) weighted mean of the
//! participants' pseudo-gradients, then the outer optimizer.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How an owner combines the participants' pseudo-gradients.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReduceRule {
    /// Work-weighted mean. Not robust: one replica can move it anywhere.
    Mean,
    /// Coordinate-wise: drop the `trim` lowest and highest values, then the
    /// work-weighted mean of the rest.
    TrimmedMean { trim: u32 },
    /// Centered clipping (Karimireddy, He, Jaggi 2021): start at the
    /// coordinate-wise median; `iters` times, move by the weighted mean of
    /// each contribution's offset, each offset's norm clipped to tau, where
    /// tau is `tau_factor` times the median offset norm.
    CenteredClip { tau_factor: f32, iters: u32 },
}

impl ReduceRule {
    pub fn parse(s: &str) -> Option<ReduceRule> {
        match s {
            "mean" => Some(ReduceRule::Mean),
            "trimmed-mean" => Some(ReduceRule::TrimmedMean { trim: 1 }),
            "centered-clip" => Some(ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }),
            _ => None,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            ReduceRule::Mean => "mean",
            ReduceRule::TrimmedMean { .. } => "trimmed-mean",
            ReduceRule::CenteredClip { .. } => "centered-clip",
        }
    }
}

/// The outer optimizer: SGD with Nesterov momentum on the pseudo-gradient.
/// lr 1 and momentum 0 make the merge a plain average of the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OuterOpt {
    pub lr: f32,
    pub momentum: f32,
}

impl OuterOpt {
    pub const AVERAGE: OuterOpt = OuterOpt { lr: 1.0, momentum: 0.0 };

    /// The optimizer of merge `k` (0-based) when the momentum warms up over
    /// `warmup` merges: it rises linearly from 0.5 to its setting, as IOTA
    /// warms its outer momentum from 0.5 to 0.9 (a large momentum on the
    /// first, largest pseudo-gradients overshoots). A setting of 0.5 or
    /// less, or no warm-up, applies from the first merge.
    pub fn at_merge(self, warmup: u64, k: u64) -> OuterOpt {
        if warmup == 0 || self.momentum <= 0.5 || k >= warmup {
            return self;
        }
        let f = k as f32 / warmup as f32;
        OuterOpt { lr: self.lr, momentum: 0.5 + (self.momentum - 0.5) * f }
    }
}

/// What one slice reduce did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReduceStats {
    /// Contributions left out because they held a non-finite value.
    pub rejected_non_finite: usize,
    /// Contributions whose offset was clipped (centered clipping).
    pub clipped: usize,
}

/// Coordinates per parallel task. Fixed, not a function of the thread
/// count: every sum over coordinates adds per-chunk partials in chunk
/// order, so a reduce gives the same bits on any machine.
pub const REDUCE_CHUNK: usize = 1 << 14;

/// Reduces one partition. `contribs[i]` is participant i's pseudo-gradient
/// slice (None if it never arrived) and `weights[i]` its work weight;
/// `momentum` is the outer momentum slice, updated in place. Returns the
/// update u (theta_next = theta_prev - u). Per coordinate, sums run in f64
/// in participant order; sums over coordinates (centered clipping's
/// distances) add fixed chunks' partials in order; so two owners given the
/// same inputs produce the same bits, whatever their core counts.
/// Coordinates are spread over the rayon pool in chunks of `REDUCE_CHUNK`.
pub fn reduce_slice(
    rule: ReduceRule,
    outer: OuterOpt,
    contribs: &[Option<&[f32]>],
    weights: &[f64],
    momentum: &mut [f32],
) -> (Vec<f32>, ReduceStats) {
    let n = momentum.len();
    let mut stats = ReduceStats::default();
    // Contributions that may take part: present, right length, all finite.
    let mut used: Vec<(&[f32], f64)> = Vec::with_capacity(contribs.len());
    for (c, &w) in contribs.iter().zip(weights) {
        let Some(c) = c else { continue };
        if c.len() != n || !c.par_chunks(REDUCE_CHUNK).all(|c| c.iter().all(|x| x.is_finite())) {
            stats.rejected_non_finite += 1;
            continue;
        }
        used.push((c, w));
    }
    let mut g = vec![0.0f32; n];
    if !used.is_empty() {
        let total: f64 = used.iter().map(|u| u.1).sum();
        let norm: Vec<f64> =
            used.iter().map(|u| if total > 0.0 { u.1 / total } else { 1.0 / used.len() as f64 }).collect();
        match rule {
            ReduceRule::Mean => weighted_mean(&used, &norm, &mut g),
            ReduceRule::TrimmedMean { trim } => trimmed_mean(&used, &norm, trim as usize, &mut g),
            ReduceRule::CenteredClip { tau_factor, .. } if clip_cannot_bite(used.len(), tau_factor) => {
                weighted_mean(&used, &norm, &mut g)
            }
            ReduceRule::CenteredClip { tau_factor, iters } => {
                stats.clipped = centered_clip(&used, &norm, tau_factor, iters, &mut g)
            }
        }
    }
    outer_step(outer, &mut g, momentum);
    (g, stats)
}

/// The outer step on the reduced pseudo-gradient `g`, written over it as
/// the update (each coordinate reads its own g only, so in place gives the
/// same bits). Nesterov: m <- mu m + g; u = lr (g + mu m). With no
/// momentum (mu = 0: the default, and then at every merge of the run, as
/// `OuterOpt::at_merge` never warms up from 0) the momentum is neither
/// read nor written and u = lr g: a reduce then reads the contributions
/// and writes the update, and nothing else stage-sized.
pub fn outer_step(outer: OuterOpt, g: &mut [f32], momentum: &mut [f32]) {
    let (lr, mu) = (outer.lr, outer.momentum);
    if mu == 0.0 {
        g.par_chunks_mut(REDUCE_CHUNK).for_each(|u| u.iter_mut().for_each(|u| *u *= lr));
        return;
    }
    g.par_chunks_mut(REDUCE_CHUNK).zip(momentum.par_chunks_mut(REDUCE_CHUNK)).for_each(|(u, m)| {
        for (u, m) in u.iter_mut().zip(m.iter_mut()) {
            let g = *u;
            *m = mu * *m + g;
            *u = lr * (g + mu * *m);
        }
    });
}

/// Whether centered clipping is the weighted mean for `r` contributions,
/// so its passes can be skipped. With two, the centre always lies between
/// them (the median is their midpoint, and each step, clipping neither,
/// lands on a weighted mean of the two), so the two distances add up to
/// the distance between the contributions and tau = `tau_factor` x their
/// mean is at least their sum, hence at least the larger one, when
/// `tau_factor` >= 2: nothing is ever clipped, and a step that clips
/// nothing moves any centre onto the weighted mean
/// (v + sum_i w_i (c_i - v) = sum_i w_i c_i with the w_i adding to 1).
/// Two contributions cannot be told apart by a median-based rule anyway:
/// neither is the outlier. The iterations would reach the same value up
/// to rounding in four passes over the contributions; this takes one
/// (`centered_clip_of_two_is_their_weighted_mean` checks the claim
/// against the iterations). Every owner and auditor runs this function,
/// so they agree on the bits either way.
pub fn clip_cannot_bite(r: usize, tau_factor: f32) -> bool {
    r <= 2 && tau_factor >= 2.0
}

/// `out[j] = sum_i w_i c_i[j]` over chunks of coordinates, each summing
/// participants in order into f64 (from -0.0, as `Iterator::sum` does, so
/// an all-zero column keeps its sign).
fn weighted_mean(used: &[(&[f32], f64)], w: &[f64], out: &mut [f32]) {
    out.par_chunks_mut(REDUCE_CHUNK).enumerate().for_each(|(ci, o)| {
        let at = ci * REDUCE_CHUNK;
        let mut acc = vec![-0.0f64; o.len()];
        for ((c, _), w) in used.iter().zip(w) {
            for (a, &x) in acc.iter_mut().zip(&c[at..at + o.len()]) {
                *a += w * x as f64;
            }
        }
        for (o, a) in o.iter_mut().zip(acc) {
            *o = a as f32;
        }
    });
}

fn trimmed_mean(used: &[(&[f32], f64)], w: &[f64], trim: usize, out: &mut [f32]) {
    let r = used.len();
    // Never trim everything: keep at least one value per coordinate.
    let trim = trim.min(r.saturating_sub(1) / 2);
    out.par_chunks_mut(REDUCE_CHUNK).enumerate().for_each(|(ci, o)| {
        let at = ci * REDUCE_CHUNK;
        let mut col: Vec<(f32, f64)> = Vec::with_capacity(r);
        for (j, o) in o.iter_mut().enumerate() {
            col.clear();
            col.extend(used.iter().zip(w).map(|((c, _), w)| (c[at + j], *w)));
            col.sort_by(|a, b| a.0.total_cmp(&b.0));
            let kept = &col[trim..r - trim];
            let wsum: f64 = kept.iter().map(|k| k.1).sum();
            let s: f64 = kept.iter().map(|k| k.1 * k.0 as f64).sum();
            *o = if wsum > 0.0 {
                (s / wsum) as f32
            } else {
                (kept.iter().map(|k| k.0 as f64).sum::<f64>() / kept.len() as f64) as f32
            };
        }
    });
}

fn median_of(v: &mut [f32]) -> f32 {
    match *v {
        // The same bits as the sort below gives (the sum is commutative),
        // without the sort: two replicas are the common case.
        [a] => a,
        [a, b] => ((a as f64 + b as f64) / 2.0) as f32,
        _ => {
            v.sort_by(f32::total_cmp);
            let n = v.len();
            if n % 2 == 1 { v[n / 2] } else { ((v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0) as f32 }
        }
    }
}

/// Each contribution's squared distance to `center` over one chunk of
/// coordinates starting at `at` (summed in coordinate order).
fn chunk_sq_distances(used: &[(&[f32], f64)], at: usize, center: &[f32]) -> Vec<f64> {
    used.iter()
        .map(|(c, _)| c[at..at + center.len()].iter().zip(center).map(|(&x, &v)| ((x - v) as f64).powi(2)).sum::<f64>())
        .collect()
}

/// The distances from the per-chunk partials, added in chunk order.
fn distances_of(partials: &[Vec<f64>], r: usize) -> Vec<f64> {
    (0..r).map(|i| partials.iter().map(|p| p[i]).sum::<f64>().sqrt()).collect()
}

/// Centered clipping: from the coordinate-wise median, `iters` steps of
/// v + sum_i w_i s_i (c_i - v), s_i clipping contribution i's offset to
/// tau = tau_factor x the median distance.
///
/// Each step needs every contribution's distance to the current centre,
/// a sum over all coordinates. The pass that writes a centre's chunk also
/// measures the distances to it (per-chunk partials, added in chunk order
/// afterwards), so the reduce reads the contributions 1 + iters times
/// instead of 1 + 2 x iters: the same sums in the same order, the same
/// bits (the test keeps the two-pass form to check that).
fn centered_clip(used: &[(&[f32], f64)], w: &[f64], tau_factor: f32, iters: u32, out: &mut [f32]) -> usize {
    let r = used.len();
    let iters = iters.max(1);
    let mut partials: Vec<Vec<f64>> = out
        .par_chunks_mut(REDUCE_CHUNK)
        .enumerate()
        .map(|(ci, o)| {
            let at = ci * REDUCE_CHUNK;
            let mut col = vec![0.0f32; r];
            for (j, o) in o.iter_mut().enumerate() {
                for (i, (c, _)) in used.iter().enumerate() {
                    col[i] = c[at + j];
                }
                *o = median_of(&mut col);
            }
            chunk_sq_distances(used, at, o)
        })
        .collect();
    let mut clipped = vec![false; r];
    for it in 0..iters {
        let dist = distances_of(&partials, r);
        let mut d32: Vec<f32> = dist.iter().map(|&d| d as f32).collect();
        let tau = tau_factor as f64 * median_of(&mut d32) as f64;
        let scale: Vec<f64> = dist
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if d > tau && d > 0.0 {
                    clipped[i] = true;
                    tau / d
                } else {
                    1.0
                }
            })
            .collect();
        let coef: Vec<f64> = w.iter().zip(&scale).map(|(w, s)| w * s).collect();
        let last = it + 1 == iters;
        // v + sum_i w_i s_i (c_i - v), the sum over participants in order;
        // then (but after the last step) the distances to the new centre.
        partials = out
            .par_chunks_mut(REDUCE_CHUNK)
            .enumerate()
            .map(|(ci, o)| {
                let at = ci * REDUCE_CHUNK;
                let mut step = vec![-0.0f64; o.len()];
                for ((c, _), k) in used.iter().zip(&coef) {
                    for ((s, &x), &v) in step.iter_mut().zip(&c[at..at + o.len()]).zip(o.iter()) {
                        *s += k * (x as f64 - v as f64);
                    }
                }
                for (o, s) in o.iter_mut().zip(step) {
                    *o = (*o as f64 + s) as f32;
                }
                if last { Vec::new() } else { chunk_sq_distances(used, at, o) }
            })
            .collect();
    }
    clipped.iter().filter(|&&c| c).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn honest(r: usize, n: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = Rng::new(seed);
        let base: Vec<f32> = (0..n).map(|_| rng.normal() * 0.01).collect();
        (0..r).map(|_| base.iter().map(|&b| b + rng.normal() * 0.002).collect()).collect()
    }

    fn mean_of(xs: &[Vec<f32>], w: &[f64]) -> Vec<f32> {
        let t: f64 = w.iter().sum();
        (0..xs[0].len()).map(|j| (xs.iter().zip(w).map(|(x, w)| w * x[j] as f64).sum::<f64>() / t) as f32).collect()
    }

    fn dist(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt()
    }

    fn norm(a: &[f32]) -> f64 {
        a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt()
    }

    #[test]
    fn outer_momentum_warms_up_linearly_from_one_half() {
        let o = OuterOpt { lr: 0.7, momentum: 0.9 };
        assert_eq!(o.at_merge(4, 0), OuterOpt { lr: 0.7, momentum: 0.5 });
        assert!((o.at_merge(4, 2).momentum - 0.7).abs() < 1e-6);
        assert_eq!(o.at_merge(4, 4), o);
        assert_eq!(o.at_merge(4, 100), o);
        assert_eq!(o.at_merge(0, 0), o, "no warm-up");
        let low = OuterOpt { lr: 1.0, momentum: 0.3 };
        assert_eq!(low.at_merge(4, 0), low, "never raised above its setting");
    }

    #[test]
    fn mean_with_lr_one_and_no_momentum_is_the_weighted_mean() {
        let xs = honest(5, 1001, 1);
        let w = [1.0, 2.0, 3.0, 4.0, 5.0];
        let wn: Vec<f64> = w.iter().map(|x| x / 15.0).collect();
        let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
        let mut m = vec![0.0; 1001];
        let (u, st) = reduce_slice(ReduceRule::Mean, OuterOpt::AVERAGE, &refs, &wn, &mut m);
        assert!(dist(&u, &mean_of(&xs, &w)) < 1e-6 * norm(&u));
        assert_eq!(st, ReduceStats::default());
        assert!(m.iter().all(|&v| v == 0.0), "with no momentum, the momentum is left alone");
    }

    #[test]
    fn nesterov_matches_its_definition() {
        let g = [vec![1.0f32, -2.0]];
        let refs: Vec<Option<&[f32]>> = g.iter().map(|x| Some(x.as_slice())).collect();
        let mut m = vec![0.5f32, 0.5];
        let o = OuterOpt { lr: 0.7, momentum: 0.9 };
        let (u, _) = reduce_slice(ReduceRule::Mean, o, &refs, &[1.0], &mut m);
        // m = 0.9*0.5 + g; u = 0.7 (g + 0.9 m)
        let m0 = 0.9 * 0.5 + 1.0;
        assert!((m[0] - m0).abs() < 1e-6);
        assert!((u[0] - 0.7 * (1.0 + 0.9 * m0)).abs() < 1e-6);
        assert!((u[1] - 0.7 * (-2.0 + 0.9 * (0.9 * 0.5 - 2.0))).abs() < 1e-6);
    }

    #[test]
    fn robust_rules_bound_a_byzantine_replica() {
        let n = 4096;
        for r in [3usize, 5, 8] {
            let xs = honest(r, n, r as u64);
            let w = vec![1.0 / r as f64; r];
            let honest_mean = mean_of(&xs[1..], &w[1..]);
            let scale = norm(&honest_mean);
            for attack in ["huge", "nan", "flip"] {
                let mut bad = xs.clone();
                match attack {
                    "huge" => bad[0].iter_mut().for_each(|x| *x *= 1e6),
                    "nan" => bad[0][17] = f32::NAN,
                    _ => bad[0].iter_mut().for_each(|x| *x *= -20.0),
                }
                let refs: Vec<Option<&[f32]>> = bad.iter().map(|x| Some(x.as_slice())).collect();
                for rule in
                    [ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }, ReduceRule::TrimmedMean { trim: 1 }]
                {
                    let mut m = vec![0.0; n];
                    let (u, st) = reduce_slice(rule, OuterOpt::AVERAGE, &refs, &w, &mut m);
                    assert!(u.iter().all(|x| x.is_finite()), "{rule:?} {attack}");
                    let err = dist(&u, &honest_mean) / scale;
                    assert!(err < 0.5, "{rule:?} r={r} {attack}: relative error {err}");
                    if attack == "nan" {
                        assert_eq!(st.rejected_non_finite, 1);
                    }
                }
                let mut m = vec![0.0; n];
                let (u, _) = reduce_slice(ReduceRule::Mean, OuterOpt::AVERAGE, &refs, &w, &mut m);
                if attack != "nan" {
                    assert!(dist(&u, &honest_mean) / scale > 1.0, "the plain mean is not robust ({attack})");
                }
            }
        }
    }

    #[test]
    fn centered_clip_leaves_honest_replicas_alone() {
        let xs = honest(5, 2048, 9);
        let w = vec![0.2; 5];
        let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
        let mut m = vec![0.0; 2048];
        let (u, st) =
            reduce_slice(ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }, OuterOpt::AVERAGE, &refs, &w, &mut m);
        let err = dist(&u, &mean_of(&xs, &w)) / norm(&u);
        assert_eq!(st.clipped, 0);
        assert!(err < 1e-3, "relative error {err}");
    }

    /// The reduce as it was written before it ran in parallel chunks: one
    /// coordinate at a time, distances summed over all coordinates in order.
    fn serial_reference(rule: ReduceRule, xs: &[Vec<f32>], w: &[f64]) -> Vec<f32> {
        let n = xs[0].len();
        let mean = |v: Option<&[f32]>, scale: &[f64]| -> Vec<f32> {
            (0..n)
                .map(|j| {
                    let at = v.map_or(0.0, |v| v[j] as f64);
                    let s: f64 = xs.iter().zip(w).zip(scale).map(|((c, w), s)| w * s * (c[j] as f64 - at)).sum();
                    (at + s) as f32
                })
                .collect()
        };
        match rule {
            ReduceRule::Mean => {
                (0..n).map(|j| xs.iter().zip(w).map(|(c, w)| w * c[j] as f64).sum::<f64>() as f32).collect()
            }
            ReduceRule::CenteredClip { tau_factor, iters } => {
                let mut v: Vec<f32> =
                    (0..n).map(|j| median_of(&mut xs.iter().map(|c| c[j]).collect::<Vec<_>>())).collect();
                for _ in 0..iters {
                    let d: Vec<f64> = xs
                        .iter()
                        .map(|c| c.iter().zip(&v).map(|(&x, &y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt())
                        .collect();
                    let tau =
                        tau_factor as f64 * median_of(&mut d.iter().map(|&d| d as f32).collect::<Vec<_>>()) as f64;
                    let scale: Vec<f64> = d.iter().map(|&d| if d > tau && d > 0.0 { tau / d } else { 1.0 }).collect();
                    v = mean(Some(&v), &scale);
                }
                v
            }
            ReduceRule::TrimmedMean { .. } => unreachable!("not compared"),
        }
    }

    #[test]
    fn chunked_parallel_reduce_matches_the_serial_one_on_any_thread_count() {
        // Three chunks and a partial one; a Byzantine replica so clipping acts.
        let n = 3 * REDUCE_CHUNK + 1234;
        let mut xs = honest(5, n, 4);
        xs[2].iter_mut().for_each(|x| *x *= -30.0);
        let w = [0.1, 0.3, 0.2, 0.25, 0.15];
        let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
        let cc = ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 };
        for rule in [ReduceRule::Mean, cc] {
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| {
                    let mut m = vec![0.0; n];
                    reduce_slice(rule, OuterOpt::AVERAGE, &refs, &w, &mut m)
                })
            };
            let (one, st) = run(1);
            assert_eq!(one, run(3).0, "{rule:?}: bits depend on the thread count");
            let want = serial_reference(rule, &xs, &w);
            if rule == ReduceRule::Mean {
                assert!(one.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "the mean's bits changed");
            } else {
                assert_eq!(st.clipped, 1);
                let err = dist(&one, &want) / norm(&want);
                assert!(err < 1e-6, "centered clipping moved by {err} from the serial reduce");
            }
        }
    }

    /// The ground for `clip_cannot_bite`: with two contributions, any
    /// weights (a zero one too) and any spread, the iterations clip
    /// nothing and land on the weighted mean within rounding; and the
    /// reduce, which skips them, gives the weighted mean's bits.
    #[test]
    fn centered_clip_of_two_is_their_weighted_mean() {
        let n = REDUCE_CHUNK + 77;
        let cc = ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 };
        for (seed, w0) in [(1u64, 0.5), (2, 0.9), (3, 0.999), (4, 0.0), (5, 1.0), (6, 0.3)] {
            let mut xs = honest(2, n, seed);
            if seed % 2 == 0 {
                // One replica far off: with two, it is not an outlier.
                xs[1].iter_mut().for_each(|x| *x = *x * -50.0 + 0.02);
            }
            let w = [w0, 1.0 - w0];
            let used: Vec<(&[f32], f64)> = xs.iter().zip(&w).map(|(x, &w)| (x.as_slice(), w)).collect();
            let mut iterated = vec![0.0f32; n];
            assert_eq!(centered_clip(&used, &w, 2.0, 3, &mut iterated), 0, "seed {seed}: something was clipped");
            let want = mean_of(&xs, &w);
            let err = dist(&iterated, &want) / norm(&want);
            assert!(err < 1e-6, "seed {seed}: the iterations end {err} from the weighted mean");
            let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
            let (mut m1, mut m2) = (vec![0.0; n], vec![0.0; n]);
            let (u, st) = reduce_slice(cc, OuterOpt::AVERAGE, &refs, &w, &mut m1);
            let (mean, _) = reduce_slice(ReduceRule::Mean, OuterOpt::AVERAGE, &refs, &w, &mut m2);
            assert_eq!(st.clipped, 0);
            assert!(u.iter().zip(&mean).all(|(a, b)| a.to_bits() == b.to_bits()), "seed {seed}: not the mean's bits");
        }
        // Below a factor of 2 the clip can bite with two, and runs.
        assert!(!clip_cannot_bite(2, 1.5));
        assert!(!clip_cannot_bite(3, 2.0));
    }

    #[test]
    fn missing_and_empty_contributions() {
        let mut m = vec![0.25f32; 3];
        let (u, _) =
            reduce_slice(ReduceRule::Mean, OuterOpt { lr: 1.0, momentum: 0.5 }, &[None, None], &[0.5, 0.5], &mut m);
        // No input: g = 0, the momentum still decays and moves the weights.
        assert_eq!(m, vec![0.125; 3]);
        assert_eq!(u, vec![0.0625; 3]);
    }

    /// The two-pass form the fused reduce replaced, written plainly (one
    /// thread, a sort for every median): the median, then per step one
    /// pass for the distances (per-chunk partials, added in chunk order)
    /// and one for the step.
    fn centered_clip_two_pass(
        used: &[(&[f32], f64)],
        w: &[f64],
        tau_factor: f32,
        iters: u32,
        out: &mut [f32],
    ) -> usize {
        let sorted_median = |mut v: Vec<f32>| {
            v.sort_by(f32::total_cmp);
            let n = v.len();
            if n % 2 == 1 { v[n / 2] } else { ((v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0) as f32 }
        };
        let r = used.len();
        for (j, o) in out.iter_mut().enumerate() {
            *o = sorted_median(used.iter().map(|(c, _)| c[j]).collect());
        }
        let mut clipped = vec![false; r];
        for _ in 0..iters.max(1) {
            let partials: Vec<Vec<f64>> = out
                .chunks(REDUCE_CHUNK)
                .enumerate()
                .map(|(ci, v)| {
                    let at = ci * REDUCE_CHUNK;
                    used.iter()
                        .map(|(c, _)| {
                            c[at..at + v.len()].iter().zip(v).map(|(&x, &v)| ((x - v) as f64).powi(2)).sum::<f64>()
                        })
                        .collect()
                })
                .collect();
            let dist: Vec<f64> = (0..r).map(|i| partials.iter().map(|p| p[i]).sum::<f64>().sqrt()).collect();
            let tau = tau_factor as f64 * sorted_median(dist.iter().map(|&d| d as f32).collect()) as f64;
            let mut coef = Vec::new();
            for (i, &d) in dist.iter().enumerate() {
                let s = if d > tau && d > 0.0 {
                    clipped[i] = true;
                    tau / d
                } else {
                    1.0
                };
                coef.push(w[i] * s);
            }
            for (j, o) in out.iter_mut().enumerate() {
                let v = *o;
                let mut s = -0.0f64;
                for ((c, _), k) in used.iter().zip(&coef) {
                    s += k * (c[j] as f64 - v as f64);
                }
                *o = (v as f64 + s) as f32;
            }
        }
        clipped.iter().filter(|&&c| c).count()
    }

    #[test]
    fn the_fused_centered_clip_gives_the_two_pass_bits() {
        let n = 3 * REDUCE_CHUNK + 123;
        for r in 1..=6 {
            let mut xs = honest(r, n, 40 + r as u64);
            // One replica far off, so the clip bites where r allows.
            if r >= 3 {
                xs[1].iter_mut().for_each(|x| *x = *x * -30.0 + 0.01);
            }
            let w: Vec<f64> = (0..r).map(|i| 10.0 + 3.0 * i as f64).collect();
            let t: f64 = w.iter().sum();
            let w: Vec<f64> = w.iter().map(|x| x / t).collect();
            let used: Vec<(&[f32], f64)> = xs.iter().zip(&w).map(|(x, &w)| (x.as_slice(), w)).collect();
            for iters in 1..=3 {
                let (mut fused, mut plain) = (vec![0.0f32; n], vec![0.0f32; n]);
                let a = centered_clip(&used, &w, 2.0, iters, &mut fused);
                let b = centered_clip_two_pass(&used, &w, 2.0, iters, &mut plain);
                assert_eq!(a, b, "r {r}, {iters} steps: clipped");
                assert!(
                    fused.iter().zip(&plain).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "r {r}, {iters} steps: the bits differ"
                );
                if r >= 3 {
                    assert!(a >= 1, "r {r}: the far replica was clipped");
                }
            }
        }
    }
}
