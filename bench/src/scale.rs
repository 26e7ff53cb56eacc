//! scale: what each stage of a model needs, per miner. `--plan-only`
//! prints, from `iota_core::memory_plan` and `iota_core::traffic_plan` (the
//! accounting a miner states when it registers), every stage's memory by
//! what holds it, which card sizes hold it, the boundary bytes per token and
//! the butterfly merge's bytes per replica per epoch. The measured mode
//! (the swarm on a GPU, each miner's peak memory beside its plan) needs the
//! swarm harness and is not here yet.

use anyhow::{Context, Result, bail};
use iota_core::memory_plan::{
    ComputeBackend, FIT_RESERVE, GIB, InnerOptimizer, StageMemory, Workload, host_memory, plan_memory,
};
use iota_core::traffic_plan::{boundary_traffic, merge_traffic};
use iota_core::{ModelConfig, StageSpec, WireCodec};

/// Card sizes a plan is checked against, in GiB.
const CARDS_GIB: [u64; 3] = [16, 24, 80];

#[derive(clap::Args)]
pub struct Args {
    /// Print the plan only. Without it: a swarm of this shape (every miner
    /// a process on --device) and one process of the same model, measured
    /// in one run (see `scale_measured`).
    #[arg(long)]
    plan_only: bool,
    /// Measured mode: where the miners and the one process compute (cpu,
    /// cuda, cuda:N).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Measured mode: epochs and micro-batches per epoch of the swarm.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    #[arg(long, default_value_t = 24)]
    micro_batches: u64,
    /// Measured mode: the corpus (default: the generated toy corpus).
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// Model preset.
    #[arg(long, default_value = "1.5b")]
    model: String,
    #[arg(long, default_value_t = 3)]
    stages: usize,
    /// Blocks per stage: even, balanced (by each stage's FLOPs, the tail's
    /// LM head counted), balanced:GIB (the same among splits that fit GIB
    /// cards) or the counts head first (7,7,2), as the swarm's
    /// `--stage-layers`.
    #[arg(long, default_value = "even", value_name = "even|balanced|balanced:GIB|N,N,..")]
    stage_layers: String,
    /// Replicas per stage (sets the merge's traffic and host memory).
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 2)]
    batch: usize,
    #[arg(long, default_value_t = 1024)]
    seq: usize,
    /// Micro-batches a head or body miner holds at once (default 2: the
    /// swarm's default --max-in-flight, 2 per replica, spread over the
    /// replicas of a stage).
    #[arg(long, default_value_t = 2)]
    in_flight: usize,
    /// Boundary wire codec: int8, int4, bf16, f32.
    #[arg(long, default_value = "int8")]
    codec: String,
    /// Codec of the merge's slices: bf16, int8, f32, or sparse (measured
    /// runs only: contributions as the largest --sparse-density of each
    /// block, with error feedback; `iota-control swarm --help`).
    #[arg(long, default_value = "bf16")]
    merge_codec: String,
    /// With --merge-codec sparse: the share of each block's values a
    /// contribution keeps.
    #[arg(long, default_value_t = iota_protocol::run_spec::DEFAULT_SPARSE_DENSITY)]
    sparse_density: f32,
    /// cuda-bf16 (bf16 GEMMs), cuda-fp32 or cpu.
    #[arg(long, default_value = "cuda-bf16")]
    backend: String,
    /// adamw, nadam or muon (each keeps two fp32 moments; muon a step's scratch besides).
    #[arg(long, default_value = "adamw")]
    optimizer: String,
    /// Backward on the current weights instead of the stashed ones.
    #[arg(long)]
    no_weight_stashing: bool,
    /// Every stage recomputes its activations in the backward
    /// (`iota-miner run --recompute always`). Without it the plan keeps
    /// them (its "fits" lines say where a miner's default, `--recompute
    /// auto`, turns it on), and measured miners recompute where the memory
    /// they state needs it.
    #[arg(long)]
    recompute: bool,
    /// Plan only: attention on the fused kernels (`IOTA_FLASH_ATTENTION=1`
    /// on a CUDA miner): a log-sum-exp per query saved instead of the
    /// probabilities.
    #[arg(long)]
    fused_attention: bool,
    /// Measured mode: the memory every miner states, in GiB (default: a
    /// GPU's free memory), to run as on cards of that size (16: IOTA's
    /// miners) on a larger one.
    #[arg(long, value_name = "GIB")]
    miner_memory_gib: Option<f64>,
    /// The run keeps outer momentum (a partition's writer stores it too).
    #[arg(long)]
    outer_momentum: bool,
    /// Measured mode: the swarm merges behind compute (`--merge-overlap`:
    /// epoch k's merge runs while epoch k+1 trains).
    #[arg(long)]
    merge_overlap: bool,
    /// Measured mode: keep the swarm's run folder (logs, store, stats) here
    /// instead of a temporary folder removed at the end.
    #[arg(long)]
    keep_run_dir: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    if !a.plan_only {
        if let Some(g) = a.miner_memory_gib
            && !(g.is_finite() && g > 0.0)
        {
            bail!("--miner-memory-gib {g}: a positive number of GiB");
        }
        let m = crate::scale_measured::Measure {
            model: &a.model,
            stages: a.stages,
            stage_layers: &a.stage_layers,
            replicas: a.replicas,
            batch: a.batch,
            seq: a.seq,
            epochs: a.epochs,
            micro_batches: a.micro_batches,
            codec: &a.codec,
            merge_codec: &a.merge_codec,
            sparse_density: a.sparse_density,
            device: &a.device,
            data: a.data.as_deref(),
            merge_overlap: a.merge_overlap,
            miner_memory_gib: a.miner_memory_gib,
            recompute: a.recompute.then_some("always"),
        };
        let work = tempfile::Builder::new().prefix("iota-bench-scale-").tempdir()?;
        let dir = a.keep_run_dir.clone().unwrap_or_else(|| work.path().join("run"));
        let r = crate::scale_measured::measure(&m, &dir)?;
        crate::scale_measured::print(&m, &r);
        return Ok(());
    }
    let mut cfg = ModelConfig::preset(&a.model)?;
    if a.seq == 0 || a.seq > cfg.max_seq || a.batch == 0 {
        bail!("--seq must be in 1..={} and --batch positive", cfg.max_seq);
    }
    if a.stages == 0 || a.stages > cfg.n_layers {
        bail!("--stages {} must be between 1 and the model's {} layers", a.stages, cfg.n_layers);
    }
    cfg.stage_layers = iota_control::cli::stage_layers(&a.stage_layers, &cfg, a.stages, (a.batch, a.seq, a.in_flight))?;
    let codec = WireCodec::parse(&a.codec).with_context(|| format!("unknown codec '{}'", a.codec))?;
    let merge_codec = match WireCodec::parse(&a.merge_codec) {
        Some(c) if c != WireCodec::Int4Row => c,
        _ if a.merge_codec == "sparse" => {
            bail!("--merge-codec sparse is measured, not planned: give --data and --epochs to run the swarm")
        }
        _ => bail!("unknown merge codec '{}' (bf16, int8, f32, sparse)", a.merge_codec),
    };
    let backend = ComputeBackend::parse(&a.backend)
        .with_context(|| format!("unknown backend '{}' (cuda-bf16, cuda-fp32, cpu)", a.backend))?;
    let optimizer = match a.optimizer.as_str() {
        "adamw" => InnerOptimizer::AdamW,
        "nadam" => InnerOptimizer::NAdam,
        "muon" => InnerOptimizer::Muon,
        other => bail!("unknown optimizer '{other}' (adamw, nadam, muon)"),
    };
    let w = Workload {
        batch: a.batch,
        seq: a.seq,
        in_flight: a.in_flight,
        weight_stashing: !a.no_weight_stashing,
        optimizer,
        backend,
        recompute: a.recompute,
        fused_attention: a.fused_attention && backend.is_cuda(),
    };
    let plan = plan_memory(&cfg, a.stages, &w)?;
    let specs = StageSpec::split(&cfg, a.stages)?;
    println!(
        "scale --plan-only: {}, {} stages x {} replicas, batch {} x seq {} ({} tokens a micro-batch), \
         {} micro-batch(es) in flight at a head or body miner, {}, {:?}, weight stashing {}, activations {}, \
         attention {}",
        cfg.name,
        a.stages,
        a.replicas,
        a.batch,
        a.seq,
        a.batch * a.seq,
        a.in_flight,
        backend.name(),
        optimizer,
        if w.weight_stashing { "on" } else { "off" },
        if w.recompute { "recomputed in the backward" } else { "kept" },
        if w.fused_attention { "fused" } else { "GEMMs + softmax" },
    );
    print_memory(&plan, backend);
    print_compute(&cfg, &specs, a.batch * a.seq, a.seq);
    println!();
    print_traffic(&cfg, &specs, &plan, codec, (merge_codec, a.outer_momentum), a.replicas);
    Ok(())
}

