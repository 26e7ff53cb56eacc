use std::sync::Arc;

use iota_core::{ModelConfig, Rng};
use iota_model::{CpuBackend, MbEnd, SegmentKind, StageInput};

use super::*;
use crate::inner_step::record::{StepMb, optimizer_hash};

const B: usize = 2;
const S: usize = 16;
const LR: f32 = 3e-3;

fn model() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

fn spec(m: &ModelConfig, index: usize) -> StageSpec {
    StageSpec::split(m, 3).unwrap().remove(index)
}

fn adamw(muon: bool) -> AdamWConfig {
    // A clip the gradients exceed, so the norm matters.
    AdamWConfig { muon, grad_clip: 1e-3, ..AdamWConfig::default() }
}

/// What one party holds after running one step of stage `index` from
/// fresh weights and optimizer: its trace, what the optimizer read, and
/// the record an honest miner commits.
struct Ran {
    trace: StepTrace,
    before: KeptBefore,
    header: StepHeader,
}

fn run_step(index: usize, cfg: &AdamWConfig) -> Ran {
    let m = model();
    let be = Arc::new(CpuBackend::new());
    let mut st = Stage::new(be.clone(), &m, spec(&m, index), 9);
    let n = st.layout().total();
    let mut opt = AdamW::<CpuBackend>::new(&be, n);
    let w0 = st.params_host();
    let mut mbs = Vec::new();
    for seed in [1u64, 2] {
        let mut rng = Rng::new(seed);
        let rows = B * S;
        let w = st.boundary_width();
        let tokens: Vec<u32> = (0..rows).map(|_| (rng.next_u64() % 256) as u32).collect();
        let hidden: Vec<f32> = (0..rows * w).map(|_| rng.next_f32() - 0.5).collect();
        let grad: Vec<f32> = (0..rows * w).map(|_| (rng.next_f32() - 0.5) * 1e-2).collect();
        let input = if st.spec().has_embedding() { StageInput::Tokens(&tokens) } else { StageInput::Hidden(&hidden) };
        let end = if st.spec().has_lm_head() {
            MbEnd::Targets { targets: &tokens, loss_scale: 0.5 }
        } else {
            MbEnd::Grad(&grad)
        };
        mbs.push(st.traced_mb(input, end, B, S, &weights_hash).unwrap().trace);
    }
    let (trace, before) = optimizer_traced(&mut st, &mut opt, (cfg, LR), 0, mbs, true);
    let before = before.unwrap();
    let mb = StepMb { shard: 0, first_sample: 0, samples: B as u32, attempt: 0, weights: weights_hash(&w0) };
    let header = StepHeader {
        step: 0,
        mbs: vec![mb, mb],
        weights_before: weights_hash(&w0),
        weights_after: weights_hash(&st.params_host()),
        optimizer_before: optimizer_hash(0, &before.m, &before.v),
        optimizer_after: optimizer_hash(opt.t, &be.to_host(&opt.m), &be.to_host(&opt.v)),
    };
    Ran { trace, before, header }
}

/// What a miner commits and traces when its optimizer step runs on
/// `grads` in place of the accumulated ones (or, `None`, is skipped), its
/// micro-batches traced honestly; `claim_sums`: whether it claims its own
/// gradients' squared norms (else the honest ones).
fn lazy(index: usize, cfg: &AdamWConfig, honest: &Ran, grads: Option<Vec<f32>>, claim_sums: bool) -> Ran {
    let m = model();
    let be = Arc::new(CpuBackend::new());
    let mut st = Stage::with_params(be.clone(), &m, spec(&m, index), &honest.before.weights).unwrap();
    let n = st.layout().total();
    let mut opt = AdamW::<CpuBackend>::new(&be, n);
    let (mut trace, mut header) = (honest.trace.clone(), honest.header.clone());
    if let Some(g) = grads {
        st.set_grads(&g).unwrap();
        let sums = segment_sum_squares(&st);
        opt.step(&mut st, cfg, LR);
        if claim_sums {
            trace.sum_squares = sums;
        }
    } else {
        // Skips its step, and says it took one.
        opt.t += 1;
    }
    let (w, mm, vv) = (st.params_host(), be.to_host(&opt.m), be.to_host(&opt.v));
    (trace.w_after, trace.m_after, trace.v_after) = (weights_leaves(&w), weights_leaves(&mm), weights_leaves(&vv));
    header.weights_after = weights_hash(&w);
    header.optimizer_after = optimizer_hash(opt.t, &mm, &vv);
    Ran { trace, before: KeptBefore { weights: vec![], m: vec![], v: vec![], grads: vec![] }, header }
}

/// The blocks' gradients zeroed: a miner that skipped its weight gradients.
fn without_block_grads(index: usize, g: &[f32]) -> Vec<f32> {
    let m = model();
    let layout = ParamLayout::for_stage(&m, &spec(&m, index));
    let mut g = g.to_vec();
    for s in segments_of(&layout, &spec(&m, index)) {
        if matches!(s.kind, SegmentKind::Block(_)) {
            g[s.params].fill(0.0);
        }
    }
    g
}

fn limits(index: usize) -> TraceLimits {
    let m = model();
    let layout = ParamLayout::for_stage(&m, &spec(&m, index));
    TraceLimits { segments: 64, max_mbs: 8, weights: layout.total() as u64 }
}

fn leaf_holds(index: usize, cfg: &AdamWConfig, p: &LeafProof, miner: &Ran) -> Result<bool> {
    let m = model();
    let sp = spec(&m, index);
    let layout = ParamLayout::for_stage(&m, &sp);
    p.holds(&CpuBackend::new(), (&layout, &sp), (cfg, LR), &miner.header, &miner.trace)
}

