//! adversary: `tiny` 3 stages x 2 replicas in process on loopback with two
//! validators and one dishonest miner (noise, zeros or replay in the head;
//! a loss-lying or noisy-gradient tail). Baseline from the same run: the
//! same swarm, validators included, with six honest miners. Then the merge
//! cheats (equivocation, NaN, garbage) over 2 stages x 3 replicas (with
//! two replicas no sender is a third party to a partition), against an
//! honest run of that shape. Prints per
//! mode whether both validators' stake convicted it, in which epoch, the
//! guilty votes against honest miners, the wall time as a ratio to the
//! honest baseline, and the validators' compute (time in evidence checks
//! and merged-model evaluations) as a share of the honest miners' compute
//! (time in their stage workers).

use anyhow::Result;
use iota_dataplane::miner::Adversary;
use iota_tests::validation::{Place, ScenarioReport, run_scenario, run_scenario_shaped};

#[derive(clap::Args)]
pub struct Args {
    /// Epochs per run.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Micro-batches per epoch.
    #[arg(long, default_value_t = 32)]
    micro_batches: u64,
    /// Honest runs whose median is the baseline.
    #[arg(long, default_value_t = 3)]
    baseline_runs: usize,
}

const SCENARIOS: [(&str, Adversary, Place); 9] = [
    ("noise head", Adversary::Noise, Place::Head),
    ("zeros head", Adversary::Zeros, Place::Head),
    ("replay head", Adversary::Replay, Place::Head),
    ("copy middle", Adversary::Copy, Place::Middle),
    ("grad-noise middle", Adversary::GradNoise, Place::Middle),
    ("lazy middle", Adversary::Lazy, Place::Middle),
    ("loss-lie tail", Adversary::LossLie, Place::Tail),
    ("noise tail", Adversary::Noise, Place::Tail),
    ("lazy tail", Adversary::Lazy, Place::Tail),
];

/// The merge cheats, each the first miner of a 2 x 3 swarm.
/// (`collude`: two of stage 0's three replicas, each the other's
/// accomplice; "detected" is the first one's conviction.)
const MERGE_SCENARIOS: [(&str, Adversary); 5] = [
    ("merge-equivocate", Adversary::MergeEquivocate),
    ("nan", Adversary::Nan),
    ("merge-garbage", Adversary::MergeGarbage),
    ("collude (2)", Adversary::Collude),
    ("merge-lie", Adversary::MergeLie),
];

pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    println!(
        "adversary: tiny 3 stages x 2 replicas, {} epochs x {} micro-batches, 2 validators (equal stake, >= 3 samples \
         per miner per epoch), 5 honest miners + 1 dishonest",
        a.epochs, a.micro_batches
    );
    let mut bases: Vec<ScenarioReport> =
        (0..a.baseline_runs.max(1)).map(|_| rt.block_on(run_scenario(None, a.epochs, a.micro_batches))).collect();
    bases.sort_by_key(|r| r.wall);
    let walls: Vec<String> = bases.iter().map(|r| format!("{:.1}", r.wall.as_secs_f64())).collect();
    let base = bases.swap_remove(bases.len() / 2);
    println!("honest runs: {} s (median is the baseline)", walls.join(", "));
    println!(
        "{:<17} {:>7} {:>8} {:>14} {:>7} {:>7} {:>9} {:>12}",
        "scenario", "detected", "epoch", "honest flagged", "wall s", "ratio", "checked", "validator %"
    );
    row("honest", &base, &base);
    for (name, mode, place) in SCENARIOS {
        let r = rt.block_on(run_scenario(Some((mode, place)), a.epochs, a.micro_batches));
        row(name, &r, &base);
    }
    println!("merge cheats: tiny 2 stages x 3 replicas, otherwise the same");
    let shape = (2, 3);
    let mut bases: Vec<ScenarioReport> = (0..a.baseline_runs.max(1))
        .map(|_| rt.block_on(run_scenario_shaped(None, shape, a.epochs, a.micro_batches)))
        .collect();
    bases.sort_by_key(|r| r.wall);
    let base = bases.swap_remove(bases.len() / 2);
    row("honest 2x3", &base, &base);
    for (name, mode) in MERGE_SCENARIOS {
        let r = rt.block_on(run_scenario_shaped(Some((mode, Place::Head)), shape, a.epochs, a.micro_batches));
        row(name, &r, &base);
    }
    Ok(())
}

fn row(name: &str, r: &ScenarioReport, base: &ScenarioReport) {
    let first = r.bad.and_then(|b| r.history.iter().find(|e| e.convicted.contains(&b)).map(|e| e.epoch));
    let flagged =
        r.verdicts.iter().filter(|v| v.guilty && Some(v.miner) != r.bad && Some(v.miner) != r.accomplice).count();
    let share = 100.0 * r.validator_compute.as_secs_f64() / r.miner_compute.as_secs_f64().max(1e-9);
    println!(
        "{:<17} {:>7} {:>8} {:>14} {:>7.1} {:>7.2} {:>9} {:>11.1}%",
        name,
        match (r.bad, first) {
            (None, _) => "-",
            (Some(_), Some(_)) => "yes",
            (Some(_), None) => "NO",
        },
        first.map_or("-".to_string(), |e| e.to_string()),
        flagged,
        r.wall.as_secs_f64(),
        r.wall.as_secs_f64() / base.wall.as_secs_f64(),
        r.checked,
        share
    );
}
