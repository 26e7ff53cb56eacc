//! scale, measured: a swarm of the plan's shape (the orchestrator and S x R
//! miner processes on this machine, each on the given device) and one
//! process training the same model on the same tokens at the swarm's global
//! batch, in one run. It prints the swarm's tokens/s as a ratio to the one
//! process's, the share of the epochs spent outside training (upload and
//! merge: the merge's visible cost), the time from the first epoch's start
//! to its first completed micro-batch, the merge's store fallbacks and
//! refused frames, every miner's peak memory beside its stage's plan, and
//! where each miner's time went (forward, backward, merge) beside one
//! process's time per micro-batch: a stage slower than its share, or one
//! that mostly waits, shows there.

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
    /// `--stage-layers`: even, balanced or the counts.
    pub stage_layers: &'a str,
    pub replicas: usize,
    pub batch: usize,
    pub seq: usize,
    pub epochs: u64,
    pub micro_batches: u64,
    pub codec: &'a str,
    pub merge_codec: &'a str,
    /// With `merge_codec` sparse: the share of each block kept.
    pub sparse_density: f32,
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
    pub miners: Vec<MinerFigures>,
    pub completed: u64,
    /// Merges that ran while the next epoch trained.
    pub merges_behind_compute: u64,
    /// The epochs' training phases, summed (s).
    pub training_s: f64,
    /// Tokens in one micro-batch (batch x seq).
    pub micro_batch_tokens: u64,
    /// Each stage's forward + backward seconds per micro-batch
    /// (`swarm::stage_compute_seconds`).
    pub stage_compute: Vec<Option<f64>>,
    /// Merge traffic: weight-slice bytes the miners sent over the data
    /// plane (framing included), summed; the tokens trained; the epochs.
    pub merge_bytes_sent: u64,
    pub tokens: u64,
    pub epochs: u64,
}

impl Measured {
    /// Merge bytes each miner sent per epoch, on average.
    pub fn merge_bytes_per_miner_epoch(&self) -> f64 {
        self.merge_bytes_sent as f64 / (self.miners.len().max(1) as f64 * self.epochs.max(1) as f64)
    }

    /// Merge bytes sent (all miners) per token trained.
    pub fn merge_bytes_per_token(&self) -> f64 {
        self.merge_bytes_sent as f64 / self.tokens.max(1) as f64
    }
}

/// One miner process's figures, from the totals it leaves.
#[derive(Debug, Default)]
pub struct MinerFigures {
    pub stage: Option<u32>,
    pub peak_rss_bytes: u64,
    pub peak_device_bytes: u64,
    /// The plan's peak for its stage.
    pub planned_bytes: u64,
    /// Whether it recomputed activations in the backward.
    pub recomputed: bool,
    pub step_times: iota_dataplane::stats::StepTimes,
}

impl Measured {
    /// One process's seconds per micro-batch (its whole model).
    pub fn one_process_seconds_per_micro_batch(&self) -> f64 {
        self.micro_batch_tokens as f64 / self.one_process_tokens_per_s.max(1e-9)
    }
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
        "--stage-layers",
        m.stage_layers,
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
    argv.push("--sparse-density".into());
    argv.push(m.sparse_density.to_string());
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
    Ok(summarise(&report, one, (m.batch * m.seq) as u64, &plans, cfg.spec.epochs))
}

