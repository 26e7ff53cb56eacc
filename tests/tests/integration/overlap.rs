//! The merge behind compute (`merge.overlap`) in a real swarm: each
//! epoch's butterfly merge runs while the next epoch trains, and the
//! replicas land it when that epoch ends.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use iota_core::WireCodec;
use iota_dataplane::miner::MinerSummary;
use iota_model::CpuBackend;
use iota_model::train::Pipeline;
use iota_protocol::RunConfig;
use iota_tests::{Swarm, tiny_run};

/// Runs `cfg` with six miners; returns every miner's summary, the epochs'
/// training losses, the orchestrator's counters and the held-out loss of
/// the final merged model.
async fn run(cfg: &RunConfig) -> (Vec<MinerSummary>, Vec<f32>, iota_control::orchestrator::Counters, f32) {
    let dir = tempfile::tempdir().unwrap();
    let swarm = Swarm::start(cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..6).map(|_| swarm.miner(stop.clone())).collect();
    let mut summaries = Vec::new();
    for m in miners {
        let s = tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished in time");
        summaries.push(s.unwrap().unwrap());
    }
    let (losses, counters) =
        swarm.service.with_state(|o| (o.history().iter().map(|e| e.mean_loss).collect(), o.counters().clone()));
    // The final model, as the replicas of each stage hold it, on held-out data.
    let corpus = iota_dataplane::corpus::load_corpus(cfg, None).unwrap();
    let mut p = Pipeline::new(Arc::new(CpuBackend::new()), cfg.train.clone()).unwrap();
    for (stage, s) in p.stages_mut().iter_mut().enumerate() {
        let held = summaries.iter().find(|m| m.stage == stage as u32).expect("a replica of every stage");
        s.set_params(&held.params).unwrap();
    }
    let held_out = p.eval(&corpus, 8).unwrap();
    (summaries, losses, counters, held_out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_merge_behind_compute_trains_about_as_well_as_the_synchronous_merge() {
    let sync_cfg = tiny_run(3, 2, 4, 24, WireCodec::Int8Row);
    let mut cfg = sync_cfg.clone();
    cfg.spec.merge.overlap = true;
    cfg.spec.run_id += 1;
    let t0 = Instant::now();
    let (summaries, losses, c, held_out) = run(&cfg).await;
    let overlapped_in = t0.elapsed();
    let t0 = Instant::now();
    let (_, sync_losses, sync_c, sync_held_out) = run(&sync_cfg).await;
    println!(
        "tiny 3x2, 4 epochs: merge behind compute {losses:?}, held-out {held_out:.4} in {overlapped_in:?} \
         (merging visible {} ms); synchronous {sync_losses:?}, held-out {sync_held_out:.4} in {:?} (merging {} ms)",
        c.merging_ms,
        t0.elapsed(),
        sync_c.merging_ms
    );
    assert_eq!(losses.len(), 4);
    // Epochs 0 to 2 merged behind the next epoch's training; the last one
    // synchronously, so the run ends on merged weights.
    assert_eq!(c.merges_behind_compute, 3, "{c:?}");
    assert_eq!(sync_c.merges_behind_compute, 0);
    assert_eq!(c.divergent_merges, 0, "every replica computed the same merged weights");
    assert_eq!(c.hash_mismatches, 0);
    for stage in 0..3 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2, "two replicas of stage {stage}");
        assert!(w[0] == w[1], "stage {stage} replicas differ after the last merge");
    }
    assert!(losses[3] < losses[0] - 0.3, "it learns: {losses:?}");
    // The real swarm's loss moves with the machine's timing (pathways and
    // in-flight order): the synchronous run alone landed between 2.78 and
    // 2.89 held-out over four runs here, about 4% apart. So this bound only
    // catches a landing that loses or double-counts work (an epoch's
    // progress lost per merge costs far more); the 2% target of issue 24
    // is measured where the loss does not depend on timing: the in-process
    // replay (`iota-bench convergence`, hN-overlap) and `iota-bench swarm
    // --merge-overlap` on `small` (docs/BENCHMARKS.md).
    let gap = (held_out - sync_held_out) / sync_held_out;
    assert!(gap < 0.10, "held-out {held_out} vs synchronous {sync_held_out}: {:+.2}%", gap * 100.0);
}
