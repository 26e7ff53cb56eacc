use std::sync::Arc;

use iota_core::{BottleneckStyle, ModelConfig, Rng, StageSpec};

use super::*;
use crate::CpuBackend;

/// A stand-in for the checks' hash: FNV-1a over the values' bits, spread
/// over 32 bytes (distinct values give distinct hashes here).
fn fnv(v: &[f32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (lane, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ lane as u64;
        for x in v {
            h = (h ^ u64::from(x.to_bits())).wrapping_mul(0x0100_0000_01b3);
        }
        chunk.copy_from_slice(&h.to_le_bytes());
    }
    out
}

fn cfg(style: BottleneckStyle) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny").unwrap();
    c.bottleneck_style = style;
    c
}

fn stages(c: &ModelConfig, n: usize) -> Vec<Stage<CpuBackend>> {
    let be = Arc::new(CpuBackend::new());
    StageSpec::split(c, n).unwrap().into_iter().map(|s| Stage::new(be.clone(), c, s, 7)).collect()
}

fn values(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| (rng.next_f32() - 0.5) * scale).collect()
}

const BATCH: usize = 2;
const SEQ: usize = 16;

/// A micro-batch's input and what its backward starts from, for `st`.
struct Mb {
    tokens: Vec<u32>,
    targets: Vec<u32>,
    hidden: Vec<f32>,
    grad: Vec<f32>,
}

fn mb(st: &Stage<CpuBackend>, seed: u64) -> Mb {
    let mut rng = Rng::new(seed);
    let n = BATCH * SEQ;
    let vocab = st.config().vocab_real as u32;
    let w = st.boundary_width();
    Mb {
        tokens: (0..n).map(|_| (rng.next_u64() % u64::from(vocab)) as u32).collect(),
        targets: (0..n).map(|_| (rng.next_u64() % u64::from(vocab)) as u32).collect(),
        hidden: values(&mut rng, n * w, 2.0),
        grad: values(&mut rng, n * w, 1e-2),
    }
}

fn input<'a>(st: &Stage<CpuBackend>, m: &'a Mb) -> StageInput<'a> {
    if st.spec().has_embedding() { StageInput::Tokens(&m.tokens) } else { StageInput::Hidden(&m.hidden) }
}

fn end<'a>(st: &Stage<CpuBackend>, m: &'a Mb) -> MbEnd<'a> {
    if st.spec().has_lm_head() { MbEnd::Targets { targets: &m.targets, loss_scale: 0.5 } } else { MbEnd::Grad(&m.grad) }
}

#[test]
fn the_segments_tile_a_stages_parameters_in_order() {
    for style in [BottleneckStyle::Linear, BottleneckStyle::Residual] {
        for n in [1, 2, 3] {
            for st in stages(&cfg(style), n) {
                let segs = st.segments();
                let mut at = 0;
                for s in &segs {
                    assert_eq!(s.params.start, at, "{style:?} {n} stages: {s:?} follows the one before");
                    assert!(s.params.end > s.params.start, "{s:?} owns parameters");
                    at = s.params.end;
                }
                assert_eq!(at, st.layout().total(), "{style:?} {n} stages: the segments cover the stage");
                let blocks = segs.iter().filter(|s| matches!(s.kind, SegmentKind::Block(_))).count();
                assert_eq!(blocks, st.spec().layers.len());
            }
        }
    }
}

/// Runs two micro-batches the worker's way and traced, and compares
/// every gradient, output and input gradient bit for bit.
#[test]
fn a_traced_micro_batch_gives_the_workers_bits() {
    for style in [BottleneckStyle::Linear, BottleneckStyle::Residual] {
        let c = cfg(style);
        let (mut plain, mut traced) = (stages(&c, 3), stages(&c, 3));
        for (a, b) in plain.iter_mut().zip(traced.iter_mut()) {
            for seed in [1, 2] {
                let m = mb(a, seed);
                let t = b.traced_mb(input(b, &m), end(b, &m), BATCH, SEQ, &fnv).unwrap();
                let (out, din) = if a.spec().has_lm_head() {
                    let o = a.forward_backward(input(a, &m), &m.targets, BATCH, SEQ, 0.5).unwrap();
                    (o.losses, o.din)
                } else {
                    let out = a.forward(9, input(a, &m), BATCH, SEQ).unwrap();
                    (out, a.backward(9, &m.grad).unwrap())
                };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&t.output), bits(&out), "{style:?} stage {}: output", a.spec().index);
                assert_eq!(din.as_deref().map(bits), t.din.as_deref().map(bits), "input gradient");
                assert_eq!(bits(&a.grads_host()), bits(&b.grads_host()), "gradients after micro-batch {seed}");
                let n = b.segments().len();
                assert_eq!((t.trace.outputs.len(), t.trace.input_grads.len(), t.trace.grads.len()), (n, n, n));
            }
        }
    }
}

