//! The training loss a validator holds a merged model against: a merge far
//! worse than the replicas it merged is rolled back. The tails report the
//! losses; a tail lying low would drag the baseline down and get honest
//! merges rolled back, so the baseline leaves out the tails this validator
//! found guilty in the epoch's round (its recompute of a sampled attempt
//! checks the reported loss).

use std::collections::BTreeSet;

use iota_core::PeerId;
use iota_wire::pb;

/// Each tail's mean reported loss over the last quarter of its work items
/// (in the work's order: the state of the replicas being merged), finite
/// reports only; tails with none, or a malformed id, are left out.
pub fn late_tail_losses(w: &pb::EpochWork, last_stage: u32) -> Vec<(PeerId, f32)> {
    w.miners
        .iter()
        .filter(|m| m.stage == last_stage)
        .filter_map(|m| {
            let peer = PeerId(m.peer.as_slice().try_into().ok()?);
            let late = m.items.len().div_ceil(4);
            let losses: Vec<f32> =
                m.items.iter().skip(m.items.len() - late).map(|i| i.loss).filter(|l| l.is_finite()).collect();
            (!losses.is_empty()).then(|| (peer, losses.iter().sum::<f32>() / losses.len() as f32))
        })
        .collect()
}

/// The epoch's training loss: the mean of the tails' late means, leaving
/// out the tails in `guilty`. None without any.
pub fn baseline(tails: &[(PeerId, f32)], guilty: &BTreeSet<PeerId>) -> Option<f32> {
    let l: Vec<f32> = tails.iter().filter(|(p, _)| !guilty.contains(p)).map(|(_, l)| *l).collect();
    (!l.is_empty()).then(|| l.iter().sum::<f32>() / l.len() as f32)
}

/// What a merged model's held-out loss is held against: the better of the
/// last model the validator kept (the seed's at first) and the epoch's
/// training loss. With sparse contributions the training loss is left out:
/// a sparse merge applies the largest part of each replica's progress and
/// leaves the rest in their backlogs for later merges, so the merged model
/// lags the replicas it merged by design (`small` 3 x 3, the first merge
/// of 72 micro-batches: 9.74 held out against 6.47 trained, the seed's
/// 10.9), and is held against the last model kept alone.
pub fn rollback_base(last_kept: Option<f32>, trained: Option<f32>, sparse: bool) -> Option<f32> {
    let trained = trained.filter(|_| !sparse);
    [last_kept, trained].into_iter().flatten().min_by(f32::total_cmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(tails: &[(u8, &[f32])]) -> pb::EpochWork {
        let miners = tails
            .iter()
            .map(|(id, losses)| pb::MinerWork {
                peer: vec![*id; 32],
                stage: 2,
                items: losses.iter().map(|l| pb::WorkItem { loss: *l, ..Default::default() }).collect(),
                ..Default::default()
            })
            .chain(std::iter::once(pb::MinerWork { peer: vec![9; 32], stage: 1, ..Default::default() }))
            .collect();
        pb::EpochWork { miners, ..Default::default() }
    }

    #[test]
    fn the_late_quarter_of_each_tail_counts() {
        let w = work(&[
            (1, &[9.0, 9.0, 9.0, 4.0, 9.0, 9.0, 3.0, 5.0]),
            (2, &[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, f32::NAN, 6.0]),
            (3, &[]),
        ]);
        let t = late_tail_losses(&w, 2);
        assert_eq!(t, vec![(PeerId([1; 32]), 4.0), (PeerId([2; 32]), 6.0)], "NaN and empty tails left out");
        let mut bad = w.clone();
        bad.miners[0].peer = vec![1; 31];
        assert_eq!(late_tail_losses(&bad, 2).len(), 1, "a malformed id is left out");
    }

    #[test]
    fn tails_found_guilty_are_left_out_of_the_baseline() {
        let (honest, liar, other) = ((PeerId([1; 32]), 5.0), (PeerId([2; 32]), 0.0), (PeerId([3; 32]), 5.5));
        let none = BTreeSet::new();
        assert_eq!(baseline(&[honest, other], &none), Some(5.25));
        assert_eq!(baseline(&[honest, liar, other], &none), Some(3.5), "a liar not caught lowers it");
        assert_eq!(baseline(&[honest, liar, other], &BTreeSet::from([liar.0])), Some(5.25));
        assert_eq!(baseline(&[], &none), None);
        assert_eq!(baseline(&[liar], &BTreeSet::from([liar.0])), None);
    }

    #[test]
    fn a_sparse_merge_is_held_against_the_last_kept_model_alone() {
        assert_eq!(rollback_base(Some(10.9), Some(6.5), false), Some(6.5));
        assert_eq!(rollback_base(Some(5.0), Some(6.5), false), Some(5.0));
        assert_eq!(rollback_base(Some(10.9), Some(6.5), true), Some(10.9));
        assert_eq!(rollback_base(None, Some(6.5), true), None);
        assert_eq!(rollback_base(None, Some(6.5), false), Some(6.5));
    }
}
