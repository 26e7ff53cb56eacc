//! `--orth-merge` (orth_merge.rs): the matrices Muon updates merge by
//! their orthogonalised mean pseudo-gradient, the rest as before.

use std::sync::Arc;

use iota_core::rng::Rng;
use iota_model::CpuBackend;
use iota_model::train::Pipeline;

use super::orth_merge;
use super::tests::tiny_setup;

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
    let (setup, _) = tiny_setup(2, 1, 2);
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
    let rewritten = orth_merge::orthogonalise_merge(&merged, &replicas, &mut next);
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
