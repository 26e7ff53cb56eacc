//! Trainer-level properties: the pipeline split computes the same thing as
//! the unsplit model, training lowers the loss, runs are reproducible, and a
//! resumed run continues the identical trajectory.

use std::collections::HashMap;
use std::sync::Arc;

use iota_core::{ModelConfig, WireCodec};
use iota_model::CpuBackend;
use iota_model::data::synthetic::grammar_text;
use iota_model::data::{Corpus, Tokenizer, TokenizerKind};
use iota_model::optim::{AdamWConfig, LrSchedule};
use iota_model::train::{Pipeline, TrainConfig};

fn config(stages: usize, bottleneck: usize, codec: WireCodec, steps: u64) -> TrainConfig {
    let mut model = ModelConfig::preset("tiny").unwrap();
    model.bottleneck = bottleneck;
    TrainConfig {
        model,
        tokenizer: TokenizerKind::Byte,
        stages,
        batch: 8,
        seq: 64,
        grad_accum: 1,
        steps,
        schedule: LrSchedule { peak: 3e-3, warmup: 10, total: steps, min_ratio: 0.1 },
        adamw: AdamWConfig::default(),
        codec,
        seed: 1234,
    }
}

fn corpus(seq: usize) -> Corpus {
    let text = grammar_text(7, 200_000);
    Corpus::new(Tokenizer::Byte.encode(&text), seq, 16, 0.05).unwrap()
}

fn grads_by_name(p: &Pipeline<CpuBackend>) -> HashMap<String, Vec<f32>> {
    let mut m = HashMap::new();
    for s in p.stages() {
        let g = s.grads_host();
        for e in &s.layout().entries {
            m.insert(e.name.clone(), g[e.range()].to_vec());
        }
    }
    m
}

#[test]
fn split_pipeline_equals_unsplit_model() {
    let be = Arc::new(CpuBackend::new());
    let data = corpus(64);
    let (x, y) = data.val_batch(5, 0, 4, 64);
    let mut whole = Pipeline::new(be.clone(), config(1, 0, WireCodec::F32, 10)).unwrap();
    let (lw, _) = whole.accumulate(&x, &y, 1, 1.0).unwrap();
    let gw = grads_by_name(&whole);
    for stages in [2, 3, 4] {
        let mut split = Pipeline::new(be.clone(), config(stages, 0, WireCodec::F32, 10)).unwrap();
        let (ls, bytes) = split.accumulate(&x, &y, 1, 1.0).unwrap();
        assert_eq!(bytes, (stages - 1) * 2 * 4 * 64 * 64 * 4, "f32 d-wide boundaries, both directions");
        for (a, b) in lw.iter().zip(&ls) {
            assert!((a - b).abs() <= 1e-6 * a.abs(), "{stages} stages: loss {a} vs {b}");
        }
        let gs = grads_by_name(&split);
        assert_eq!(gs.len(), gw.len(), "same tensors");
        for (name, g) in &gw {
            let h = &gs[name];
            let scale = g.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-12);
            let worst = g.iter().zip(h).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-6 * scale, "{stages} stages, {name}: gradient differs by {worst:e} (scale {scale:e})");
        }
    }
}

#[test]
fn tiny_model_halves_its_loss() {
    let be = Arc::new(CpuBackend::new());
    let data = corpus(64);
    // Two stages with the int8 bottleneck: the path a real swarm uses.
    let mut p = Pipeline::new(be, config(2, 16, WireCodec::Int8Row, 150)).unwrap();
    let first = p.eval(&data, 4).unwrap();
    let mut last = f32::NAN;
    for _ in 0..150 {
        let r = p.train_step(&data).unwrap();
        assert!(r.skipped.is_empty());
        last = r.loss;
    }
    let after = p.eval(&data, 4).unwrap();
    println!("tiny: validation loss {first:.3} -> {after:.3} (last train loss {last:.3})");
    assert!((first - (256f32).ln()).abs() < 0.3, "starts near uniform: {first}");
    assert!(after < first / 2.0, "loss must at least halve: {first} -> {after}");
}

#[test]
fn same_seed_same_trajectory() {
    let be = Arc::new(CpuBackend::new());
    let data = corpus(64);
    let run = |seed: u64| {
        let mut c = config(2, 16, WireCodec::Int8Row, 6);
        c.seed = seed;
        let mut p = Pipeline::new(be.clone(), c).unwrap();
        (0..6).map(|_| p.train_step(&data).unwrap().loss.to_bits()).collect::<Vec<_>>()
    };
    let a = run(1);
    assert_eq!(a, run(1), "bitwise identical losses");
    assert_ne!(a, run(2));
}

