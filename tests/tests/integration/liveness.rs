//! Unreliable miners in a real swarm (issue 22): one `silent`, `closed`,
//! `slow` or `flaky` miner among four honest ones, in the head stage, the
//! tail stage, or joining mid-run (`iota_tests::liveness`). The run must
//! complete with no micro-batch dropped; a silent or closed miner is benched
//! and never merged.

use iota_dataplane::miner::Adversary;
use iota_tests::liveness::{Place, run_scenario};

async fn run_with(adversary: Adversary, place: Place) {
    let r = run_scenario(Some((adversary, place)), 3, 16, 4).await;
    println!("{adversary:?} {place:?}: {:?}, {:?}\n  adversary: {:?}", r.wall, r.counters, r.bad);
    assert_eq!(r.history.len(), 3, "every epoch completed: {:?}", r.history);
    assert_eq!(r.counters.dropped, 0, "no micro-batch dropped ({adversary:?} {place:?}): {:?}", r.counters);
    assert!(r.history.iter().all(|e| e.completed == 16));
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = r.honest.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert!(!w.is_empty(), "an honest replica of stage {stage}");
        assert!(w.iter().all(|x| *x == w[0]), "stage {stage} honest replicas identical");
    }
    if matches!(adversary, Adversary::Silent | Adversary::Closed) {
        let m = r.bad.expect("the adversary registered");
        assert_eq!((m.delivered, m.work), (0, 0), "it never worked: settlement pays it nothing");
        assert!(m.benched || m.benched_epochs > 0 || m.failures == 0, "{m:?}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_miner_with_a_closed_port_in_the_head_stage_stalls_nothing() {
    run_with(Adversary::Closed, Place::Head).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_miner_with_a_closed_port_joining_mid_run_stalls_nothing() {
    run_with(Adversary::Closed, Place::MidRun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flaky_miner_in_the_head_stage_drops_nothing() {
    run_with(Adversary::Flaky, Place::Head).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flaky_miner_joining_mid_run_drops_nothing() {
    run_with(Adversary::Flaky, Place::MidRun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_miner_in_the_tail_stage_drops_nothing() {
    run_with(Adversary::Slow, Place::Tail).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_miner_joining_mid_run_drops_nothing() {
    run_with(Adversary::Slow, Place::MidRun).await;
}
