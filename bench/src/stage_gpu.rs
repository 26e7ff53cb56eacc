//! stage-gpu: one body pipeline stage of the `1b` preset (bottleneck decoder,
//! its blocks, bottleneck encoder), forward+backward on `CudaBackend`,
//! against the same stage in PyTorch on the same GPU in the same run
//! (`bench/stage_ref.py`: eager, then torch.compile). Also prints the
//! achieved TFLOP/s against the cuBLASLt bf16 GEMM peak measured here.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use iota_core::{ModelConfig, Rng, StageSpec};
use iota_cuda::backend::{CudaBackend, GemmPrecision};
use iota_model::{Backend, Stage, StageInput};

#[derive(clap::Args)]
pub struct Args {
    /// Model preset whose block shape is measured.
    #[arg(long, default_value = "1b")]
    model: String,
    /// Stages the model is split into; the bench runs the middle one.
    #[arg(long, default_value_t = 4)]
    stages: usize,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 1024)]
    seq: usize,
    /// Timed iterations (the median is reported), after --warmup untimed ones.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Precision of our linear GEMMs: bf16 or fp32.
    #[arg(long, default_value = "bf16")]
    gemm: String,
    /// Python with PyTorch, for the reference rows.
    #[arg(long, default_value = "python3")]
    python: String,
    /// The PyTorch reference script.
    #[arg(long, default_value = "bench/stage_ref.py")]
    torch_script: PathBuf,
    /// PyTorch modes to run (eager, compile).
    #[arg(long, default_value = "eager,compile")]
    torch_modes: String,
    /// Skip the PyTorch rows.
    #[arg(long)]
    no_torch: bool,
    /// Side of the square bf16 GEMM whose speed is the roofline (0: not
    /// measured, e.g. under a profiler, where its kernels would mix with ours).
    #[arg(long, default_value_t = 8192)]
    peak_size: usize,
    /// Also time forward + backward + an AdamW step, as a miner runs each
    /// micro-batch (the step rewrites the weights and their bf16 copies).
    #[arg(long)]
    with_step: bool,
    /// Also time one more forward + backward kernel by kernel (CUDA events
    /// around every launch, GEMM and copy; the events themselves add a
    /// little) and print the table: launches per step and where the time goes.
    #[arg(long)]
    kernels: bool,
}

/// FLOPs of one forward of the stage per token, counting every GEMM the
/// backends run (attention's score and value products over the full t x t
/// square, as both implementations compute it). Backward is twice forward.
fn forward_flops_per_token(c: &ModelConfig, blocks: usize, seq: usize) -> f64 {
    let (d, f, b) = (c.d_model as f64, c.ffn_hidden as f64, c.bottleneck as f64);
    let linear = d * c.qkv_dim() as f64 + c.q_dim() as f64 * d + d * 2.0 * f + f * d;
    let attention = 2.0 * seq as f64 * c.q_dim() as f64;
    blocks as f64 * 2.0 * (linear + attention) + 2.0 * (2.0 * b * d)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[derive(Debug)]
struct TorchRow {
    mode: String,
    result: Result<f64, String>,
}

fn run_torch(a: &Args, c: &ModelConfig, blocks: usize) -> Result<(String, Vec<TorchRow>), String> {
    let out = Command::new(&a.python)
        .arg(&a.torch_script)
        .args(["--d", &c.d_model.to_string(), "--heads", &c.n_heads.to_string()])
        .args(["--kv-heads", &c.n_kv_heads.to_string(), "--ffn", &c.ffn_hidden.to_string()])
        .args(["--layers", &blocks.to_string(), "--bottleneck", &c.bottleneck.to_string()])
        .args(["--batch", &a.batch.to_string(), "--seq", &a.seq.to_string()])
        .args(["--iters", &a.iters.to_string(), "--warmup", &a.warmup.to_string()])
        .args(["--modes", &a.torch_modes, "--device", &format!("cuda:{}", a.gpu)])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", a.python))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().rev().find_map(|l| l.strip_prefix("RESULT ")) else {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        return Err(format!("{} exited with {}: {last}", a.torch_script.display(), out.status));
    };
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("unreadable RESULT line: {e}"))?;
    let label = format!(
        "PyTorch {} on {} ({})",
        v["torch"].as_str().unwrap_or("?"),
        v["device"].as_str().unwrap_or("?"),
        v["dtype"].as_str().unwrap_or("?")
    );
    let rows = a
        .torch_modes
        .split(',')
        .filter(|m| !m.is_empty())
        .map(|m| {
            let r = &v[m];
            let result = match (r["ms"].as_f64(), r["error"].as_str()) {
                (Some(ms), _) => Ok(ms),
                (None, Some(e)) => Err(e.to_string()),
                (None, None) => Err("no figure".into()),
            };
            TorchRow { mode: m.to_string(), result }
        })
        .collect();
    Ok((label, rows))
}

