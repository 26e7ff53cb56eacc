//! One run of `tiny` (2 stages x 2 replicas) with four honest miners and at
//! most one unreliable one (`Adversary`) placed in the head stage, the tail
//! stage or joining mid-run: the integration tests assert on it and
//! `iota-bench liveness` times it against the honest run.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use iota_control::orchestrator::{Counters, EpochSummary, MinerState, Orchestrator};
use iota_core::WireCodec;
use iota_dataplane::miner::{Adversary, MinerSummary};

use crate::{Swarm, tiny_run_batch};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Head,
    Tail,
    MidRun,
}

/// What a scenario did.
#[derive(Debug)]
pub struct ScenarioReport {
    pub wall: Duration,
    pub history: Vec<EpochSummary>,
    pub counters: Counters,
    pub honest: Vec<MinerSummary>,
    /// The unreliable miner as the orchestrator last saw it.
    pub bad: Option<MinerState>,
    /// The epoch in which it was first benched.
    pub benched_in: Option<u64>,
    /// Its share of its stage's deliveries, and of its stage's measured
    /// speed (1 / latency), at the end.
    pub route_share: f64,
    pub speed_share: f64,
    /// Honest miners benched at some point of the run.
    pub honest_benched: usize,
}

async fn wait_for(swarm: &Swarm, what: &str, f: impl Fn(&Orchestrator) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !swarm.service.with_state(&f) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `epochs` x `per_epoch` micro-batches of `batch` sequences with
/// `adversary` at `place` (None: four honest miners only), in a temporary
/// directory.
pub async fn run_scenario(
    adversary: Option<(Adversary, Place)>,
    epochs: u64,
    per_epoch: u64,
    batch: usize,
) -> ScenarioReport {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run_batch(2, 2, epochs, per_epoch, WireCodec::Int8Row, batch);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let subscribed = |n: usize| move |o: &Orchestrator| o.miners().filter(|m| m.subscribed).count() >= n;
    let mut honest = Vec::new();
    let mut bad = None;
    let t0 = Instant::now();
    // Registration order decides the stage (the emptiest first).
    match adversary {
        Some((a, Place::Head)) => {
            bad = Some(swarm.miner_with(|o| o.adversary = Some(a), stop.clone()));
            wait_for(&swarm, "the adversary", subscribed(1)).await;
        }
        Some((a, Place::Tail)) => {
            honest.push(swarm.miner(stop.clone()));
            wait_for(&swarm, "the first miner", subscribed(1)).await;
            bad = Some(swarm.miner_with(|o| o.adversary = Some(a), stop.clone()));
            wait_for(&swarm, "the adversary", subscribed(2)).await;
        }
        _ => {}
    }
    while honest.len() < 4 {
        honest.push(swarm.miner(stop.clone()));
    }
    if let Some((a, Place::MidRun)) = adversary {
        wait_for(&swarm, "the run to start", |o| o.counters().completed >= 4).await;
        bad = Some(swarm.miner_with(|o| o.adversary = Some(a), stop.clone()));
    }
    // Watch for the first benching while the run goes on.
    let mut benched_in = None;
    let mut summaries = Vec::new();
    for m in honest {
        let mut m = std::pin::pin!(m);
        let done = loop {
            tokio::select! {
                r = &mut m => break r,
                _ = tokio::time::sleep(Duration::from_millis(25)) => {
                    if benched_in.is_none() {
                        benched_in = swarm.service.with_state(|o| {
                            o.miners().find(|m| m.benched || m.benched_epochs > 0).map(|_| o.epoch())
                        });
                    }
                    assert!(t0.elapsed() < Duration::from_secs(180), "the run did not finish");
                }
            }
        };
        summaries.push(done.unwrap().unwrap());
    }
    let wall = t0.elapsed();
    let bad_peer = match bad {
        Some(b) => {
            tokio::time::timeout(Duration::from_secs(30), b).await.ok().and_then(|r| r.ok()?.ok()).map(|s| s.peer)
        }
        None => None,
    };
    let honest_peers: Vec<_> = summaries.iter().map(|s| s.peer).collect();
    let (history, counters, bad_state, shares) = swarm.service.with_state(|o| {
        // The unreliable miner: the one registered that is not honest.
        let m = o
            .miners()
            .find(|m| {
                Some(m.peer) == bad_peer
                    || (bad_peer.is_none() && adversary.is_some() && !honest_peers.contains(&m.peer))
            })
            .cloned();
        let shares = m.as_ref().map(|b| {
            let stage: Vec<&MinerState> = o.miners().filter(|x| x.stage == b.stage && !x.removed).collect();
            let routes: u64 = stage.iter().map(|x| x.delivered).sum();
            let speed = |x: &MinerState| if x.latency_ms > 0.0 { 1.0 / x.latency_ms } else { 0.0 };
            let speeds: f64 = stage.iter().map(|x| speed(x)).sum();
            (b.delivered as f64 / routes.max(1) as f64, if speeds > 0.0 { speed(b) / speeds } else { 0.0 })
        });
        (o.history().to_vec(), o.counters().clone(), m, shares.unwrap_or((0.0, 0.0)))
    });
    let honest_benched = swarm.service.with_state(|o| {
        o.miners().filter(|m| honest_peers.contains(&m.peer) && (m.benched || m.benched_epochs > 0)).count()
    });
    ScenarioReport {
        wall,
        history,
        counters,
        honest: summaries,
        bad: bad_state,
        benched_in,
        route_share: shares.0,
        speed_share: shares.1,
        honest_benched,
    }
}
