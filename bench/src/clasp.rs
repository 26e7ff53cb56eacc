//! clasp: how many sampled pathways CLASP needs to catch a harmful miner.
//! Seeded simulated epochs (stages x replicas, a falling loss trend, Gaussian
//! per-sample noise) with one miner in stage 1 that adds `h` nats to every
//! sample through it. Prints, per harm and number of pathways, the detection
//! power (the share of epochs in which that miner is flagged) and the
//! false-positive rate over the honest miners of the same runs. Baseline
//! from the same runs: the naive attribution (a miner's mean loss minus its
//! stage peers' mean loss, Welch standard error, the same critical value).
//! Two scenarios: the harmful miner works all epoch, or joins at mid-epoch
//! (when the loss is lower). Then the cost: record throughput and the time of
//! one estimate at 12, 256 and 1,024 miners; and the Yuma step for 256
//! validators x 4,096 miners against one pass that reads every weight
//! (the floor any consensus over the whole matrix pays).

use std::time::Instant;

use anyhow::Result;
use iota_control::settlement::clasp::{Clasp, ClaspConfig, ClaspParams, ClaspReport};
use iota_core::Rng;

use crate::timing::median;

#[derive(clap::Args)]
pub struct Args {
    /// Seeded epochs per (scenario, harm, pathways) cell.
    #[arg(long, default_value_t = 300)]
    epochs: u64,
    /// Pipeline stages.
    #[arg(long, default_value_t = 3)]
    stages: usize,
    /// Replicas per stage.
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Per-sample loss noise (nats, standard deviation).
    #[arg(long, default_value_t = 0.05)]
    noise: f64,
    /// One-sided critical value before the Bonferroni correction.
    #[arg(long, default_value_t = 3.0)]
    z: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

const HARMS: [f64; 4] = [0.01, 0.02, 0.05, 0.1];
const PATHWAYS: [u64; 4] = [64, 256, 1024, 4096];

/// Training progress: 4.2 nats falling to ~3.06 over the epoch.
fn trend(t: f64) -> f64 {
    3.0 + 1.2 * (-3.0 * t).exp()
}

#[derive(Default)]
struct Tally {
    epochs: u64,
    caught: u64,
    naive_caught: u64,
    honest: u64,
    false_pos: u64,
    naive_false_pos: u64,
    est_us: Vec<f64>,
}

/// One epoch: the bad miner is (stage 1, replica 0); `late` makes it work
/// only in the second half. Returns the CLASP report and the naive flags.
fn epoch(a: &Args, seed: u64, n: u64, harm: f64, late: bool) -> (ClaspReport<u32>, Vec<bool>, f64) {
    let (s_n, r_n) = (a.stages, a.replicas);
    let mut rng = Rng::derived(a.seed, &[seed, n, harm.to_bits(), late as u64]);
    let mut clasp = Clasp::new(s_n, n);
    // Per (stage, replica): count, sum, sum of squares (the naive baseline).
    let mut naive = vec![(0.0f64, 0.0f64, 0.0f64); s_n * r_n];
    let mut path = vec![0u32; s_n];
    for i in 0..n {
        let t = i as f64 / n as f64;
        let mut loss = trend(t) + a.noise * rng.normal() as f64;
        for (s, slot) in path.iter_mut().enumerate() {
            let r = if s == 1 && late && t < 0.5 { 1 + rng.below(r_n as u64 - 1) } else { rng.below(r_n as u64) };
            *slot = (s * 1000) as u32 + r as u32;
            if s == 1 && r == 0 {
                loss += harm;
            }
        }
        let _ = clasp.record(i, &path, loss as f32);
        for &k in &path {
            let c = &mut naive[(k / 1000) as usize * r_n + (k % 1000) as usize];
            *c = (c.0 + 1.0, c.1 + loss, c.2 + loss * loss);
        }
    }
    let params = ClaspParams { z: a.z, ..ClaspParams::default() };
    let t0 = Instant::now();
    let report = clasp.estimate(&params);
    let us = t0.elapsed().as_secs_f64() * 1e6;
    // Naive: mean through the miner minus mean through its peers, Welch SE,
    // flagged when the lower bound at the same critical value exceeds 0.
    let flags = report
        .miners
        .iter()
        .map(|m| {
            let base = m.stage * r_n;
            let own = naive[base + (m.key % 1000) as usize];
            let peers = (0..r_n)
                .filter(|&r| r as u32 != m.key % 1000)
                .map(|r| naive[base + r])
                .fold((0.0, 0.0, 0.0), |acc, c| (acc.0 + c.0, acc.1 + c.1, acc.2 + c.2));
            let stats = |(n, s, q): (f64, f64, f64)| {
                let mean = s / n;
                (mean, ((q / n - mean * mean) * n / (n - 1.0)).max(0.0) / n)
            };
            let ((m1, v1), (m2, v2)) = (stats(own), stats(peers));
            own.0 >= 2.0 && peers.0 >= 2.0 && (m1 - m2) - report.critical * (v1 + v2).sqrt() > 0.0
        })
        .collect();
    (report, flags, us)
}

fn scenario(a: &Args, late: bool) -> Vec<Vec<Tally>> {
    HARMS
        .iter()
        .map(|&harm| {
            PATHWAYS
                .iter()
                .map(|&n| {
                    let mut t = Tally::default();
                    for e in 0..a.epochs {
                        let (report, naive, us) = epoch(a, e, n, harm, late);
                        t.epochs += 1;
                        t.est_us.push(us);
                        for (m, &nf) in report.miners.iter().zip(&naive) {
                            if m.stage == 1 && m.key % 1000 == 0 {
                                t.caught += m.harmful() as u64;
                                t.naive_caught += nf as u64;
                            } else {
                                t.honest += 1;
                                t.false_pos += m.harmful() as u64;
                                t.naive_false_pos += nf as u64;
                            }
                        }
                    }
                    t
                })
                .collect()
        })
        .collect()
}

fn pct(k: u64, n: u64) -> String {
    format!("{:.1}", 100.0 * k as f64 / n.max(1) as f64)
}

fn print_scenario(name: &str, cells: &[Vec<Tally>]) {
    println!("\n{name}  (FP: honest miners flagged / honest miners judged)");
    println!(
        "{:>7} {:>9} {:>10} {:>10} {:>12} {:>12} {:>12}",
        "harm", "pathways", "power %", "naive %", "honest FP", "naive FP", "estimate us"
    );
    for (harm, row) in HARMS.iter().zip(cells) {
        for (n, t) in PATHWAYS.iter().zip(row) {
            println!(
                "{:>7.2} {:>9} {:>10} {:>10} {:>12} {:>12} {:>12.1}",
                harm,
                n,
                pct(t.caught, t.epochs),
                pct(t.naive_caught, t.epochs),
                format!("{}/{}", t.false_pos, t.honest),
                format!("{}/{}", t.naive_false_pos, t.honest),
                median(t.est_us.clone()),
            );
        }
    }
}

/// Record throughput and estimate time at `miners` miners over 4 stages.
fn cost(miners: usize, samples: u64) -> (f64, f64) {
    let stages = 4;
    let per = (miners / stages).max(2) as u64;
    let cfg = ClaspConfig { max_miners: miners.max(8), ..ClaspConfig::new(stages, samples) };
    let mut clasp: Clasp<u32> = Clasp::with_config(cfg);
    let mut rng = Rng::new(9);
    let mut path = vec![0u32; stages];
    let t0 = Instant::now();
    for i in 0..samples {
        for (s, slot) in path.iter_mut().enumerate() {
            *slot = (s as u64 * per + rng.below(per)) as u32;
        }
        let _ = clasp.record(i, &path, 3.0 + 0.05 * rng.normal());
    }
    let ns = t0.elapsed().as_secs_f64() * 1e9 / samples as f64;
    let t1 = Instant::now();
    let report = clasp.estimate(&ClaspParams::default());
    let ms = t1.elapsed().as_secs_f64() * 1e3;
    assert_eq!(report.miners.len(), stages * per as usize);
    (ns, ms)
}

pub fn run(a: Args) -> Result<()> {
    anyhow::ensure!(a.stages >= 2 && a.replicas >= 2, "need >= 2 stages and >= 2 replicas");
    let t0 = Instant::now();
    println!(
        "clasp: {} stages x {} replicas, one miner in stage 1 adds `harm` nats to each sample through it; loss trend \
         4.2 -> 3.06 nats over the epoch, noise {} nats/sample; {} seeded epochs per cell; flagged when the lower \
         bound exceeds 0 at z = {} Bonferroni-corrected over the miners (CLASP and naive share the critical value)",
        a.stages, a.replicas, a.noise, a.epochs, a.z
    );
    print_scenario("harmful miner works all epoch (uniform routing)", &scenario(&a, false));
    print_scenario("harmful miner joins at mid-epoch (its peers carry the first half)", &scenario(&a, true));
    println!("\ncost (4 stages, 2^20 samples, one estimate)");
    println!("{:>7} {:>12} {:>12}", "miners", "record ns", "estimate ms");
    for miners in [12, 256, 1024] {
        let (ns, ms) = cost(miners, 1 << 20);
        println!("{miners:>7} {ns:>12.1} {ms:>12.1}");
    }
    yuma_step(a.seed);
    println!("\ntotal {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// Times one Yuma epoch (256 validators x 4,096 miners, random sparse-ish
/// weights, bonds from a previous epoch) on this thread; the baseline is a
/// single pass normalising every row of the same matrix.
pub fn yuma_step(seed: u64) {
    use iota_control::settlement::yuma::{self, YumaInput};
    let (v, m) = (256usize, 4096usize);
    let mut rng = Rng::new(seed ^ 0x59_75_6d_61);
    let weights: Vec<Vec<f64>> =
        (0..v).map(|_| (0..m).map(|_| if rng.next_f64() < 0.5 { rng.next_f64() } else { 0.0 }).collect()).collect();
    let stakes: Vec<f64> = (0..v).map(|_| 1.0 + 1_000.0 * rng.next_f64()).collect();
    let first = yuma::run(&YumaInput { stakes: stakes.clone(), weights: weights.clone(), ..YumaInput::default() })
        .expect("a valid input");
    let input = YumaInput { stakes, weights, bonds: Some(first.bonds), ..YumaInput::default() };
    let mut ours = Vec::new();
    let mut floor = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let out = yuma::run(&input).expect("a valid input");
        ours.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(out);
        let t = Instant::now();
        let rows: Vec<Vec<f64>> = input
            .weights
            .iter()
            .map(|r| {
                let sum: f64 = r.iter().sum();
                r.iter().map(|x| x / sum).collect()
            })
            .collect();
        floor.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(rows);
    }
    let (ours, floor) = (median(ours), median(floor));
    println!("\nyuma step, {v} validators x {m} miners, one thread (median of 7)");
    println!("{:>14} {:>22} {:>7}", "yuma ms", "one normalising pass ms", "ratio");
    println!("{ours:>14.1} {floor:>22.1} {:>7.1}", ours / floor);
}
