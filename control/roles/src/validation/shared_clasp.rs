//! CLASP's finding over an epoch's work: the miners it calls harmful. It is
//! a function of the work alone, and costs `O(p^3)` in the epoch's miners (a
//! second or more at 2,000 miners). Validators run by one process (the
//! simulator's sixteen, `sim`) share it instead of each computing the
//! same set again; a real validator, alone in its process, computes its
//! own. The finding is keyed by the whole work, so a validator given
//! different work never takes another's.

use std::collections::BTreeSet;
use std::sync::Mutex;

use iota_core::PeerId;
use iota_wire::pb;
use prost::Message;

use crate::settlement::clasp::Clasp;
use crate::settlement::scores::clasp_params;

/// The miners whose effect on the epoch's loss CLASP finds significantly
/// harmful, from the epoch's completed attempts: (issue order, pathway,
/// the tail's reported loss) each.
pub(super) fn harmful_by_clasp<'a>(
    stages: u32,
    records: impl Iterator<Item = (u64, &'a [PeerId], f32)> + Clone,
) -> BTreeSet<PeerId> {
    let horizon = records.clone().map(|(o, _, _)| o).max().map_or(0, |o| o + 1);
    let mut clasp = Clasp::new(stages as usize, horizon);
    let (mut sum, mut n) = (0.0f64, 0u64);
    for (order, pathway, loss) in records {
        // Refused records (a non-finite loss, say) are counted by CLASP
        // and left out; the recompute judges the report itself.
        if clasp.record(order, pathway, loss).is_ok() {
            sum += f64::from(loss);
            n += 1;
        }
    }
    let mean = if n > 0 { sum / n as f64 } else { 0.0 };
    clasp.estimate(&clasp_params(mean)).harmful().map(|m| m.key).collect()
}

#[derive(Default)]
pub struct SharedClasp {
    last: Mutex<Option<([u8; 32], BTreeSet<PeerId>)>>,
}

impl SharedClasp {
    /// The finding for `work`: the one kept if it is for the same work,
    /// else `compute`'s (then kept).
    pub(super) fn get_or(&self, work: &pb::EpochWork, compute: impl FnOnce() -> BTreeSet<PeerId>) -> BTreeSet<PeerId> {
        let key = *blake3::hash(&work.encode_to_vec()).as_bytes();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, found)) = last.as_ref()
            && *k == key
        {
            return found.clone();
        }
        let found = compute();
        *last = Some((key, found.clone()));
        found
    }
}
