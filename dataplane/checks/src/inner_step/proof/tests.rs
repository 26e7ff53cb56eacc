use iota_core::{BottleneckStyle, Rng};
use iota_model::{CpuBackend, SegmentKind};

use super::*;

const B: usize = 2;
const S: usize = 16;
const LOSS_SCALE: f32 = 0.5;

fn model(style: BottleneckStyle) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny").unwrap();
    c.bottleneck_style = style;
    c
}

/// One micro-batch of a stage: its input and what its backward starts from.
struct Mb {
    tokens: Vec<u32>,
    targets: Vec<u32>,
    hidden: Vec<f32>,
    grad: Vec<f32>,
}

impl Mb {
    fn new(st: &Stage<CpuBackend>, seed: u64) -> Mb {
        let mut rng = Rng::new(seed);
        let n = B * S;
        let vocab = st.config().vocab_real as u64;
        let w = st.boundary_width();
        let mut vals = |k: usize, scale: f32| (0..k).map(|_| (rng.next_f32() - 0.5) * scale).collect::<Vec<f32>>();
        let (hidden, grad) = (vals(n * w, 2.0), vals(n * w, 1e-2));
        let mut rng = Rng::new(seed ^ 0x55);
        let mut toks = || (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect::<Vec<u32>>();
        Mb { tokens: toks(), targets: toks(), hidden, grad }
    }
    fn input(&self, st: &Stage<CpuBackend>) -> StageInput<'_> {
        if st.spec().has_embedding() { StageInput::Tokens(&self.tokens) } else { StageInput::Hidden(&self.hidden) }
    }
    fn end(&self, st: &Stage<CpuBackend>) -> MbEnd<'_> {
        if st.spec().has_lm_head() {
            MbEnd::Targets { targets: &self.targets, loss_scale: LOSS_SCALE }
        } else {
            MbEnd::Grad(&self.grad)
        }
    }
    fn edges(&self, st: &Stage<CpuBackend>) -> Edges {
        let stage_input = match self.input(st) {
            StageInput::Tokens(t) => tokens_hash(t),
            StageInput::Hidden(h) => weights_hash(h),
        };
        let stage_end = match self.end(st) {
            MbEnd::Targets { targets, loss_scale } => {
                end_hash(&ProofEnd::Targets { targets: targets.to_vec(), loss_scale })
            }
            MbEnd::Grad(g) => weights_hash(g),
        };
        Edges { stage_input, stage_end, forward_weights: weights_hash(&st.params_host()) }
    }
}

fn stage(model: &ModelConfig, index: usize) -> Stage<CpuBackend> {
    let spec = StageSpec::split(model, 3).unwrap().remove(index);
    Stage::new(Arc::new(CpuBackend::new()), model, spec, 5)
}

/// The traces of `mbs` run in turn on a fresh copy of stage `index`.
fn traces(model: &ModelConfig, index: usize, mbs: &[Mb]) -> Vec<MbTrace> {
    let mut st = stage(model, index);
    mbs.iter().map(|m| st.traced_mb(m.input(&st), m.end(&st), B, S, &weights_hash).unwrap().trace).collect()
}

/// A lazy miner's trace: the honest values, but the blocks' gradients
/// never accumulated (each block's hash stays the one before the
/// micro-batch), as a miner that skips its weight gradients computes.
fn skip_weight_grads(st: &Stage<CpuBackend>, honest: &[MbTrace]) -> Vec<MbTrace> {
    let segs = st.segments();
    let mut out = honest.to_vec();
    for t in &mut out {
        for (k, s) in segs.iter().enumerate() {
            if matches!(s.kind, SegmentKind::Block(_)) {
                t.grads[k] = weights_hash(&vec![0.0; s.params.len()]);
            }
        }
    }
    out
}

/// The validator's stage as it stands before micro-batch `upto` of the
/// step: the earlier ones accumulated.
fn validator_before(model: &ModelConfig, index: usize, mbs: &[Mb], upto: usize) -> Stage<CpuBackend> {
    let mut st = stage(model, index);
    for m in &mbs[..upto] {
        st.traced_mb(m.input(&st), m.end(&st), B, S, &weights_hash).unwrap();
    }
    st
}

fn prove(
    model: &ModelConfig,
    index: usize,
    mbs: &[Mb],
    theirs: &[MbTrace],
) -> Option<(SegmentProof, Stage<CpuBackend>)> {
    let ours = traces(model, index, mbs);
    let at = first_disagreement(theirs, &ours).unwrap()?;
    let mut st = validator_before(model, index, mbs, at.mb);
    let m = &mbs[at.mb];
    let (input, end) = (m.input(&st), m.end(&st));
    let p = SegmentProof::build(&mut st, input, end, (B as u32, S as u32), at, &theirs[at.mb]).unwrap();
    Some((p, st))
}

fn holds(model: &ModelConfig, index: usize, p: &SegmentProof, root: &[u8; 32]) -> Result<bool> {
    let spec = StageSpec::split(model, 3).unwrap().remove(index);
    p.recheck(&Arc::new(CpuBackend::new()), model, &spec, root)
}

#[test]
fn honest_traces_agree_and_give_no_dispute() {
    let m = model(BottleneckStyle::Residual);
    for index in 0..3 {
        let st = stage(&m, index);
        let mbs = [Mb::new(&st, 1), Mb::new(&st, 2)];
        let (a, b) = (traces(&m, index, &mbs), traces(&m, index, &mbs));
        assert_eq!(first_disagreement(&a, &b).unwrap(), None, "stage {index}");
        assert!(first_disagreement(&a[..1], &b).is_err(), "a trace of fewer micro-batches");
        let mut short = a.clone();
        short[1].grads.pop();
        assert!(first_disagreement(&short, &b).is_err(), "a trace of fewer segments");
    }
}