#[test]
fn resume_continues_the_identical_trajectory() {
    let be = Arc::new(CpuBackend::new());
    let data = corpus(64);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(3, 16, WireCodec::Int4Row, 8);
    let mut straight = Pipeline::new(be.clone(), cfg.clone()).unwrap();
    let full: Vec<u32> = (0..8).map(|_| straight.train_step(&data).unwrap().loss.to_bits()).collect();

    let mut first = Pipeline::new(be.clone(), cfg).unwrap();
    let mut resumed: Vec<u32> = (0..4).map(|_| first.train_step(&data).unwrap().loss.to_bits()).collect();
    first.save(dir.path(), 2).unwrap();
    drop(first);
    let mut second = Pipeline::load(be, dir.path()).unwrap();
    assert_eq!(second.step_count(), 4);
    resumed.extend((0..4).map(|_| second.train_step(&data).unwrap().loss.to_bits()));
    assert_eq!(full, resumed);
    for (a, b) in straight.stages().iter().zip(second.stages()) {
        assert_eq!(a.params_host(), b.params_host(), "weights identical after resume");
    }
    // The weights file is plain safetensors under Llama names.
    let ckpt = iota_model::checkpoint::resolve(dir.path()).unwrap();
    let st = iota_model::checkpoint::read_safetensors(&ckpt.join("model.safetensors")).unwrap();
    assert!(st.tensors.contains_key("model.embed_tokens.weight"));
    assert!(st.tensors.contains_key("model.layers.3.mlp.down_proj.weight"));
    assert!(st.tensors.contains_key("model.layers.1.bottleneck.down_proj.weight"));
    assert!(st.tensors.contains_key("lm_head.weight"));
    assert_eq!(st.tensors["model.layers.0.self_attn.k_proj.weight"].0, vec![32, 64]);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let be = Arc::new(CpuBackend::new());
    let mut c = config(2, 16, WireCodec::Int8Row, 1);
    c.seq = 1000;
    let err = Pipeline::new(be.clone(), c).err().expect("seq beyond max_seq is refused");
    assert!(err.to_string().contains("max_seq"));
    let mut p = Pipeline::new(be.clone(), config(2, 16, WireCodec::Int8Row, 1)).unwrap();
    let x = vec![300u32; 64];
    let err = p.accumulate(&x, &x, 1, 1.0).unwrap_err();
    assert!(format!("{err:#}").contains("outside the vocabulary"), "{err:#}");
    let stage = &mut p.stages_mut()[1];
    assert!(stage.backward(99, &[0.0; 4]).is_err());
    assert!(stage.forward(1, iota_model::StageInput::Hidden(&[0.0; 3]), 1, 64).is_err());
}

/// Validators recompute a miner's work and compare bitwise, on whatever
/// machine they run: the CPU reference must give the same bits whatever
/// the number of threads (every parallel reduction has a fixed split).
#[test]
fn cpu_results_are_bitwise_independent_of_the_thread_count() {
    let data = corpus(64);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let be = Arc::new(CpuBackend::new());
            let mut p = Pipeline::new(be, config(3, 32, WireCodec::Int8Row, 3)).unwrap();
            let mut losses = Vec::new();
            for _ in 0..2 {
                losses.push(p.train_step(&data).unwrap().loss.to_bits());
            }
            let (x, y) = data.val_batch(5, 0, 4, 64);
            let (l, _) = p.accumulate(&x, &y, 1, 1.0).unwrap();
            let params: Vec<Vec<f32>> = p.stages().iter().map(|s| s.params_host()).collect();
            let grads: Vec<Vec<f32>> = p.stages().iter().map(|s| s.grads_host()).collect();
            (losses, l.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), params, grads)
        })
    };
    let one = run(1);
    assert!(one.2.iter().flatten().all(|v| v.is_finite()));
    for threads in [2, 3, 8] {
        let other = run(threads);
        assert_eq!(one.0, other.0, "losses, {threads} threads");
        assert_eq!(one.1, other.1, "per-token losses, {threads} threads");
        for (a, b) in one.2.iter().zip(&other.2) {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "weights, {threads} threads");
        }
        for (a, b) in one.3.iter().zip(&other.3) {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "gradients, {threads} threads");
        }
    }
}

