//! scale, measured: a swarm of the plan's shape (the orchestrator and S x R
//! miner processes on this machine, each on the given device) and one
//! process training the same model on the same tokens at the swarm's global
//! batch, in one run. It prints the swarm's tokens/s as a ratio to the one
//! process's, the share of the epochs spent outside training (upload and
//! merge: the merge's visible cost), the time from the first epoch's start
//! to its first completed micro-batch, the merge's store fallbacks and
//! refused frames, and every miner's peak memory beside its stage's plan.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use iota_control::cli::RunArgs;
use iota_control::swarm::{self, SwarmOptions, SwarmReport};
use iota_core::memory_plan::{ComputeBackend, GIB, Workload, plan_memory};
use iota_model::train::{Pipeline, TrainConfig};
use iota_model::{Backend, CpuBackend};

/// What a measured run is given (the plan's flags, and these).
pub struct Measure<'a> {
    pub model: &'a str,
    pub stages: usize,
    pub replicas: usize,
    pub batch: usize,
    pub seq: usize,
    pub epochs: u64,
    pub micro_batches: u64,
    pub codec: &'a str,
    pub merge_codec: &'a str,
    /// `cpu` or `cuda[:N]`: every miner's and the one process's.
    pub device: &'a str,
    pub data: Option<&'a Path>,
    /// The swarm merges behind compute.
    pub merge_overlap: bool,
    /// Memory every miner states (GiB; None: a GPU's free memory) and
    /// when it recomputes activations (None: the miner's default, auto).
    pub miner_memory_gib: Option<f64>,
    pub recompute: Option<&'a str>,
}

/// What one measured run found.
#[derive(Debug)]
pub struct Measured {
    pub one_process_tokens_per_s: f64,
    /// Over the epochs (training, upload and merge), start-up excluded.
    pub swarm_tokens_per_s: f64,
    /// Upload and merge time over all epoch time.
    pub outside_training: f64,
    /// The first epoch's start to its first completed micro-batch (s).
    pub first_micro_batch_s: Option<f64>,
    pub store_fallbacks: (u64, u64),
    pub frames_refused: u64,
    /// Per miner process: (stage, peak resident bytes, peak device bytes,
    /// the plan's peak for its stage, whether it recomputed activations).
    pub miners: Vec<(Option<u32>, u64, u64, u64, bool)>,
    pub completed: u64,
    /// Merges that ran while the next epoch trained.
    pub merges_behind_compute: u64,
}

#[derive(Parser)]
struct RunCli {
    #[command(flatten)]
    run: RunArgs,
}

/// The binary beside this one (target/release, or target/debug when a
/// test runs from target/debug/deps).
fn sibling_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)].into_iter().find(|p| p.exists())
}

