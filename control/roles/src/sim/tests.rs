//! Scenarios in milliseconds of wall time: each checks the run's own
//! findings (`SimReport::problems`) and what the scenario is about.

use super::*;

fn ok(cfg: &SimConfig) -> SimReport {
    let r = run(cfg).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.problems().is_empty(), "seed {}: {:?}", cfg.seed, r.problems());
    assert_eq!(r.epochs_done, cfg.epochs, "{r:?}");
    assert_eq!(r.completed + r.dropped, cfg.epochs * cfg.micro_batches_per_epoch, "{r:?}");
    r
}

#[test]
fn a_swarm_runs_to_its_end_and_its_seed_replays_it_bit_for_bit() {
    let cfg = SimConfig::default();
    let a = ok(&cfg);
    assert_eq!(a.dropped, 0, "an honest, steady swarm drops nothing: {a:?}");
    let b = ok(&cfg);
    assert_eq!(a, b, "the same seed, the same run");
    let c = ok(&SimConfig { seed: 2, ..cfg });
    assert_ne!(a.digest, c.digest, "another seed, another run");
}

/// More identities than places: the rest queue, and keep their places
/// while miners crash and new ones arrive every epoch.
#[test]
fn churn_with_a_queue_loses_no_place_and_stalls_nothing() {
    let cfg = SimConfig { miners: 20, places_per_stage: 5, epochs: 5, churn: 0.1, seed: 3, ..SimConfig::default() };
    let r = ok(&cfg);
    assert!(r.queue_max >= 5, "{r:?}");
    assert!(r.crashed > 0 && r.joined == r.crashed, "{r:?}");
}

/// A quarter of the miners cut off for 5 s in epoch 1, and the
/// orchestrator restarting from its saved state at epoch 2's start.
#[test]
fn a_partition_and_an_orchestrator_restart_end_the_run_with_every_epoch_accounted_for() {
    let cfg =
        SimConfig { epochs: 4, partition: Some((1, 0.25)), restart_at_epoch: Some(2), seed: 4, ..SimConfig::default() };
    let r = ok(&cfg);
    assert!(r.longest_stall_ms > 0);
}

/// A store 20 times slower: uploads and merges wait, nothing is lost.
#[test]
fn a_slow_store_delays_the_run_and_loses_nothing() {
    let fast = ok(&SimConfig { seed: 5, ..SimConfig::default() });
    let slow = ok(&SimConfig { seed: 5, store_ms: 4_000, ..SimConfig::default() });
    assert!(slow.sim_ms > fast.sim_ms, "{} vs {}", slow.sim_ms, fast.sim_ms);
    assert_eq!(slow.dropped, 0);
}

/// Validators running the real round: every epoch's work is drawn from,
/// its evidence asked for and checked, and every weight vector a
/// validator sends is in its epoch's settlement.
#[test]
fn validators_check_every_epoch_and_every_weight_vector_they_send_is_settled() {
    let cfg = SimConfig { validators: 4, epochs: 3, seed: 6, ..SimConfig::default() };
    let r = ok(&cfg);
    assert!(r.checks >= cfg.epochs * 12, "{r:?}");
    assert_eq!(r.settled, cfg.epochs, "{r:?}");
    assert_eq!(r.weight_vectors, 4 * cfg.epochs, "{r:?}");
    assert_eq!(r.weights_unsettled, 0, "{r:?}");
    assert_eq!(r, ok(&cfg), "the same seed, the same run");
}

/// One miner of every adversary mode, among honest ones, with validators:
/// each is named as the real swarm names that mode on the stage it got
/// (`SimReport::problems` holds every outcome against it), no honest
/// miner is convicted, and the run replays bit for bit.
#[test]
fn every_adversary_mode_is_named_as_the_swarm_names_it_and_no_honest_miner_is_convicted() {
    let cfg = SimConfig {
        miners: 60,
        replicas: 12,
        validators: 4,
        epochs: 3,
        seed: 7,
        adversaries: SimAdversary::NAMES.iter().map(|(_, a)| *a).collect(),
        ..SimConfig::default()
    };
    let r = ok(&cfg);
    assert_eq!(r.adversaries.len(), SimAdversary::NAMES.len());
    let convicted = r.adversaries.iter().filter(|a| a.named.starts_with("convicted")).count();
    assert!(convicted >= 20, "{:?}", r.adversaries);
    assert_eq!(r.honest_convicted, 0);
    assert_eq!(r.weights_unsettled, 0);
    assert_eq!(r, ok(&cfg), "the same seed, the same run");
}

/// The outcomes are the modes' own: the same run without its validators
/// convicts none of the cheats only a recompute or an audit shows.
#[test]
fn without_validators_the_recompute_cheats_go_unnamed() {
    let modes =
        vec![SimAdversary::Noise, SimAdversary::SkipOptimizer, SimAdversary::MergeLie, SimAdversary::ScaledPoison];
    let cfg = SimConfig { miners: 16, replicas: 4, epochs: 2, seed: 8, adversaries: modes, ..SimConfig::default() };
    let r = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.adversaries.iter().all(|a| a.named != "convicted (recompute)"), "{:?}", r.adversaries);
    assert!(r.adversaries.iter().any(|a| !a.is_named_as_expected()), "{:?}", r.adversaries);
}