/// The head stage of `tiny` in 2 stages (batch 2 x seq 16), with
/// micro-batches of tokens and made-up output gradients, for tests that
/// drive a stage's forwards, backwards and steps in a pipeline's orders.
struct HeadStage {
    cfg: TrainConfig,
    spec: iota_core::StageSpec,
    be: Arc<CpuBackend>,
    data: iota_model::data::Corpus,
}

impl HeadStage {
    fn new() -> HeadStage {
        let cfg = config(2, 16, WireCodec::F32, 10);
        let spec = iota_core::StageSpec::split(&cfg.model, 2).unwrap()[0].clone();
        HeadStage { cfg, spec, be: Arc::new(CpuBackend::new()), data: corpus(16) }
    }
    fn batch(&self, i: u64) -> Vec<u32> {
        let mb = iota_model::train::micro_batch_id(i, self.data.num_shards(), 2);
        self.data.micro_batch(1, mb, 16).0
    }
    fn dout(&self, salt: f32) -> Vec<f32> {
        (0..32 * self.spec.boundary_width).map(|i| ((i as f32 * 0.37 + salt).sin()) * 1e-2).collect()
    }
}

#[test]
fn a_stage_stepped_between_forward_and_backward_differentiates_the_weights_it_forwarded_with() {
    use iota_model::optim::AdamW;
    use iota_model::{Stage, StageInput};
    let h = HeadStage::new();
    let (cfg, spec, be) = (&h.cfg, &h.spec, h.be.clone());
    let batch = |i: u64| h.batch(i);
    let dout = |salt: f32| h.dout(salt);
    let (x1, x2) = (batch(0), batch(1));
    // The pipeline's order: forward 1, forward 2, backward 1, step, backward 2.
    let run = |stash: bool| -> (Vec<f32>, usize) {
        let mut st = Stage::new(be.clone(), &cfg.model, spec.clone(), 5);
        st.set_weight_stashing(stash);
        let mut opt = AdamW::new(&*be, st.layout().total());
        st.forward(1, StageInput::Tokens(&x1), 2, 16).unwrap();
        st.forward(2, StageInput::Tokens(&x2), 2, 16).unwrap();
        st.backward(1, &dout(0.0)).unwrap();
        assert!(opt.step(&mut st, &cfg.adamw, 1e-2).applied);
        let kept = st.stashed_versions();
        st.zero_grads();
        st.backward(2, &dout(1.0)).unwrap();
        assert_eq!(st.stashed_versions(), 0, "nothing in flight, nothing kept");
        (st.grads_host(), kept)
    };
    // Reference: micro-batch 2 alone, on the weights it was forwarded with.
    let mut fresh = Stage::new(be.clone(), &cfg.model, spec.clone(), 5);
    fresh.forward(2, StageInput::Tokens(&x2), 2, 16).unwrap();
    fresh.backward(2, &dout(1.0)).unwrap();
    let want = fresh.grads_host();
    let (stashed, kept) = run(true);
    assert_eq!(kept, 1, "the step kept the weights micro-batch 2 was forwarded with");
    assert_eq!(stashed, want);
    let (unstashed, kept) = run(false);
    assert_eq!(kept, 0);
    let diff = unstashed.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(diff > 1e-6, "stepping changed nothing the backward reads: {diff}");
}