pub fn run(a: Args) -> Result<()> {
    let precision =
        GemmPrecision::parse(&a.gemm).with_context(|| format!("unknown --gemm '{}' (bf16, fp32)", a.gemm))?;
    let mut cfg = ModelConfig::preset(&a.model)?;
    if a.seq > cfg.max_seq {
        bail!("--seq {} exceeds the model's max_seq {}", a.seq, cfg.max_seq);
    }
    if a.stages < 3 {
        bail!("--stages must be at least 3 so the middle stage is a body stage");
    }
    // A body stage has no embedding or LM head: the vocabulary does not enter.
    cfg.vocab_size = 256;
    cfg.vocab_real = 256;
    let spec = StageSpec::split(&cfg, a.stages)?.remove(a.stages / 2);
    let blocks = spec.layers.len();
    let be = Arc::new(iota_cuda::open_backend(a.gpu, precision).context("opening the GPU")?);
    let peak = if a.peak_size > 0 { be.bf16_gemm_tflops(a.peak_size, 10)? } else { f64::NAN };

    let mut stage = Stage::new(be.clone(), &cfg, spec, 1);
    let n = a.batch * a.seq;
    let w = stage.boundary_width();
    let mut rng = Rng::new(7);
    let mut z = vec![0.0f32; n * w];
    let mut dz = vec![0.0f32; n * w];
    rng.fill_normal(&mut z, 1.0);
    rng.fill_normal(&mut dz, 1e-3);
    let mut key = 0u64;
    let mut step = |be: &CudaBackend| {
        key += 1;
        be.time_ms(|| {
            stage.forward(key, StageInput::Hidden(&z), a.batch, a.seq).expect("forward");
            stage.backward(key, &dz).expect("backward");
        })
    };
    for _ in 0..a.warmup {
        step(&be);
    }
    let ours = median((0..a.iters.max(1)).map(|_| step(&be)).collect());
    let kernels = if a.kernels {
        be.set_kernel_timing(true);
        let total = step(&be);
        be.set_kernel_timing(false);
        Some((total, be.kernel_times()))
    } else {
        None
    };
    let with_step = if a.with_step {
        let mut opt = iota_model::optim::AdamW::new(be.as_ref(), stage.layout().total());
        let adamw = iota_model::optim::AdamWConfig::default();
        let mut timed = |be: &CudaBackend| {
            key += 1;
            be.time_ms(|| {
                stage.forward(key, StageInput::Hidden(&z), a.batch, a.seq).expect("forward");
                stage.backward(key, &dz).expect("backward");
                opt.step(&mut stage, &adamw, 1e-4);
                stage.zero_grads();
            })
        };
        for _ in 0..a.warmup {
            timed(&be);
        }
        Some(median((0..a.iters.max(1)).map(|_| timed(&be)).collect()))
    } else {
        None
    };
    let flops = forward_flops_per_token(&cfg, blocks, a.seq) * 3.0 * n as f64;

    let torch = if a.no_torch { Err("skipped (--no-torch)".to_string()) } else { run_torch(&a, &cfg, blocks) };
    let figures = Figures { backend: be.name(), blocks, tokens: n, flops, peak, ours, with_step };
    print_table(&a, &cfg, &figures, &torch);
    if let Some((total, k)) = kernels {
        print_kernel_table(total, &k);
    }
    Ok(())
}

/// What one run of the benchmark measured of ours.
struct Figures {
    backend: String,
    blocks: usize,
    /// Tokens per step (batch x seq).
    tokens: usize,
    /// Floating-point operations per step (forward and backward).
    flops: f64,
    /// The bf16 GEMM peak measured here (TFLOP/s; NaN: not measured).
    peak: f64,
    /// Median milliseconds per step.
    ours: f64,
    /// ... with an AdamW step per micro-batch (`--with-step`).
    with_step: Option<f64>,
}

