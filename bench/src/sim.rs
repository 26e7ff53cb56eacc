//! `iota-bench sim`: the deterministic swarm simulator (`iota_roles::sim`)
//! at 100 to 10,000 miners: events the orchestrator stepped per second of
//! wall time, the simulator's memory per miner, wall time per simulated
//! epoch, and how much faster than real time the run went (virtual time
//! over wall time, the baseline being real time itself); then one Yuma
//! epoch at 256 validators x 4,096 miners beside a normalising pass.

use std::time::Instant;

use anyhow::Result;
use iota_control::sim::{SimAdversary, SimConfig, run as simulate};

#[derive(clap::Args)]
pub struct Args {
    /// Miner counts to simulate, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [100usize, 1_000, 2_000, 10_000])]
    miners: Vec<usize>,
    #[arg(long, default_value_t = 10)]
    epochs: u64,
    /// Share of the live miners that crash each epoch (replaced by as many
    /// newcomers).
    #[arg(long, default_value_t = 0.05)]
    churn: f64,
    #[arg(long, default_value_t = 8)]
    stages: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Validators of equal stake, each running the real validator round.
    #[arg(long, default_value_t = 16)]
    validators: usize,
    /// Plant one miner of every adversary mode.
    #[arg(long)]
    adversaries: bool,
}

/// The shape for `miners`: `stages` stages of miners / stages replicas,
/// a tenth more places than that (newcomers from churn take them), four
/// micro-batches a replica each epoch; `validators` of equal stake and,
/// if `adversaries`, one miner of every adversary mode.
pub fn config(
    miners: usize,
    (stages, epochs, churn, seed): (u32, u64, f64, u64),
    validators: usize,
    adversaries: bool,
) -> SimConfig {
    let replicas = (miners as u32 / stages).max(1);
    SimConfig {
        miners,
        stages,
        replicas,
        places_per_stage: replicas + replicas.div_ceil(10),
        epochs,
        micro_batches_per_epoch: 4 * u64::from(replicas),
        in_flight: replicas,
        seed,
        churn,
        validators,
        adversaries: if adversaries { SimAdversary::NAMES.iter().map(|(_, a)| *a).collect() } else { Vec::new() },
        ..SimConfig::default()
    }
}

pub fn run(a: Args) -> Result<()> {
    println!(
        "sim: {} stages, {} epochs, {:.0}% churn an epoch, {} validators, {}, seed {} (one thread, virtual clock)",
        a.stages,
        a.epochs,
        100.0 * a.churn,
        a.validators,
        if a.adversaries { "one adversary of every mode" } else { "no adversaries" },
        a.seed
    );
    println!(
        "{:>7} {:>10} {:>12} {:>10} {:>13} {:>12} {:>9} {:>10} {:>8}",
        "miners", "events", "events/s", "wall s", "wall s/epoch", "bytes/miner", "sim s", "x realtime", "queue"
    );
    for &n in &a.miners {
        let cfg = config(n, (a.stages, a.epochs, a.churn, a.seed), a.validators, a.adversaries);
        iota_model::alloc::reset_peak_on_this_thread();
        let base = iota_model::alloc::live_on_this_thread();
        let t0 = Instant::now();
        let r = simulate(&cfg).map_err(anyhow::Error::msg)?;
        let wall = t0.elapsed().as_secs_f64();
        let peak = (iota_model::alloc::peak_on_this_thread() - base).max(0) as f64;
        let problems = r.problems();
        println!(
            "{n:>7} {:>10} {:>12.0} {wall:>10.2} {:>13.3} {:>12.0} {:>9.0} {:>10.0} {:>8}",
            r.events,
            r.events as f64 / wall,
            wall / a.epochs as f64,
            peak / n as f64,
            r.sim_ms as f64 / 1e3,
            r.sim_ms as f64 / 1e3 / wall,
            r.queue_max
        );
        println!(
            "        {} completed, {} dropped, {} crashed and as many joined, longest stall {:.1} s (timeout {:.1} s), digest {}",
            r.completed,
            r.dropped,
            r.crashed,
            r.longest_stall_ms as f64 / 1e3,
            r.phase_timeout_ms as f64 / 1e3,
            &r.digest[..16]
        );
        println!(
            "        {} validators: {} evidence checks, {} weight vectors, {} of {} epochs settled, {} validator reports refused",
            cfg.validators, r.checks, r.weight_vectors, r.settled, a.epochs, r.validator_refusals
        );
        for o in &r.adversaries {
            println!("        adversary {:<20} stage {:>2}: {}", o.mode, o.stage, o.named);
        }
        if !problems.is_empty() {
            println!("        problems: {problems:?}");
        }
    }
    crate::clasp::yuma_step(a.seed);
    Ok(())
}
