//! The current epoch's done micro-batches by miner, for evidence asks
//! (evidence_asks.rs). Its own file: the orchestrator's state holds it.

use std::collections::{BTreeMap, HashMap};

use iota_core::PeerId;

use super::state::{MbRecord, MbStatus};

/// The current epoch's completed micro-batches, by each miner on their
/// pathway. Every validator asks of every miner it drew; a scan of the
/// epoch's micro-batches for each ask was a tenth of a 2,000-miner run.
/// Derived from `mbs` and rebuilt when it may have changed: a micro-batch
/// becomes done only in `try_complete`, which counts it in
/// `counters.completed`, so a micro-batch done now and missing from the
/// index moved the count. An entry gone stale (the epoch's micro-batches
/// cleared) is harmless: the caller reads each record's status again.
#[derive(Clone, Debug, Default)]
pub(super) struct DoneIndex {
    /// (epoch, completed count, micro-batches issued) it was built at.
    built_at: Option<(u64, u64, usize)>,
    by_miner: HashMap<PeerId, Vec<u64>>,
}

impl DoneIndex {
    /// The sequence numbers of the done micro-batches whose pathway holds
    /// `miner`, in issue order.
    pub(super) fn of(&mut self, epoch: u64, completed: u64, mbs: &BTreeMap<u64, MbRecord>, miner: PeerId) -> &[u64] {
        let at = (epoch, completed, mbs.len());
        if self.built_at != Some(at) {
            self.by_miner.clear();
            for r in mbs.values() {
                if let MbStatus::Done { pathway, .. } = &r.status {
                    for p in pathway {
                        self.by_miner.entry(*p).or_default().push(r.seq);
                    }
                }
            }
            self.built_at = Some(at);
        }
        self.by_miner.get(&miner).map_or(&[], Vec::as_slice)
    }
}