#[test]
fn a_trace_round_trips_binds_to_its_record_and_refuses_hostile_bytes() {
    let cfg = adamw(false);
    let ran = run_step(1, &cfg);
    let n = limits(1).weights;
    let bytes = ran.trace.encode();
    assert_eq!(StepTrace::decode(&bytes, limits(1)).unwrap(), ran.trace);
    ran.trace.bind(&ran.header, n).unwrap();
    for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
        assert!(StepTrace::decode(&bytes[..cut], limits(1)).is_err(), "cut at {cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(StepTrace::decode(&longer, limits(1)).is_err(), "bytes after the end");
    assert!(
        StepTrace::decode(&bytes, TraceLimits { max_mbs: 1, ..limits(1) }).is_err(),
        "more micro-batches than a step"
    );
    let mut other = ran.trace.clone();
    other.w_after[0][0] ^= 1;
    assert!(other.bind(&ran.header, n).is_err(), "weights after not the record's");
    let mut other = ran.trace.clone();
    other.t_before += 1;
    assert!(other.bind(&ran.header, n).is_err(), "another counter");
    let mut other = ran.trace.clone();
    other.mbs.pop();
    assert!(other.bind(&ran.header, n).is_err(), "fewer micro-batches than the record");
}

#[test]
fn honest_steps_agree_and_proofs_against_them_fail() {
    for muon in [false, true] {
        let cfg = adamw(muon);
        let (a, b) = (run_step(0, &cfg), run_step(0, &cfg));
        assert_eq!(first_step_disagreement(&a.trace, &b.trace).unwrap(), None, "muon {muon}");
        let m = model();
        let sp = spec(&m, 0);
        let layout = ParamLayout::for_stage(&m, &sp);
        for leaf in [0, a.trace.w_after.len() as u64 - 1, a.trace.w_after.len() as u64 / 2] {
            let p = LeafProof::build(&layout, &sp, &cfg, &b.before.view(), leaf).unwrap();
            assert!(!leaf_holds(0, &cfg, &p, &a).unwrap(), "muon {muon}: leaf {leaf} of honest work");
        }
        let p = NormProof::build(&layout, &sp, &b.before.view(), 1).unwrap();
        assert!(!p.holds(&CpuBackend::new(), &a.trace).unwrap(), "an honest squared norm");
    }
}

/// A miner that skipped its weight gradients, traced its micro-batches
/// honestly and claims the squared norms its step used: proven at the
/// first block's squared norm.
#[test]
fn skipped_weight_gradients_behind_honest_micro_batches_are_proven_by_a_norm() {
    let cfg = adamw(false);
    let honest = run_step(1, &cfg);
    let miner = lazy(1, &cfg, &honest, Some(without_block_grads(1, &honest.before.grads)), true);
    miner.trace.bind(&miner.header, limits(1).weights).unwrap();
    let d = first_step_disagreement(&miner.trace, &honest.trace).unwrap().unwrap();
    let m = model();
    let (sp, first_block) = (spec(&m, 1), 1); // decoder, then the blocks
    assert_eq!(d, StepDispute::SumSquares(first_block));
    let layout = ParamLayout::for_stage(&m, &sp);
    let p = NormProof::build(&layout, &sp, &honest.before.view(), first_block).unwrap();
    assert!(p.holds(&CpuBackend::new(), &miner.trace).unwrap());
    let mut forged = p.clone();
    forged.grads[0] += 1.0;
    assert!(forged.holds(&CpuBackend::new(), &miner.trace).is_err(), "gradients not the trace's");
}

/// The same miner claiming the honest squared norms: its leaves after are
/// what nothing gives, proven at the first leaf that differs, with AdamW
/// and with Muon (the leaf widened to its matrices).
#[test]
fn lazy_and_skipped_steps_are_proven_at_one_leaf() {
    for muon in [false, true] {
        let cfg = adamw(muon);
        let honest = run_step(1, &cfg);
        let skip_grads = lazy(1, &cfg, &honest, Some(without_block_grads(1, &honest.before.grads)), false);
        let skip_step = lazy(1, &cfg, &honest, None, false);
        for (name, miner) in [("skip-weight-grad", skip_grads), ("skip-optimizer", skip_step)] {
            miner.trace.bind(&miner.header, limits(1).weights).unwrap();
            let Some(StepDispute::Leaf(leaf)) = first_step_disagreement(&miner.trace, &honest.trace).unwrap() else {
                panic!("{name}: a leaf dispute");
            };
            let m = model();
            let sp = spec(&m, 1);
            let layout = ParamLayout::for_stage(&m, &sp);
            let p = LeafProof::build(&layout, &sp, &cfg, &honest.before.view(), leaf).unwrap();
            assert!(leaf_holds(1, &cfg, &p, &miner).unwrap(), "muon {muon}: {name} at leaf {leaf}");
            let widened = p.range.end - p.range.start > WEIGHTS_LEAF as u64;
            if muon && widened {
                let mut narrow = p.clone();
                narrow.range = leaf * WEIGHTS_LEAF as u64..(leaf + 1) * WEIGHTS_LEAF as u64;
                assert!(leaf_holds(1, &cfg, &narrow, &miner).is_err(), "a Muon matrix in part");
            }
            let mut forged = p.clone();
            forged.m.values[0] += 1.0;
            assert!(leaf_holds(1, &cfg, &forged, &miner).is_err(), "moments not the miner's");
            let mut forged = p.clone();
            forged.grads[0].1.values[0] += 1.0;
            assert!(leaf_holds(1, &cfg, &forged, &miner).is_err(), "gradients not the trace's");
        }
    }
}