pub fn measure(m: &Measure<'_>, work: &Path) -> Result<Measured> {
    let miner_bin = sibling_binary("iota-miner")
        .context("iota-miner not found beside this binary: build it first (cargo build --release --bins)")?;
    let mut argv: Vec<String> = [
        "scale",
        "--model",
        m.model,
        "--codec",
        m.codec,
        "--merge-codec",
        m.merge_codec,
        "--run-dir",
        work.to_str().context("a UTF-8 work folder")?,
    ]
    .map(String::from)
    .to_vec();
    for (flag, v) in [
        ("--stages", m.stages as u64),
        ("--replicas", m.replicas as u64),
        ("--batch", m.batch as u64),
        ("--seq", m.seq as u64),
        ("--epochs", m.epochs),
        ("--micro-batches", m.micro_batches),
    ] {
        argv.push(flag.into());
        argv.push(v.to_string());
    }
    if let Some(d) = m.data {
        argv.push("--data".into());
        argv.push(d.to_str().context("a UTF-8 data path")?.into());
    }
    if m.merge_overlap {
        argv.push("--merge-overlap".into());
    }
    let run = RunCli::try_parse_from(argv).map_err(|e| anyhow::anyhow!("{e}"))?.run;
    let cfg = run.run_config()?;
    run.claim_run_dir(&cfg)?;
    let corpus = iota_dataplane::corpus::load_corpus(&cfg, run.data_path()?.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut opts = SwarmOptions::on_this_machine(
        cfg.clone(),
        run.data_path()?,
        run.store_dir()?,
        run.run_dir.clone(),
        miner_bin,
        m.device,
    );
    opts.extra_miner_args = swarm::miner_memory_args(m.miner_memory_gib, m.recompute);
    let report = rt.block_on(swarm::run(opts))?;
    if report.interrupted {
        bail!("interrupted");
    }
    let one = one_process(
        &cfg.train,
        cfg.spec.replicas as usize,
        cfg.spec.epochs * cfg.spec.micro_batches_per_epoch,
        &corpus,
        m.device,
    )?;
    let backend = if m.device == "cpu" { ComputeBackend::Cpu } else { ComputeBackend::CudaBf16Gemm };
    // The miners' attention: fused where the environment turns it on.
    let fused = std::env::var("IOTA_FLASH_ATTENTION").is_ok_and(|v| v == "1");
    let w = Workload::of(backend, m.batch, m.seq, 2).fusing(fused);
    // A miner recomputes activations where its memory needs it: its plan is
    // the recomputing one then.
    let plans =
        [plan_memory(&cfg.train.model, m.stages, &w)?, plan_memory(&cfg.train.model, m.stages, &w.recomputing(true))?];
    Ok(summarise(&report, one, &plans))
}

fn summarise(
    r: &SwarmReport,
    one_process_tokens_per_s: f64,
    plans: &[Vec<iota_core::memory_plan::StageMemory>; 2],
) -> Measured {
    let c = &r.counters;
    let epochs_ms = (c.training_ms + c.uploading_ms + c.merging_ms).max(1);
    let first = c.first_training_at_ms.zip(c.first_completed_at_ms).map(|(a, b)| b.saturating_sub(a) as f64 / 1e3);
    let miners = r
        .miner_totals
        .iter()
        .map(|t| {
            let stage = t.as_ref().and_then(|t| t.stage);
            let recomputed = t.as_ref().is_some_and(|t| t.recomputed);
            let plan = &plans[recomputed as usize];
            let planned = stage.and_then(|s| plan.get(s as usize)).map_or(0, |p| p.peak());
            let (rss, dev) = t.as_ref().map_or((0, 0), |t| (t.peak_rss_bytes, t.peak_device_bytes));
            (stage, rss, dev, planned, recomputed)
        })
        .collect();
    let frames_refused = r.miner_totals.iter().flatten().map(|t| t.rejected.values().sum::<u64>()).sum();
    Measured {
        one_process_tokens_per_s,
        swarm_tokens_per_s: r.tokens as f64 / (epochs_ms as f64 / 1e3),
        outside_training: (c.uploading_ms + c.merging_ms) as f64 / epochs_ms as f64,
        first_micro_batch_s: first,
        store_fallbacks: r.merge_from_store,
        frames_refused,
        miners,
        completed: r.completed,
        merges_behind_compute: c.merges_behind_compute,
    }
}

/// One process at the swarm's global batch (each optimizer step takes the
/// micro-batches the R replicas take one inner step on), over as many
/// micro-batches: its tokens/s.
fn one_process(
    train: &TrainConfig,
    replicas: usize,
    micro_batches: u64,
    corpus: &iota_model::data::Corpus,
    device: &str,
) -> Result<f64> {
    let mut cfg = train.clone();
    cfg.grad_accum = train.grad_accum * replicas;
    cfg.steps = (micro_batches / cfg.grad_accum as u64).max(1);
    cfg.schedule.total = cfg.steps;
    cfg.schedule.warmup = (cfg.steps / 20).clamp(1, 100);
    match device.parse::<iota_cuda::ComputeDevice>().map_err(anyhow::Error::msg)? {
        iota_cuda::ComputeDevice::Cpu => time_steps(Pipeline::new(Arc::new(CpuBackend::new()), cfg)?, corpus),
        iota_cuda::ComputeDevice::Cuda(i) => {
            let be = iota_cuda::open_backend(i, iota_cuda::backend::GemmPrecision::Bf16)?;
            time_steps(Pipeline::new(Arc::new(be), cfg)?, corpus)
        }
    }
}

fn time_steps<B: Backend + 'static>(mut p: Pipeline<B>, corpus: &iota_model::data::Corpus) -> Result<f64> {
    let steps = p.cfg.steps;
    let t0 = Instant::now();
    let mut tokens = 0usize;
    for _ in 0..steps {
        tokens += p.train_step(corpus)?.tokens;
    }
    Ok(tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9))
}