fn gib(b: u64) -> String {
    format!("{:.2}", b as f64 / GIB as f64)
}

fn print_memory(plan: &[StageMemory], backend: ComputeBackend) {
    let where_ = if backend.is_cuda() { "GPU" } else { "host" };
    print!("\n{:<44}", format!("{where_} memory per miner (GiB)"));
    for m in plan {
        print!(" {:>14}", format!("{} ({:?})", m.index, m.role).to_lowercase());
    }
    println!();
    print!("{:<44}", "parameters");
    for m in plan {
        print!(" {:>14}", format!("{:.1}M", m.params as f64 / 1e6));
    }
    println!();
    // Every stage has the same lines in the same order, but the last one's
    // label says which workspace is the larger (the tail's may be its loss).
    let lines: Vec<Vec<(&str, u64)>> = plan.iter().map(StageMemory::lines).collect();
    for i in 0..lines[0].len() {
        let label = if i + 1 == lines[0].len() { "workspace (backward, or the tail's loss)" } else { lines[0][i].0 };
        print!("{label:<44}");
        for l in &lines {
            print!(" {:>14}", gib(l[i].1));
        }
        println!();
    }
    print!("{:<44}", "  saved activations: attention probabilities");
    for m in plan {
        print!(" {:>14}", gib(m.attention_probs_per_micro_batch * m.held_micro_batches as u64));
    }
    println!();
    print!("{:<44}", "  micro-batches held / stashed versions");
    for m in plan {
        print!(" {:>14}", format!("{} / {}", m.held_micro_batches, m.stashed_versions));
    }
    println!();
    print!("{:<44}", "loading merged weights (a second fp32 copy)");
    for m in plan {
        print!(" {:>14}", gib(m.reload_peak()));
    }
    println!();
    print!("{:<44}", "PEAK");
    for m in plan {
        print!(" {:>14}", gib(m.peak()));
    }
    println!();
    print!("{:<44}", "  without the bf16 copies (must fit)");
    for m in plan {
        print!(" {:>14}", gib(m.required_peak()));
    }
    println!();
    print!("{:<44}", "between micro-batches");
    for m in plan {
        print!(" {:>14}", gib(m.between_micro_batches()));
    }
    println!();
    for card in CARDS_GIB {
        let usable = card as f64 * (1.0 - FIT_RESERVE);
        print!("{:<44}", format!("fits {card} GiB ({usable:.1} usable): headroom"));
        for m in plan {
            // The copies are a cache: they take the headroom, not a fit.
            let headroom = usable - m.required_peak() as f64 / GIB as f64;
            print!(" {:>14}", format!("{} ({headroom:+.1})", if m.fits(card * GIB) { "yes" } else { "no" }));
        }
        println!();
    }
}