fn summarise(
    r: &SwarmReport,
    one_process_tokens_per_s: f64,
    micro_batch_tokens: u64,
    plans: &[Vec<iota_core::memory_plan::StageMemory>; 2],
    epochs: u64,
) -> Measured {
    let c = &r.counters;
    let epochs_ms = (c.training_ms + c.uploading_ms + c.merging_ms).max(1);
    let first = c.first_training_at_ms.zip(c.first_completed_at_ms).map(|(a, b)| b.saturating_sub(a) as f64 / 1e3);
    let miners = r
        .miner_totals
        .iter()
        .map(|t| {
            let Some(t) = t else { return MinerFigures::default() };
            let plan = &plans[t.recomputed as usize];
            MinerFigures {
                stage: t.stage,
                peak_rss_bytes: t.peak_rss_bytes,
                peak_device_bytes: t.peak_device_bytes,
                planned_bytes: t.stage.and_then(|s| plan.get(s as usize)).map_or(0, |p| p.peak()),
                recomputed: t.recomputed,
                step_times: t.step_times,
            }
        })
        .collect();
    let frames_refused = r.miner_totals.iter().flatten().map(|t| t.rejected.values().sum::<u64>()).sum();
    let merge_bytes_sent =
        r.miner_totals.iter().flatten().filter_map(|t| t.lanes.get("weight_slices")).map(|l| l.bytes_sent).sum();
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
        training_s: c.training_ms as f64 / 1e3,
        micro_batch_tokens,
        stage_compute: swarm::stage_compute_seconds(&r.miner_totals),
        merge_bytes_sent,
        tokens: r.tokens,
        epochs,
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
        "scale (measured): {}, {} stages ({} blocks) x {} replicas, batch {} x seq {}, {} epochs x {} micro-batches, on {}, merge {}",
        m.model,
        m.stages,
        m.stage_layers,
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
    println!(
        "  merge traffic (weight slices sent over the data plane): {:.2} MB per miner per epoch, {:.1} bytes per trained token",
        r.merge_bytes_per_miner_epoch() / 1e6,
        r.merge_bytes_per_token()
    );
    let one = r.one_process_seconds_per_micro_batch();
    let stages = r.stage_compute.clone();
    let ms = |s: f64| format!("{:.1}", s * 1e3);
    let known: Vec<f64> = stages.iter().flatten().copied().collect();
    if known.len() == stages.len() && !known.is_empty() {
        let sum: f64 = known.iter().sum();
        println!(
            "  compute per micro-batch, ms: stages {} = {}; one process {} ({:.2}x)",
            known.iter().map(|&s| ms(s)).collect::<Vec<_>>().join(" + "),
            ms(sum),
            ms(one),
            sum / one.max(1e-12)
        );
    }
    println!(
        "  {:<6} {:>14} {:>16} {:>9} {:>16} {:>16} {:>8} {:>7}",
        "miner", "stage", "peak GiB", "plan GiB", "forwards (ms)", "backwards (ms)", "merge s", "busy %"
    );
    let count_ms = |b: &iota_dataplane::stats::Busy| match b.count {
        0 => "-".to_string(),
        n => format!("{n} x {}", ms(b.seconds() / n as f64)),
    };
    println!(
        "  (the last stage's forwards include its loss and backward; busy: forwards and backwards over the training time)"
    );
    for (i, f) in r.miners.iter().enumerate() {
        let (peak, kind) =
            if f.peak_device_bytes > 0 { (f.peak_device_bytes, "device") } else { (f.peak_rss_bytes, "resident") };
        let stage =
            f.stage.map_or("-".to_string(), |s| s.to_string() + if f.recomputed { " (recomputing)" } else { "" });
        let t = &f.step_times;
        let busy = (t.forward.seconds() + t.backward.seconds()) / r.training_s.max(1e-9);
        println!(
            "  {:<6} {:>14} {:>16} {:>9} {:>16} {:>16} {:>8.2} {:>7.0}",
            i,
            stage,
            format!("{} {kind}", gib(peak)),
            gib(f.planned_bytes),
            count_ms(&t.forward),
            count_ms(&t.backward),
            t.weight_slice.seconds(),
            100.0 * busy
        );
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
            stage_layers: "even",
            replicas: 2,
            batch: 2,
            seq: 32,
            epochs: 2,
            micro_batches: 8,
            codec: "int8",
            merge_codec: "bf16",
            sparse_density: 1.0 / 32.0,
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
        for f in &r.miners {
            assert!(!f.recomputed, "no memory stated on the CPU, so nothing recomputes");
            assert!(f.stage.is_some() && f.planned_bytes > 0);
            // A miner process holds its stage and more (runtime, corpus, pools).
            assert!(
                f.peak_rss_bytes > f.planned_bytes,
                "resident {} under the plan's {}",
                f.peak_rss_bytes,
                f.planned_bytes
            );
            let t = &f.step_times;
            assert!(t.forward.count > 0 && t.forward.micros > 0, "{t:?}");
            // The last stage computes its backward with the loss, on the
            // activations it receives: no gradients come to it.
            let tail = f.stage == Some(1);
            assert_eq!(t.backward.count == 0, tail, "stage {:?}: {t:?}", f.stage);
        }
        // Each completed micro-batch went through each stage (a re-routed
        // one more than once), spread over the stage's two replicas.
        for (s, kind) in [(0, "backward"), (1, "forward")] {
            let n: u64 = r
                .miners
                .iter()
                .filter(|f| f.stage == Some(s))
                .map(|f| if s == 0 { f.step_times.backward.count } else { f.step_times.forward.count })
                .sum();
            assert!(n >= 16, "stage {s}: {n} {kind} inputs for 16 micro-batches");
        }
        let stages = r.stage_compute.clone();
        assert_eq!(stages.len(), 2);
        assert!(stages.iter().all(|s| s.is_some_and(|s| s > 0.0)), "{stages:?}");
        assert!(r.training_s > 0.0 && r.one_process_seconds_per_micro_batch() > 0.0);
        // Every miner sent its butterfly slices over the data plane (none
        // through the store): at least its bf16 contributions, 2P(R-1)/R
        // values, each epoch.
        assert_eq!(r.epochs, 2);
        assert!(r.merge_bytes_per_miner_epoch() > 0.0 && r.merge_bytes_per_token() > 0.0, "{r:?}");
        assert_eq!(r.tokens, 16 * 2 * 32, "tokens trained: 16 micro-batches of 2 x 32");
    }
}
