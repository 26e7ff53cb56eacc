//! swarm: the local swarm (orchestrator + S x R miner processes) against
//! single-process training of the same model on the same number of tokens,
//! in one run: tokens/s, and the validation loss of the final weights (for
//! the swarm: the last merged weights of every stage, put back together).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use iota_control::cli::RunArgs;
use iota_control::state_db::StateDb;
use iota_control::swarm::{self, SwarmOptions};
use iota_dataplane::fileio::FileIo;
use iota_dataplane::local_store::LocalDirStore;
use iota_dataplane::miner::merge::load_weights;
use iota_model::CpuBackend;
use iota_model::train::Pipeline;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Validation batches for the final loss. 256 unless told: on 16
    /// (8,192 tokens of `tiny`'s batches) the same seed's runs moved by
    /// 2-3% against each other, more than the differences asked about
    /// (docs/BENCHMARKS.md, "Indices coded Elias-Fano").
    #[arg(long, default_value_t = 256)]
    val_batches: u64,
    /// Keep the benchmark's run folder (printed) instead of removing it.
    #[arg(long)]
    keep: bool,
    /// Skip the one-process baseline (deterministic for given settings, so
    /// a sweep of swarm settings need train it only once).
    #[arg(long)]
    no_baseline: bool,
}

/// The benchmark works in a folder it creates itself, and removes only that
/// (when the returned guard drops): inside `--run-dir` when one is given, in
/// the system's temporary directory otherwise. It never deletes a folder
/// the user pointed it at.
fn work_dir(run_dir: &Path) -> Result<tempfile::TempDir> {
    if run_dir == Path::new("runs/swarm") {
        return Ok(tempfile::Builder::new().prefix("iota-bench-swarm-").tempdir()?);
    }
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    Ok(tempfile::Builder::new().prefix("bench-swarm-").tempdir_in(run_dir)?)
}