/// Weight prediction: a micro-batch forwarded while another is in flight
/// runs forward and backward on the weights extrapolated by one step
/// (w + (w - w before the last step)); one forwarded with nothing in
/// flight on the current weights; the stage's own weights are untouched.
#[test]
fn a_predicting_stage_forwards_and_backwards_on_the_extrapolated_weights() {
    use iota_model::optim::AdamW;
    use iota_model::{Stage, StageInput};
    let h = HeadStage::new();
    let (cfg, spec, be) = (&h.cfg, &h.spec, h.be.clone());
    let batch = |i: u64| h.batch(i);
    let dout = |salt: f32| h.dout(salt);
    let mut st = Stage::new(be.clone(), &cfg.model, spec.clone(), 5);
    st.set_weight_prediction(Some(1));
    let mut opt = AdamW::new(&*be, st.layout().total());
    // Before any step nothing is extrapolated, even with one in flight.
    let w0 = st.params_host();
    let first = st.forward(1, StageInput::Tokens(&batch(0)), 2, 16).unwrap();
    let early = st.forward(9, StageInput::Tokens(&batch(3)), 2, 16).unwrap();
    let mut fresh = Stage::with_params(be.clone(), &cfg.model, spec.clone(), &w0).unwrap();
    assert_eq!(early, fresh.forward(9, StageInput::Tokens(&batch(3)), 2, 16).unwrap());
    st.discard(9);
    st.backward(1, &dout(0.0)).unwrap();
    assert!(opt.step(&mut st, &cfg.adamw, 1e-2).applied);
    st.zero_grads();
    let w1 = st.params_host();
    assert_ne!(w0, w1);
    drop(first);
    // Micro-batch 2 with nothing ahead: the current weights.
    let out2 = st.forward(2, StageInput::Tokens(&batch(1)), 2, 16).unwrap();
    let mut at_w1 = Stage::with_params(be.clone(), &cfg.model, spec.clone(), &w1).unwrap();
    assert_eq!(out2, at_w1.forward(2, StageInput::Tokens(&batch(1)), 2, 16).unwrap());
    // Micro-batch 3 with micro-batch 2 ahead: one step extrapolated, as
    // the backend computes it.
    let out3 = st.forward(3, StageInput::Tokens(&batch(2)), 2, 16).unwrap();
    let predicted: Vec<f32> = w0.iter().zip(&w1).map(|(b, w)| (b * (-1.0f32 / 2.0) + w) * 2.0).collect();
    let mut at_pred = Stage::with_params(be.clone(), &cfg.model, spec.clone(), &predicted).unwrap();
    assert_eq!(out3, at_pred.forward(3, StageInput::Tokens(&batch(2)), 2, 16).unwrap());
    assert_eq!(st.params_host(), w1, "the stage's own weights stay as they are");
    st.backward(2, &dout(1.0)).unwrap();
    assert!(opt.step(&mut st, &cfg.adamw, 1e-2).applied);
    st.zero_grads();
    let w2 = st.params_host();
    st.backward(3, &dout(2.0)).unwrap();
    at_pred.backward(3, &dout(2.0)).unwrap();
    assert_eq!(st.grads_host(), at_pred.grads_host(), "the backward ran on the forward's predicted weights");
    assert_eq!(st.params_host(), w2);
    assert_eq!(st.stashed_versions(), 0);
}

/// Activation recomputation changes what a stage keeps, not what it
/// computes: every stage of a 3-stage `tiny` pipeline, driven in a
/// pipeline's order (head and body: forward 1, forward 2, backward 1,
/// step, backward 2, with weight stashing; tail: two forward-backwards
/// with a step between) gives the same outputs, losses, input gradients
/// and weight gradients bit for bit with and without it. (What it keeps
/// is checked against the allocator in tests/memory_plan.rs.)
#[test]
fn a_recomputing_stage_computes_the_same_bits() {
    use iota_model::optim::AdamW;
    use iota_model::{Stage, StageInput};
    let cfg = config(3, 16, WireCodec::F32, 10);
    let be = Arc::new(CpuBackend::new());
    let data = corpus(16);
    let mb = |i: u64| data.micro_batch(1, iota_model::train::micro_batch_id(i, data.num_shards(), 2), 16);
    let ((x1, y1), (x2, y2)) = (mb(0), mb(1));
    let wave = |len: usize, salt: f32| -> Vec<f32> { (0..len).map(|i| (i as f32 * 0.37 + salt).sin() * 0.5).collect() };
    for spec in iota_core::StageSpec::split(&cfg.model, 3).unwrap() {
        let width = spec.boundary_width;
        let (h1, h2) = (wave(32 * width, 0.0), wave(32 * width, 1.0));
        let (g1, g2) = (wave(32 * width, 2.0), wave(32 * width, 3.0));
        let input = |first: bool| -> StageInput {
            match (spec.has_embedding(), first) {
                (true, true) => StageInput::Tokens(&x1),
                (true, false) => StageInput::Tokens(&x2),
                (false, true) => StageInput::Hidden(&h1),
                (false, false) => StageInput::Hidden(&h2),
            }
        };
        let run = |recompute: bool| -> Vec<Vec<f32>> {
            let mut st = Stage::new(be.clone(), &cfg.model, spec.clone(), 5);
            st.set_recompute(recompute);
            assert_eq!(st.recompute(), recompute);
            let mut opt = AdamW::new(&*be, st.layout().total());
            let mut seen = Vec::new();
            if spec.has_lm_head() {
                for (first, y) in [(true, &y1), (false, &y2)] {
                    let out = st.forward_backward(input(first), y, 2, 16, 1.0).unwrap();
                    seen.extend([out.losses, out.din.unwrap(), st.grads_host()]);
                    assert!(opt.step(&mut st, &cfg.adamw, 1e-2).applied);
                    st.zero_grads();
                }
                return seen;
            }
            seen.push(st.forward(1, input(true), 2, 16).unwrap());
            seen.push(st.forward(2, input(false), 2, 16).unwrap());
            seen.extend(st.backward(1, &g1).unwrap());
            seen.push(st.grads_host());
            assert!(opt.step(&mut st, &cfg.adamw, 1e-2).applied);
            assert_eq!(st.stashed_versions(), 1);
            st.zero_grads();
            seen.extend(st.backward(2, &g2).unwrap());
            seen.push(st.grads_host());
            seen
        };
        let (kept, recomputed) = (run(false), run(true));
        assert_eq!(kept.len(), recomputed.len());
        assert!(kept.iter().all(|v| !v.is_empty() && v.iter().all(|x| x.is_finite())));
        for (i, (a, b)) in kept.iter().zip(&recomputed).enumerate() {
            assert!(
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "stage {} ({:?}), result {i} differs with recomputation",
                spec.index,
                spec.role()
            );
        }
    }
}