pub fn print(m: &Measure<'_>, r: &Measured) {
    let gib = |b: u64| format!("{:.2}", b as f64 / GIB as f64);
    println!(
        "scale (measured): {}, {} stages x {} replicas, batch {} x seq {}, {} epochs x {} micro-batches, on {}, merge {}",
        m.model,
        m.stages,
        m.replicas,
        m.batch,
        m.seq,
        m.epochs,
        m.micro_batches,
        m.device,
        if m.merge_overlap { "behind compute" } else { "synchronous" }
    );
    println!("  one process, global batch: {:>10.0} tokens/s", r.one_process_tokens_per_s);
    println!(
        "  swarm, over its epochs:    {:>10.0} tokens/s = {:.2}x one process (goal >= 0.7x)",
        r.swarm_tokens_per_s,
        r.swarm_tokens_per_s / r.one_process_tokens_per_s.max(1e-9)
    );
    println!("  epochs outside training (upload + merge): {:.1}% (goal <= 10%)", 100.0 * r.outside_training);
    match r.first_micro_batch_s {
        Some(s) => println!("  first epoch's start to its first micro-batch: {s:.2} s (goal < 5 s)"),
        None => println!("  no micro-batch completed"),
    }
    println!(
        "  merge through the store: {} contributions, {} updates; frames refused: {}; micro-batches completed: {}",
        r.store_fallbacks.0, r.store_fallbacks.1, r.frames_refused, r.completed
    );
    if m.merge_overlap {
        println!("  merges behind compute: {}", r.merges_behind_compute);
    }
    println!("  {:<8} {:>14} {:>16} {:>14}", "miner", "stage", "peak GiB", "plan GiB");
    for (i, (stage, rss, dev, plan, recomputed)) in r.miners.iter().enumerate() {
        let (peak, kind) = if *dev > 0 { (*dev, "device") } else { (*rss, "resident") };
        let stage = stage.map_or("-".to_string(), |s| s.to_string() + if *recomputed { " (recomputing)" } else { "" });
        println!("  {:<8} {:>14} {:>16} {:>14}", i, stage, format!("{} {kind}", gib(peak)), gib(*plan));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measured mode end to end on `tiny` (CI runs it on the CPU).
    #[test]
    fn a_measured_run_reports_every_figure() {
        if sibling_binary("iota-miner").is_none() {
            println!("skipped: no iota-miner binary beside the test (cargo build --bins first)");
            return;
        }
        let work = tempfile::tempdir().unwrap();
        let m = Measure {
            model: "tiny",
            stages: 2,
            replicas: 2,
            batch: 2,
            seq: 32,
            epochs: 2,
            micro_batches: 8,
            codec: "int8",
            merge_codec: "bf16",
            device: "cpu",
            data: None,
            merge_overlap: false,
            miner_memory_gib: None,
            recompute: None,
        };
        let r = measure(&m, &work.path().join("run")).unwrap();
        print(&m, &r);
        assert_eq!(r.completed, 16);
        assert!(r.one_process_tokens_per_s > 0.0 && r.swarm_tokens_per_s > 0.0);
        assert!(r.outside_training > 0.0 && r.outside_training < 1.0, "{}", r.outside_training);
        assert!(r.first_micro_batch_s.is_some_and(|s| s > 0.0));
        assert_eq!((r.store_fallbacks, r.frames_refused), ((0, 0), 0));
        assert_eq!(r.miners.len(), 4);
        for (stage, rss, _, plan, recomputed) in &r.miners {
            assert!(!recomputed, "no memory stated on the CPU, so nothing recomputes");
            assert!(stage.is_some() && *plan > 0);
            // A miner process holds its stage and more (runtime, corpus, pools).
            assert!(*rss > *plan, "resident {rss} under the plan's {plan}");
        }
    }
}
