//! The replicas' inner optimizer moments at a merge (`-avg-moments`).

use iota_model::CpuBackend;
use iota_model::train::Pipeline;

/// Every replica's inner optimizer moments of each stage replaced by their
/// mean over the replicas (both moments: a first moment averaged alone,
/// over a replica's own second moment, blows up the embedding rows of
/// tokens that replica has seldom seen). With `muon_only`, only the
/// momentum of the matrices Muon updates (they have no second moment),
/// each replica keeping its own AdamW moments: a small payload where the
/// embedding and LM head hold most of the weights.
pub(super) fn average_inner_moments(replicas: &mut [Pipeline<CpuBackend>], muon_only: bool) {
    use iota_model::backend::Backend;
    let be = CpuBackend::new();
    let r = replicas.len() as f32;
    for s in 0..replicas[0].stages().len() {
        let n = be.len(&replicas[0].optimizers_mut()[s].m);
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        for p in replicas.iter_mut() {
            let o = &p.optimizers_mut()[s];
            for (a, b) in m.iter_mut().zip(be.to_host(&o.m)) {
                *a += b / r;
            }
            for (a, b) in v.iter_mut().zip(be.to_host(&o.v)) {
                *a += b / r;
            }
        }
        // Without Muon no matrix has a momentum of its own to average.
        let on = replicas[0].cfg.adamw.muon;
        let muon: Vec<std::ops::Range<usize>> = replicas[0].stages()[s]
            .layout()
            .entries
            .iter()
            .filter(|e| on && e.takes_muon())
            .map(|e| e.range())
            .collect();
        for p in replicas.iter_mut() {
            let o = &mut p.optimizers_mut()[s];
            if muon_only {
                let mut own = be.to_host(&o.m);
                for range in &muon {
                    own[range.clone()].copy_from_slice(&m[range.clone()]);
                }
                o.m = be.upload(&own);
            } else {
                o.m = be.upload(&m);
                o.v = be.upload(&v);
            }
        }
    }
}
