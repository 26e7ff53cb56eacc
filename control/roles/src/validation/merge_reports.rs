//! Which of a merge's participants reported false merged weights.
//!
//! Every participant of a butterfly merge applies the same accepted
//! updates, so every honest one ends with the same weights and reports
//! their hash (`MergeDone`). A validator loads the stored merge itself and
//! hashes each stage. A participant whose report differs lied (or its
//! weights are not the merge's), but only where the stored merge is
//! confirmed by a participant who reported exactly it: with no report
//! matching, the validator may have loaded something other than what the
//! participants applied, and judges nobody.

use std::collections::BTreeMap;

use iota_core::PeerId;
use iota_wire::pb;

/// Reports read per stage at most (a merge has far fewer participants).
pub const MAX_REPORTS: usize = 4096;

/// A participant whose report contradicts the stored merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FalseReport {
    pub stage: u32,
    pub peer: PeerId,
    pub reported: [u8; 32],
    pub stored: [u8; 32],
}

/// The participants of `stages` whose reported hash is not the hash
/// `loaded` gives their stage, in stage and peer order. Malformed reports
/// (ids or hashes not 32 bytes) are skipped; a stage not loaded, or whose
/// loaded hash nobody reported, judges nobody.
pub fn false_reports(stages: &[pb::StageWeights], loaded: &BTreeMap<u32, [u8; 32]>) -> Vec<FalseReport> {
    let mut out = Vec::new();
    for sw in stages {
        let Some(stored) = loaded.get(&sw.stage) else { continue };
        let reports: BTreeMap<PeerId, [u8; 32]> = sw
            .reported
            .iter()
            .take(MAX_REPORTS)
            .filter_map(|r| {
                Some((PeerId(r.peer.as_slice().try_into().ok()?), r.weights_hash.as_slice().try_into().ok()?))
            })
            .collect();
        if !reports.values().any(|h| h == stored) {
            continue;
        }
        out.extend(reports.into_iter().filter(|(_, h)| h != stored).map(|(peer, reported)| FalseReport {
            stage: sw.stage,
            peer,
            reported,
            stored: *stored,
        }));
    }
    out
}

/// The reason a validator gives for a false report (printable, short).
pub fn reason(f: &FalseReport) -> String {
    let hex = |h: &[u8; 32]| h[..8].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "reported stage {} merged weights {}.., the stored merge hashes to {}..",
        f.stage,
        hex(&f.reported),
        hex(&f.stored)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(peer: u8, hash: u8) -> pb::MergeReport {
        pb::MergeReport { peer: vec![peer; 32], weights_hash: vec![hash; 32] }
    }

    fn stage(s: u32, reported: Vec<pb::MergeReport>) -> pb::StageWeights {
        pb::StageWeights { stage: s, objects: Vec::new(), reported }
    }

    #[test]
    fn a_report_other_than_the_stored_merge_is_false_where_another_confirms_it() {
        let loaded = BTreeMap::from([(0, [7; 32]), (1, [8; 32])]);
        let stages = vec![
            // Stage 0: peer 1 honest, peer 2 lies.
            stage(0, vec![report(1, 7), report(2, 0xff)]),
            // Stage 1: nobody reported what the validator loaded: no verdict.
            stage(1, vec![report(3, 9), report(4, 9)]),
            // Stage 2 was not loaded.
            stage(2, vec![report(5, 1), report(6, 2)]),
        ];
        let f = false_reports(&stages, &loaded);
        assert_eq!(f, vec![FalseReport { stage: 0, peer: PeerId([2; 32]), reported: [0xff; 32], stored: [7; 32] }]);
        assert!(reason(&f[0]).contains("ffffffffffffffff") && reason(&f[0]).contains("0707070707070707"));
        // Everyone honest: nobody.
        assert!(false_reports(&[stage(0, vec![report(1, 7), report(2, 7)])], &loaded).is_empty());
    }

    #[test]
    fn malformed_reports_are_skipped_not_trusted() {
        let loaded = BTreeMap::from([(0, [7; 32])]);
        let short = pb::MergeReport { peer: vec![1; 31], weights_hash: vec![7; 32] };
        let bad_hash = pb::MergeReport { peer: vec![2; 32], weights_hash: vec![1; 5] };
        // The only well-formed report is false, but nobody well formed
        // confirms the stored merge: nobody is judged.
        let f = false_reports(&[stage(0, vec![short, bad_hash, report(3, 0xff)])], &loaded);
        assert!(f.is_empty(), "{f:?}");
    }
}
