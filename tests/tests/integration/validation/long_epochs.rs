//! Evidence for every inner step of an epoch, past what a miner's memory
//! holds: snapshots go to the miner's evidence directory and come back
//! intact when a validator draws the attempt (issue 56: long epochs and
//! stages above `small` got honest miners convicted for evidence they had
//! not kept).

use iota_tests::validation::Scenario;

/// Where the scenario's miners spill (one directory per miner below it).
fn spill_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("iota-test-evidence-{}", std::process::id()))
}

/// Six honest miners whose memory holds no weights snapshot at all: every
/// state of every epoch is spilled to disk, and every attempt of every
/// miner is drawn by both validators. Each is shown: nobody is accused,
/// and every miner is cleared in every epoch it worked in. Without the
/// spill directory each of these attempts would have no evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn honest_miners_show_every_drawn_attempt_from_snapshots_spilled_to_disk() {
    let r = Scenario {
        each: |o| {
            o.evidence_bytes = 0;
            o.evidence_dir = Some(spill_dir());
        },
        config: |c| c.spec.validation.min_per_miner = 64,
        ..Scenario::new(None, 2, 24)
    }
    .run()
    .await;
    let _ = std::fs::remove_dir_all(spill_dir());
    assert_eq!(r.history.len(), 2, "the run completes");
    let guilty: Vec<_> = r.verdicts.iter().filter(|v| v.guilty).collect();
    assert!(guilty.is_empty(), "honest miners accused: {guilty:?}");
    for e in 0..2u64 {
        let worked: std::collections::BTreeSet<_> =
            r.history[e as usize].miners.iter().filter(|m| m.completed > 0).map(|m| m.peer).collect();
        let cleared: std::collections::BTreeSet<_> =
            r.verdicts.iter().filter(|v| v.epoch == e && !v.guilty).map(|v| v.miner).collect();
        assert!(!worked.is_empty() && worked.is_subset(&cleared), "epoch {e}: worked {worked:?}, cleared {cleared:?}");
    }
    // Every attempt drawn: 24 micro-batches through 3 stages, checked by
    // two validators, in each of the two epochs.
    assert!(r.checked >= 2 * 2 * 3 * 20, "evidence objects checked: {}", r.checked);
    assert!(r.history.iter().all(|h| h.convicted.is_empty() && !h.rolled_back));
}
