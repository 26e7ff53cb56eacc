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
