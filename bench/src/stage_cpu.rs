//! stage-cpu: one pipeline stage's forward+backward on `CpuBackend`, against
//! the floor of running the very same GEMMs (shapes, strides, threading)
//! back to back with nothing else.

use std::sync::Arc;

use anyhow::Result;
use iota_core::codec::boundary_cost;
use iota_core::config::PRESETS;
use iota_core::{ModelConfig, Rng, StageSpec, WireCodec};
use iota_model::cpu::gemm::{GemmCall, sgemm};
use iota_model::{CpuBackend, Stage, StageInput};
use rayon::prelude::*;

use crate::timing::{Sample, measure, median, ms};

#[derive(clap::Args)]
pub struct Args {
    /// Timed iterations (the median is reported).
    #[arg(long, default_value_t = 7)]
    iters: usize,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 256)]
    seq: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Also time the stage recomputing its activations in the backward
    /// (`Stage::set_recompute`), alternating with the stage keeping them.
    #[arg(long)]
    recompute: bool,
}

/// The benchmark's stage shape: d=512, 8 heads (MHA), ffn 1408; a 12-layer
/// model split in 3, so the middle stage has 4 blocks plus the bottleneck
/// decoder and encoder.
fn bench_config() -> ModelConfig {
    let mut c = ModelConfig::preset("small").unwrap();
    c.name = "stage-cpu".into();
    c.vocab_size = 256;
    c.vocab_real = 256;
    c.d_model = 512;
    c.n_layers = 12;
    c.n_heads = 8;
    c.n_kv_heads = 8;
    c.ffn_hidden = 1408;
    c.max_seq = 256;
    c.bottleneck = 32;
    c
}

struct Prepared {
    call: GemmCall,
    dst: Vec<Vec<f32>>,
    lhs: Vec<f32>,
    rhs: Vec<f32>,
}

fn prepare(calls: &[GemmCall], rng: &mut Rng) -> Vec<Prepared> {
    calls
        .iter()
        .map(|&call| {
            let mut lhs = vec![0.0; call.lhs.extent()];
            let mut rhs = vec![0.0; call.rhs.extent()];
            rng.fill_normal(&mut lhs, 1.0);
            rng.fill_normal(&mut rhs, 1.0);
            let dst = (0..call.batch).map(|_| vec![0.0; call.dst.extent()]).collect();
            Prepared { call, dst, lhs, rhs }
        })
        .collect()
}