/// Each segment alone, from the values that enter it, gives the hashes
/// the traced run recorded for it; a changed weight in one block changes
/// that block's hashes and none before it.
#[test]
fn one_segment_alone_gives_the_traced_hashes() {
    let c = cfg(BottleneckStyle::Residual);
    for (i, mut st) in stages(&c, 3).into_iter().enumerate() {
        let m = mb(&st, 11 + i as u64);
        let traced = st.traced_mb(input(&st, &m), end(&st, &m), BATCH, SEQ, &fnv).unwrap().trace;
        let after = st.grads_host();
        st.zero_grads();
        let segs = st.segments();
        // Forward, one segment at a time, keeping what enters each.
        let mut inputs: Vec<Vec<f32>> = Vec::new();
        let mut x: Option<Vec<f32>> = None;
        for (k, s) in segs.iter().enumerate() {
            let into = x.as_deref().map_or(input(&st, &m), StageInput::Hidden);
            let e = (s.kind == SegmentKind::LmHead).then(|| end(&st, &m));
            let out = st.segment_run(k, into, e, BATCH, SEQ).unwrap();
            assert_eq!(fnv(&out.output), traced.outputs[k], "stage {i} segment {k}: output");
            let entered =
                x.take().unwrap_or_else(|| if st.spec().has_embedding() { Vec::new() } else { m.hidden.clone() });
            inputs.push(entered);
            x = Some(out.output);
        }
        st.zero_grads();
        // Backward, last first, each from the gradient the one after gave.
        let mut dout: Option<Vec<f32>> = None;
        for (k, s) in segs.iter().enumerate().rev() {
            let into =
                if k == 0 && st.spec().has_embedding() { input(&st, &m) } else { StageInput::Hidden(&inputs[k]) };
            let e = match &dout {
                Some(g) => MbEnd::Grad(g),
                None => end(&st, &m),
            };
            let out = st.segment_run(k, into, Some(e), BATCH, SEQ).unwrap();
            assert_eq!(fnv(&out.din.clone().unwrap_or_default()), traced.input_grads[k], "stage {i} segment {k}: din");
            assert_eq!(fnv(&st.grads_host()[s.params.clone()]), traced.grads[k], "stage {i} segment {k}: grads");
            dout = out.din;
        }
        assert_eq!(st.grads_host(), after, "stage {i}: the segments' gradients are the traced run's");
    }
}

#[test]
fn a_changed_block_shows_first_in_that_blocks_hashes() {
    let c = cfg(BottleneckStyle::Linear);
    let (mut a, mut b) = (stages(&c, 3).remove(1), stages(&c, 3).remove(1));
    let segs = b.segments();
    let k = segs.iter().position(|s| s.kind == SegmentKind::Block(0)).unwrap();
    let mut w = b.params_host();
    w[segs[k].params.start + 5] += 0.25;
    b.set_params(&w).unwrap();
    let m = mb(&a, 3);
    let ta = a.traced_mb(input(&a, &m), end(&a, &m), BATCH, SEQ, &fnv).unwrap().trace;
    let tb = b.traced_mb(input(&b, &m), end(&b, &m), BATCH, SEQ, &fnv).unwrap().trace;
    let first = (0..segs.len()).find(|&j| ta.outputs[j] != tb.outputs[j]);
    assert_eq!(first, Some(k), "the forward parts first at the changed block");
    // Backward: the blocks after it see the same gradient flowing in.
    for j in k + 1..segs.len() {
        assert_ne!(ta.grads[j], tb.grads[j], "segment {j} reads the changed block's output");
    }
}

#[test]
fn hostile_segment_inputs_are_refused_not_panicked_on() {
    let c = cfg(BottleneckStyle::Linear);
    let mut st = stages(&c, 3).remove(1);
    let (d, n) = (c.d_model, BATCH * SEQ);
    let ok = vec![0.1f32; n * d];
    let blk = st.segments().iter().position(|s| matches!(s.kind, SegmentKind::Block(_))).unwrap();
    let bad = [
        st.segment_run(99, StageInput::Hidden(&ok), None, BATCH, SEQ).err(),
        st.segment_run(blk, StageInput::Hidden(&ok[1..]), None, BATCH, SEQ).err(),
        st.segment_run(blk, StageInput::Hidden(&[f32::NAN; 1]), None, 1, 1).err(),
        st.segment_run(blk, StageInput::Tokens(&[1; 32]), None, BATCH, SEQ).err(),
        st.segment_run(blk, StageInput::Hidden(&ok), Some(MbEnd::Grad(&ok[2..])), BATCH, SEQ).err(),
        st.segment_run(blk, StageInput::Hidden(&ok), None, BATCH, c.max_seq + 1).err(),
        st.segment_run(
            blk,
            StageInput::Hidden(&ok),
            Some(MbEnd::Targets { targets: &[0; 32], loss_scale: 1.0 }),
            BATCH,
            SEQ,
        )
        .err(),
    ];
    for (i, e) in bad.iter().enumerate() {
        assert!(e.is_some(), "case {i} was refused");
    }
    let mut tail = stages(&c, 3).remove(2);
    let last = tail.segments().len() - 1;
    let h = vec![0.1f32; n * d];
    assert!(tail.segment_run(last, StageInput::Hidden(&h), None, BATCH, SEQ).is_err(), "an LM head needs targets");
    let big = [c.vocab_real as u32; 32];
    let e = Some(MbEnd::Targets { targets: &big, loss_scale: 1.0 });
    assert!(tail.segment_run(last, StageInput::Hidden(&h), e, BATCH, SEQ).is_err(), "targets past the vocabulary");
}