/// A step's FLOPs per stage and what Muon's Newton-Schulz steps add to
/// them (`core/src/compute_plan.rs`), which `--optimizer auto` weighs.
fn print_compute(cfg: &ModelConfig, specs: &[StageSpec], tokens: usize, seq: usize) {
    use iota_core::compute_plan::{AUTO_MUON_MAX_SLOWDOWN, muon_slowdown, stage_newton_schulz_flops, stage_step_flops};
    print!("\n{:<44}", format!("compute per optimizer step ({tokens} tokens)"));
    for s in specs {
        print!(" {:>14}", format!("{} ({:?})", s.index, s.role()).to_lowercase());
    }
    println!();
    let step: Vec<f64> = specs.iter().map(|s| stage_step_flops(cfg, s, tokens, seq)).collect();
    let ns: Vec<f64> = specs.iter().map(|s| stage_newton_schulz_flops(cfg, s)).collect();
    let rows = [
        (
            "blocks",
            specs.iter().map(|s| format!("{} ({}..{})", s.layers.len(), s.layers.start, s.layers.end)).collect(),
        ),
        ("training step (GFLOP)", step.iter().map(|f| format!("{:.1}", f / 1e9)).collect::<Vec<_>>()),
        ("Muon's Newton-Schulz (GFLOP)", ns.iter().map(|f| format!("{:.1}", f / 1e9)).collect()),
        ("  Muon adds", ns.iter().zip(&step).map(|(n, t)| format!("{:.0}%", 100.0 * n / t)).collect()),
    ];
    for (label, cells) in rows {
        print!("{label:<44}");
        for c in cells {
            print!(" {c:>14}");
        }
        println!();
    }
    let mean = step.iter().sum::<f64>() / step.len() as f64;
    let slowest = step.iter().copied().fold(0.0, f64::max);
    if mean > 0.0 && specs.len() > 1 {
        // With a card per miner the pipeline runs at its slowest stage's pace.
        let balanced = iota_core::compute_plan::balanced_with_imbalance(cfg, specs.len(), seq);
        print!(
            "the slowest stage's step is {:.2}x the stages' mean: on a card per miner each is busy {:.0}% of the time",
            slowest / mean,
            100.0 * mean / slowest
        );
        match balanced {
            Some((b, r)) if (r - slowest / mean).abs() > 1e-9 => println!(
                " (--stage-layers balanced: {}, {r:.2}x, {:.0}%)",
                b.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(","),
                100.0 / r
            ),
            _ => println!(" (as balanced as a split of blocks allows)"),
        }
    }
    if let Some(slow) = muon_slowdown(cfg, specs.len(), tokens, seq) {
        let choice = if slow <= AUTO_MUON_MAX_SLOWDOWN { "muon" } else { "adamw" };
        println!(
            "the pipeline's slowest stage: Muon adds {:.0}%, so --optimizer auto takes {choice} (Muon up to {:.0}%)",
            slow * 100.0,
            AUTO_MUON_MAX_SLOWDOWN * 100.0
        );
    }
}