fn replay(p: &mut [Prepared]) {
    for g in p.iter_mut() {
        let c = g.call;
        if c.batch == 1 {
            sgemm(&mut g.dst[0], c.dst, &g.lhs, c.lhs, &g.rhs, c.rhs, c.acc, c.parallel);
        } else {
            let (lhs, rhs) = (&g.lhs, &g.rhs);
            g.dst.par_iter_mut().for_each(|d| sgemm(d, c.dst, lhs, c.lhs, rhs, c.rhs, c.acc, false));
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    if let Some(t) = a.threads {
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global()?;
    }
    let cfg = bench_config();
    let spec = StageSpec::split(&cfg, 3)?.remove(1);
    let be = Arc::new(CpuBackend::new());
    let mut stage = Stage::new(be.clone(), &cfg, spec.clone(), 1);
    let n = a.batch * a.seq;
    let w = stage.boundary_width();
    let mut rng = Rng::new(7);
    let mut z = vec![0.0f32; n * w];
    let mut dz = vec![0.0f32; n * w];
    rng.fill_normal(&mut z, 1.0);
    rng.fill_normal(&mut dz, 1e-3);
    let mut recomputing = Stage::new(be.clone(), &cfg, spec.clone(), 1);
    recomputing.set_recompute(true);
    let mut key = 0u64;
    let mut run_step = |stage: &mut Stage<CpuBackend>| {
        key += 1;
        stage.forward(key, StageInput::Hidden(&z), a.batch, a.seq).expect("forward");
        stage.backward(key, &dz).expect("backward");
    };
    let mut step = || run_step(&mut stage);
    step();
    be.start_gemm_log();
    step();
    let calls = be.take_gemm_log();
    let mut prepared = prepare(&calls, &mut rng);
    replay(&mut prepared);
    // Alternate the two so both see the same machine conditions; ratios are
    // medians of the per-pair ratios.
    let (mut ours, mut floor, mut recomputed) = (Vec::new(), Vec::new(), Vec::new());
    if a.recompute {
        run_step(&mut recomputing);
    }
    for _ in 0..a.iters {
        ours.push(measure(|| run_step(&mut stage)));
        floor.push(measure(|| replay(&mut prepared)));
        if a.recompute {
            recomputed.push(measure(|| run_step(&mut recomputing)));
        }
    }
    let flops: f64 = calls.iter().map(|c| c.flops()).sum();
    println!(
        "stage-cpu: d={} heads={} ffn={} blocks={} (+ bottleneck {} in/out), batch {} x seq {} = {} tokens, {}",
        cfg.d_model,
        cfg.n_heads,
        cfg.ffn_hidden,
        spec.layers.len(),
        cfg.bottleneck,
        a.batch,
        a.seq,
        n,
        iota_model::Backend::name(&*be)
    );
    println!("  {:<28} {:>13} {:>13} {:>12} {:>10}", "", "wall ms/step", "cpu ms/step", "GFLOP/s", "tokens/s");
    let row = |name: &str, v: &[Sample]| {
        let wall = median(v.iter().map(|s| ms(s.wall)).collect());
        let cpu = median(v.iter().map(|s| ms(s.cpu)).collect());
        println!(
            "  {:<28} {:>13.1} {:>13.1} {:>12.1} {:>10.0}",
            name,
            wall,
            cpu,
            flops / wall / 1e6,
            n as f64 / wall * 1e3
        );
    };
    row("stage fwd+bwd (ours)", &ours);
    row("same GEMMs alone (floor)", &floor);
    if a.recompute {
        // GFLOP/s counts the keeping stage's GEMMs: the recomputed forward
        // is extra work, not useful work.
        row("fwd+bwd, recomputing", &recomputed);
        let r =
            median(recomputed.iter().zip(&ours).map(|(r, o)| r.wall.as_secs_f64() / o.wall.as_secs_f64()).collect());
        println!("  recomputing / keeping activations (median of {} alternating pairs): wall {r:.3}x", a.iters);
    }
    let pair = |f: fn(&Sample) -> f64| median(ours.iter().zip(&floor).map(|(o, b)| f(o) / f(b)).collect());
    println!(
        "  ratio ours / floor (median of {} alternating pairs): wall {:.3}x, cpu {:.3}x  (goal <= 1.3x; {} GEMM calls, {:.1} GFLOP per step)",
        a.iters,
        pair(|s| s.wall.as_secs_f64()),
        pair(|s| s.cpu.as_secs_f64()),
        calls.len(),
        flops / 1e9
    );
    println!();
    println!("boundary compression (bytes per token, one direction, vs the bf16 d-wide hidden state):");
    println!(
        "  {:<6} {:>5} {:>4} {:>11} {:>12} {:>12} {:>12}",
        "preset", "d", "b", "bf16 hidden", "bf16", "int8", "int4"
    );
    for name in PRESETS {
        let c = ModelConfig::preset(name)?;
        let cell = |codec| {
            let k = boundary_cost(c.d_model, c.bottleneck, codec);
            format!("{}B {:.0}x", k.bytes_per_token, k.ratio)
        };
        println!(
            "  {:<6} {:>5} {:>4} {:>10}B {:>12} {:>12} {:>12}",
            name,
            c.d_model,
            c.bottleneck,
            2 * c.d_model,
            cell(WireCodec::Bf16),
            cell(WireCodec::Int8Row),
            cell(WireCodec::Int4Row)
        );
    }
    Ok(())
}
