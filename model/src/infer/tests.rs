//! The KV-cache forward against the trainer's full-sequence forward.

use std::sync::Arc;

use iota_core::rng::Rng;
use iota_core::{BottleneckStyle, WireCodec};

use crate::CpuBackend;
use crate::hf::weights::tests::tiny_train;
use crate::hf::{ModelWeights, Provenance};
use crate::infer::Llama;
use crate::train::Pipeline;

/// Per-token losses from the KV-cache path, one sequence.
fn kv_losses(m: &Llama, tokens: &[u32], targets: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache();
    tokens
        .iter()
        .zip(targets)
        .map(|(&t, &y)| {
            let logits = m.step(&mut cache, t).unwrap();
            let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
            lse - logits[y as usize]
        })
        .collect()
}

fn check(stages: usize, codec: WireCodec, bottleneck: usize, tol: f32) {
    check_style(stages, codec, bottleneck, BottleneckStyle::Linear, tol);
}

fn check_style(stages: usize, codec: WireCodec, bottleneck: usize, style: BottleneckStyle, tol: f32) {
    let mut train = tiny_train(stages);
    train.codec = codec;
    train.model.bottleneck = bottleneck;
    train.model.bottleneck_style = style;
    // Large weights make the logits far from uniform, so a wrong position,
    // head or boundary shows in the losses.
    train.model.init_std = 0.25;
    let mut p = Pipeline::new(Arc::new(CpuBackend::new()), train.clone()).unwrap();
    let stage_params: Vec<Vec<f32>> = p.stages().iter().map(|s| s.params_host()).collect();
    let w = ModelWeights::from_stages(&train, &stage_params, Provenance::default()).unwrap();
    let m = Llama::new(&w, false).unwrap();
    let seq = train.seq;
    let mut rng = Rng::new(5);
    let tokens: Vec<u32> = (0..2 * seq).map(|_| rng.below(256) as u32).collect();
    let targets: Vec<u32> = (0..2 * seq).map(|_| rng.below(256) as u32).collect();
    let want = p.eval_tokens(&tokens, &targets, 1).unwrap();
    let spread = want.iter().cloned().fold(0f32, f32::max) - want.iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 1.0, "losses too uniform to test anything: spread {spread}");
    for row in 0..2 {
        let r = row * seq..(row + 1) * seq;
        let got = kv_losses(&m, &tokens[r.clone()], &targets[r.clone()]);
        for (i, (g, w)) in got.iter().zip(&want[r]).enumerate() {
            assert!((g - w).abs() <= tol, "{stages} stages {codec:?}: row {row} position {i}: kv {g} vs full {w}");
        }
    }
}

#[test]
fn kv_cache_matches_the_full_forward_one_stage() {
    check(1, WireCodec::F32, 16, 1e-4);
}

#[test]
fn kv_cache_matches_the_full_forward_across_bottlenecked_stages() {
    check(3, WireCodec::F32, 16, 1e-4);
    check(2, WireCodec::F32, 0, 1e-4);
}

#[test]
fn kv_cache_matches_the_full_forward_across_residual_bottlenecks() {
    check_style(3, WireCodec::F32, 4, BottleneckStyle::Residual, 1e-4);
    check_style(3, WireCodec::Int8Row, 2, BottleneckStyle::Residual, 2e-3);
}

#[test]
fn kv_cache_applies_the_wire_codec_at_boundaries() {
    // Quantisation is per row, so token-at-a-time sees the same error the
    // batched forward does (up to a rounding that lands on a level edge).
    check(3, WireCodec::Int8Row, 16, 2e-3);
}

#[test]
fn exact_boundaries_differ_from_quantised_ones_and_context_is_bounded() {
    let mut train = tiny_train(3);
    train.model.init_std = 0.25;
    train.codec = WireCodec::Int4Row;
    let p = Pipeline::new(Arc::new(CpuBackend::new()), train.clone()).unwrap();
    let params: Vec<Vec<f32>> = p.stages().iter().map(|s| s.params_host()).collect();
    let w = ModelWeights::from_stages(&train, &params, Provenance::default()).unwrap();
    let (q, exact) = (Llama::new(&w, false).unwrap(), Llama::new(&w, true).unwrap());
    let (mut cq, mut ce) = (q.new_cache(), exact.new_cache());
    let a = q.step(&mut cq, 65).unwrap();
    let b = exact.step(&mut ce, 65).unwrap();
    assert!(a.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-4), "int4 quantisation changed nothing");
    assert!(q.step(&mut cq, 300).is_err(), "a token outside the vocabulary was accepted");
    let mut c = exact.new_cache();
    for _ in 0..train.model.max_seq {
        exact.step(&mut c, 1).unwrap();
    }
    assert!(exact.step(&mut c, 1).unwrap_err().to_string().contains("context is full"));
}