fn print_traffic(
    cfg: &ModelConfig,
    specs: &[StageSpec],
    plan: &[StageMemory],
    codec: WireCodec,
    (merge_codec, outer_momentum): (WireCodec, bool),
    replicas: usize,
) {
    if let Some(t) = specs.first().map(|s| boundary_traffic(cfg, s, codec)).filter(|t| t.boundaries > 0) {
        let c = t.per_direction;
        println!(
            "boundary ({} channels, {}): {} B per token each way, {:.1}x less than the bf16 hidden state ({} B)",
            specs[0].boundary_width,
            codec.name(),
            c.bytes_per_token,
            c.ratio,
            c.bf16_hidden_bytes
        );
    }
    println!(
        "{:<44} {:>12} {:>12} {:>14} {:>12} {:>14}",
        "per stage", "B/token sent", "merge MB out", "merge MB in", "store MB", "host GiB"
    );
    for (s, m) in specs.iter().zip(plan) {
        let t = boundary_traffic(cfg, s, codec);
        let mt = merge_traffic(m.params, replicas, merge_codec, outer_momentum);
        let host = host_memory(m.params, replicas, merge_codec);
        println!(
            "{:<44} {:>12} {:>12.1} {:>14.1} {:>12.1} {:>14}",
            format!("stage {} ({:?})", s.index, s.role()).to_lowercase(),
            t.sent_per_token(),
            mt.sent() / 1e6,
            mt.received / 1e6,
            mt.store_writes / 1e6,
            gib(host.total()),
        );
    }
    println!(
        "merge: per replica per epoch, {} slices, R = {replicas} (2P(R-1)/R contributions + P(R-2)/R updates); \
         store MB: f32 merged slices (and outer momentum, with --outer-momentum) it writes as a partition's writer; host GiB: receive pool \
         (256 MiB), evidence log budgets (1.25 GiB), the merge's vectors (not on the GPU)",
        merge_codec.name()
    );
}
