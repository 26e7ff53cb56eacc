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
use iota_tests::validation::{Place, Scenario, ScenarioReport, run_scenario, run_scenario_shaped};

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
    /// Runs of each hostile-participant mode (`--hostile`), each with its
    /// own validator seeds and miner identities.
    #[arg(long, default_value_t = 10)]
    seeds: u64,
    /// Each mode over `--seeds` runs against an honest baseline of the
    /// same shape: the hostile participants (framing-sender, withholder,
    /// lying-owner, referee-collusion, ask-flood), the evidence cheats
    /// (fabricated-evidence at the head, a middle stage and the tail), the
    /// lazy trainers (skip-weight-grad, skip-optimizer, skip-backward), a
    /// contribution not its weights' (scaled-poison, copy-partner,
    /// negate-partner), and
    /// the dishonest-miner and merge-cheat scenarios of the default run; a
    /// comma list of name prefixes runs only those.
    #[arg(long, value_name = "MODES", num_args = 0..=1, default_missing_value = "all")]
    hostile: Option<String>,
}

/// The modes `--hostile` runs over seeds: issue 56's hostile participants
/// and issue 55's evidence cheats (name, mode, place, shape), then every
/// single-run scenario below; `None` is the `ask-flood` validator (honest
/// miners, the first validator asking for every attempt of every miner).
/// A seeded mode: (name, mode, place, shape); no mode is the `ask-flood`
/// validator.
type SeededMode = (&'static str, Option<Adversary>, Place, (u32, u32));

const HOSTILE: [SeededMode; 17] = [
    ("framing-sender", Some(Adversary::FramingSender), Place::Head, (2, 3)),
    ("withholder", Some(Adversary::Withholder), Place::Head, (2, 3)),
    ("withholder r2", Some(Adversary::Withholder), Place::Head, (2, 2)),
    ("lying-owner r2", Some(Adversary::LyingOwner), Place::Head, (2, 2)),
    ("referee-collusion", Some(Adversary::RefereeCollusion), Place::Head, (2, 3)),
    ("ask-flood", None, Place::Head, (3, 2)),
    ("copy-weights", None, Place::Head, (3, 2)),
    ("fabricated-evidence head", Some(Adversary::FabricatedEvidence), Place::Head, (3, 2)),
    ("fabricated-evidence middle", Some(Adversary::FabricatedEvidence), Place::Middle, (3, 2)),
    ("fabricated-evidence tail", Some(Adversary::FabricatedEvidence), Place::Tail, (3, 2)),
    ("skip-weight-grad middle", Some(Adversary::SkipWeightGrad), Place::Middle, (3, 2)),
    ("skip-optimizer head", Some(Adversary::SkipOptimizer), Place::Head, (3, 2)),
    ("skip-backward head", Some(Adversary::SkipBackward), Place::Head, (3, 2)),
    ("scaled-poison r2", Some(Adversary::ScaledPoison), Place::Head, (2, 2)),
    ("scaled-poison", Some(Adversary::ScaledPoison), Place::Head, (2, 3)),
    ("copy-partner r2", Some(Adversary::CopyPartner), Place::Head, (2, 2)),
    ("negate-partner r2", Some(Adversary::NegatePartner), Place::Head, (2, 2)),
];

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
    if let Some(only) = a.hostile.as_deref() {
        return hostile(&rt, &a, only);
    }
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

/// Each hostile mode over `a.seeds` runs against the median of as many
/// honest runs of its shape (at least `a.baseline_runs`), seeds shared.
fn hostile(rt: &tokio::runtime::Runtime, a: &Args, only: &str) -> Result<()> {
    let wanted = |name: &str| only == "all" || only.split(',').any(|w| name.starts_with(w.trim()));
    let every: Vec<SeededMode> = HOSTILE
        .iter()
        .copied()
        .chain(SCENARIOS.iter().map(|(n, m, p)| (*n, Some(*m), *p, (3, 2))))
        .chain(MERGE_SCENARIOS.iter().map(|(n, m)| (*n, Some(*m), Place::Head, (2, 3))))
        .collect();
    let picked: Vec<_> = every.iter().filter(|(n, ..)| wanted(n)).collect();
    anyhow::ensure!(
        !picked.is_empty(),
        "no mode matches {only:?}; the modes: {:?}",
        every.iter().map(|h| h.0).collect::<Vec<_>>()
    );
    println!(
        "hostile participants: tiny, {} epochs x {} micro-batches, 2 validators (equal stake), {} runs a mode; \
         wall ratio against the median honest run of the same shape; paid: the most work the cheat was credited \
         in the epoch it was convicted; validator %: the validators' compute as a share of the honest miners' \
         (median); proven: runs where a verdict against the cheat carried a proof of a failed inner step the \
         orchestrator re-checked",
        a.epochs, a.micro_batches, a.seeds
    );
    println!(
        "{:<26} {:>6} {:>7} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>11} {:>7}",
        "mode",
        "shape",
        "named",
        "by epoch 1",
        "flagged",
        "convict",
        "paid",
        "ratio p50",
        "ratio max",
        "validator %",
        "proven"
    );
    let mut bases: std::collections::BTreeMap<(u32, u32), f64> = Default::default();
    for (name, mode, place, shape) in picked {
        let base = match bases.get(shape) {
            Some(b) => *b,
            None => {
                let b = honest_baseline(rt, a, *shape);
                bases.insert(*shape, b);
                b
            }
        };
        let mut t = Tally::default();
        let mut copier_share = 0.0f64;
        for i in 0..a.seeds {
            let mut sc =
                Scenario::new(mode.map(|m| (m, *place)), a.epochs, a.micro_batches).shaped(*shape).seeded(9000 + 2 * i);
            match *name {
                "ask-flood" => sc.first_validator = |v| v.ask_flood = true,
                "copy-weights" => sc.first_validator = |v| v.copy_weights = true,
                _ => {}
            }
            let r = rt.block_on(sc.run());
            let paid: f64 = r.validator_pay.iter().sum();
            copier_share = copier_share.max(r.validator_pay.first().copied().unwrap_or(0.0) / paid.max(1e-12));
            t.add(&r, base);
        }
        t.print(name, mode.is_some(), *shape, a.seeds as usize);
        if *name == "copy-weights" {
            println!(
                "  copy-weights: the copier's share of the validators' emission, most over the runs: {copier_share:.3} \
                 (it checks nothing and sends the honest weights; the other validator verifies)"
            );
        }
    }
    Ok(())
}

/// The median wall time of `a.baseline_runs` honest runs of `shape`.
fn honest_baseline(rt: &tokio::runtime::Runtime, a: &Args, shape: (u32, u32)) -> f64 {
    let mut walls: Vec<f64> = (0..a.baseline_runs.max(1) as u64)
        .map(|i| {
            let sc = Scenario::new(None, a.epochs, a.micro_batches).shaped(shape).seeded(7000 + 2 * i);
            rt.block_on(sc.run()).wall.as_secs_f64()
        })
        .collect();
    walls.sort_by(f64::total_cmp);
    println!("honest {}x{}: {:?} s (median is the baseline)", shape.0, shape.1, walls);
    walls[walls.len() / 2]
}

/// One mode's runs, added up.
#[derive(Default)]
struct Tally {
    named: usize,
    /// Runs where a verdict against the cheat carried a proof of a failed
    /// inner step the orchestrator re-checked.
    step_proven: usize,
    first: usize,
    flagged: usize,
    convicted: usize,
    /// The most work a cheat was credited in the epoch it was convicted.
    paid: u64,
    ratios: Vec<f64>,
    validator_shares: Vec<f64>,
}

impl Tally {
    fn add(&mut self, r: &ScenarioReport, base: f64) {
        if std::env::var_os("IOTA_BENCH_VERBOSE").is_some() {
            let epochs: Vec<_> = r.history.iter().map(|e| (e.epoch, e.convicted.len(), e.rolled_back)).collect();
            eprintln!("run: wall {:.1} s, (epoch, convicted, rolled back) {epochs:?}", r.wall.as_secs_f64());
        }
        let bad = |p: &iota_core::PeerId| Some(*p) == r.bad || Some(*p) == r.accomplice;
        let caught = r.bad.and_then(|b| r.history.iter().find(|e| e.convicted.contains(&b)));
        self.named += usize::from(caught.is_some());
        self.step_proven += usize::from(r.step_proofs > 0);
        // Every mode cheats from epoch 0; a finding that outlives its
        // merge (withholding) convicts in the epoch after.
        self.first += usize::from(caught.is_some_and(|e| e.epoch <= 1));
        if let Some(e) = caught {
            let credited = e.miners.iter().filter(|m| bad(&m.peer)).map(|m| m.credited).max().unwrap_or(0);
            self.paid = self.paid.max(credited);
        }
        self.flagged += r.verdicts.iter().filter(|v| v.guilty && !bad(&v.miner)).count();
        self.convicted += r.history.iter().flat_map(|e| &e.convicted).filter(|p| !bad(p)).count();
        self.ratios.push(r.wall.as_secs_f64() / base);
        self.validator_shares.push(100.0 * r.validator_compute.as_secs_f64() / r.miner_compute.as_secs_f64().max(1e-9));
    }

    fn print(mut self, name: &str, cheat: bool, shape: (u32, u32), n: usize) {
        self.ratios.sort_by(f64::total_cmp);
        self.validator_shares.sort_by(f64::total_cmp);
        let of = |k: usize| if cheat { format!("{k}/{n}") } else { "-".to_string() };
        let median = |v: &[f64]| v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
        println!(
            "{:<26} {:>6} {:>7} {:>10} {:>8} {:>8} {:>9} {:>9.2} {:>9.2} {:>10.1}% {:>7}",
            name,
            format!("{}x{}", shape.0, shape.1),
            of(self.named),
            of(self.first),
            self.flagged,
            self.convicted,
            if cheat { self.paid.to_string() } else { "-".to_string() },
            median(&self.ratios),
            self.ratios.last().copied().unwrap_or(f64::NAN),
            median(&self.validator_shares),
            of(self.step_proven)
        );
    }
}