fn residual(mut c: TrainConfig) -> TrainConfig {
    c.model.bottleneck_style = iota_core::BottleneckStyle::Residual;
    c
}

/// With its branches' output projections at zero the residual bottleneck is
/// the linear one: the same losses and the same gradients of every tensor
/// the two share, bit for bit; the branches' own gradients are live.
#[test]
fn the_residual_bottleneck_without_its_branches_is_the_linear_one() {
    let be = Arc::new(CpuBackend::new());
    let data = corpus(64);
    let (x, y) = data.val_batch(5, 0, 4, 64);
    let mut lin = Pipeline::new(be.clone(), config(3, 8, WireCodec::Int8Row, 10)).unwrap();
    let mut res = Pipeline::new(be.clone(), residual(config(3, 8, WireCodec::Int8Row, 10))).unwrap();
    for s in res.stages_mut() {
        let mut p = s.params_host();
        for e in s.layout().entries.iter().filter(|e| e.name.ends_with("_mlp.down_proj.weight")) {
            p[e.range()].fill(0.0);
        }
        s.set_params(&p).unwrap();
    }
    let (ll, lb) = lin.accumulate(&x, &y, 1, 1.0).unwrap();
    let (rl, rb) = res.accumulate(&x, &y, 1, 1.0).unwrap();
    assert_eq!(lb, rb, "the same bytes cross the wire");
    assert_eq!(ll.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), rl.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    let (gl, gr) = (grads_by_name(&lin), grads_by_name(&res));
    assert_eq!(gr.len(), gl.len() + 2 * 2 * 3, "two boundaries, each an encoder and a decoder branch of 3 tensors");
    for (name, g) in &gr {
        match gl.get(name) {
            Some(want) => assert!(g == want, "{name}: gradient differs from the linear bottleneck's"),
            None if name.ends_with("down_proj.weight") => {
                assert!(g.iter().any(|v| *v != 0.0), "{name}: no gradient reaches the branch's output")
            }
            None => {}
        }
    }
}

#[test]
fn a_tiny_pipeline_with_the_residual_bottleneck_halves_its_loss() {
    let be = Arc::new(CpuBackend::new());
    let data = corpus(64);
    // Three stages, 2 channels at each boundary in int4: 3 bytes a token,
    // 43x less than the 128-byte bf16 hidden state of `tiny`.
    let mut p = Pipeline::new(be, residual(config(3, 2, WireCodec::Int4Row, 150))).unwrap();
    let first = p.eval(&data, 4).unwrap();
    for _ in 0..150 {
        assert!(p.train_step(&data).unwrap().skipped.is_empty());
    }
    let after = p.eval(&data, 4).unwrap();
    println!("tiny, residual bottleneck b=2 int4: validation loss {first:.3} -> {after:.3}");
    assert!(after < first / 2.0, "loss must at least halve: {first} -> {after}");
}