/// A miner that skips its weight gradients is narrowed to its last block's
/// backward in the first micro-batch; the proof binds to its own trace
/// and its recheck (one block) holds, at every stage.
#[test]
fn skipped_weight_gradients_are_proven_at_one_block() {
    for style in [BottleneckStyle::Linear, BottleneckStyle::Residual] {
        let m = model(style);
        for index in 0..3 {
            let st = stage(&m, index);
            let mbs = [Mb::new(&st, 3), Mb::new(&st, 4)];
            let theirs = skip_weight_grads(&st, &traces(&m, index, &mbs));
            let (p, vst) = prove(&m, index, &mbs, &theirs).expect("a dispute");
            let segs = st.segments();
            let last_block = segs.iter().rposition(|s| matches!(s.kind, SegmentKind::Block(_))).unwrap();
            assert_eq!(p.at, Disputed { mb: 0, segment: last_block, backward: true }, "{style:?} stage {index}");
            let edges = mbs[0].edges(&vst);
            p.bind(&theirs[0], None, &edges).unwrap();
            assert!(holds(&m, index, &p, &edges.forward_weights).unwrap(), "{style:?} stage {index}: the proof holds");
        }
    }
}

/// Honest on its first micro-batch, lazy on its second: the proof is of
/// the second, its gradients before bound to the first's trace.
#[test]
fn a_dispute_in_a_later_micro_batch_binds_to_the_one_before() {
    let m = model(BottleneckStyle::Linear);
    let st = stage(&m, 1);
    let mbs = [Mb::new(&st, 5), Mb::new(&st, 6)];
    let honest = traces(&m, 1, &mbs);
    let mut theirs = honest.clone();
    theirs[1] = skip_weight_grads(&st, &honest[1..])[0].clone();
    // It kept the first micro-batch's block gradients: its claim for the
    // second is the hash of those.
    let (p, vst) = prove(&m, 1, &mbs, &theirs).unwrap();
    assert_eq!(p.at.mb, 1);
    let edges = mbs[1].edges(&vst);
    p.bind(&theirs[1], Some(&theirs[0]), &edges).unwrap();
    assert!(p.bind(&theirs[1], None, &edges).is_err(), "the gradients before are the first micro-batch's, not zeros");
    assert!(holds(&m, 1, &p, &edges.forward_weights).unwrap());
}

/// A forward output the miner claims other than its segment gives.
#[test]
fn a_wrong_forward_output_is_proven_at_its_segment() {
    let m = model(BottleneckStyle::Residual);
    for index in 0..3 {
        let st = stage(&m, index);
        let mbs = [Mb::new(&st, 7)];
        let mut theirs = traces(&m, index, &mbs);
        let k = st.segments().len() / 2;
        theirs[0].outputs[k][0] ^= 1;
        let (p, vst) = prove(&m, index, &mbs, &theirs).unwrap();
        assert_eq!(p.at, Disputed { mb: 0, segment: k, backward: false });
        let edges = mbs[0].edges(&vst);
        p.bind(&theirs[0], None, &edges).unwrap();
        assert!(holds(&m, index, &p, &edges.forward_weights).unwrap(), "stage {index}");
    }
}

/// A proof against an honest miner does not hold; a proof whose values
/// are not the miner's does not bind; weights not the committed ones are
/// refused.
#[test]
fn a_proof_against_honest_work_or_with_forged_values_fails() {
    let m = model(BottleneckStyle::Linear);
    let st = stage(&m, 2);
    let mbs = [Mb::new(&st, 8)];
    let honest = traces(&m, 2, &mbs);
    let k = st.segments().len() - 2;
    // The validator claims a dispute where there is none.
    let mut vst = validator_before(&m, 2, &mbs, 0);
    let at = Disputed { mb: 0, segment: k, backward: true };
    let (input, end) = (mbs[0].input(&vst), mbs[0].end(&vst));
    let p = SegmentProof::build(&mut vst, input, end, (B as u32, S as u32), at, &honest[0]).unwrap();
    let edges = mbs[0].edges(&vst);
    p.bind(&honest[0], None, &edges).unwrap();
    assert!(!holds(&m, 2, &p, &edges.forward_weights).unwrap(), "honest work recomputes to its claims");
    let mut forged = p.clone();
    if let ProofInput::Values(v) = &mut forged.input {
        v[3] += 1.0;
    }
    assert!(forged.bind(&honest[0], None, &edges).is_err(), "another input");
    let mut forged = p.clone();
    if let ProofEnd::Grad(g) = &mut forged.end {
        g[0] *= 2.0;
    }
    assert!(forged.bind(&honest[0], None, &edges).is_err(), "another output gradient");
    let mut forged = p.clone();
    forged.grads_before[0] = 1.0;
    assert!(forged.bind(&honest[0], None, &edges).is_err(), "other gradients before");
    let mut forged = p.clone();
    forged.claimed.grads[0] ^= 1;
    assert!(forged.bind(&honest[0], None, &edges).is_err(), "a claim the miner did not make");
    let mut forged = p.clone();
    forged.weights.values[0] += 0.5;
    assert!(holds(&m, 2, &forged, &edges.forward_weights).is_err(), "weights not the committed ones");
    assert!(holds(&m, 1, &p, &edges.forward_weights).is_err(), "another stage's shape");
}
