//! Unreliable miners in a real swarm (issue 22): one `silent`, `closed`,
//! `slow` or `flaky` miner among four honest ones, in the head stage, the
//! tail stage, or joining mid-run. The run must complete with no
//! micro-batch dropped; a silent or closed miner is benched and never
//! merged.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use iota_core::WireCodec;
use iota_dataplane::miner::Adversary;
use iota_tests::{Swarm, tiny_run};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    Head,
    Tail,
    MidRun,
}

async fn wait_for(swarm: &Swarm, what: &str, f: impl Fn(&iota_control::orchestrator::Orchestrator) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !swarm.service.with_state(&f) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `tiny` 2 stages x 2 replicas, 3 epochs of 16 micro-batches, with
/// four honest miners and one `adversary` placed at `place`.
async fn run_with(adversary: Adversary, place: Place) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 2, 3, 16, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let bad = |swarm: &Swarm| swarm.miner_with(|o| o.adversary = Some(adversary), stop.clone());
    let mut honest = Vec::new();
    let mut bad_miner = None;
    // Registration order decides the stage: the emptiest stage first.
    let registered =
        |n: usize| move |o: &iota_control::orchestrator::Orchestrator| o.miners().filter(|m| m.subscribed).count() >= n;
    match place {
        Place::Head => {
            bad_miner = Some(bad(&swarm));
            wait_for(&swarm, "the adversary", registered(1)).await;
        }
        Place::Tail => {
            honest.push(swarm.miner(stop.clone()));
            wait_for(&swarm, "the first miner", registered(1)).await;
            bad_miner = Some(bad(&swarm));
            wait_for(&swarm, "the adversary", registered(2)).await;
        }
        Place::MidRun => {}
    }
    while honest.len() < 4 {
        honest.push(swarm.miner(stop.clone()));
    }
    if place == Place::MidRun {
        wait_for(&swarm, "the run to start", |o| o.epoch() == 0 && o.counters().completed >= 4).await;
        bad_miner = Some(bad(&swarm));
    }
    let t0 = Instant::now();
    let mut summaries = Vec::new();
    for m in honest {
        summaries
            .push(tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap());
    }
    let elapsed = t0.elapsed();
    let bad_summary =
        tokio::time::timeout(Duration::from_secs(30), bad_miner.unwrap()).await.expect("adversary finished").unwrap();
    let bad_peer = bad_summary.as_ref().map(|s| s.peer).ok();
    let (history, counters, bad_state) = swarm.service.with_state(|o| {
        let m = bad_peer.and_then(|p| o.miner(&p).cloned());
        (o.history().to_vec(), o.counters().clone(), m)
    });
    println!("{adversary:?} {place:?}: {elapsed:?}, {counters:?}\n  adversary: {bad_state:?}");
    assert_eq!(history.len(), 3, "every epoch completed: {history:?}");
    assert_eq!(counters.dropped, 0, "no micro-batch dropped ({adversary:?} {place:?}): {counters:?}");
    assert!(history.iter().all(|e| e.completed == 16));
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert!(!w.is_empty(), "an honest replica of stage {stage}");
        assert!(w.iter().all(|x| *x == w[0]), "stage {stage} honest replicas identical");
    }
    if matches!(adversary, Adversary::Silent | Adversary::Closed) {
        let m = bad_state.expect("the adversary registered");
        assert_eq!(m.delivered, 0, "it never worked");
        // Benched or never given work: either way it took no part in any merge.
        assert!(m.benched || m.benched_epochs > 0 || m.failures == 0, "{m:?}");
        assert_eq!(m.work, 0, "its recorded work is zero: settlement pays it nothing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_miner_in_the_tail_stage_stalls_nothing() {
    run_with(Adversary::Silent, Place::Tail).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_miner_in_the_head_stage_stalls_nothing() {
    run_with(Adversary::Silent, Place::Head).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_miner_joining_mid_run_stalls_nothing() {
    run_with(Adversary::Silent, Place::MidRun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_miner_with_a_closed_port_in_the_tail_stage_stalls_nothing() {
    run_with(Adversary::Closed, Place::Tail).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flaky_miner_in_the_tail_stage_drops_nothing() {
    run_with(Adversary::Flaky, Place::Tail).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_miner_in_the_head_stage_drops_nothing() {
    run_with(Adversary::Slow, Place::Head).await;
}