/// The table: ours, with the optimizer step, and PyTorch's modes, each as
/// ms/step, tokens/s, TFLOP/s, share of peak and ratio to ours.
fn print_table(a: &Args, cfg: &ModelConfig, f: &Figures, torch: &Result<(String, Vec<TorchRow>), String>) {
    println!(
        "stage-gpu: {} middle stage of {}: d={} heads={}/{} ffn={} blocks={} (+ bottleneck {} in/out), batch {} x seq {} = {} tokens",
        a.model,
        a.stages,
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.ffn_hidden,
        f.blocks,
        cfg.bottleneck,
        a.batch,
        a.seq,
        f.tokens
    );
    println!("  ours: {}; {:.1} GFLOP per step (fwd+bwd)", f.backend, f.flops / 1e9);
    println!("  bf16 GEMM peak measured here (cuBLASLt {0}^3): {1:.0} TFLOP/s", a.peak_size, f.peak);
    println!("  {:<40} {:>10} {:>12} {:>9} {:>8} {:>10}", "", "ms/step", "tokens/s", "TFLOP/s", "% peak", "ours / it");
    let row = |name: &str, ms: f64| {
        let tf = f.flops / (ms * 1e-3) / 1e12;
        println!(
            "  {:<40} {:>10.2} {:>12.0} {:>9.1} {:>7.1}% {:>9.2}x",
            name,
            ms,
            f.tokens as f64 / ms * 1e3,
            tf,
            100.0 * tf / f.peak,
            ms / f.ours
        );
    };
    row("iota-rs CudaBackend", f.ours);
    if let Some(ms) = f.with_step {
        row("iota-rs, + AdamW step per micro-batch", ms);
    }
    match torch {
        Ok((label, rows)) => {
            println!("  reference: {label}");
            for r in rows {
                match &r.result {
                    Ok(ms) => row(&format!("PyTorch {}", r.mode), *ms),
                    Err(e) => println!("  PyTorch {:<32} failed: {e}", r.mode),
                }
            }
            if let Some(Ok(eager)) = rows.iter().find(|r| r.mode == "eager").map(|r| &r.result) {
                println!("  ratio ours / PyTorch eager (tokens/s): {:.2}x  (goal >= 1.0x)", eager / f.ours);
            }
        }
        Err(e) => println!("  PyTorch reference: not run: {e}"),
    }
}

/// One step's work by kernel: launches, stream time, share of the step.
fn print_kernel_table(step_ms: f64, k: &[iota_cuda::kernel_timer::KernelTime]) {
    let launches: usize = k.iter().map(|k| k.launches).sum();
    let timed: f64 = k.iter().map(|k| k.ms).sum();
    println!(
        "  one step by kernel: {launches} launches, {timed:.2} ms inside them of {step_ms:.2} ms on the stream \
         (the rest: gaps between launches)"
    );
    println!("  {:<36} {:>9} {:>10} {:>8}", "kernel", "launches", "ms", "% step");
    for k in k {
        println!("  {:<36} {:>9} {:>10.3} {:>7.1}%", k.name, k.launches, k.ms, 100.0 * k.ms / step_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flop_count_matches_a_hand_count() {
        // One block d=4, 2 heads x 2 (MHA), ffn 8, bottleneck 1, seq 3:
        // qkv 4*12 + o 4*4 + gate_up 4*16 + down 8*4 = 160 MACs, attention
        // 2 * 3 * 4 = 24 MACs, bottleneck 2 * 1 * 4 = 8 MACs; FLOPs = 2 x MACs.
        let mut c = ModelConfig::preset("tiny").unwrap();
        c.d_model = 4;
        c.n_heads = 2;
        c.n_kv_heads = 2;
        c.ffn_hidden = 8;
        c.bottleneck = 1;
        assert_eq!(forward_flops_per_token(&c, 1, 3), 2.0 * (160.0 + 24.0) + 2.0 * 8.0);
    }

    fn args_for(script: &std::path::Path) -> Args {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: Args,
        }
        let mut a = Cli::parse_from(["x"]).a;
        a.torch_script = script.to_path_buf();
        a
    }

    #[test]
    fn the_reference_result_line_is_parsed_and_failures_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let c = ModelConfig::preset("1b").unwrap();
        let ok = dir.path().join("ok.py");
        std::fs::write(
            &ok,
            "import sys\nprint('warming up')\nprint('RESULT {\"torch\": \"2.11\", \"device\": \"H100\", \"dtype\": \"bf16-autocast\", \"eager\": {\"ms\": 12.5}, \"compile\": {\"error\": \"BackendCompilerFailed: no\"}}')\n",
        )
        .unwrap();
        let (label, rows) = run_torch(&args_for(&ok), &c, 4).unwrap();
        assert_eq!(label, "PyTorch 2.11 on H100 (bf16-autocast)");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].result, Ok(12.5));
        assert!(rows[1].result.as_ref().unwrap_err().contains("BackendCompilerFailed"));
        let bad = dir.path().join("bad.py");
        std::fs::write(&bad, "import sys\nsys.stderr.write('ModuleNotFoundError: torch\\n')\nsys.exit(1)\n").unwrap();
        let err = run_torch(&args_for(&bad), &c, 4).err().unwrap();
        assert!(err.contains("ModuleNotFoundError: torch"), "{err}");
    }
}
