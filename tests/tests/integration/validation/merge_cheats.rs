//! The swarm every merge adversary test runs in.

use super::*;

/// What a run with one merge adversary ended with.
pub(super) struct MergeCheatRun {
    pub(super) bad: iota_core::PeerId,
    pub(super) history: Vec<iota_control::orchestrator::EpochSummary>,
    pub(super) counters: iota_control::orchestrator::Counters,
    pub(super) mismatches: Vec<iota_core::merge::Mismatch>,
    pub(super) verdicts: Vec<iota_control::orchestrator::VerdictRecord>,
    /// Every miner at the end: (peer, stage, epochs convicted).
    pub(super) miners: Vec<(iota_core::PeerId, u32, u32)>,
}

/// `tiny` over `shape` for `epochs` x `per_epoch` micro-batches, two
/// validators (`change` sets the run up further), the first miner to
/// register running `mode` and `honest` honest ones after it; returns once
/// the honest miners and the validators are done.
pub(super) async fn run_merge_cheat(
    mode: Adversary,
    (stages, replicas): (u32, u32),
    (epochs, per_epoch): (u64, u64),
    honest: usize,
    change: fn(&mut iota_protocol::RunConfig),
) -> MergeCheatRun {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(stages, replicas, epochs, per_epoch, WireCodec::Int8Row);
    let ids = iota_tests::with_validators(&mut cfg, 2);
    change(&mut cfg);
    let swarm = iota_tests::Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let vs: Vec<_> = ids.into_iter().enumerate().map(|(i, id)| swarm.validator(id, i as u64, stop.clone())).collect();
    let bad = swarm.miner_with(|o| o.adversary = Some(mode), stop.clone());
    let bad_peer = swarm.first_registered().await;
    let honest: Vec<_> = (0..honest).map(|_| swarm.miner(stop.clone())).collect();
    for m in honest {
        tokio::time::timeout(Duration::from_secs(120), m).await.expect("miner finished in time").unwrap().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(10), bad).await;
    for v in vs {
        tokio::time::timeout(Duration::from_secs(10), v).await.expect("validator ended").unwrap().unwrap();
    }
    swarm.service.with_state(|o| MergeCheatRun {
        bad: bad_peer,
        history: o.history().to_vec(),
        counters: o.counters().clone(),
        mismatches: o.mismatches().to_vec(),
        verdicts: o.verdicts().to_vec(),
        miners: o.miners().map(|m| (m.peer, m.stage, m.convicted_epochs)).collect(),
    })
}