pub fn run(mut a: Args) -> Result<()> {
    let work = work_dir(&a.run.run_dir)?;
    a.run.run_dir = work.path().to_path_buf();
    // Its miners run here, on the CPU: `--schedule auto` as `iota-control swarm` takes it.
    a.run.local_miner_device = Some("cpu".into());
    let cfg = a.run.run_config()?;
    if let Some(note) = a.run.optimizer_note(&cfg) {
        println!("{note}");
    }
    println!("{}", a.run.schedule_note(&cfg)?);
    a.run.claim_run_dir(&cfg)?;
    let corpus = iota_dataplane::corpus::load_corpus(&cfg, a.run.data_path()?.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let miner_bin = std::env::current_exe()?.parent().context("binary dir")?.join("iota-miner");
    anyhow::ensure!(miner_bin.exists(), "{} not found: build iota-dataplane in release first", miner_bin.display());
    print_run_shape(&a, &cfg);
    // It reads the merged weights back from the directory afterwards.
    anyhow::ensure!(a.run.bucket.is_none(), "the swarm benchmark keeps its objects in RUN_DIR/store; drop --bucket");
    let store_dir = a.run.store_dir()?;
    let report = rt.block_on(swarm::run(SwarmOptions::on_this_machine(
        cfg.clone(),
        a.run.data_path()?,
        store_dir.clone(),
        a.run.run_dir.clone(),
        miner_bin,
        "cpu",
    )))?;
    anyhow::ensure!(!report.interrupted, "interrupted");
    let swarm_tps = report.tokens as f64 / report.elapsed.as_secs_f64();
    let swarm_val = merged_model(&rt, &cfg, &a.run.run_dir, &store_dir)?.eval(&corpus, a.val_batches)?;
    println!("\n  {:<34} {:>10} {:>10} {:>16}", "", "tokens/s", "seconds", "validation loss");
    println!("  {:<34} {:>10.0} {:>10.1} {:>16.4}", "swarm (ours)", swarm_tps, report.elapsed.as_secs_f64(), swarm_val);
    if a.no_baseline {
        println!("  (one-process baseline not run: --no-baseline)");
    } else {
        let (single_tps, single_secs, single_val) = one_process_baseline(&cfg, &corpus, a.val_batches)?;
        println!(
            "  {:<34} {:>10.0} {:>10.1} {:>16.4}",
            "one process, global batch (baseline)", single_tps, single_secs, single_val
        );
        println!(
            "  ratios: throughput {:.2}x (goal >= 0.7x), final loss {:.3}x ({:+.1}%, goal within 2%)",
            swarm_tps / single_tps,
            swarm_val / single_val,
            (swarm_val / single_val - 1.0) * 100.0
        );
    }
    print_swarm_details(&report);
    if a.keep {
        println!("  run folder kept: {}", work.keep().display());
    }
    Ok(())
}

/// The run the benchmark makes: model, shape, tokens, codec, merge ramp.
fn print_run_shape(a: &Args, cfg: &iota_protocol::RunConfig) {
    println!(
        "swarm: {} {} stages x {} replicas, {} epochs x {} micro-batches of {} x {} tokens ({} tokens), codec {}",
        a.run.model,
        cfg.spec.stages,
        cfg.spec.replicas,
        cfg.spec.epochs,
        cfg.spec.micro_batches_per_epoch,
        cfg.train.batch,
        cfg.train.seq,
        cfg.spec.total_micro_batches() * (cfg.train.batch * cfg.train.seq) as u64,
        cfg.train.codec.name()
    );
    if cfg.spec.ramp_first_epoch > 0 {
        let lens: Vec<String> = (0..cfg.spec.epoch_count()).map(|e| cfg.spec.epoch_len(e).to_string()).collect();
        println!("swarm: the merge ramp makes {} epochs of {} micro-batches", lens.len(), lens.join(", "));
    }
}

/// The swarm's final weights (the last merged file of every stage), read
/// as a newcomer would: the objects the orchestrator recorded, checked
/// against their announcements.
fn merged_model(
    rt: &tokio::runtime::Runtime,
    cfg: &iota_protocol::RunConfig,
    run_dir: &Path,
    store_dir: &Path,
) -> Result<Pipeline<CpuBackend>> {
    let mut merged = Pipeline::new(Arc::new(CpuBackend::new()), cfg.train.clone())?;
    let store = LocalDirStore::shared(store_dir, FileIo::start(false))?;
    let state = StateDb::open(&run_dir.join("state.sqlite"))?.load()?.context("no saved orchestrator state")?;
    for (s, stage) in merged.stages_mut().iter_mut().enumerate() {
        let objects = state.stage_weights(s as u32);
        let p = rt.block_on(load_weights(&store, &objects, stage.layout())).0?;
        stage.set_params(&p)?;
    }
    Ok(merged)
}

/// One process, same model and tokens, at the swarm's global batch: each
/// of its optimizer steps accumulates the micro-batches the R replicas
/// take one inner step on, so it takes as many steps as each replica, on
/// the same schedule (its warm-up included). (Comparing with one process
/// at a replica's batch, R times the steps, is what made the swarm look
/// 18% worse in docs/BENCHMARKS.md: see `iota-bench convergence`.)
/// Its tokens per second, seconds and validation loss.
fn one_process_baseline(
    cfg: &iota_protocol::RunConfig,
    corpus: &iota_model::data::Corpus,
    val_batches: u64,
) -> Result<(f64, f64, f32)> {
    let mut single_cfg = cfg.train.clone();
    single_cfg.grad_accum = cfg.train.grad_accum * cfg.spec.replicas as usize;
    let mut single = Pipeline::new(Arc::new(CpuBackend::new()), single_cfg.clone())?;
    let t0 = Instant::now();
    let mut tokens = 0usize;
    for _ in 0..single_cfg.steps {
        tokens += single.train_step(corpus)?.tokens;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((tokens as f64 / secs, secs, single.eval(corpus, val_batches)?))
}

/// The swarm's counts, epoch losses, loss outliers and phase times.
fn print_swarm_details(report: &iota_control::swarm::SwarmReport) {
    println!(
        "  swarm: {} micro-batches completed, {} re-routed, {} dropped; epoch losses {:?}",
        report.completed,
        report.rerouted,
        report.dropped,
        report.history.iter().map(|e| (e.mean_loss * 1000.0).round() / 1000.0).collect::<Vec<_>>()
    );
    let outliers = loss_outliers(&report.history);
    if outliers.is_empty() {
        println!("  micro-batch losses over {OUTLIER_RATIO}x their epoch's median: none");
    } else {
        let listed: Vec<String> =
            outliers.iter().map(|(e, worst, median)| format!("epoch {e}: {worst:.2} (median {median:.2})")).collect();
        println!("  micro-batch losses over {OUTLIER_RATIO}x their epoch's median: {}", listed.join(", "));
    }
    let c = &report.counters;
    let phases = (c.training_ms + c.uploading_ms + c.merging_ms).max(1);
    println!(
        "  swarm phases: training {:.1}s, upload {:.1}s, merge {:.1}s visible ({:.1}% of the epochs outside \
         training); merges behind compute: {}",
        c.training_ms as f64 / 1e3,
        c.uploading_ms as f64 / 1e3,
        c.merging_ms as f64 / 1e3,
        100.0 * (c.uploading_ms + c.merging_ms) as f64 / phases as f64,
        c.merges_behind_compute
    );
}

/// A micro-batch loss this many times its epoch's median is reported: a
/// spike that an epoch's mean hides (or shows without saying which).
const OUTLIER_RATIO: f32 = 1.5;

/// Epochs with a micro-batch loss over `OUTLIER_RATIO` times the epoch's
/// median: (epoch, that loss, the median). Dropped micro-batches (NaN) are
/// left out; an epoch needs two losses to have a median worth comparing.
fn loss_outliers(history: &[iota_control::orchestrator::EpochSummary]) -> Vec<(u64, f32, f32)> {
    history
        .iter()
        .filter_map(|e| {
            let mut l: Vec<f32> = e.losses.iter().copied().filter(|x| x.is_finite()).collect();
            if l.len() < 2 {
                return None;
            }
            l.sort_by(f32::total_cmp);
            let median = if l.len() % 2 == 1 { l[l.len() / 2] } else { 0.5 * (l[l.len() / 2 - 1] + l[l.len() / 2]) };
            let worst = l[l.len() - 1];
            (worst > OUTLIER_RATIO * median).then_some((e.epoch, worst, median))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_the_epoch_mean_hides_is_named_with_its_epoch() {
        let epoch = |epoch: u64, losses: &[f32]| iota_control::orchestrator::EpochSummary {
            epoch,
            mean_loss: losses.iter().sum::<f32>() / losses.len() as f32,
            losses: losses.to_vec(),
            completed: losses.len() as u64,
            ..Default::default()
        };
        let history = [
            epoch(10, &[6.7, 6.8, 6.6, 6.9]),
            epoch(11, &[6.2, 6.1, 24.0, 6.3]),
            epoch(12, &[6.1, f32::NAN, 6.2]),
            epoch(13, &[30.0]),
        ];
        assert_eq!(loss_outliers(&history), vec![(11, 24.0, 6.25)]);
    }

    #[test]
    fn the_benchmark_removes_only_the_folder_it_made() {
        let user = tempfile::tempdir().unwrap();
        std::fs::write(user.path().join("precious.txt"), b"the user's").unwrap();
        let work = work_dir(user.path()).unwrap();
        assert!(work.path().starts_with(user.path()) && work.path() != user.path());
        std::fs::write(work.path().join("state.sqlite"), b"bench").unwrap();
        let made = work.path().to_path_buf();
        drop(work);
        assert!(!made.exists());
        assert_eq!(std::fs::read(user.path().join("precious.txt")).unwrap(), b"the user's");
    }
}
