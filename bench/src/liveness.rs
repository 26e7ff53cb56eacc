//! liveness: `tiny` 2 stages x 2 replicas in process on loopback (four
//! honest miners), with one `silent`, `closed`, `slow`, `flaky` or
//! `hostile-unreachable` miner in the head stage, the tail stage, or
//! joining mid-run. Baseline from the
//! same run: the same swarm with the honest miners only. Prints each
//! scenario's wall time as a ratio to it, micro-batches dropped, the epoch
//! the bad miner was first benched in, its recorded work, and (slow) its
//! share of its stage's routes against its share of the measured speed;
//! each the median of `--runs` runs.

use std::time::Duration;

use anyhow::Result;
use iota_dataplane::miner::Adversary;
use iota_tests::liveness::{Place, ScenarioReport, run_scenario};

#[derive(clap::Args)]
pub struct Args {
    /// Epochs per run.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Micro-batches per epoch (3 x 64 = the 192).
    #[arg(long, default_value_t = 64)]
    micro_batches: u64,
    /// Sequences (of 64 tokens) per micro-batch: 8, the `iota-control
    /// orchestrator` default the measurements ran with.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Honest runs whose median is the baseline.
    #[arg(long, default_value_t = 3)]
    baseline_runs: usize,
    /// Runs of each scenario; the median one is reported (one run's wall
    /// time swings by 10-20% on a loaded 2-core VM).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Only these adversaries (silent, closed, slow, flaky,
    /// hostile-unreachable; default all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn parse(s: &str) -> Option<Adversary> {
    Some(match s {
        "silent" => Adversary::Silent,
        "closed" => Adversary::Closed,
        "slow" => Adversary::Slow,
        "flaky" => Adversary::Flaky,
        "hostile-unreachable" => Adversary::HostileUnreachable,
        _ => return None,
    })
}

pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    let mut kinds =
        vec![Adversary::Silent, Adversary::Closed, Adversary::Slow, Adversary::Flaky, Adversary::HostileUnreachable];
    if !a.only.is_empty() {
        kinds = a
            .only
            .iter()
            .map(|s| {
                parse(s).ok_or_else(|| {
                    anyhow::anyhow!("unknown adversary '{s}' (silent, closed, slow, flaky, hostile-unreachable)")
                })
            })
            .collect::<Result<_>>()?;
    }
    println!(
        "liveness: tiny 2 stages x 2 replicas, {} epochs x {} micro-batches of {} x 64 tokens, 4 honest miners + 1 unreliable",
        a.epochs, a.micro_batches, a.batch
    );
    // This VM's wall times swing by tens of percent from run to run: the
    // baseline is the median of `baseline_runs` honest runs.
    let mut bases: Vec<ScenarioReport> = (0..a.baseline_runs.max(1))
        .map(|_| rt.block_on(run_scenario(None, a.epochs, a.micro_batches, a.batch)))
        .collect();
    bases.sort_by_key(|r| r.wall);
    let walls: Vec<String> = bases.iter().map(|r| format!("{:.1}", r.wall.as_secs_f64())).collect();
    let base = bases.swap_remove(bases.len() / 2);
    println!("honest runs: {} s (median is the baseline)", walls.join(", "));
    print_header();
    print_row("honest (baseline)", &base, base.wall);
    for k in kinds {
        for place in [Place::Head, Place::Tail, Place::MidRun] {
            let mut rs: Vec<ScenarioReport> = (0..a.runs.max(1))
                .map(|_| rt.block_on(run_scenario(Some((k, place)), a.epochs, a.micro_batches, a.batch)))
                .collect();
            rs.sort_by_key(|r| r.wall);
            // Honest miners benched in any of the runs, and the slowest
            // run's ratio: the median run alone would hide an unlucky one.
            let any_benched: usize = rs.iter().map(|r| r.honest_benched).sum();
            let worst = rs.last().map_or(0.0, |r| r.wall.as_secs_f64() / base.wall.as_secs_f64());
            let mut r = rs.swap_remove(rs.len() / 2);
            r.honest_benched = any_benched;
            print_row(&format!("{k:?} {place:?}").to_lowercase(), &r, base.wall);
            if a.runs > 1 {
                println!(
                    "{:<26} {} runs: slowest {worst:.2}x; honest miners benched over all runs: {any_benched}",
                    "", a.runs
                );
            }
        }
    }
    Ok(())
}

fn print_header() {
    println!(
        "{:<26} {:>8} {:>7} {:>8} {:>8} {:>9} {:>10} {:>11} {:>14}",
        "scenario", "wall s", "ratio", "dropped", "benched", "its work", "its routes", "its speed", "honest benched"
    );
}

fn print_row(name: &str, r: &ScenarioReport, base: Duration) {
    let benched = r.benched_in.map_or("-".to_string(), |e| format!("epoch {e}"));
    let (work, routes, speed) = match &r.bad {
        Some(m) => (
            m.delivered.to_string(),
            format!("{:.0}%", 100.0 * r.route_share),
            format!("{:.0}%", 100.0 * r.speed_share),
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    println!(
        "{:<26} {:>8.1} {:>6.2}x {:>8} {:>8} {:>9} {:>10} {:>11} {:>14}",
        name,
        r.wall.as_secs_f64(),
        r.wall.as_secs_f64() / base.as_secs_f64(),
        r.counters.dropped,
        benched,
        work,
        routes,
        speed,
        r.honest_benched
    );
}
