//! An experiment on the merge for Muon's matrices (`--orth-merge`): the
//! mean of R orthogonalised half-batch updates is a shorter step than one
//! orthogonalised full-batch update in the directions of small singular
//! value (docs/BENCHMARKS.md, "Where Muon's merge-interval cost comes
//! from"). Here the merged pseudo-gradient of each such matrix is
//! orthogonalised again and given the replicas' mean Frobenius norm, which
//! at one inner step per merge is the one-process update's shape and size.

use iota_model::CpuBackend;
use iota_model::backend::Backend;
use iota_model::train::Pipeline;

/// Rewrites `next` (each stage's merged weights) so that every matrix Muon
/// updates moves from the last merged weights by the orthogonalised mean
/// pseudo-gradient, scaled to the mean of the replicas' own pseudo-gradient
/// norms. Other tensors keep the plain merge. Returns how many matrices it
/// rewrote.
pub(super) fn orthogonalise_merge(
    merged: &Pipeline<CpuBackend>,
    replicas: &[Pipeline<CpuBackend>],
    next: &mut [Vec<f32>],
) -> usize {
    let be = CpuBackend::new();
    let mut rewritten = 0;
    for (s, theta_next) in next.iter_mut().enumerate() {
        let theta_prev = merged.stages()[s].params_host();
        let locals: Vec<Vec<f32>> = replicas.iter().map(|p| p.stages()[s].params_host()).collect();
        for e in merged.stages()[s].layout().entries.iter().filter(|e| e.takes_muon()) {
            let r = e.range();
            let (rows, cols) = (e.shape[0], e.shape[1]);
            let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| (x as f64).powi(2)).sum::<f64>().sqrt();
            let own: f64 = locals
                .iter()
                .map(|l| norm(&mut theta_prev[r.clone()].iter().zip(&l[r.clone()]).map(|(p, q)| p - q)))
                .sum::<f64>()
                / locals.len() as f64;
            let mean: Vec<f32> = theta_prev[r.clone()].iter().zip(&theta_next[r.clone()]).map(|(p, n)| p - n).collect();
            if own == 0.0 || mean.iter().all(|&x| x == 0.0) {
                continue;
            }
            let mut buf = be.upload(&mean);
            iota_model::optim::newton_schulz(&be, &mut buf, rows, cols);
            let ortho = be.to_host(&buf);
            let scale = (own / norm(&mut ortho.iter().copied()).max(1e-30)) as f32;
            for ((t, p), o) in theta_next[r.clone()].iter_mut().zip(&theta_prev[r.clone()]).zip(&ortho) {
                *t = p - scale * o;
            }
            rewritten += 1;
        }
    }
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;
    use iota_core::rng::Rng;
    use std::sync::Arc;

    /// mean(s^4) / mean(s^2)^2 of a matrix's singular values s, from its
    /// Gram matrix: 1 for a flat spectrum, about 1 + k/n for a random one.
    fn spread(d: &[f32], rows: usize, cols: usize) -> f64 {
        let (k, n, at) = if rows <= cols {
            (rows, cols, Box::new(|i: usize, j: usize| d[i * cols + j]) as Box<dyn Fn(usize, usize) -> f32>)
        } else {
            (cols, rows, Box::new(|i: usize, j: usize| d[j * cols + i]) as Box<dyn Fn(usize, usize) -> f32>)
        };
        let mut g = vec![0.0f64; k * k];
        for a in 0..k {
            for b in 0..k {
                g[a * k + b] = (0..n).map(|j| at(a, j) as f64 * at(b, j) as f64).sum();
            }
        }
        let tr: f64 = (0..k).map(|i| g[i * k + i]).sum();
        let tr2: f64 = g.iter().map(|x| x * x).sum();
        (tr2 / k as f64) / (tr / k as f64).powi(2)
    }

    #[test]
    fn the_matrices_move_by_a_flat_step_of_the_replicas_mean_norm_and_the_rest_as_merged() {
        let (setup, _) = super::super::tests::tiny_setup(2, 1, 2);
        let be = Arc::new(CpuBackend::new());
        let merged = Pipeline::new(be.clone(), setup.train.clone()).unwrap();
        let mut replicas: Vec<_> = (0..2).map(|_| Pipeline::new(be.clone(), setup.train.clone()).unwrap()).collect();
        let mut rng = Rng::new(5);
        let mut plain = Vec::new();
        for s in 0..merged.stages().len() {
            let prev = merged.stages()[s].params_host();
            let mut sum = vec![0.0f32; prev.len()];
            for r in replicas.iter_mut() {
                let own: Vec<f32> = prev.iter().map(|p| p - 1e-2 * rng.normal()).collect();
                r.stages_mut()[s].set_params(&own).unwrap();
                sum.iter_mut().zip(&own).for_each(|(a, b)| *a += b / 2.0);
            }
            plain.push(sum);
        }
        let mut next = plain.clone();
        let rewritten = orthogonalise_merge(&merged, &replicas, &mut next);
        let mut matrices = 0;
        for s in 0..merged.stages().len() {
            let prev = merged.stages()[s].params_host();
            for e in &merged.stages()[s].layout().entries {
                let r = e.range();
                if !e.takes_muon() {
                    assert_eq!(next[s][r.clone()], plain[s][r.clone()], "{} left the plain merge", e.name);
                    continue;
                }
                matrices += 1;
                let (rows, cols) = (e.shape[0], e.shape[1]);
                let delta =
                    |t: &[f32]| -> Vec<f32> { prev[r.clone()].iter().zip(&t[r.clone()]).map(|(p, q)| p - q).collect() };
                let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                let own: f64 = replicas.iter().map(|p| norm(&delta(&p.stages()[s].params_host()))).sum::<f64>() / 2.0;
                let (before, after) = (delta(&plain[s]), delta(&next[s]));
                assert!((norm(&after) / own - 1.0).abs() < 1e-4, "{}: norm {} against {own}", e.name, norm(&after));
                // The mean of two random steps is shorter than either; the rewrite restores the length.
                assert!(norm(&before) < 0.8 * own, "{}", e.name);
                let (sb, sa) = (spread(&before, rows, cols), spread(&after, rows, cols));
                assert!(sa < 1.3 && sa < sb - 0.1, "{} {rows}x{cols}: spread {sb:.3} -> {sa:.3}", e.name);
            }
        }
        assert!(matrices > 0 && rewritten == matrices, "{rewritten} of {matrices} matrices rewritten");
    }
}
